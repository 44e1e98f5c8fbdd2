"""Which machine runs a ready node: the one that holds its inputs.

On a cluster each machine (a Dask worker) has its own node-local tiers, which no other machine can
read. The planner, on the client, knows where every finished node's directory is and sends a ready
node to the worker holding the most bytes of its inputs, so a subject's chain stays on one machine
and its intermediates never cross the network. A node goes elsewhere only when that worker is busy
past a threshold while another has a free slot, or when its inputs are spread over several workers
(a fan-in); then the inputs it lacks are copied to it first, worker to worker (``fetch``), never read
from another machine's tier.

>>> from sea.graph import NodeSpec, WorkflowGraph
>>> g = WorkflowGraph.from_specs([NodeSpec("s1"), NodeSpec("s2"), NodeSpec("a1", upstream=(("s1", "x"),)),
...     NodeSpec("join", upstream=(("a1", "x"), ("s2", "x")))])
>>> planner = LocalityPlanner(g, {"w1": 1, "w2": 1})
>>> [planner.assign(k).worker for k in planner.order(["s1", "s2"])]
['w1', 'w2']
>>> planner.finished("s1", "w1", size=100); planner.finished("s2", "w2", size=10)
>>> planner.assign("a1").worker, planner.assign("a1").fetch
('w1', {})
>>> planner.finished("a1", "w1", size=50); a = planner.assign("join")
>>> a.worker, a.fetch
('w1', {'s2': 'w2'})
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..graph import WorkflowGraph
from ..ordering import rank


@dataclass
class Assignment:
    """Where ``key`` runs, and the inputs to copy there first (producer key -> worker holding it)."""

    key: str
    worker: str
    fetch: dict[str, str] = field(default_factory=dict)
    local: bool = True  # every input held by a worker was on this one


@dataclass
class WorkerRow:
    """A worker's line in the report."""

    worker: str
    nodes_run: int = 0
    with_inputs_held: int = 0  # nodes whose inputs some worker held (sources and home inputs excluded)
    local_hits: int = 0  # ... of which ran where all those inputs were
    bytes_received: int = 0  # node directories copied here from other workers


class LocalityPlanner:
    """Client-side placement across workers. ``slots``: worker -> tasks it runs at once.

    ``busy_threshold``: tasks queued on the worker holding a node's inputs, beyond its slots, before
    the node goes to a worker with a free slot instead (its inputs are then copied there).
    """

    def __init__(self, graph: WorkflowGraph, slots: dict[str, int], busy_threshold: int = 4):
        if not slots:
            raise ValueError("no Dask worker to run on: start workers or check the cluster options")
        self.graph = graph
        self.slots = dict(slots)
        self.busy_threshold = busy_threshold
        self.load: Counter[str] = Counter()  # tasks assigned and not finished
        self.holders: dict[str, set[str]] = {}  # node -> workers holding its directory
        self.size: dict[str, int] = {}
        self.rows = {w: WorkerRow(w) for w in slots}
        self.done: set[str] = set()  # nodes finished (and not to be run again)
        self.recomputed = 0  # nodes run again because a worker holding their data was lost
        self._running: dict[str, Assignment] = {}

    # ------------------------------------------------------------------ decisions
    def order(self, ready: Sequence[str]) -> list[str]:
        """Ready nodes, best first: inputs held by some worker, then deepest (depth-first)."""
        return sorted(ready, key=self.rank)

    def rank(self, key: str) -> tuple:
        """The sort key of :meth:`order` for one ready node (:func:`sea.ordering.rank`)."""
        return rank(key, self.graph, lambda key: 0 if self._held_inputs(key) else 1)

    def assign(self, key: str) -> Assignment:
        held = self._held_inputs(key)
        by_worker: Counter[str] = Counter()
        for producer in held:
            for worker in self.holders[producer]:
                by_worker[worker] += self.size.get(producer, 0) + 1  # +1: an empty directory still counts
        best = max(self.slots, key=lambda w: (by_worker[w], -self._queued(w), w == self._least_loaded()))
        if by_worker and self._queued(best) >= self.busy_threshold:
            idle = self._least_loaded()
            if self.load[idle] < self.slots[idle]:
                best = idle
        fetch = {p: sorted(self.holders[p])[0] for p in held if best not in self.holders[p]}
        assignment = Assignment(key, best, fetch, local=not fetch)
        self.load[best] += 1
        self._running[key] = assignment
        return assignment

    # ------------------------------------------------------------------ events
    def finished(self, key: str, worker: str, size: int) -> None:
        """``key`` finished on ``worker``; its directory (``size`` bytes) is there until evicted."""
        assignment = self._running.pop(key, None)
        if assignment is not None:
            self.load[assignment.worker] -= 1
            row = self.rows.setdefault(worker, WorkerRow(worker))
            row.nodes_run += 1
            if self._held_inputs(key):
                row.with_inputs_held += 1
                row.local_hits += assignment.local
            for producer, _ in assignment.fetch.items():
                row.bytes_received += self.size.get(producer, 0)
                self.holders[producer].add(worker)
        self.holders.setdefault(key, set()).add(worker)
        self.size[key] = size
        self.done.add(key)

    def worker_lost(self, worker: str, committed: Callable[[str], bool]) -> tuple[set[str], set[str]]:
        """``worker`` died with its tiers. Returns (nodes that were running there or waiting for a
        copy from there, nodes to run
        again): those whose only copy was there and that a consumer still needs, or whose declared
        outputs had not been ``committed`` home, and, as Spark recomputes lost partitions from their
        lineage, the producers those need whose data is gone too (every consumer of a producer had
        finished, so its worker evicted it). Nodes whose directory is complete in the home are
        found there by the engine's own cache check when they are asked to run again."""
        self.slots.pop(worker, None)
        self.load.pop(worker, None)
        running = {k for k, a in self._running.items() if a.worker == worker or worker in a.fetch.values()}
        for key in running:
            if self._running[key].worker != worker:
                self.load[self._running[key].worker] -= 1
        for key in running:
            del self._running[key]
        lost = set()
        for key, workers in list(self.holders.items()):
            workers.discard(worker)
            if not workers:
                lost.add(key)
                del self.holders[key]
        finished_before = set(self.done)

        def needed(key: str) -> bool:
            consumers = self.graph.consumers(key)
            return any(c not in finished_before for c in consumers) if consumers else not committed(key)

        def still_held(key: str) -> bool:
            return bool(self.holders.get(key)) and any(c not in finished_before for c in self.graph.consumers(key))

        again: set[str] = set()
        stack = [k for k in lost if k in finished_before and needed(k)] + sorted(running)
        while stack:
            key = stack.pop()
            if key in again:
                continue
            again.add(key)
            self.done.discard(key)
            stack += [p for p in self.graph.producers(key) if p in finished_before and p not in again and not still_held(p)]
        again -= running
        self.recomputed += len(again)
        return running, again

    def worker_joined(self, worker: str, slots: int = 1) -> None:
        self.slots[worker] = slots
        self.rows.setdefault(worker, WorkerRow(worker))
    def failed(self, key: str) -> None:
        assignment = self._running.pop(key, None)
        if assignment is not None:
            self.load[assignment.worker] -= 1

    def evicted_everywhere(self, key: str) -> None:
        """Every consumer of ``key`` finished: no worker keeps its directory any more."""
        self.holders.pop(key, None)

    def worker_of(self, key: str) -> str | None:
        """The worker a running node was sent to."""
        assignment = self._running.get(key)
        return assignment.worker if assignment else None

    def workers_to_tell(self, key: str) -> list[str]:
        """The workers holding an input of ``key``: they may evict it now that ``key`` finished."""
        return sorted({w for p in self.graph.producers(key) for w in self.holders.get(p, ())})

    # ------------------------------------------------------------------ helpers
    def _held_inputs(self, key: str) -> list[str]:
        return [p for p in self.graph.producers(key) if self.holders.get(p)]

    def _queued(self, worker: str) -> int:
        return self.load[worker] - self.slots[worker]

    def _least_loaded(self) -> str:
        return min(self.slots, key=lambda w: (self.load[w] / self.slots[w], w))
