"""The workflow graph as the core sees it: node keys, edges, and what each node declares.

Adapters translate their engine's graph into :class:`NodeSpec` objects; the core never sees an
engine object. A node's ``key`` is its working directory relative to the home, which is also the
path its consumers use to reach it, so it is stable across runs.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable
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
    keep_dir: bool = False  # the engine is told to keep its directory (Nipype's remove_unnecessary_outputs: false): home whole, as with checkpoints: all
    reuses_dir: bool = False  # a rerun reuses parts of its directory (a MapNode's sub-nodes): it reruns in it
    label: str = ""  # what a person calls it (a Pydra task and node name), if not its key
    memory: int = 0  # bytes of memory it declares it uses (Nipype's mem_gb); 0: not declared


@dataclass
class WorkflowGraph:
    """Nodes and their producer -> consumer edges, with derived chain hashes and depths."""

    nodes: dict[str, NodeSpec] = field(default_factory=dict)
    dag: nx.DiGraph = field(default_factory=nx.DiGraph)
    _order: dict[str, int] = field(default_factory=dict, init=False, repr=False)
    _depth: dict[str, int] = field(default_factory=dict, init=False, repr=False)
    _chain: dict[str, str] = field(default_factory=dict, init=False, repr=False)

    @classmethod
    def from_specs(cls, specs: Iterable[NodeSpec]) -> WorkflowGraph:
        return cls().add(specs)

    def add(self, specs: Iterable[NodeSpec]) -> WorkflowGraph:
        """Add nodes whose producers are already in the graph or among ``specs`` (an engine such as
        Pydra creates its jobs as their inputs become known). Nodes already in the graph keep their
        order, depth and chain hash: an edge is only ever added towards a new node."""
        new = {}
        for spec in specs:
            if spec.key in self.nodes or spec.key in new:
                raise ValueError(f"two nodes share the directory {spec.key!r}")
            new[spec.key] = spec
        sub = nx.DiGraph()
        sub.add_nodes_from(new)
        for spec in new.values():
            for producer, _label in spec.upstream:
                if producer in new:
                    sub.add_edge(producer, spec.key)
        if not nx.is_directed_acyclic_graph(sub):
            raise ValueError("the workflow graph has a cycle")
        for key in nx.topological_sort(sub):
            spec = new[key]
            self.nodes[key] = spec
            self.dag.add_node(key)
            for producer, _label in spec.upstream:
                if producer in self.nodes:
                    self.dag.add_edge(producer, key)
            preds = list(self.dag.predecessors(key))
            self._order[key] = len(self._order)
            self._depth[key] = 1 + max((self._depth[p] for p in preds), default=-1)
            parts = [spec.kind, spec.signature]
            parts += sorted(f"{label}<-{self._chain.get(p, p)}" for p, label in spec.upstream)
            self._chain[key] = hashlib.sha256("\n".join(parts).encode()).hexdigest()
        return self

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


def paths_named(value, skip: Callable[[object], bool] = lambda _item: False) -> list[str]:
    """The absolute paths ``value`` names as text (a string or path-like, at any depth of lists,
    tuples, sets and dicts' values), but for the items ``skip`` takes: what an adapter reports as a
    node's references, that keep the directories they are in.

    >>> paths_named({"out": ["/w/a/x.nii", "rel.txt", 3], "log": "/w/a/\\nnot a path"})
    ['/w/a/x.nii']
    """
    found: list[str] = []

    def walk(item) -> None:
        if skip(item):
            return
        if isinstance(item, (str, os.PathLike)):
            text = os.fspath(item)
            text = text.strip() if isinstance(text, str) else ""
            if os.path.isabs(text) and "\n" not in text:
                found.append(text)
        elif isinstance(item, (list, tuple, set, frozenset)):
            for each in item:
                walk(each)
        elif isinstance(item, dict):
            for each in item.values():
                walk(each)

    walk(value)
    return found
