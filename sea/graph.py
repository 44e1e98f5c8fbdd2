"""The workflow graph as the core sees it: node keys, edges, and what each node declares.

Adapters translate their engine's graph into :class:`NodeSpec` objects; the core never sees an
engine object. A node's ``key`` is its working directory relative to the home, which is also the
path its consumers use to reach it, so it is stable across runs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import networkx as nx


@dataclass(frozen=True)
class NodeSpec:
    """One node of the workflow, engine-neutral.

    ``signature`` hashes what the node computes from its own (unconnected) inputs and code; the
    core chains it with the upstream signatures to recognise finished work on a rerun even when
    intermediate data was evicted. ``sink_destination`` is set on sinks: the directory (on the
    shared filesystem) that receives their declared outputs.
    """

    key: str
    kind: str = "node"
    signature: str = ""
    upstream: tuple[tuple[str, str], ...] = ()  # (producer key, edge label)
    sink_destination: Path | None = None
    persist_dir: bool = False  # flush the whole directory home (a sink that writes into its own dir)


@dataclass
class WorkflowGraph:
    """Nodes and their producer -> consumer edges, with derived chain hashes and depths."""

    nodes: dict[str, NodeSpec] = field(default_factory=dict)
    dag: nx.DiGraph = field(default_factory=nx.DiGraph)

    @classmethod
    def from_specs(cls, specs: Iterable[NodeSpec]) -> WorkflowGraph:
        graph = cls()
        for spec in specs:
            if spec.key in graph.nodes:
                raise ValueError(f"two nodes share the directory {spec.key!r}")
            graph.nodes[spec.key] = spec
            graph.dag.add_node(spec.key)
        for spec in graph.nodes.values():
            for producer, _label in spec.upstream:
                if producer in graph.nodes:
                    graph.dag.add_edge(producer, spec.key)
        if not nx.is_directed_acyclic_graph(graph.dag):
            raise ValueError("the workflow graph has a cycle")
        graph._order = {k: i for i, k in enumerate(nx.topological_sort(graph.dag))}
        graph._depth = {}
        graph._chain = {}
        for key in sorted(graph._order, key=graph._order.get):
            preds = list(graph.dag.predecessors(key))
            graph._depth[key] = 1 + max((graph._depth[p] for p in preds), default=-1)
            spec = graph.nodes[key]
            parts = [spec.kind, spec.signature]
            parts += sorted(f"{label}<-{graph._chain.get(p, p)}" for p, label in spec.upstream)
            graph._chain[key] = hashlib.sha256("\n".join(parts).encode()).hexdigest()
        return graph

    def __len__(self) -> int:
        return len(self.nodes)

    def __contains__(self, key: str) -> bool:
        return key in self.nodes

    def consumers(self, key: str) -> list[str]:
        return list(self.dag.successors(key))

    def producers(self, key: str) -> list[str]:
        return list(self.dag.predecessors(key))

    def topological(self) -> list[str]:
        return sorted(self._order, key=self._order.get)

    def index(self, key: str) -> int:
        return self._order[key]

    def depth(self, key: str) -> int:
        """Longest path from a source: deeper ready nodes continue a chain (depth-first)."""
        return self._depth[key]

    def chain(self, key: str) -> str:
        """Hash of the node's signature and, recursively, of everything upstream of it."""
        return self._chain[key]

    def owner(self, relpath: str) -> str | None:
        """The node whose directory contains ``relpath`` (e.g. a MapNode's sub-node directory)."""
        path = relpath
        while path and path != ".":
            if path in self.nodes:
                return path
            path = str(Path(path).parent)
        return None
