"""Checkpoints: which node directories go home so that a rerun need not recompute them.

Sea evicts a node's directory once its consumers finished: the first run writes little to the shared
filesystem, but a rerun that changes a late step finds the producers it needs gone and recomputes
them. A checkpoint is a node directory copied home by the stager (after declared outputs, never
holding up a consumer) and put at its usual path the moment it is complete, where the engine's own
cache check (Nipype's hash files, Pydra's checksums) and Sea's journal find it.

``auto`` decides per node, when it finishes, by cost. Recomputing a node on a rerun costs its own
run time plus the recomputation of every producer it needs that is not kept either (recursively:
the evicted chain behind it). Copying it home costs what the stager's own copies take per file and
per byte on this shared filesystem (fitted during the run; from the last run or ``sea probe`` before
the first copy). A node is kept when recomputing it would take more than a factor times its copy
(:data:`FACTOR` by default; 2 here):

    >>> policy = CheckpointPolicy(Checkpoints.AUTO, CopyCost(per_file=0.01, per_byte=1e-8), factor=2)
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

# Keep a node when recomputing it costs more than FACTOR times copying it home (the configuration's
# checkpoint_factor). The copy's price is paid on every first run, in the background, the
# recomputation only on a rerun that needs the node. Measured (benchmarks/results/reruns-factors-full.md,
# fmri_preproc on the busy filesystem, medians of 3): factor 1 ran the first run in 1.03x the time of
# no checkpoints and the rerun after a late change in 0.38x MultiProc's; factor 2: 0.98x and 0.56x;
# factor 4: 1.01x and 0.50x. Break-even (1) it is.
FACTOR = 1.0
PRIOR_PER_FILE = 0.005  # seconds a copy costs per file on a shared filesystem, before any is measured
PRIOR_BANDWIDTH = 100e6  # bytes per second (Lustre's unloaded write in the Sea paper: 121 MiB/s)
PRIOR_SIZE, PRIOR_WEIGHT = 16 * 2**20, 2.0  # the prior counts as 2 copies of an empty and of a 16 MiB file


@dataclass
class CopyCost:
    """Seconds the stager takes to copy ``files`` files of ``nbytes`` bytes home: a per-file latency
    plus a per-byte time, fitted by least squares to the stager's own copies of this run. The prior
    (``per_file``, ``per_byte`` as given) counts as :data:`PRIOR_WEIGHT` copies of an empty file and
    as many of a 16 MiB one: a few small files (a run's first copies) cannot make the fit say that
    bytes are dear or free, and a run's copies soon outweigh it.

    >>> cost = CopyCost(per_file=0.005, per_byte=1e-8)
    >>> for _ in range(40):
    ...     cost.observe(0, 0.05); cost.observe(10**8, 2.05)  # 50 ms a file, 50 MB/s
    >>> round(cost.per_file, 3), round(1 / cost.per_byte / 1e6)
    (0.04, 50)
    """

    per_file: float = PRIOR_PER_FILE
    per_byte: float = 1 / PRIOR_BANDWIDTH
    _sums: list[float] = field(default_factory=lambda: [0.0] * 5)  # n, sx, sy, sxx, sxy
    _observed: int = 0

    def __post_init__(self) -> None:
        for x in (0, PRIOR_SIZE):
            self._add(x, self.per_file + x * self.per_byte, PRIOR_WEIGHT)

    def _add(self, x: float, y: float, weight: float = 1.0) -> None:
        for i, value in enumerate((1.0, x, y, x * x, x * y)):
            self._sums[i] += weight * value

    def observe(self, nbytes: int, seconds: float) -> None:
        """One file copied home, ``nbytes`` in ``seconds``."""
        self._observed += 1
        self._add(float(nbytes), seconds)
        n, sx, sy, sxx, sxy = self._sums
        per_byte = (n * sxy - sx * sy) / (n * sxx - sx * sx)
        if per_byte > 0:
            self.per_byte = per_byte
            self.per_file = max(0.0, (sy - per_byte * sx) / n)

    def predict(self, files: int, nbytes: int) -> float:
        return files * self.per_file + nbytes * self.per_byte

    @property
    def measured(self) -> bool:
        return self._observed > 0

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
    _seconds: dict[str, float] = field(default_factory=dict)  # key -> its run time
    _chain: dict[str, set[str]] = field(default_factory=dict)  # key -> it and the evicted producers it needs
    _kept: dict[str, float] = field(default_factory=dict)  # key -> the recomputation its copy spares
    saved_seconds: float = 0.0  # recomputation the kept directories spare a rerun that needs them all

    def decide(
        self, key: str, seconds: float, files: int, nbytes: int, producers: Iterable[str], forced: bool = False, consumed: bool = True
    ) -> bool:
        """Node ``key`` finished in ``seconds`` with ``files`` files of ``nbytes``: keep its directory?
        ``forced``: it is kept whatever the mode (it had a directory in the home, or it persists);
        ``consumed``: other nodes read it (in ``auto``, only a node a rerun may need is worth a copy)."""
        chain = {key}  # it and the evicted producers it needs, each once (a diamond counts its source once)
        for producer in producers:
            if producer not in self._kept:
                chain |= self._chain.get(producer, {producer})
        self._seconds[key] = seconds
        self._chain[key] = chain
        cost = self.rerun_cost(key)
        if self.mode is Checkpoints.ALL or forced:
            keep = True
        elif self.mode is Checkpoints.NONE or not consumed:
            keep = False
        else:
            keep = cost > self.factor * self.cost.predict(files, nbytes)
        if keep:
            self.keep(key)
        return keep

    def keep(self, key: str) -> None:
        if key not in self._kept:
            self._kept[key] = self.rerun_cost(key)
            self.saved_seconds += self._kept[key]
            self._chain[key] = set()

    def abandoned(self, key: str) -> None:
        """The copy of a kept directory did not happen (the run ended first)."""
        self.saved_seconds -= self._kept.pop(key, 0.0)
        self._chain[key] = {key}

    def known(self, key: str, seconds: float, kept: bool) -> None:
        """A node this run did not execute (the engine's cache had it, or Sea's journal): its last
        known run time, and whether its directory is in the home."""
        self._seconds[key] = seconds
        self._chain[key] = {key}
        if kept:
            self.keep(key)

    def rerun_cost(self, key: str) -> float:
        """Seconds a rerun that needs ``key``'s directory would spend recomputing (0 if kept)."""
        if key in self._kept:
            return 0.0
        return sum(self._seconds.get(k, 0.0) for k in self._chain.get(key, ()))

    def worst_rerun(self) -> tuple[str | None, float]:
        """The evicted node whose directory costs a rerun the most to recompute, and those seconds."""
        costs = {k: self.rerun_cost(k) for k in self._chain if k not in self._kept}
        if not costs:
            return None, 0.0
        key = max(costs, key=costs.get)
        return key, costs[key]
