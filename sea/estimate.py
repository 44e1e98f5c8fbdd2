"""Node sizes: unknown before a node runs, so estimated, then learned as nodes finish."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SizeEstimator:
    """Estimate = the largest size seen for the same kind of node; else the bytes of its inputs
    (a node that transforms an image writes about what it reads); else ``default``."""

    default: int
    learned: dict[str, int] = field(default_factory=dict)

    def estimate(self, kind: str, input_bytes: int | None = None) -> int:
        if kind in self.learned:
            return self.learned[kind]
        if input_bytes:
            return input_bytes
        return self.default

    def learn(self, kind: str, size: int) -> None:
        self.learned[kind] = max(size, self.learned.get(kind, 0))
