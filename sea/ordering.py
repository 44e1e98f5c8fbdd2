"""The order in which ready nodes start: locality first, then depth-first.

A ready node whose inputs sit on the fastest tier runs first (its inputs are hot, and its producers
can be evicted sooner); among equals the deepest node runs first, so one subject's chain finishes
before the next subject's starts and intermediates die young (the Spark-vs-Nipype result).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .graph import WorkflowGraph


def order_ready(keys: Sequence[str], graph: WorkflowGraph, input_rank: Callable[[str], int]) -> list[str]:
    """``keys`` sorted by (rank of the tier holding the node's inputs, -depth, topological index).

    ``input_rank(key)`` is 0 when every input is on the fastest tier and grows with slower tiers.

    >>> from sea.graph import NodeSpec, WorkflowGraph
    >>> g = WorkflowGraph.from_specs([NodeSpec("a1"), NodeSpec("a2", upstream=(("a1", "x"),)), NodeSpec("b1")])
    >>> order_ready(["b1", "a2"], g, lambda key: 0)
    ['a2', 'b1']
    """
    known = [k for k in keys if k in graph]
    unknown = [k for k in keys if k not in graph]
    known.sort(key=lambda k: (input_rank(k), -graph.depth(k), graph.index(k)))
    return known + unknown
