"""Node sizes: unknown before a node runs, so estimated, then learned as nodes finish."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SizeEstimator:
    """Estimate = the largest size seen for the same node (``kind`` is ``"Interface:name"``);
    else the bytes of its inputs (a node that transforms an image writes about what it reads);
    else the largest size seen for the same interface; else ``default``.

    >>> e = SizeEstimator(default=64)
    >>> e.estimate("Function:smooth"), e.estimate("Function:smooth", input_bytes=1000)
    (64, 1000)
    >>> e.learn("Function:smooth", 4000); e.estimate("Function:smooth", 1000), e.estimate("Function:mask")
    (4000, 4000)
    """

    default: int
    learned: dict[str, int] = field(default_factory=dict)

    def estimate(self, kind: str, input_bytes: int | None = None) -> int:
        if kind in self.learned:
            return self.learned[kind]
        if input_bytes:
            return input_bytes
        return self.learned.get(_interface(kind), self.default)

    def learn(self, kind: str, size: int) -> None:
        for key in {kind, _interface(kind)}:
            self.learned[key] = max(size, self.learned.get(key, 0))


def _interface(kind: str) -> str:
    return kind.split(":", 1)[0]
