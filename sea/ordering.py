"""The order in which ready nodes start: locality first, then depth-first.

A ready node whose inputs sit on the fastest tier runs first (its inputs are hot, and its producers
can be evicted sooner); among equals the deepest node runs first, so one subject's chain finishes
before the next subject's starts and intermediates die young (the Spark-vs-Nipype result).

:func:`rank` is that order as a sort key; :class:`ReadyQueue` keeps ready nodes in it as they come
(a heap: a node's rank is computed once, when it becomes ready, not every scheduling round).
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Generic, TypeVar

from .graph import WorkflowGraph

Item = TypeVar("Item", bound=Hashable)
UNKNOWN = (float("inf"),)  # the rank of a node the graph does not know (a MapNode's sub-node): last, in turn
HELD_PER_ROUND = 16  # ready jobs an adapter holds back (SeaEngine.may_start) before it stops looking further down the queue


def rank(key: str, graph: WorkflowGraph, input_rank: Callable[[str], int]) -> tuple:
    """The sort key of a ready node: (rank of the tier holding its inputs, -depth, topological
    index). ``input_rank(key)`` is 0 when every input is on the fastest tier and grows with slower
    tiers."""
    if key not in graph:
        return UNKNOWN
    return (input_rank(key), -graph.depth(key), graph.index(key))


def input_tier_rank(run, key: str) -> int:
    """The ``input_rank`` of a node of ``run`` (a :class:`sea.run_state.Run`): the index of the
    fastest tier holding one of its producers' directories; past the last tier when none does."""
    tiers = run.hierarchy.all
    ranks = []
    for producer in run.graph.producers(key):
        node = run.nodes[producer]
        ranks.append(tiers.index(node.placement.tier) if node.placement and not node.evicted else len(tiers))
    return min(ranks, default=len(tiers))


def order_ready(keys: Sequence[str], graph: WorkflowGraph, input_rank: Callable[[str], int]) -> list[str]:
    """``keys`` best first (see :func:`rank`); keys the graph does not know last, in their order.

    >>> from sea.graph import NodeSpec, WorkflowGraph
    >>> g = WorkflowGraph.from_specs([NodeSpec("a1"), NodeSpec("a2", upstream=(("a1", "x"),)), NodeSpec("b1")])
    >>> order_ready(["b1", "a2"], g, lambda key: 0)
    ['a2', 'b1']
    """
    return sorted(keys, key=lambda k: rank(k, graph, input_rank))


class ReadyQueue(Generic[Item]):
    """Ready items (an engine's jobs) best first by ``rank_of(key)``, where ``key`` names the node
    an item runs (two items may run one node). A rank is computed when an item is pushed, and again
    only when the core says that key's rank changed (:meth:`rerank`); items of equal rank come out
    in the order they went in. Safe to use from several threads.

    >>> ranks = {"a": (1,), "b": (0,)}
    >>> queue = ReadyQueue(ranks.__getitem__)
    >>> queue.push(10, "a"); queue.push(11, "b")
    >>> ranks["a"] = (-1,); queue.rerank(["a"])
    >>> [queue.pop(), queue.pop(), len(queue)]
    [10, 11, 0]
    """

    def __init__(self, rank_of: Callable[[str], tuple]):
        self._rank_of = rank_of
        self._heap: list[list] = []  # [rank, turn, item, key, live]
        self._entries: dict[Item, list] = {}
        self._by_key: dict[str, set[Item]] = {}
        self._turn = itertools.count()
        self._lock = threading.Lock()

    def push(self, item: Item, key: str) -> None:
        rank_ = self._rank_of(key)  # outside the queue's lock: a rank may take the engine's
        with self._lock:
            if item not in self._entries:
                self._add(item, key, rank_)

    def _add(self, item: Item, key: str, rank_: tuple) -> None:
        entry = [rank_, next(self._turn), item, key, True]
        self._entries[item] = entry
        self._by_key.setdefault(key, set()).add(item)
        heapq.heappush(self._heap, entry)

    def pop(self) -> Item:
        """The best item, removed. Raises IndexError when empty."""
        with self._lock:
            while self._heap:
                entry = heapq.heappop(self._heap)
                if entry[4]:
                    self._forget(entry)
                    return entry[2]
            raise IndexError("pop from an empty ReadyQueue")

    def _forget(self, entry: list) -> None:
        del self._entries[entry[2]]
        items = self._by_key[entry[3]]
        items.discard(entry[2])
        if not items:
            del self._by_key[entry[3]]

    def discard(self, item: Item) -> None:
        with self._lock:
            entry = self._entries.get(item)
            if entry is not None:
                entry[4] = False  # left in the heap, skipped when it comes up
                self._forget(entry)

    def rerank(self, keys: Iterable[str]) -> None:
        """The ranks of these keys changed (the tier holding their inputs did): those in the queue
        take their new place. Keys not in the queue cost a lookup."""
        with self._lock:
            queued = [key for key in keys if key in self._by_key]
        ranks = {key: self._rank_of(key) for key in queued}  # outside the queue's lock, as in push
        with self._lock:
            for key, rank_ in ranks.items():
                for item in list(self._by_key.get(key, ())):
                    entry = self._entries[item]
                    entry[4] = False
                    self._forget(entry)
                    self._add(item, key, rank_)

    def keys(self) -> list[str]:
        """The keys of the items in the queue."""
        with self._lock:
            return list(self._by_key)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, item: object) -> bool:
        return item in self._entries
