"""``sea plan`` for Nipype: the workflow's execution graph, without running it."""

from __future__ import annotations

from pathlib import Path

from sea.config import SeaConfig
from sea.plan import PlanInput

from . import _nipype_internals as nx_
from .graph import node_specs


def describe(obj, config: SeaConfig) -> PlanInput | None:
    """A :class:`PlanInput` for a Nipype ``Workflow``; ``None`` for anything else."""
    from nipype.pipeline.engine import Workflow

    if not isinstance(obj, Workflow):
        return None
    if not obj.base_dir:
        return PlanInput(home=None, specs=[], input_bytes=0)
    home = Path(obj.base_dir).resolve()
    graph = nx_.expanded_graph(obj)
    input_bytes = sum(nx_.unconnected_file_bytes(node) for node in graph.nodes() if graph.in_degree(node) == 0)
    poll = float(obj.config["execution"].get("poll_sleep_duration", 2))
    return PlanInput(home=home, specs=node_specs(graph, home, config.sinks), input_bytes=input_bytes, poll_seconds=poll)
