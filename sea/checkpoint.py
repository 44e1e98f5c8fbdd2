"""Checkpoints: which node directories go home so that a rerun need not recompute them.

Sea evicts a node's directory once its consumers finished: the first run writes little to the shared
filesystem, but a rerun that changes a late step finds the producers it needs gone and recomputes
them. A checkpoint is a node directory copied home by the stager (after declared outputs, never
holding up a consumer) and swapped in at its usual path when it is evicted, where the engine's own
cache check (Nipype's hash files, Pydra's checksums) and Sea's journal find it.

``auto`` decides per node, when it finishes, by cost. Recomputing a node on a rerun costs its own
run time plus the recomputation of every producer it needs that is not kept either (recursively:
the evicted chain behind it). Copying it home costs what the stager's own copies take per file and
per byte on this shared filesystem (fitted during the run; from the last run or ``sea probe`` before
the first copy). A node is kept when recomputing it would take more than :data:`FACTOR` times its copy:

    >>> policy = CheckpointPolicy(Checkpoints.AUTO, CopyCost(per_file=0.01, per_byte=1e-8))
    >>> policy.decide("a", seconds=0.2, files=5, nbytes=10**8, producers=[])  # 0.2 s vs 1.05 s copy
    False
    >>> policy.decide("b", seconds=0.8, files=5, nbytes=10**7, producers=["a"])  # 1.0 s vs 0.15 s
    True
    >>> policy.decide("c", seconds=0.1, files=5, nbytes=10**7, producers=["b"])  # b is kept: 0.1 s
    False
    >>> round(policy.rerun_cost("c"), 3), round(policy.saved_seconds, 3)
    (0.1, 1.0)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .config import Checkpoints

# Keep a node when recomputing it costs more than FACTOR times copying it home. The copy's price
# is paid on every first run, the recomputation only on a rerun that needs the node; 2 keeps the
# first run within the 1.10x target on the busy benchmark filesystem (docs/performance.md).
FACTOR = 2.0
PRIOR_PER_FILE = 0.005  # seconds a copy costs per file on a shared filesystem, before any is measured
PRIOR_BANDWIDTH = 100e6  # bytes per second (Lustre's unloaded write in the Sea paper: 121 MiB/s)


@dataclass
class CopyCost:
    """Seconds the stager takes to copy ``files`` files of ``nbytes`` bytes home: a per-file latency
    plus a per-byte time, fitted by least squares to the stager's own copies of this run."""

    per_file: float = PRIOR_PER_FILE
    per_byte: float = 1 / PRIOR_BANDWIDTH
    _n: int = 0
    _sx: float = 0.0
    _sy: float = 0.0
    _sxx: float = 0.0
    _sxy: float = 0.0

    def observe(self, nbytes: int, seconds: float) -> None:
        """One file copied home, ``nbytes`` in ``seconds``."""
        self._n += 1
        self._sx += nbytes
        self._sy += seconds
        self._sxx += float(nbytes) * nbytes
        self._sxy += float(nbytes) * seconds
        spread = self._n * self._sxx - self._sx**2
        if self._n >= 3 and spread > 0:
            per_byte = (self._n * self._sxy - self._sx * self._sy) / spread
            per_file = (self._sy - per_byte * self._sx) / self._n
            if per_byte > 0 and per_file >= 0:
                self.per_byte, self.per_file = per_byte, per_file
                return
        if self._sx > 0:  # too few sizes for a fit (or one that makes no sense): all of it per byte
            self.per_byte, self.per_file = self._sy / self._sx, 0.0

    def predict(self, files: int, nbytes: int) -> float:
        return files * self.per_file + nbytes * self.per_byte

    @property
    def measured(self) -> bool:
        return self._n > 0

    def to_dict(self) -> dict[str, float]:
        return {"per_file": self.per_file, "per_byte": self.per_byte}

    @classmethod
    def from_dict(cls, data: dict | None) -> CopyCost:
        try:
            per_file, per_byte = float(data["per_file"]), float(data["per_byte"])
        except (TypeError, KeyError, ValueError):
            return cls()
        return cls(per_file=per_file, per_byte=per_byte) if per_file >= 0 and per_byte > 0 else cls()


@dataclass
class CheckpointPolicy:
    """The checkpoint decision for each node of one run, and what the report says of them."""

    mode: Checkpoints
    cost: CopyCost = field(default_factory=CopyCost)
    factor: float = FACTOR
    _rerun: dict[str, float] = field(default_factory=dict)  # key -> seconds a rerun needing it would spend
    _kept: set[str] = field(default_factory=set)
    saved_seconds: float = 0.0  # recomputation the kept directories spare a rerun that needs them all

    def decide(
        self, key: str, seconds: float, files: int, nbytes: int, producers: Iterable[str], forced: bool = False, consumed: bool = True
    ) -> bool:
        """Node ``key`` finished in ``seconds`` with ``files`` files of ``nbytes``: keep its directory?
        ``forced``: it is kept whatever the mode (it had a directory in the home, or it persists);
        ``consumed``: other nodes read it (in ``auto``, only a node a rerun may need is worth a copy)."""
        chain = seconds + sum(self._rerun.get(p, 0.0) for p in producers if p not in self._kept)
        self._rerun[key] = chain
        if self.mode is Checkpoints.ALL or forced:
            keep = True
        elif self.mode is Checkpoints.NONE or not consumed:
            keep = False
        else:
            keep = chain > self.factor * self.cost.predict(files, nbytes)
        if keep:
            self.keep(key)
        return keep

    def keep(self, key: str) -> None:
        if key not in self._kept:
            self._kept.add(key)
            self.saved_seconds += self._rerun.get(key, 0.0)

    def known(self, key: str, seconds: float, kept: bool) -> None:
        """A node this run did not execute (the engine's cache had it, or Sea's journal): its last
        known run time, and whether its directory is in the home."""
        self._rerun[key] = seconds
        if kept:
            self._kept.add(key)

    def rerun_cost(self, key: str) -> float:
        """Seconds a rerun that needs ``key``'s directory would spend recomputing (0 if kept)."""
        return 0.0 if key in self._kept else self._rerun.get(key, 0.0)

    def worst_rerun(self) -> tuple[str | None, float]:
        """The node whose directory costs a rerun the most to recompute, and those seconds."""
        evicted = {k: v for k, v in self._rerun.items() if k not in self._kept}
        if not evicted:
            return None, 0.0
        key = max(evicted, key=evicted.get)
        return key, evicted[key]
