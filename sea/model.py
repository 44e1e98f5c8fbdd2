"""The performance model: predict a run's makespan and tier usage before it runs.

The Sea paper's model counts bandwidth only: a run on the shared filesystem takes
``D_read / L_r + D_write / L_w``; with Sea, inputs are read once from the shared filesystem and
every other byte moves at the speed of the tier that holds it, each tier taking what fits and the
rest falling through to the next. We generalise it to N tiers and add the two things it ignores:
compute (``C`` seconds on ``p`` processes) and the overlap our stager gives. A prediction is a
range: ``lower`` assumes I/O and compute overlap perfectly (``max``), ``upper`` that they do not
overlap at all (``+``); the last declared output's flush is after the compute in both. With
prefetch, the inputs' reads overlap compute even in ``upper``, but for those of the first readers
(``first_input_bytes``: nothing computes before they arrive), which bounds what prefetch can gain.

What fits where is not a guess either: :func:`simulate` replays the workflow graph with Sea's own
ordering (locality, depth-first), sizes and run times learned in earlier runs, and eviction when the
last consumer finishes, and reports the peak bytes each tier holds and the nodes that spill.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from .graph import WorkflowGraph
from .ordering import order_ready


@dataclass(frozen=True)
class Bandwidth:
    """Bytes per second."""

    read: float
    write: float


@dataclass(frozen=True)
class TierModel:
    name: str
    capacity: float  # bytes Sea may use; float("inf") for the home
    bandwidth: Bandwidth


@dataclass
class Simulation:
    """What a replay of the graph says about one run."""

    makespan_compute: float = 0.0  # compute only, p processes, Sea's order
    peak_bytes: dict[str, float] = field(default_factory=dict)  # per tier
    bytes_written: dict[str, float] = field(default_factory=dict)  # per tier
    spills: int = 0
    live_peak: float = 0.0  # the live working set: bytes whose consumers have not all finished


@dataclass(frozen=True)
class Workload:
    input_bytes: float  # read once from the shared filesystem
    intermediate_bytes: float  # written by nodes, read back by their consumers
    output_bytes: float  # declared outputs, written home once
    last_output_bytes: float
    compute_seconds: float  # total, all nodes
    processes: int
    first_input_bytes: float = 0.0  # of input_bytes, what the first ``processes`` readers read before anything computes


@dataclass(frozen=True)
class Prediction:
    io_seconds: float
    compute_seconds: float
    tail_seconds: float  # after the last node: the last output's flush
    wait_seconds: float = 0.0  # a scheduler that polls: a poll's sleep between each step of the longest chain and the next
    hidden_seconds: float = 0.0  # of io_seconds, what overlaps compute whatever the order (prefetch's copies)

    @property
    def lower(self) -> float:
        return max(self.io_seconds, self.compute_seconds) + self.tail_seconds + self.wait_seconds

    @property
    def upper(self) -> float:
        exposed = self.io_seconds - self.hidden_seconds
        return exposed + max(self.hidden_seconds, self.compute_seconds) + self.tail_seconds + self.wait_seconds


def predict_shared(w: Workload, shared: Bandwidth) -> Prediction:
    """Every node directory on the shared filesystem (plain MultiProc)."""
    read = w.input_bytes + w.intermediate_bytes
    write = w.intermediate_bytes + w.output_bytes
    return Prediction(read / shared.read + write / shared.write, w.compute_seconds / w.processes, 0.0)


def predict_sea(w: Workload, tiers: list[TierModel], shared: Bandwidth, live_peak: float, prefetch: bool = False) -> Prediction:
    """Intermediates (and outputs, staged) on the tiers by capacity against the live working set,
    the rest on the shared filesystem; outputs flushed home in the background, but the last. With
    ``prefetch``, the inputs are copied to the first tier while earlier readers compute: only the
    first readers' wait for theirs.

    >>> w = Workload(input_bytes=8e8, intermediate_bytes=0, output_bytes=0, last_output_bytes=0,
    ...              compute_seconds=160, processes=2, first_input_bytes=2e8)  # 8 subjects, 100 MB each
    >>> slow = Bandwidth(read=25e6, write=25e6)
    >>> tmpfs = TierModel("tmpfs", float("inf"), Bandwidth(read=6e9, write=2.5e9))
    >>> off, on = predict_sea(w, [tmpfs], slow, 0), predict_sea(w, [tmpfs], slow, 0, prefetch=True)
    >>> round(off.upper), round(on.upper), round(on.lower)  # reads 32 s, of which 8 s the first readers'
    (112, 88, 80)
    """
    staged = w.intermediate_bytes + w.output_bytes
    io = w.input_bytes / shared.read
    hidden = 0.0
    if prefetch and tiers:
        hidden = max(w.input_bytes - w.first_input_bytes, 0.0) / shared.read
        io += w.input_bytes / tiers[0].bandwidth.write + w.input_bytes / tiers[0].bandwidth.read  # the copies, read back
    left = 1.0
    for tier in tiers:
        share = left if live_peak <= 0 else min(left, tier.capacity / live_peak)
        io += share * (staged / tier.bandwidth.write + staged / tier.bandwidth.read)
        left -= share
        if left <= 0:
            break
    io += left * (staged / shared.write + staged / shared.read)
    flush = w.output_bytes / shared.write  # overlapped with compute by the stager ...
    tail = w.last_output_bytes / shared.write  # ... except the last output's
    return Prediction(max(io, flush - tail), w.compute_seconds / w.processes, tail, hidden_seconds=hidden)


def simulate(
    graph: WorkflowGraph,
    sizes: dict[str, float],
    seconds: dict[str, float],
    tiers: list[TierModel],
    processes: int,
) -> Simulation:
    """Replay the run: ``processes`` slots, Sea's ready-node order, placement on the first tier
    with room for the node's size, eviction when its last consumer finishes."""
    sim = Simulation(peak_bytes={t.name: 0.0 for t in tiers}, bytes_written={t.name: 0.0 for t in tiers})
    used = {t.name: 0.0 for t in tiers}
    where: dict[str, str] = {}
    waiting = {k: set(graph.producers(k)) for k in graph.nodes}
    consumers_left = {k: set(graph.consumers(k)) for k in graph.nodes}
    ready = [k for k, deps in waiting.items() if not deps]
    running: list[tuple[float, str]] = []
    clock = 0.0

    def rank(key: str) -> int:
        names = list(used)
        ranks = [names.index(where[p]) for p in graph.producers(key) if where.get(p)]
        return min(ranks, default=len(tiers))

    def evict(key: str) -> None:
        if where.get(key):
            used[where[key]] -= sizes.get(key, 0.0)
            where[key] = ""

    while ready or running:
        for key in order_ready(list(ready), graph, rank):
            if len(running) >= processes:
                break
            size = sizes.get(key, 0.0)
            chosen = tiers[-1]
            for tier in tiers:
                if used[tier.name] + size <= tier.capacity:
                    chosen = tier
                    break
                sim.spills += 1
            where[key] = chosen.name
            used[chosen.name] += size
            sim.bytes_written[chosen.name] += size
            sim.peak_bytes[chosen.name] = max(sim.peak_bytes[chosen.name], used[chosen.name])
            sim.live_peak = max(sim.live_peak, sum(used.values()))
            ready.remove(key)
            heapq.heappush(running, (clock + seconds.get(key, 0.0), key))
        clock, done = heapq.heappop(running)
        for producer in graph.producers(done):
            consumers_left[producer].discard(done)
            if not consumers_left[producer]:
                evict(producer)
        if not consumers_left[done]:
            evict(done)  # a sink: gone once flushed
        for consumer in graph.consumers(done):
            waiting[consumer].discard(done)
            if not waiting[consumer]:
                ready.append(consumer)
    sim.makespan_compute = clock
    return sim
