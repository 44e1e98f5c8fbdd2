"""Every use of Pydra's internals by pydra_sea, in one place, pinned to the tested versions.

Pydra 1.0 has no public API for a worker to see the workflow it runs jobs of. What we read:

- ``Job.return_values["exec_graph"]`` and ``["workflow"]`` of a workflow job: set by
  ``Submitter.expand_workflow_async`` before its first node job is handed to the worker;
- the execution graph's ``nodes`` (``NodeExecution``: ``name``, ``_tasks`` once started), its
  ``predecessors[name]`` and ``successors[name]``;
- a workflow's ``outputs``, whose values are ``LazyOutField`` objects naming their node (``_node``);
- ``Job.cache_root`` (public, settable): where the job's directory goes;
- fileformats' ``FsMountIdentifier._mount_table``: a cache of the mount table taken once per
  process, which Pydra uses to decide whether a workflow's outputs can be hard-linked into its
  directory. A tier mounted after that (a tmpfs a job script mounts) would be taken for the
  filesystem it sits on, and the link fail with EXDEV; we drop the cache when a run starts.

``tests/test_pydra_internals.py`` checks each of these against the installed Pydra.
"""

from __future__ import annotations

import typing as ty
from importlib import metadata

import attrs

TESTED_RANGE = ("1.0a12", "1.0a12")


def pydra_version() -> str:
    return metadata.version("pydra")


def pydra_version_supported() -> bool:
    from packaging.version import Version

    low, high = (Version(v) for v in TESTED_RANGE)
    return low <= Version(pydra_version()) <= high


def forget_mount_table() -> None:
    from fileformats.core.fs_mount_identifier import FsMountIdentifier

    FsMountIdentifier._mount_table = None


def exec_graph(workflow_job) -> ty.Any | None:
    return (workflow_job.return_values or {}).get("exec_graph")


def name_of(node) -> str:
    return node.name


def node_holding(graph, job) -> ty.Any | None:
    """The graph's NodeExecution that created ``job`` (the job object itself, not a copy)."""
    for node in graph.nodes:
        if node.name == job.name and node._tasks is not None and any(t is job for t in node._tasks.values()):
            return node
    return None


def jobs_of(node) -> list:
    return list(node._tasks.values()) if node._tasks is not None else []


def predecessors(graph, node) -> list:
    return list(graph.predecessors.get(name_of(node), []))


def successors(graph, node) -> list:
    return list(graph.successors.get(name_of(node), []))


def output_node_names(workflow_job) -> set[str]:
    """Names of the nodes whose outputs are the workflow's outputs (what must reach the home)."""
    from pydra.engine.lazy import LazyOutField

    workflow = (workflow_job.return_values or {}).get("workflow")
    if workflow is None:
        return set()
    values = attrs.asdict(workflow.outputs, recurse=False) if attrs.has(type(workflow.outputs)) else {}
    return {v._node.name for v in values.values() if isinstance(v, LazyOutField)}
