"""Nipype's execution graph, translated into the core's :class:`~sea.graph.NodeSpec` list."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from sea import NodeSpec, SeaConfigError

from . import _nipype_internals as nx_

logger = logging.getLogger("sea")


def node_specs(graph, home: Path, sinks: tuple[str, ...]) -> list[NodeSpec]:
    """One spec per execution node directory; keys are node directories relative to ``home``."""

    def key(directory: Path) -> str:
        try:
            return str(Path(directory).relative_to(home))
        except ValueError:  # Nipype resolves links: base_dir/wf linked to a directory elsewhere
            raise SeaConfigError(
                f"the node directory {directory} is outside base_dir {home} (a link in base_dir leads elsewhere?): Sea "
                "keeps the node directories under base_dir, where its records are; set base_dir to where the link leads"
            ) from None

    specs: dict[str, NodeSpec] = {}
    firsts, collided = {}, set()  # key -> the first node of that directory; directories of nodes that differ
    for node in graph.nodes():
        interface = nx_.interface_name(node)
        sink = nx_.sink_base_directory(node) if interface in sinks else None
        spec = NodeSpec(
            key=key(nx_.logical_dir(node)),
            kind=f"{interface}:{node.name}",
            signature=nx_.own_inputs(node) + nx_.grabbed_now(node),
            upstream=tuple((key(d), label) for d, label in nx_.producers(node, graph)),
            sink_destination=sink,
            persist_dir=interface in sinks and sink is None,
            reuses_dir=nx_.is_mapnode(node),
            memory=nx_.declared_memory(node),
            keep_dir=nx_.keeps_directory(node),
        )
        twin = specs.get(spec.key)
        if twin is not None:  # two nodes, one directory (iterables repeating a value, parameterize_dirs=False):
            # one node for the core, reading what either reads; the plugin runs the second after the first
            if spec.key not in collided and nx_.inputs_set(node) != nx_.inputs_set(firsts[spec.key]):
                collided.add(spec.key)
                logger.warning(
                    "[Sea] nodes with different inputs share the directory %s (iterables values Nipype names alike, such as '' "
                    "and ' '): MultiProc runs each there, and the last one's results stay; Sea runs the first and takes the "
                    "others as done. Give the values names that differ in letters or digits", spec.key,
                )  # fmt: skip
            spec = replace(twin, upstream=tuple(dict.fromkeys(twin.upstream + spec.upstream)))
        else:
            firsts[spec.key] = node
        specs[spec.key] = spec
    return list(specs.values())
