"""Nipype's execution graph, translated into the core's :class:`~sea.graph.NodeSpec` list."""

from __future__ import annotations

from pathlib import Path

from sea import NodeSpec

from . import _nipype_internals as nx_


def node_specs(graph, home: Path, sinks: tuple[str, ...]) -> list[NodeSpec]:
    """One spec per execution node; keys are node directories relative to ``home``."""

    def key(directory: Path) -> str:
        return str(Path(directory).relative_to(home))

    specs = []
    for node in graph.nodes():
        interface = nx_.interface_name(node)
        sink = nx_.sink_base_directory(node) if interface in sinks else None
        specs.append(
            NodeSpec(
                key=key(nx_.logical_dir(node)),
                kind=f"{interface}:{node.name}",
                signature=nx_.own_inputs(node),
                upstream=tuple((key(d), label) for d, label in nx_.producers(node, graph)),
                sink_destination=sink,
                persist_dir=interface in sinks and sink is None,
                reuses_dir=nx_.is_mapnode(node),
            )
        )
    return specs
