"""Checkpoints: which node directories go home so that a rerun need not recompute them, within a budget.

Sea evicts a node's directory once its consumers finished: the first run writes little to the shared
filesystem, but a rerun that changes a late step finds the producers it needs gone and recomputes
them. A checkpoint is a node directory copied home by the stager (after declared outputs, never
holding up a consumer) where the engine's own cache check and Sea's journal find it: with
``checkpoints: auto`` as one file, a pack (:mod:`sea.pack`) in ``.sea/checkpoints/``, unpacked to a
tier when a rerun needs it; with ``all`` (or a node the engine keeps) as the directory itself.

``auto`` decides per node, when it finishes. Recomputing a node on a rerun costs its own run time
plus the recomputation of every producer it needs that is not kept either (recursively: the
evicted chain behind it). A node is kept when all of these hold:

1. recomputing it would take more than a factor times its copy home (:data:`FACTOR`; the copy's
   cost per file and per byte is fitted to the stager's own copies, from the last run or ``sea
   probe`` before the first copy), and at least :data:`MIN_SPARED`;
2. it spares a rerun at least :data:`SHARE` of the run's average recomputation per byte of budget:
   a pack must be worth its share of what the budget can hold (this bounds what the first run
   writes: on a chain of equal steps and a budget of one directory per chain, its middle);
3. it fits in the budget: ``checkpoint_budget`` (by default as many bytes as the run delivers:
   declared outputs and the directories that go home), and at most half of what the home (its free
   space, the user's quota) has left beyond the outputs still to come. When it does not fit, packs
   that spare less than half as much per byte make room, dropped once it is home.

At the run's end the packs are trimmed to the budget of what the run really delivered (the least
worth per byte first). A copy that fails (out of space, over quota, an I/O error) drops its
checkpoint and ends checkpointing for the run: it never fails the run.

    >>> policy = CheckpointPolicy(Checkpoints.AUTO, CopyCost(per_file=0.01, per_byte=1e-8), factor=2)
    >>> policy.decide("a", seconds=0.2, files=5, nbytes=10**8, producers=[])  # 0.2 s vs 2.02 s copy
    False
    >>> policy.decide("b", seconds=0.8, files=5, nbytes=10**7, producers=["a"])  # 1.0 s vs 0.22 s
    True
    >>> policy.decide("c", seconds=0.1, files=5, nbytes=10**7, producers=["b"])  # b is kept: 0.1 s
    False
    >>> round(policy.rerun_cost("c"), 3), round(policy.saved_seconds, 3)
    (0.1, 1.0)

Within a budget of 15 MB, two packs of 10 MB cannot both stay: the second, worth twice as much per
byte, takes the first one's place once it is home:

    >>> policy = CheckpointPolicy(Checkpoints.AUTO, CopyCost(per_file=0.01, per_byte=1e-8), budget=Budget("15MB"))
    >>> policy.decide("x", seconds=1.0, files=5, nbytes=10**7, producers=[]), policy.committed("x", 10**7)
    (True, [])
    >>> policy.decide("y", seconds=3.0, files=5, nbytes=10**7, producers=[]), policy.committed("y", 10**7)
    (True, ['x'])
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .config import Checkpoints
from .sizes import parse_size

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
# A pack must spare a rerun at least this share of the run's recomputation per byte of budget (the
# run's node-seconds over the budget's bytes): on a chain of equal steps with a budget of one
# directory per chain, its middle and its end qualify, so the first run writes about twice the budget
SHARE = 0.5
# Nor is a pack worth a file on the shared filesystem (a metadata operation, a file of the quota) when
# it spares a rerun less than this: a few data grabbers' milliseconds cost a rerun nothing
MIN_SPARED = 0.5  # seconds


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


@dataclass(frozen=True)
class Budget:
    """What checkpoints may hold in the home: ``spec`` is a size (``"2GiB"``), a share of the
    bytes the run delivers (``"100%"``, the default; up to ``"1000%"``), or ``None`` (no limit).

    >>> Budget("50%").bytes(delivered=4 * 2**30) == 2 * 2**30, Budget("1GiB").bytes(delivered=0), Budget(None).bytes(0) > 2**60
    (True, 1073741824, True)
    """

    spec: str | None = None

    def bytes(self, delivered: int) -> int:
        if self.spec is None:
            return 2**62
        share = parse_share(self.spec)
        return int(share * delivered) if share is not None else parse_size(self.spec)


def parse_share(text: str) -> float | None:
    """``1.0`` for ``"100%"``; ``None`` when ``text`` is not a percentage; ``ValueError`` past 1000%."""
    text = str(text).strip()
    if not text.endswith("%"):
        return None
    try:
        value = float(text[:-1]) / 100
    except ValueError:
        raise ValueError(f"{text!r} is not a percentage such as '100%'") from None
    if not 0 <= value <= 10:
        raise ValueError(f"{text!r} is not a percentage from 0% to 1000%")
    return value


@dataclass
class Held:
    """A pack the budget holds: committed home, or on its way."""

    nbytes: int
    worth: float  # recomputation spared per byte, when it was decided
    committed: bool = False
    victims: tuple[str, ...] = ()  # packs it replaces, dropped once it is home
    pinned: bool = False  # a rerun will read it (its resume plan counted on it): never a victim before


class _Packs(dict):
    """key -> :class:`Held`, with the bytes they hold summed as packs come and go (the budget is
    asked after every node: a sum over the packs each time grew with the run)."""

    nbytes = 0

    def __setitem__(self, key: str, held: Held) -> None:
        self.nbytes += held.nbytes - (self[key].nbytes if key in self else 0)
        super().__setitem__(key, held)

    def __delitem__(self, key: str) -> None:
        self.nbytes -= self[key].nbytes
        super().__delitem__(key)

    def pop(self, key: str, *default):
        if key in self:
            self.nbytes -= self[key].nbytes
        return super().pop(key, *default)

    def resize(self, key: str, nbytes: int) -> None:
        self.nbytes += nbytes - self[key].nbytes
        self[key].nbytes = nbytes


@dataclass
class CheckpointPolicy:
    """The checkpoint decision for each node of one run, and what the report says of them.

    The engine tells it what the budget depends on: ``expected_delivered()``, the bytes it expects
    the run to deliver (what went home so far and an estimate of the rest); ``total_seconds()``,
    the node-seconds it expects the whole run to take; ``home_room()``, the bytes the home can still
    take (its free space, the user's quota), ``None`` if unknown."""

    mode: Checkpoints
    cost: CopyCost = field(default_factory=CopyCost)
    factor: float = FACTOR
    budget: Budget = field(default_factory=Budget)
    expected_delivered: Callable[[], int] = lambda: 0
    total_seconds: Callable[[], float] = lambda: 0.0
    home_room: Callable[[], int | None] = lambda: None
    overhead: Callable[[], int] = lambda: 0  # what Sea's own files take in the home (its journal, the result records)
    _seconds: dict[str, float] = field(default_factory=dict)  # key -> its run time
    _chain: dict[str, set[str]] = field(default_factory=dict)  # key -> it and the evicted producers it needs
    _kept: dict[str, float] = field(default_factory=dict)  # key -> the recomputation its copy spares
    _held: _Packs = field(default_factory=_Packs)  # packs: key -> what the budget holds for it
    saved_seconds: float = 0.0  # recomputation the kept directories spare a rerun that needs them all
    delivered: int = 0  # bytes the run delivered so far (declared outputs, directories that go home)
    stopped: str = ""  # why checkpointing stopped for this run (a copy failed), if it did
    over_budget: int = 0  # checkpoints not kept for want of room in the budget
    dropped: int = 0  # packs removed from the home to make room, or by the trim at the end

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
        elif self.mode is Checkpoints.NONE or not consumed or self.stopped:
            keep = False
        else:
            keep = cost > max(self.factor * self.cost.predict(1, nbytes), MIN_SPARED) and self._fits(key, nbytes, cost / max(nbytes, 1))
        if keep:
            self.keep(key)
        return keep

    # ---------------------------------------------------------------- the budget (auto's packs)
    def limit(self) -> int:
        """Bytes checkpoints may hold in the home now."""
        expected = max(self.delivered, self.expected_delivered())
        limit = self._budget_bytes(expected)
        room = self.home_room()
        if room is not None:  # the outputs still to come first; checkpoints take half of what is left
            limit = min(limit, self.held_bytes() + max(0, room - (expected - self.delivered)) // 2)
        return limit

    def _budget_bytes(self, delivered: int) -> int:
        """The budget for a run delivering ``delivered`` bytes: a share of it holds Sea's own files
        too (what Sea leaves in the home is then at most that share), a size the checkpoints alone."""
        share = self.budget.spec is not None and parse_share(self.budget.spec) is not None
        return self.budget.bytes(delivered) - (self.overhead() if share else 0)

    def held_bytes(self) -> int:
        return self._held.nbytes

    def held_keys(self) -> list[str]:
        """The nodes whose packs are home (or on their way)."""
        return list(self._held)

    def forget(self, key: str) -> None:
        """``key`` runs again: the pack an earlier run left of it is gone (``Run.forget_pack``)."""
        self._held.pop(key, None)

    def _fits(self, key: str, nbytes: int, worth: float) -> bool:
        limit = self.limit()
        if limit <= 0:
            self.over_budget += 1
            return False
        if self.budget.spec is not None and worth < SHARE * self.total_seconds() / max(self.budget.bytes(max(self.delivered, self.expected_delivered())), 1):
            return False  # worth less than its share of the budget
        free = limit - self.held_bytes()
        victims: list[str] = []
        if nbytes > free:  # packs worth less than half as much per byte make room
            for other, held in sorted(self._held.items(), key=lambda item: item[1].worth):
                if free >= nbytes or held.worth * 2 > worth:
                    break
                if held.committed and not held.pinned and not any(other in h.victims for h in self._held.values()):
                    victims.append(other)
                    free += held.nbytes
        if nbytes > free:
            self.over_budget += 1
            return False
        self._held[key] = Held(nbytes, worth, victims=tuple(victims))
        return True

    def committed(self, key: str, nbytes: int) -> list[str]:
        """``key``'s pack is home (``nbytes``): the packs it replaces, to remove now."""
        held = self._held.get(key)
        if held is None:
            return []
        self._held.resize(key, nbytes)
        held.committed = True
        victims = [v for v in held.victims if v in self._held]
        held.victims = ()
        for victim in victims:
            self.drop(victim)
        return victims

    def drop(self, key: str) -> None:
        """``key``'s pack leaves the home (to make room, or the trim at the end)."""
        if self._held.pop(key, None) is not None:
            self.dropped += 1
            self.abandoned(key)

    def failed(self, key: str, reason: str) -> bool:
        """``key``'s copy home failed: no more checkpoints in this run. True the first time."""
        self.abandoned(key)
        first = not self.stopped
        self.stopped = self.stopped or reason
        return first

    def trim(self, final: bool) -> list[str]:
        """The packs to remove so that what the budget holds fits it (``final``: the run delivered
        all it will, so its budget is what it really delivered), the least worth per byte first."""
        delivered = self.delivered if final else max(self.delivered, self.expected_delivered())
        limit = self._budget_bytes(delivered)
        dropped = []
        for key, held in sorted(self._held.items(), key=lambda item: item[1].worth):
            if self.held_bytes() <= limit:
                break
            if held.committed:
                dropped.append(key)
                self.drop(key)
        return dropped

    # ---------------------------------------------------------------- kept directories
    def keep(self, key: str) -> None:
        if key not in self._kept:
            self._kept[key] = self.rerun_cost(key)
            self.saved_seconds += self._kept[key]
            self._chain[key] = set()

    def abandoned(self, key: str) -> None:
        """The copy of a kept directory did not happen (the run ended first, it failed), or its pack
        was dropped."""
        self.saved_seconds -= self._kept.pop(key, 0.0)
        self._chain[key] = {key}
        held = self._held.get(key)
        if held is not None and not held.committed:
            del self._held[key]

    def known(self, key: str, seconds: float, kept: bool) -> None:
        """A node this run did not execute (the engine's cache had it, or Sea's journal): its last
        known run time, and whether its directory is in the home."""
        self._seconds[key] = seconds
        self._chain[key] = {key}
        if kept:
            self.keep(key)

    def known_pack(self, key: str, nbytes: int, seconds: float, pinned: bool = False) -> None:
        """A pack an earlier run left in the home, which this run keeps using: the budget holds it,
        worth (to the trim) its node's last run time per byte. ``pinned``: this run will unpack it
        (:meth:`unpin` once it did): no other pack takes its room before."""
        self._held[key] = Held(nbytes, seconds / max(nbytes, 1), committed=True, pinned=pinned)

    def unpin(self, key: str | None = None) -> None:
        """``key``'s pack was unpacked (``None``: the run is over): it may make room from now on."""
        for other, held in self._held.items():
            if key is None or other == key:
                held.pinned = False

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


class Deliverables:
    """What the run delivers home (declared outputs, directories that go home whole): the bytes
    delivered so far, and an estimate of the whole, from each kind's learned size for what is still
    to come (``estimate(kind)``). Cost per event is constant; an estimate costs a step per kind.

    >>> d = Deliverables(lambda kind: 100)
    >>> d.add("sink"); d.add("sink"); d.done("sink", 30); d.delivered, d.expected()
    (30, 130)
    """

    def __init__(self, estimate: Callable[[str], int]):
        self._estimate = estimate
        self._pending: dict[str, int] = {}
        self.delivered = 0

    def add(self, kind: str) -> None:
        self._pending[kind] = self._pending.get(kind, 0) + 1
        self.known = True

    known = False  # a node that delivers is known (a graph that grows may not show one yet)

    def done(self, kind: str, nbytes: int) -> None:
        """A node of ``kind`` delivered ``nbytes`` (in this run, or an earlier one)."""
        if self._pending.get(kind):
            self._pending[kind] -= 1
        self.delivered += nbytes

    def expected(self) -> int:
        return self.delivered + sum(n * self._estimate(kind) for kind, n in self._pending.items() if n)
