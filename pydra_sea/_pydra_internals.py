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
- the lock files of Pydra's ``SoftFileLock`` (jobs' in ``cache_root``, file hashes' in
  ``PersistentCache.location_default()``): a killed process can leave one empty, or naming a host
  other than this one (a container's), blocking every later run; those a killed run made are removed;
- a workflow's ``_result.pklz`` saved by a run that a KeyboardInterrupt stopped (no outputs, not
  errored: Pydra would take it as done), removed;
- a job's ``_result.pklz`` (a pickled ``Result`` whose ``outputs`` hold fileformats ``FileSet``
  objects with absolute ``fspaths``, and ``cache_dir``): rewritten for a directory moved home;
- fileformats' ``FsMountIdentifier._mount_table``: a cache of the mount table taken once per
  process, which Pydra uses to decide whether a workflow's outputs can be hard-linked into its
  directory. A tier mounted after that (a tmpfs a job script mounts) would be taken for the
  filesystem it sits on, and the link fail with EXDEV; we drop the cache when a run starts;
- prefetch: a job's task fields whose type holds a fileformats ``FileSet`` (set to the copies and
  back; ``Job._inputs``, the inputs the job resolved and cached, is reset with them); that
  ``Job.checksum`` hashes a file by its bytes and extensions, not its directory, and is cached;
- file hashes: ``pydra.utils.hash.hash_object`` keeps a file set's hash in the ``PersistentCache``
  under its class, paths and mtimes, and a job's checksum looks it up there; a task field's
  converter keeps a file set of the field's class as it is (``TypeParser.coerce``); a node's
  consumers are its successors' ``node._task`` fields holding ``LazyOutField`` objects naming it
  (``_node``, ``_field``);
- ``NodeExecution.update_status`` (``queued``: state index -> job; ``running``: state index ->
  (job, start time)): Pydra's loop calls it for every node after each job ends, and it asks every
  queued and running job whether it is done, a look on disk each; jobs the worker still runs are
  left out of that look; ``NodeExecution.get_runnable_tasks`` queues the jobs it makes runnable
  (``blocked`` -> ``queued``) and returns the whole queue, which ``Submitter.expand_workflow``
  submits unless submitted (by checksum), and walks every index of the node's state each call,
  after every job is made too (``blocked`` empty, not ``None``): while a run lives, it returns those
  it made runnable in that call, and is not called once ``blocked`` is empty (:func:`look_only_at_free_jobs`);
- ``pydra.engine.state.map_splits`` (a module global ``State.prepare_states_val`` calls): replaced,
  while a run lives, by one that flattens each split input once (:func:`split_in_linear_time`);
- ``Submitter.fetch_finished(futures) -> (pending, done)``, each turn's wait for a job's end; the loop
  keeps the ``pending`` set and adds each new future to it (``set.add``): replaced, while a run
  lives, by one that pays each future's callback once, and returns the set it was given less the
  futures that ended (:func:`fetch_finished_by_event`);
- ``Job.submitter``: a workflow job expands through the submitter it records; a nested workflow
  job sent to a Dask worker is given that worker's own submitter (``Submitter.run_start_time``
  set as ``Submitter.__call__`` sets it).

``tests/test_pydra_internals.py`` checks each of these against the installed Pydra.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import re
import socket
import time
import typing as ty
from importlib import metadata
from pathlib import Path

import attrs

from sea.graph import paths_named

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


def default_cache_root() -> Path:
    """Where a Submitter given no ``cache_root`` keeps its jobs: Pydra's per-user cache
    (``~/.cache/pydra/<version>/run-cache``; ``Submitter.__init__``)."""
    from pydra.utils.general import default_run_cache_root

    return Path(default_run_cache_root)


def job_dir_names_like() -> tuple[str, ...]:
    """What job directories in a cache root are called (``Job.checksum``: ``<kind>-<32 hex digits>``)."""
    return tuple(f"{kind}-{'0' * 32}" for kind in ("python", "shell", "workflow"))


def exec_graph(workflow_job) -> ty.Any | None:
    return (workflow_job.return_values or {}).get("exec_graph")


def name_of(node) -> str:
    return node.name


def jobs_named(graph, name: str) -> list[tuple[ty.Any, ty.Any]]:
    """(job, node) for every job the graph's node ``name`` made so far (none before it starts)."""
    return [(job, node) for node in graph.nodes if node.name == name and node._tasks is not None for job in node._tasks.values()]


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


def consumed_outputs(graph, node) -> dict[str, tuple]:
    """The output fields of ``node`` its successor nodes take as inputs, each with the types of
    the fields that take it: what Pydra hashes, in its event loop, to make the successors' jobs."""
    from pydra.engine.lazy import LazyOutField

    consumed: dict[str, tuple] = {}
    name = name_of(node)
    for successor in successors(graph, node):
        task = successor.node._task
        for field in attrs.fields(type(task)):
            value = getattr(task, field.name, None)
            if isinstance(value, LazyOutField) and value._node.name == name:
                consumed[value._field] = (*consumed.get(value._field, ()), field.type)
    try:  # they go to the job's process with it (a class made in a function does not)
        pickle.dumps(consumed)
    except Exception:
        return {}
    return consumed


def hash_outputs(result, consumed: dict[str, tuple]) -> int:
    """In the job's process, once it ran: hash each file set of its ``consumed`` outputs that its
    consumers take as it is, into Pydra's persistent hash cache, where the consumers' checksums will
    find it (keyed by class, paths and mtimes, as Pydra keys it) instead of reading the files again
    one after another in Pydra's event loop while the processes wait. A file set a consumer converts
    to another class is left to Pydra. The number of file sets hashed."""
    from fileformats.core import FileSet
    from pydra.utils.hash import hash_object
    from pydra.utils.typing import TypeParser

    outputs = getattr(result, "outputs", None)
    if outputs is None or getattr(result, "errored", False) or not attrs.has(type(outputs)):
        return 0
    found: list[FileSet] = []
    for name, types in consumed.items():
        value = getattr(outputs, name, None)
        TypeParser.apply_to_instances(FileSet, lambda fs, types=types: (found.append(fs) if all(_taken_as_is(fs, t) for t in types) else None) or fs, value)
    for fileset in found:
        hash_object(fileset)
    return len(found)


def _taken_as_is(fileset, field_type) -> bool:
    """A field of ``field_type`` keeps ``fileset`` as it is (no conversion to another class)."""
    from fileformats.core import FileSet

    if field_type is ty.Any:
        return True
    classes, seen = [], [field_type]
    while seen:
        t = seen.pop()
        if isinstance(t, type) and issubclass(t, FileSet):
            classes.append(t)
        seen.extend(ty.get_args(t))
    return any(isinstance(fileset, c) for c in classes)


def readonly_caches(job) -> list[Path]:
    """The Submitter's ``readonly_caches``: other runs' caches, searched after ``cache_root``."""
    return [Path(p) for p in job.all_caches[1:]]


def cached_result(job, root: Path) -> ty.Any | None:
    """The job's result if ``root`` or a read-only cache holds it, complete and not errored (Pydra's
    own cache check, ``Job.done``, searches the same places in the same order)."""
    from pydra.engine.result import load_result

    result = load_result(job.checksum, [Path(root), *readonly_caches(job)])
    return result if result is not None and not result.errored else None


def run_under(job, root: Path) -> None:
    """The job's directory (and its lock and info files) go under ``root``."""
    job.cache_root = Path(root)


def remove_side_files(job, root: Path) -> None:
    """The files a job keeps next to its directory while it runs (its lock, ``<uid>_info.json``),
    left behind when it failed while saving its result (out of space)."""
    for name in (f"{job.checksum}.lock", f"{job.uid}_info.json", f"{job.checksum}_save.lock"):
        Path(root, name).unlink(missing_ok=True)


# the side files Pydra makes beside job directories, by name: a job's ``<uid>_info.json`` (``uuid4().hex``),
# its directory's lock ``<checksum>.lock`` (``<kind>-<32 hex digits>``) and its result's ``<checksum>_save.lock``;
# in the hash cache, ``<blake2b hex digest>.lock``. A task may write files of its own beside its
# directory (``../run.lock``, ``../subject_info.json``): never taken for Pydra's
JOB_SIDE_FILE = re.compile(r"[0-9a-f]{32}_info\.json|[A-Za-z_]+-[0-9a-f]{32}(_save)?\.lock")
HASH_LOCK = re.compile(r"[0-9a-f]{128}\.lock")


def remove_stray_side_files(root: Path) -> None:
    """Pydra's job side files (:data:`JOB_SIDE_FILE`) directly in ``root``, a tier's cache root,
    once no job runs there; a job's own files beside its directory stay (strays, taken home)."""
    for entry in os.scandir(root):
        if JOB_SIDE_FILE.fullmatch(entry.name) and not entry.is_dir(follow_symlinks=False):
            Path(entry.path).unlink(missing_ok=True)


# filelock writes its holder's PID in a SoftFileLock from 3.22 (sea-workflows requires it); before, a
# held lock is an empty file, as a killed holder's is
FILELOCK_NAMES_HOLDER = (3, 22)


def filelock_version() -> tuple[int, ...]:
    from importlib.metadata import version

    return tuple(int(part) for part in re.findall(r"\d+", version("filelock"))[:2])


def lock_holder(path: str) -> tuple[int, str] | None:
    """The (PID, host name) a filelock ``SoftFileLock`` names in the lock file at ``path``: its
    holder's ``PID\nhost\n[start]\n`` (3.22 on), or a ``filelock/2`` record's ``pid=``/``host=``
    lines; ``None`` if it names none (empty, partial, not one of those)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            text = os.read(fd, 1025).decode("utf-8")
        finally:
            os.close(fd)
    except (OSError, UnicodeDecodeError):
        return None
    lines = text.splitlines()
    if not text.endswith("\n") or not lines or len(text) > 1024:
        return None  # a partial write names nobody yet
    if lines[0] == "filelock/2":
        fields = dict(line.partition("=")[::2] for line in lines[1:])
        pid, host = fields.get("pid", ""), fields.get("host", "")
    elif len(lines) in (2, 3):
        pid, host = lines[0], lines[1]
    else:
        return None
    return (int(pid), host) if pid.isascii() and pid.isdigit() and host else None


def remove_killed_runs_locks(home: Path, killed: dict, log: logging.Logger) -> list[Path]:
    """Pydra guards each job's directory with a filelock ``SoftFileLock`` (``<cache_root>/<checksum>.lock``)
    and each file hash it caches too (``PersistentCache``: ``<location>/<key>.lock``). Two kinds
    such a lock of a killed run (``killed``: the record of Sea's run lock it left, its ``host``,
    ``pid`` and ``started``) are never broken by filelock, and every later run that hashes that file
    or runs that job waits for them forever, under ``cf`` as under Sea:

    - an empty one: the process was killed between creating it and writing its PID in it;
    - one naming another host (a container's own host name, Docker's and Podman's default):
      filelock cannot tell whether its holder lives.

    Removes those made while the killed run lived (from its start until now, this run's start),
    saying so; returns them. One naming another host goes only where the killed run is known to
    have made it: in this ``cache_root`` (one Sea run at a time: its run lock) if it names the
    killed run's host, in the hash cache (the user's every run shares it) if it names the killed
    run's process too. A filelock before 3.22 (:data:`FILELOCK_NAMES_HOLDER`) leaves the lock a
    live process holds empty too (a ``cf`` run beside this one, in the same hash cache): then none
    is removed, and one line says so."""
    from pydra.utils.hash import PersistentCache

    if filelock_version() < FILELOCK_NAMES_HOLDER:
        log.warning(
            "[Sea] the run that was killed may have left empty lock files that Pydra waits for forever; filelock %s leaves a live "
            "process's lock empty too, so Sea removes none: if this run waits, remove the empty *.lock files in %s and %s "
            "(or install filelock >= 3.22)",
            ".".join(map(str, filelock_version())), home, PersistentCache.location_default(),
        )  # fmt: skip
        return []
    since, before = killed.get("started"), time.time()
    if not isinstance(since, (int, float)):
        return []
    from sea.private import pid_namespace

    # filelock names a holder's host and, outside the first PID namespace, that namespace
    # (``host?pidns-<inode in hex>``): one this process shares it judges by the PID itself
    mine = (killed.get("host"), killed.get("pidns")) == (socket.gethostname(), pid_namespace())
    namespace = re.fullmatch(r"pid:\[(\d+)\]", str(killed.get("pidns")))
    names = set() if mine else {str(killed.get("host"))} | ({f"{killed.get('host')}?pidns-{int(namespace[1]):x}"} if namespace else set())
    removed: list[Path] = []
    for root, named, theirs in ((Path(home), JOB_SIDE_FILE, lambda pid: True), (Path(PersistentCache.location_default()), HASH_LOCK, lambda pid: pid == killed.get("pid"))):
        try:
            entries = list(os.scandir(root))
        except OSError:
            continue
        for entry in entries:
            if not entry.name.endswith(".lock") or not named.fullmatch(entry.name):
                continue  # a job's own marker beside its directory (``touch ../stage1.lock``) is not Pydra's
            try:
                st = entry.stat(follow_symlinks=False)
                if not entry.is_file(follow_symlinks=False) or not since <= st.st_mtime <= before:
                    continue
                if st.st_size:
                    holder = lock_holder(entry.path)
                    if holder is None or holder[1] not in names or not theirs(holder[0]):
                        continue
                os.unlink(entry.path)
                removed.append(Path(entry.path))
            except OSError:
                continue  # taken or removed meanwhile
    if removed:
        places = ", ".join(sorted({str(path.parent) for path in removed}))
        log.warning("[Sea] removed %d lock files left by the run that was killed, which Pydra would wait for forever (in %s)", len(removed), places)
    return removed


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


_locate_result: ty.Callable[[str], Path | None] | None = None  # set while a run of the ``sea`` worker lasts


def find_results_on_tiers(locate: ty.Callable[[str], Path | None] | None) -> None:
    """Pydra submits a checksum once: a job of another node with the same checksum (the same task
    and inputs) is not submitted but waits until ``Job.result`` finds that checksum's result in its
    caches (``pydra.engine.job.load_result``). A job Sea placed on a tier whose directory does not
    go home would never be found there: while ``locate`` is set, a result not found in a job's
    caches is looked for in the directory ``locate(checksum)`` gives (``None``: none to look in)."""
    global _locate_result
    import pydra.engine.job as job_module

    _locate_result = locate
    original = getattr(job_module.load_result, "_sea_original", None)
    if original is None:
        original = job_module.load_result

        def load_result(checksum, caches, *args, **kwargs):
            found = original(checksum, caches, *args, **kwargs)
            if found is None and _locate_result is not None and (where := _locate_result(checksum)) is not None:
                found = original(checksum, [where.parent], *args, **kwargs)
            return found

        load_result._sea_original = original
        job_module.load_result = load_result


# while a run of the sea worker lives (look_only_at_free_jobs): the state indices of each node's jobs
# that are queued or running and not with the worker, by id(NodeExecution), and where each job
# queued is, by id(job)
_free: dict[int, set] = {}
_queued_at: dict[int, tuple[ty.Any, ty.Any]] = {}
_update_status: ty.Callable | None = None  # Pydra's own NodeExecution.update_status
_get_runnable: ty.Callable | None = None  # Pydra's own NodeExecution.get_runnable_tasks


def look_only_at_free_jobs(on: bool) -> None:
    """Each turn, Pydra's loop asks every queued or running job of every node whether it is done
    (``NodeExecution.update_status``: ``Job.done`` loads its result from disk, each of its caches
    in turn; ``Job.run_start_time`` stats its lock), and every node hands the loop its whole queue
    again (``NodeExecution.get_runnable_tasks`` returns ``list(self.queued.values())``), which the
    loop walks to find the jobs not yet submitted: a turn's cost grows with the jobs queued, which
    is every job of a fan-out (cf's too). While ``on``:

    - a node's status looks only at its jobs the worker does not hold (:func:`job_taken`,
      :func:`job_returned`): one the worker still runs is not done; the others as Pydra does;
    - a node hands the loop only the jobs it made runnable in this call, which the loop submits in
      the same turn (Pydra's own, the whole queue, when the Submitter caps the jobs at once,
      ``max_concurrent``, or cleans stale locks: then a job left out of a turn comes back);
    - a node whose every job is made (none left ``blocked``) is not asked for more: Pydra's call
      walks each index of the node's state to find none (a turn cost a fan-out's every job).

    Fixes that belong in Pydra; ``False`` puts Pydra's own back."""
    global _update_status, _get_runnable
    from pydra.engine.submitter import NodeExecution

    if on and _update_status is None:
        _update_status, NodeExecution.update_status = NodeExecution.update_status, _update_status_of_free_jobs
        _get_runnable, NodeExecution.get_runnable_tasks = NodeExecution.get_runnable_tasks, _runnable_tasks_made_now
    elif not on and _update_status is not None:
        NodeExecution.update_status, _update_status = _update_status, None
        NodeExecution.get_runnable_tasks, _get_runnable = _get_runnable, None
        _free.clear()
        _queued_at.clear()


def job_taken(job) -> None:
    """The worker runs ``job`` (SeaWorker.run): its node's status leaves it out until it returns."""
    if (where := _queued_at.get(id(job))) is not None:
        _free[id(where[0])].discard(where[1])


def job_returned(job) -> None:
    if (where := _queued_at.get(id(job))) is not None:
        _free[id(where[0])].add(where[1])


def _runnable_tasks_made_now(self, graph) -> list:
    """``NodeExecution.get_runnable_tasks`` while :func:`look_only_at_free_jobs` is on: Pydra's own
    with the node's queue set aside, so that what it queues is what it made runnable now."""
    queued = self.queued
    if self.blocked is not None and not self.blocked:
        made = {}  # every job made already: Pydra's call would walk each index of the node's state to find none
    else:
        self.queued = {}
        try:
            _get_runnable(self, graph)
        finally:
            made, self.queued = self.queued, queued
            queued.update(made)
    free = _free.setdefault(id(self), set())
    for index, job in made.items():
        free.add(index)
        _queued_at[id(job)] = (self, index)
    submitter = self.submitter
    if submitter.max_concurrent != float("inf") or submitter.clean_stale_locks:
        return list(queued.values())  # Pydra's: a job the loop leaves out of this turn comes back in the next
    return list(made.values())


def _update_status_of_free_jobs(self) -> None:
    """``NodeExecution.update_status`` while :func:`look_only_at_free_jobs` is on (a module-level
    function: a job pickled for a process refers to it by name, never by value)."""
    free = _free.get(id(self))
    if free is None or not self.started:
        return _update_status(self)
    if not free:
        return None  # all with the worker: nothing to look at
    all_queued, all_running = self.queued, self.running
    queued = {i: all_queued[i] for i in free if i in all_queued}
    running = {i: all_running[i] for i in free if i in all_running}
    looked = dict(queued) | {i: entry[0] for i, entry in running.items()}
    # Pydra looks at those only (the node's whole queue set aside, not taken apart and put back)
    self.queued, self.running = queued, running
    try:
        return _update_status(self)
    finally:
        for i, job in looked.items():
            all_queued.pop(i, None)
            all_running.pop(i, None)
            if i not in queued and i not in running:  # done or errored: out of the node's queue
                free.discard(i)
                _queued_at.pop(id(job), None)
        all_queued.update(queued)
        all_running.update(running)  # with those that started
        self.queued, self.running = all_queued, all_running


_map_splits: ty.Callable | None = None  # Pydra's own pydra.engine.state.map_splits


def split_in_linear_time(on: bool) -> None:
    """A split node's jobs are made (``NodeExecution.start`` -> ``State.prepare_states_val`` ->
    ``pydra.engine.state.map_splits``) by flattening the whole of each split input once per job, to
    take one element of it: a node split over N values costs N^2 (5,000 values: 17 s; 20,000: 264 s
    on our CI machine, in ``cf`` as in ``sea``). While ``on``, each input is flattened once per node
    and indexed: the same values, the same objects, in the same order. A fix that belongs in Pydra
    (``map_splits``); ``False`` puts Pydra's own back."""
    global _map_splits
    from pydra.engine import state

    if on and _map_splits is None:
        _map_splits, state.map_splits = state.map_splits, _map_splits_flattening_once
    elif not on and _map_splits is not None:
        state.map_splits, _map_splits = _map_splits, None


def _map_splits_flattening_once(split_iter, inputs, container_ndim=None):
    """``pydra.engine.state.map_splits`` with each input flattened once (:func:`split_in_linear_time`)."""
    from pydra.engine.state import flatten
    from pydra.utils.general import ensure_list

    container_ndim = container_ndim or {}
    flat: dict[str, list] = {}
    for split in split_iter:
        values = {}
        for k, v in split.items():
            if k not in flat:
                flat[k] = list(flatten(ensure_list(inputs[k]), max_depth=container_ndim.get(k, None)))
            values[k] = flat[k][v]
        yield values


_fetch_finished: ty.Callable | None = None  # Pydra's own Submitter.fetch_finished
_ended: set = set()  # futures that ended and no turn has taken yet
_wakers: list = []  # turns waiting for one to end


class _Pending(set):
    """The set of a loop's pending futures that Pydra keeps between turns and adds each new one to:
    it remembers which were added since a turn last looked, so that a turn costs what it adds."""

    def __init__(self, futures=()):
        super().__init__(futures)
        self.added = list(self)

    def add(self, future) -> None:
        if future not in self:
            super().add(future)
            self.added.append(future)


def fetch_finished_by_event(on: bool) -> None:
    """Each turn of Pydra's loop waits for a job's end with ``asyncio.wait(every pending future,
    FIRST_COMPLETED)`` (``Submitter.fetch_finished``), which adds and then removes a callback on
    every pending future: a fan-out's turn costs its pending jobs (45 ms a turn at 20,000 on our CI
    machine), and a big graph's loop turns thousands of times. While ``on``, a future gets one
    callback when it is added to the loop's pending set, and a turn takes the futures that ended
    since: the same (pending, done) as Pydra's, each future paid once (the pending set returned is
    the one Pydra passed, less those done, not a copy of it). A fix that belongs in Pydra;
    ``False`` puts Pydra's own back."""
    global _fetch_finished
    from pydra.engine.submitter import Submitter

    if on and _fetch_finished is None:
        _fetch_finished, Submitter.fetch_finished = Submitter.fetch_finished, _fetch_finished_by_event
    elif not on and _fetch_finished is not None:
        Submitter.fetch_finished, _fetch_finished = _fetch_finished, None
        _ended.clear()


def _future_ended(future) -> None:
    _ended.add(future)
    while _wakers:
        waker = _wakers.pop()
        if not waker.done():
            waker.set_result(None)


async def _fetch_finished_by_event(self, futures: set) -> tuple[set, set]:
    """``Submitter.fetch_finished`` (:func:`fetch_finished_by_event`): (still pending, ended), once
    one of ``futures`` ended; nothing pending, nothing ended, for none (Pydra's ``ValueError``)."""
    import asyncio

    if not futures:
        return set(), set()
    if not isinstance(futures, _Pending):
        futures = _Pending(futures)  # once a loop: Pydra adds to the set this returns
    added, futures.added = futures.added, []
    for future in added:
        if future.done():
            _ended.add(future)
        else:
            future.add_done_callback(_future_ended)
    while not (done := {f for f in _ended if f in futures}):
        waker = asyncio.get_running_loop().create_future()
        _wakers.append(waker)
        await waker
    _ended.difference_update(done)
    futures.difference_update(done)
    return futures, done


def look_in_home(job, home: Path, tier: Path) -> None:
    """The finished job's result is read from ``home`` only (and the read-only caches), not from
    ``tier``, where it ran: Pydra's loop polls ``Job.done`` of every job it has not seen finish
    (``load_result``: does ``<root>/<checksum>`` exist, then open its ``_result.pklz``), and a
    directory moving home leaves the tier between those two steps. The job looks unfinished until
    one rename puts its complete copy in the home."""
    job.cache_root = Path(home)
    job.all_caches = [r for r in job.all_caches[1:] if r not in (Path(home), Path(tier))]


def relocate_result(copy: Path, moves: dict[Path, Path]) -> list[str]:
    """Rewrite the paths in ``copy/_result.pklz`` (a job directory made under the old paths of
    ``moves``, old directory -> new directory) for the path the copy will have: written under a
    temporary name, fsync'ed, renamed. Returns the new paths written."""
    prefixes = {}
    for old, new in moves.items():
        prefixes[Path(old)] = prefixes[Path(old).resolve()] = Path(new)
    return _rewrite_result(Path(copy) / "_result.pklz", _prefix_mover(prefixes), move_cache_dir=True)


def input_files(job) -> list[Path]:
    """The files the job's task reads through its inputs: each file set's primary path (a
    multi-file set's other files are its same-stem companions, which a prefetched copy takes along)."""
    from fileformats.core import FileSet
    from pydra.utils.typing import TypeParser

    found: list[Path] = []

    def note(fileset: FileSet) -> FileSet:
        found.append(Path(fileset.fspath) if len(fileset.fspaths) > 1 else next(iter(fileset.fspaths)))
        return fileset

    for _, value in _file_inputs(job):
        TypeParser.apply_to_instances(FileSet, note, value)
    return found


def read_copies(job, copies: dict[str, str]) -> tuple[dict[str, ty.Any], dict[Path, Path]]:
    """Point the job's file inputs at complete fast copies, keeping ``job.checksum``: Pydra hashes a
    file set by its contents and the names of its files relative to their common stem (their
    extensions), which a copy
    (same name, same companions, same bytes) keeps, so the job's directory and its cache check are
    the same with and without the copies; its checksum is also taken first and kept by the job.

    Returns the inputs replaced (field -> original value, for :func:`put_back_inputs`) and copy
    directory -> original directory (for :func:`restore_originals`). A file set whose files are not
    all in one copy's directory keeps its original paths."""
    from fileformats.core import FileSet
    from pydra.utils.typing import TypeParser

    job.checksum  # noqa: B018 - computed and cached with the original paths
    dirs = {Path(c).parent: Path(s).parent for s, c in copies.items()}

    def swap(fileset: FileSet) -> FileSet:
        paths = [Path(p) for p in fileset.fspaths]
        primary = Path(fileset.fspath) if len(paths) > 1 else paths[0]
        if str(primary) not in copies:
            return fileset
        target = Path(copies[str(primary)]).parent
        if any(p.parent != primary.parent or not (target / p.name).exists() for p in paths):
            return fileset
        return _with_paths(fileset, [target / p.name for p in paths])

    originals: dict[str, ty.Any] = {}
    for name, value in _file_inputs(job):
        new = TypeParser.apply_to_instances(FileSet, swap, value)
        if _paths_in(new) != _paths_in(value):
            originals[name] = value
            setattr(job.task, name, new)
    if originals:
        job._inputs = None  # resolved again, from the copies, where the job runs
    return originals, dirs


def put_back_inputs(job, originals: dict[str, ty.Any]) -> None:
    """The job ran: its task names the original files again (the copies go after their last reader)."""
    for name, value in originals.items():
        setattr(job.task, name, value)
    if originals:
        job._inputs = None


def restore_originals(directory: Path, dirs: dict[Path, Path]) -> None:
    """A job that ran on prefetched copies may hand their paths on in its outputs (a task returning
    its input): its saved result is rewritten to name the originals, which outlive the copies."""
    if dirs:
        _rewrite_result(Path(directory) / "_result.pklz", _prefix_mover(dirs), move_cache_dir=False)


def _file_inputs(job) -> list[tuple[str, ty.Any]]:
    from fileformats.core import FileSet
    from pydra.utils.typing import TypeParser

    fields = attrs.fields(type(job.task))
    return [
        (f.name, getattr(job.task, f.name))
        for f in fields
        if not f.name.startswith("_") and TypeParser.contains_type(FileSet, f.type) and getattr(job.task, f.name) not in (None, attrs.NOTHING)
    ]


def output_paths(result) -> list[str]:
    """The paths a finished job's outputs name (its ``Result.outputs``' file sets): what its
    consumers will read, which may be in its producers' directories (a task returning its inputs)."""
    outputs = getattr(result, "outputs", None)
    if outputs is None or not attrs.has(type(outputs)):
        return []
    return [path for f in attrs.fields(type(outputs)) if not f.name.startswith("_") for path in _paths_in(getattr(outputs, f.name))]


def _paths_in(value) -> list[str]:
    """The paths ``value`` names: its file sets', and absolute paths written as plain text (a shell
    task's ``pwd``, handed on as a string: a reference to that directory all the same)."""
    from fileformats.core import FileSet
    from pydra.utils.typing import TypeParser

    found: list[str] = []
    TypeParser.apply_to_instances(FileSet, lambda fs: found.extend(sorted(map(str, fs.fspaths))) or fs, value)
    return found + paths_named(value, skip=lambda item: isinstance(item, FileSet))


def _with_paths(fileset, paths: list[Path]):
    """``fileset`` naming ``paths`` instead; not ``type(fileset)(paths)``, which checks the files."""
    import copy as copy_module

    from fileformats.core.fileset import FileSetMetadata

    moved = copy_module.copy(fileset)
    moved.fspaths = frozenset(paths)
    moved._metadata = FileSetMetadata(moved, overlay=fileset._explicit_metadata)
    return moved


def _prefix_mover(prefixes: dict[Path, Path]) -> ty.Callable[[Path], Path]:
    """A path rewriter: under a directory of ``prefixes`` (the longest first), to its new one."""
    pairs = sorted(((str(before), str(after)) for before, after in prefixes.items()), key=lambda pair: -len(pair[0]))

    def move(path: Path) -> Path:
        text = str(path)
        for before, after in pairs:
            if text == before or text.startswith(before + os.sep):
                return Path(after + text[len(before) :])
        return path

    return move


def _rewrite_result(result_file: Path, move: ty.Callable[[Path], Path], move_cache_dir: bool) -> list[str]:
    """Rewrite with ``move`` the file paths of a saved ``Result`` (and its ``cache_dir``, with
    ``move_cache_dir``): written under a temporary name, fsync'ed, renamed. Returns the new file
    paths written."""
    import cloudpickle as cp

    if not result_file.exists():
        return []
    with open(result_file, "rb") as f:
        result = cp.load(f)
    written = _move_outputs(result, move)
    if move_cache_dir:
        result.cache_dir = move(Path(result.cache_dir))
    elif not written:
        return written
    tmp = result_file.with_name(f".{result_file.name}.relocating")
    with open(tmp, "wb") as f:
        cp.dump(result, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, result_file)
    return written


def _move_outputs(result, move: ty.Callable[[Path], Path]) -> list[str]:
    """Rewrite with ``move`` the file paths a ``Result``'s outputs name, in place; the new paths."""
    from fileformats.core import FileSet
    from pydra.utils.typing import TypeParser

    written: list[str] = []

    def relocate(fileset: FileSet) -> FileSet:
        paths = [move(Path(p)) for p in fileset.fspaths]
        if set(paths) == set(map(Path, fileset.fspaths)):
            return fileset
        written.extend(str(p) for p in paths)
        return _with_paths(fileset, paths)

    if result.outputs is not None:
        for field in attrs.fields(type(result.outputs)):
            # past the field's converter: it would make each type of a union (NiftiGzX before NiftiGz)
            # check that the files are at their new paths, where the copy is not yet
            object.__setattr__(result.outputs, field.name, TypeParser.apply_to_instances(FileSet, relocate, getattr(result.outputs, field.name)))
    return written


def run_in_view(job_pkl: bytes, rerun: bool, view):
    """The pickled job run at its directory's path in the home (:mod:`sea.view`): its file inputs
    name their producers' and prefetched copies' paths as the home names them, and its result,
    saved and returned, names their real paths again. The reason, if the view could not be made."""
    import cloudpickle as cp
    from fileformats.core import FileSet
    from pydra.utils.typing import TypeParser

    job = cp.loads(job_pkl)
    job.checksum  # noqa: B018 - Pydra hashes file sets by their contents: the same in the view
    real = lambda path: Path(view.to_physical(str(path)))  # noqa: E731
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(view.mounted())
        except OSError as e:
            return f"a job's view could not be mounted ({e.strerror or e})"

        real_of: dict[str, str] = {}  # Pydra's hash cache keys: a path as the job is shown it -> its real one

        def shown(fileset: FileSet) -> FileSet:
            paths = [Path(view.to_logical(str(p))) for p in fileset.fspaths]
            if paths == list(map(Path, fileset.fspaths)):
                return fileset
            real_of.update((repr(seen), repr(Path(p))) for seen, p in zip(paths, fileset.fspaths, strict=True))
            return _with_paths(fileset, paths)

        for name, value in _file_inputs(job):
            setattr(job.task, name, TypeParser.apply_to_instances(FileSet, shown, value))
        stack.enter_context(_hashes_found_at_real_paths(real_of))
        job._inputs = None
        run_under(job, view.home)
        # Pydra empties a job's directory by removing it (``Job._populate_filesystem``): the bound
        # directory cannot be removed, so it is emptied here and the job told it may reuse it
        _empty(Path(view.physical))
        job._can_resume = True
        # the result names the real paths as it is saved: Pydra's loop reads it (Job.done) as
        # soon as it is there, before this process has returned
        import pydra.engine.job as job_module

        save = job_module.save

        def saved_real(*args, **kwargs):
            result = kwargs.get("result")
            if result is not None:
                _move_outputs(result, real)
                result.cache_dir = real(Path(result.cache_dir))
            if args and Path(args[0]) == view.logical:  # the same directory, named so that a home moved away meanwhile is not made again
                args = (Path(view.physical), *args[1:])
            return save(*args, **kwargs)

        job_module.save = saved_real
        try:
            result = job.run(rerun=rerun)
        finally:
            job_module.save = save
    return result


class _NotCached(Exception):
    pass


def _not_cached():
    raise _NotCached


@contextlib.contextmanager
def _hashes_found_at_real_paths(real_of: dict[str, str]) -> ty.Iterator[None]:
    """Pydra keys its persistent hash cache by a file set's paths (their ``repr``) and mtimes
    (``bytes_repr_fileset``): the paths a job is shown in its view would miss what its checksum
    found at the real ones, and each input would be read again, whole, as the job ends
    (``Job._check_for_hash_changes``: 2 s of the incrementation's 40 jobs of 32 MiB). A key naming
    shown paths is looked up at the real ones (the same files, so the same mtimes) and computed at
    the shown ones, as Pydra would, where that finds nothing (an input the job changed)."""
    from pydra.utils.hash import PersistentCache

    lookup = PersistentCache.get_or_calculate_hash

    def at_real_paths(self, key, calculate_hash):
        real = tuple(real_of.get(k, k) if isinstance(k, str) else k for k in key)
        if real != key:
            with contextlib.suppress(_NotCached):
                return lookup(self, real, _not_cached)
        return lookup(self, key, calculate_hash)

    PersistentCache.get_or_calculate_hash = at_real_paths
    try:
        yield
    finally:
        PersistentCache.get_or_calculate_hash = lookup


def _empty(directory: Path) -> None:
    import shutil

    for entry in os.scandir(directory):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)


def submit_through(job, submitter) -> None:
    """Have ``submitter`` expand ``job`` (a workflow job made by another process's submitter and
    sent here pickled): a workflow job expands through the submitter it records (``job.submitter``)."""
    import datetime

    job.submitter = submitter
    submitter.run_start_time = datetime.datetime.now()  # as Submitter.__call__ sets it
