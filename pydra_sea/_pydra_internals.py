"""Every use of Pydra's internals by pydra_sea, in one place, pinned to the tested versions.

Pydra 1.0 has no public API for a worker to see the workflow it runs jobs of. What we read:

- ``Job.return_values["exec_graph"]`` and ``["workflow"]`` of a workflow job: set by
  ``Submitter.expand_workflow_async`` before its first node job is handed to the worker;
- the execution graph's ``nodes`` (``NodeExecution``: ``name``, ``_tasks`` once started), its
  ``predecessors[name]`` and ``successors[name]``;
- a workflow's ``outputs``, whose values are ``LazyOutField`` objects naming their node (``_node``);
- ``Job.cache_root`` (public, settable): where the job's directory goes, and ``Job.all_caches``
  (settable: the read-only roots searched after it) where its result is looked for; results are
  read with ``pydra.engine.result.load_result`` (the first root holding the job's directory wins);
- the files a running job keeps in its ``cache_root`` (``<checksum>.lock``, ``<uid>_info.json``,
  ``<checksum>_save.lock``; ``Job.uid``), removed after a job that failed while saving;
- a workflow's ``_result.pklz`` saved by a run that a KeyboardInterrupt stopped (no outputs, not
  errored: Pydra would take it as done), removed;
- a job's ``_result.pklz`` (a pickled ``Result`` whose ``outputs`` hold fileformats ``FileSet``
  objects with absolute ``fspaths``, and ``cache_dir``): rewritten for a directory moved home;
- fileformats' ``FsMountIdentifier._mount_table``: a cache of the mount table taken once per
  process, which Pydra uses to decide whether a workflow's outputs can be hard-linked into its
  directory. A tier mounted after that (a tmpfs a job script mounts) would be taken for the
  filesystem it sits on, and the link fail with EXDEV; we drop the cache when a run starts;
- ``Job.submitter``: a workflow job expands through the submitter it records; a nested workflow
  job sent to a Dask worker is given that worker's own submitter (``Submitter.run_start_time``
  set as ``Submitter.__call__`` sets it).

``tests/test_pydra_internals.py`` checks each of these against the installed Pydra.
"""

from __future__ import annotations

import typing as ty
from importlib import metadata
from pathlib import Path

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


def job_dir_names_like() -> tuple[str, ...]:
    """What job directories in a cache root are called (``Job.checksum``: ``<kind>-<32 hex digits>``)."""
    return tuple(f"{kind}-{'0' * 32}" for kind in ("python", "shell", "workflow"))


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


def cached_result(job, root: Path) -> ty.Any | None:
    """The job's result if ``root`` holds it, complete and not errored (Pydra's own cache check)."""
    from pydra.engine.result import load_result

    result = load_result(job.checksum, [Path(root)])
    return result if result is not None and not result.errored else None


def run_under(job, root: Path) -> None:
    """The job's directory (and its lock and info files) go under ``root``."""
    job.cache_root = Path(root)


def remove_side_files(job, root: Path) -> None:
    """The files a job keeps next to its directory while it runs (its lock, ``<uid>_info.json``),
    left behind when it failed while saving its result (out of space)."""
    for name in (f"{job.checksum}.lock", f"{job.uid}_info.json", f"{job.checksum}_save.lock"):
        Path(root, name).unlink(missing_ok=True)


def remove_stray_side_files(root: Path) -> None:
    """Every job side file (``<uid>_info.json``, ``<checksum>.lock``, ``<checksum>_save.lock``)
    directly in ``root``, a directory only Sea's job directories live in, once no job runs there."""
    for pattern in ("*_info.json", "*.lock"):
        for path in Path(root).glob(pattern):
            path.unlink(missing_ok=True)


def discard_unfinished_result(job) -> bool:
    """Pydra saves a job's result in a ``finally``; a run stopped by Ctrl-C or SIGTERM (a
    ``KeyboardInterrupt``, not an ``Exception``) leaves a workflow result with no outputs that is not
    marked errored, which the next run would return as done. Removes such a result."""
    import cloudpickle as cp

    path = Path(job.cache_dir) / "_result.pklz"
    try:
        with open(path, "rb") as f:
            result = cp.load(f)
    except Exception:  # absent, or cut short: Pydra's own check rejects it
        return False
    if result.outputs is None and not result.errored:
        path.unlink()
        return True
    return False


def discard_result(job) -> None:
    """Remove a finished workflow's result: Pydra's ``Submitter.__call__`` logs an exception from
    the worker and returns the saved result as a success when there is one, and a rerun would
    return it as done. Without it, the error reaches the caller and a rerun does the work again."""
    (Path(job.cache_dir) / "_result.pklz").unlink(missing_ok=True)


def look_home_first(job, home: Path, elsewhere: Path) -> None:
    """The finished job's result is read from ``home`` once its directory is there, from
    ``elsewhere`` until then (load_result takes the first root that has the directory, and Sea
    moves a directory home by one rename of a complete copy)."""
    readonly = [r for r in job.all_caches[1:] if r not in (Path(home), Path(elsewhere))]
    job.cache_root = Path(home)
    job.all_caches = [Path(elsewhere), *readonly]


def relocate_result(copy: Path, old: Path, new: Path) -> None:
    """Rewrite the paths in ``copy/_result.pklz`` (a job directory copied from ``old``) to ``new``,
    the path the copy will have: written under a temporary name, fsync'ed, renamed."""
    import copy as copy_module
    import os

    import cloudpickle as cp
    from fileformats.core import FileSet
    from fileformats.core.fileset import FileSetMetadata
    from pydra.utils.typing import TypeParser

    result_file = Path(copy) / "_result.pklz"
    if not result_file.exists():
        return
    with open(result_file, "rb") as f:
        result = cp.load(f)
    prefixes = [(str(p), str(new)) for p in dict.fromkeys([Path(old), Path(old).resolve()])]

    def move(path: Path) -> Path:
        text = str(path)
        for before, after in prefixes:
            if text == before or text.startswith(before + os.sep):
                return Path(after + text[len(before) :])
        return path

    def relocate(fileset: FileSet) -> FileSet:
        moved = copy_module.copy(fileset)  # not FileSet(...): that checks the files, not there yet
        moved.fspaths = frozenset(move(p) for p in fileset.fspaths)
        moved._metadata = FileSetMetadata(moved, overlay=fileset._explicit_metadata)
        return moved

    if result.outputs is not None:
        for field in attrs.fields(type(result.outputs)):
            setattr(result.outputs, field.name, TypeParser.apply_to_instances(FileSet, relocate, getattr(result.outputs, field.name)))
    result.cache_dir = move(Path(result.cache_dir))
    tmp = result_file.with_name(f".{result_file.name}.relocating")
    with open(tmp, "wb") as f:
        cp.dump(result, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, result_file)


def submit_through(job, submitter) -> None:
    """Have ``submitter`` expand ``job`` (a workflow job made by another process's submitter and
    sent here pickled): a workflow job expands through the submitter it records (``job.submitter``)."""
    import datetime

    job.submitter = submitter
    submitter.run_start_time = datetime.datetime.now()  # as Submitter.__call__ sets it
