"""Node sizes, run times and memory: unknown before a node runs, so estimated, then learned as
nodes finish, and kept in the home (``.sea/history.json``) so the next run, and ``sea plan``, start
from what the last one measured."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path


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
    seconds: dict[str, float] = field(default_factory=dict)  # the last run time seen per kind
    copy_home: dict[str, float] = field(default_factory=dict)  # what a copy home cost (sea.checkpoint.CopyCost)
    memory: dict[str, int] = field(default_factory=dict)  # the most memory a node of each kind was measured to hold
    files: dict[str, int] = field(default_factory=dict)  # the files a node of each kind made (the last seen)
    delivered: int = 0  # the bytes the last run delivered home (declared outputs, directories that persist)

    def estimate(self, kind: str, input_bytes: int | None = None) -> int:
        if kind in self.learned:
            return self.learned[kind]
        if input_bytes:
            return input_bytes
        return self.learned.get(_interface(kind), self.default)

    def learn(self, kind: str, size: int, seconds: float | None = None, files: int | None = None) -> None:
        for key in {kind, _interface(kind)}:
            self.learned[key] = max(size, self.learned.get(key, 0))
        if seconds is not None:
            self.seconds[kind] = seconds
        if files is not None:
            self.files[kind] = files

    def learn_memory(self, kind: str, nbytes: int) -> bool:
        """A node of ``kind`` held ``nbytes`` of memory at most; True if that is more than any before."""
        if nbytes <= self.memory.get(kind, 0):
            return False
        self.memory[kind] = nbytes
        return True

    @classmethod
    def load(cls, path: Path, default: int) -> SizeEstimator:
        try:
            data = json.loads(Path(path).read_text())
            copy_home = {k: float(v) for k, v in data.get("copy_home", {}).items()}
            memory = {k: int(v) for k, v in data.get("memory", {}).items()}
            files = {k: int(v) for k, v in data.get("files", {}).items()}
            learned, seconds = {k: int(v) for k, v in data["bytes"].items()}, {k: float(v) for k, v in data["seconds"].items()}
            return cls(default, learned, seconds, copy_home, memory, files, int(data.get("delivered", 0)))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return cls(default)  # no history yet, or one we cannot read: start from the defaults

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        data = {"bytes": self.learned, "seconds": self.seconds, "copy_home": self.copy_home, "memory": self.memory, "files": self.files, "delivered": self.delivered}
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)


def _interface(kind: str) -> str:
    return kind.split(":", 1)[0]
