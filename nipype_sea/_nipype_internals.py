"""Every use of Nipype's private API by SeaMultiProc, in one module, pinned to tested versions.

Nipype offers no public hooks for placement, so SeaMultiProc subclasses ``MultiProcPlugin`` and
overrides its private methods. This module turns those private hooks into a handful of events
(:class:`EventedMultiProc`) and reads the private node attributes the adapter needs. The tests in
``tests/test_nipype_internals.py`` check each assumption and fail loudly when a Nipype release
changes one; the supported range is :data:`TESTED_RANGE`.

Facts relied upon (nipype 1.8-1.12):
- ``DistributedPluginBase.run`` sleeps ``poll_sleep_duration`` between rounds and calls
  ``_send_procs_to_workers`` each round; MultiProc sorts ready jobs with ``_sort_jobs``, checks
  ``_local_hash_check``, then ``_submit_job(deepcopy(node))``; results come back through
  ``_async_callback`` -> ``_get_result`` -> ``_task_finished_cb`` / ``_clean_queue``.
- ``Node.output_dir()`` is cached in ``Node._output_dir``; consumers read a producer's
  ``result_<name>.pklz`` at the path in ``node.input_source``, fixed before the run starts.
- MapNode sub-nodes live in ``<mapnode dir>/mapflow`` and are tracked in ``mapnodesubids``.
- MultiProc and its bases read from ``plugin_args`` only the keys of :data:`MULTIPROC_ARGS`.
- ``Node._get_hashval()`` computes the inputs' hash once and keeps it (``_hashvalue``,
  ``_hashed_inputs``, pickled with the node); ``Node.run`` names the hash file with the kept
  hash; it needs ``node.config``, which ``Node.run`` fills first (prefetch: :func:`read_copies`).
"""

from __future__ import annotations

import gc
import io
import logging
import os
import pickle
import re
import sys
import threading
from copy import deepcopy
from pathlib import Path
from traceback import format_exception

import nipype
import numpy as np
from nipype.interfaces.base import File
from nipype.pipeline.engine import MapNode
from nipype.pipeline.plugins.base import DistributedPluginBase
from nipype.pipeline.plugins.multiproc import MultiProcPlugin, run_node

from sea.config import SeaConfigError, check_bool, check_choice, check_positive_number, check_whole_number
from sea.interrupt import StopRequest, stop_process_pool
from sea.tiers import key_in_private_dir

TESTED_RANGE = ("1.8", "1.13")
logger = logging.getLogger("nipype.workflow")  # [lowest tested, first untested)


def _optional(check):
    """``check``, with ``None`` (Nipype's default) accepted too."""
    return lambda value, what: value if value is None else check(value, what)


def _callable(value, what):
    if not callable(value):
        raise SeaConfigError(f"{what} must be a function called with (node, status), not {value!r}")
    return value


# The plugin_args keys MultiProcPlugin, DistributedPluginBase and PluginBase read (``sea`` is
# SeaMultiProc's own), with what Nipype needs of each value; ``maxtasksperchild`` and
# ``non_daemon`` are LegacyMultiProc's, which MultiProc's docstring still lists and fMRIPrep passes.
# tests/test_nipype_internals.py fails when Nipype reads a key missing here.
MULTIPROC_ARGS = {
    "n_procs": lambda value, what: check_whole_number(value, what, 1),
    "memory_gb": check_positive_number,
    "raise_insufficient": check_bool,
    "n_gpu_procs": lambda value, what: check_whole_number(value, what, 0),
    "mp_context": _optional(lambda value, what: check_choice(value, what, ["fork", "spawn", "forkserver"])),
    "scheduler": _optional(lambda value, what: check_choice(value, what, ["tsort", "mem_thread"])),
    "status_callback": _optional(_callable),
    "max_jobs": lambda value, what: value if isinstance(value, float) and value == float("inf") else check_whole_number(value, what, 1),
    "maxtasksperchild": _optional(lambda value, what: check_whole_number(value, what, 1)),
    "non_daemon": check_bool,
    "sea": lambda value, what: value,  # checked by SeaConfig.load
}


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:2])


def nipype_version_supported(version: str = nipype.__version__) -> bool:
    low, high = TESTED_RANGE
    return _release(low) <= _release(version) < _release(high)


# ------------------------------------------------------------------------- nodes
def workflow_home(graph) -> Path | None:
    """The workflow's ``base_dir`` (every execution node carries it), or ``None`` if unset."""
    base_dirs = {node.base_dir for node in graph.nodes()}
    if len(base_dirs) != 1 or None in base_dirs:
        return None
    return Path(base_dirs.pop()).resolve()


def use_temporary_home(graph) -> Path:
    """A workflow without ``base_dir``: Nipype gives each node a ``mkdtemp()`` of its own (some made
    already, by ``Workflow.run`` fixing the consumers' ``input_source``). Give every node one
    temporary directory instead, the home, and repoint ``input_source``."""
    import tempfile

    home = Path(tempfile.mkdtemp(prefix="sea-home-")).resolve()
    moved = {}
    for node in graph.nodes():
        before = Path(node.output_dir())
        node.base_dir, node._output_dir = str(home), None
        moved[before] = Path(node.output_dir())
    _repoint_inputs(graph, moved)
    return home


def writes_provenance(config) -> bool:
    """``execution.write_provenance`` is on: ``Workflow.run`` reads every node's result after the plugin."""
    from nipype.utils.misc import str2bool

    return str2bool(config["execution"].get("write_provenance", False))


def run_dirs(graph) -> dict:
    """What the plugin changes on the caller's nodes (their directory, where they read inputs), to
    put back after the run with :func:`restore_run_dirs`: ``Workflow.run`` returns these nodes, and
    their results are read (``node.result``, provenance) at their usual paths."""
    return {node: (node._output_dir, dict(node.input_source)) for node in graph.nodes()}


def restore_run_dirs(saved: dict) -> None:
    for node, (output_dir, input_source) in saved.items():
        node._output_dir = output_dir
        node.input_source.clear()
        node.input_source.update(input_source)


def _repoint_inputs(graph, moved: dict[Path, Path]) -> None:
    for node in graph.nodes():
        for field, (result, out) in list(node.input_source.items()):
            if Path(result).parent in moved:
                node.input_source[field] = (str(moved[Path(result).parent] / Path(result).name), out)


def forget_stale_links(graph, home: Path) -> int:
    """Undo what links left by a killed run did to the graph before Sea saw it.

    Nipype resolves a node's directory with ``realpath`` and fixes consumers' ``input_source`` from
    it before the plugin runs; a link left in the home by a killed Sea run makes both point into
    that run's tier. Remove such links, recompute the directories, and repoint ``input_source``.
    """
    moved: dict[Path, Path] = {}
    for node in graph.nodes():
        current = Path(node.output_dir())
        key = None if current.is_relative_to(home) else key_in_private_dir(current)
        if key is None:
            continue
        if (home / key).is_symlink():
            (home / key).unlink()
        node._output_dir = None
        moved[current] = Path(node.output_dir())
    _repoint_inputs(graph, moved)
    return len(moved)


def expanded_graph(workflow):
    """The execution graph ``workflow.run()`` would build, without running anything (for
    ``sea plan``): the same private steps as ``Workflow.run`` up to the plugin call."""
    from copy import deepcopy

    from nipype import config
    from nipype.pipeline.engine.utils import generate_expanded_graph, merge_dict

    flat = workflow._create_flat_graph()
    workflow.config = merge_dict(deepcopy(config._sections), workflow.config)
    workflow._set_needed_outputs(flat)
    graph = generate_expanded_graph(deepcopy(flat))
    for index, node in enumerate(graph.nodes()):
        node.config = merge_dict(deepcopy(workflow.config), node.config)
        node.base_dir = workflow.base_dir
        node.index = index
    workflow._configure_exec_nodes(graph)
    return graph


def unconnected_file_bytes(node) -> int:
    """Bytes of the existing files named by the node's unconnected inputs (what it reads from the
    shared filesystem when it is a source)."""
    return sum(os.path.getsize(p) for p in unconnected_input_files(node))


def _paths_in(value) -> list[str]:
    """The absolute paths of existing files in an input or output value (lists and tuples walked)."""
    if isinstance(value, str):
        return [value] if os.path.isabs(value) and os.path.isfile(value) else []
    if isinstance(value, (list, tuple)):
        return [p for item in value for p in _paths_in(item)]
    return []


def _reads(node, name: str) -> bool:
    """Whether the node may read the file its input ``name`` names: not when the input is a
    ``File(exists=False)``, a name only (a sink's ``source_file``, an output file's name)."""
    trait = node.inputs.traits().get(name)
    return not (trait is not None and isinstance(trait.trait_type, File) and trait.trait_type.exists is False)


def unconnected_input_files(node) -> list[str]:
    """The files named by the node's inputs that no connection sets (a node reading the raw data)."""
    return [p for name, value in node.inputs.get().items() if name not in node.input_source and _reads(node, name) for p in _paths_in(value)]


def connected_output_files(directory: Path, connections, consumer) -> list[str]:
    """The files a finished node in ``directory`` hands ``consumer`` through ``connections`` (the
    execution graph edge's ``connect`` list of (output, input)) for it to read, from its saved result."""
    from nipype.pipeline.engine.utils import loadpkl

    results = sorted(Path(directory).glob("result_*.pklz"))
    if not results:
        return []
    outputs = getattr(loadpkl(results[0]), "outputs", None)
    if outputs is None:
        return []
    # a Node's outputs are a traited spec; a MapNode's, a Bunch of lists
    values = outputs.get() if hasattr(outputs, "copyable_trait_names") else dict(outputs.dictcopy())
    names = {source for source, target in connections if isinstance(source, str) and _reads(consumer, target)}
    return [p for name in sorted(names) for p in _paths_in(values.get(name))]


def consumers_with_connections(graph, node):
    """(consumer, the execution graph edge's ``connect`` list of (output, input)) for each consumer."""
    for consumer in graph.successors(node):
        yield consumer, graph.get_edge_data(node, consumer).get("connect", [])


def read_copies(node, copies: dict[str, str]) -> int:
    """Point the node's inputs at fast copies of the files they name, keeping its hash: the hash
    is taken first, with the original paths, and kept in the node (Nipype computes it once), so its
    directory, its cache check and a later run without copies see the same node. Inputs whose files
    the interface links into its directory (``copyfile=False``) keep the original: the link would
    outlive the copy. Returns the number of inputs changed."""
    if not copies or is_mapnode(node):
        return 0
    if node.config is None:  # as Node.run starts: the hash method is read from it
        from nipype import config
        from nipype.pipeline.engine.utils import merge_dict

        node.config = merge_dict(deepcopy(config._sections), {})
    node._get_hashval()

    def swapped(value):
        if isinstance(value, str):
            return copies.get(value, value)
        if isinstance(value, (list, tuple)):
            return type(value)(swapped(v) for v in value)
        return value

    changed = 0
    traits = node.inputs.traits()
    for name, value in node.inputs.get().items():
        if traits[name].copyfile is False:
            continue
        new = swapped(value)
        if new != value:
            setattr(node.inputs, name, new)
            changed += 1
    return changed


def restore_originals(directory: Path, copies: dict[str, str]) -> None:
    """A node that ran on prefetched copies may hand their paths on in its outputs (a function
    returning its input, a gradient table made of two file names): its saved result is rewritten
    to name the originals, which outlive the copies (a copy goes once its readers finished)."""
    originals = {copy: original for original, copy in copies.items()}
    _rewrite_results(Path(directory).glob("result_*.pklz"), lambda path: originals.get(path, path))


def logical_dir(node) -> Path:
    """The node's directory as Nipype records it; calling it caches the path before Sea links it."""
    return Path(node.output_dir())


def set_run_dir(node, path: Path) -> None:
    """Make the (copied) node run in ``path``: its real directory, which Nipype may empty."""
    node._output_dir = str(path)


def producers(node, graph) -> list[tuple[Path, str]]:
    """(producer directory, edge label) for each connected input, plus order-only edges."""
    edges = [(Path(result).parent, f"{out}->{field}") for field, (result, out) in sorted(node.input_source.items())]
    known = {directory for directory, _ in edges}
    for pred in graph.predecessors(node):
        directory = logical_dir(pred)
        if directory not in known:
            edges.append((directory, "order"))
    return edges


def own_inputs(node) -> str:
    """The node's unconnected inputs with their hashes, as Nipype hashes them, as text."""
    hash_method = (node.config or {}).get("execution", {}).get("hash_method", "timestamp")
    try:
        hashed, _ = node.inputs.get_hashval(hash_method=hash_method)
    except Exception:  # noqa: BLE001 - an input Nipype cannot hash: never treat the node as done
        return f"unhashable {os.urandom(8).hex()}"
    return repr([(name, value) for name, value in hashed if name not in node.input_source])


def paths_read(result) -> list[str]:
    """The absolute paths among the inputs a node ran with (its ``InterfaceResult.inputs``)."""
    found: list[str] = []

    def walk(value) -> None:
        if isinstance(value, str):
            if os.path.isabs(value):
                found.append(value)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)

    walk(getattr(result, "inputs", None) or {})
    return found


def interface_name(node) -> str:
    return type(node.interface).__name__


def is_mapnode(node) -> bool:
    return isinstance(node, MapNode)


def sink_base_directory(node) -> Path | None:
    value = getattr(node.inputs, "base_directory", None)
    if isinstance(value, str) and value:
        return Path(value).resolve()
    return None


def redirect_sink(node, staging: Path) -> None:
    node.inputs.base_directory = str(staging)


def read_inputs_from(node, physical_dir) -> None:
    """Point the node's ``input_source`` at its producers' real directories: on a busy shared
    filesystem every path lookup through the home's links is a metadata round trip. Only where the
    node reads its inputs changes; they are the same files, and nothing of it is hashed."""
    for field, (result, out) in list(node.input_source.items()):
        where = physical_dir(Path(result).parent)
        if where is not None:
            node.input_source[field] = (str(where / Path(result).name), out)


def cached_in_home(node) -> bool:
    """Nipype's own check (``_local_hash_check``) that ``node`` is done in its directory in the
    home and need not run: its hash file is there and up to date, and it is not forced to rerun."""
    try:
        cached, updated = node.is_cached()
    except Exception:  # noqa: BLE001 - Nipype forces a rerun when it cannot check
        return False
    overwrite, always_run = node.overwrite, node.interface.always_run
    return cached and updated and (overwrite is False or (overwrite is None and not always_run))


def relocate_results(directory: Path, moves: dict[Path, Path]) -> list[str]:
    """A node directory (and the sub-node directories in it) made under the old paths of ``moves``
    (old directory -> new directory) is now at ``directory``: rewrite the paths its ``result_*.pklz``
    files give (Nipype saves them absolute unless ``use_relative_paths``) and its links point at.
    Returns the new paths written (they may name other nodes' directories)."""
    prefixes = sorted(((str(old), str(new)) for old, new in moves.items()), key=lambda pair: -len(pair[0]))

    def moved(path: str) -> str:
        for old, new in prefixes:
            if path == old or path.startswith(old + os.sep):
                return new + path[len(old) :]
        return path

    results, written = [], []
    for dirpath, dirs, files in os.walk(directory):
        for name in [*dirs, *files]:
            entry = os.path.join(dirpath, name)
            if os.path.islink(entry) and moved(os.readlink(entry)) != os.readlink(entry):
                target = moved(os.readlink(entry))
                tmp = os.path.join(dirpath, f".{name}.relocating")
                os.symlink(target, tmp)
                os.replace(tmp, entry)
                written.append(target)
            elif name.startswith("result_") and name.endswith(".pklz"):
                results.append(Path(entry))
    return written + _rewrite_results(results, moved)


def _rewrite_results(result_files, rewrite) -> list[str]:
    """Rewrite with ``rewrite`` the path strings that Nipype result files give as outputs (what a
    consumer reads; the inputs and the run directory stay a record of where the node ran). A file is
    read without setting its traited objects up, so nothing is validated (an output trait checks that
    its file exists: the directory on its way home is not at its new path yet, a producer's may be
    gone already), and written back with their state, rewritten for the outputs: under a temporary
    name, then renamed. Returns the new paths written."""
    import gzip
    import json

    written: list[str] = []

    def moved(value):
        if isinstance(value, str):
            new = rewrite(value)
            if new != value:
                written.append(new)
            return new
        if isinstance(value, (list, tuple)):  # a traits list (TraitListObject) is written back as a list
            items = [moved(v) for v in value]
            return type(value)(items) if type(value) in (list, tuple) else (list if isinstance(value, list) else tuple)(items)
        if isinstance(value, dict):
            return {k: moved(v) for k, v in value.items()}
        return value

    for path in result_files:
        data = gzip.decompress(Path(path).read_bytes())
        header, end = b"", data.find(b"\n")
        if end >= 0:  # savepkl(versioning=True) starts with a line of JSON
            try:
                json.loads(data[:end])
                header, data = data[: end + 1], data[end + 1 :]
            except (UnicodeDecodeError, ValueError):
                pass
        loader = _Unvalidated(io.BytesIO(data))
        result = loader.load()
        outputs, states = getattr(result, "outputs", None), loader.states
        before = len(written)
        if id(outputs) in states:
            states[id(outputs)] = moved(states[id(outputs)])
        elif outputs is not None:
            outputs.__dict__.update(moved(dict(outputs.__dict__)))  # a MapNode's outputs: a Bunch

        if len(written) == before:
            continue
        buffer = io.BytesIO()
        _StatesKept(buffer, states).dump(result)
        tmp = Path(path).with_name(f".{Path(path).name}.relocating")
        with open(tmp, "wb") as fh:
            fh.write(gzip.compress(header + buffer.getvalue()))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    return written


class _StatesKept(pickle.Pickler):
    """Writes back what :class:`_Unvalidated` read: traited objects with the states it kept."""

    def __init__(self, file, states: dict[int, object]):
        super().__init__(file, pickle.DEFAULT_PROTOCOL)
        self.states = states

    def reducer_override(self, obj):
        import copyreg

        state = self.states.get(id(obj))
        return NotImplemented if state is None else (copyreg.__newobj__, (type(obj),), state)


class _Unvalidated(pickle._Unpickler):
    """A pickle reader that leaves traited objects (a node's inputs and outputs) as it found them,
    their state in ``states`` (by ``id``), instead of setting their traits: setting validates them."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, file):
        super().__init__(file)
        self.states: dict[int, object] = {}

    def _build(self):
        from traits.api import HasTraits

        state = self.stack.pop()
        if isinstance(self.stack[-1], HasTraits):
            self.states[id(self.stack[-1])] = state
            return
        self.stack.append(state)
        pickle._Unpickler.load_build(self)

    dispatch[pickle.BUILD[0]] = _build


# ------------------------------------------------------------------------- plugin hooks
class EventedMultiProc(MultiProcPlugin):
    """MultiProc with its private hooks turned into events for an adapter.

    Subclasses implement ``order_ready_jobs``, ``prepare_node``, ``retry_node``, ``job_finished``
    and ``job_failed``; they call ``skip_job`` to mark a job done without running it. The scheduling
    loop wakes as soon as a job finishes instead of sleeping ``poll_sleep_duration`` (kept as the
    longest wait).
    """

    def __init__(self, plugin_args=None):
        super().__init__(plugin_args=plugin_args)
        self._wake = threading.Event()
        self._poll_timeout = 2.0
        self._submitted: dict[int, tuple[object, bool]] = {}
        self._result = None  # the result _get_result just returned, for the _task_finished_cb that follows
        self.stop_request = StopRequest(self.wake)  # a stop signal raises at the start of the next round

    # events (no-op defaults) ---------------------------------------------
    def order_ready_jobs(self, jobids: list[int]) -> list[int]:
        return jobids

    def prepare_job(self, jobid: int) -> bool:
        """About to run ``jobid`` (it fits the resources). Return True when the adapter knows nothing
        of it can be cached (Nipype's own hash check, on the shared filesystem, is then skipped)."""
        return False

    def prepare_node(self, node) -> None:
        """``node`` is the copy about to be sent to a worker process."""

    def retry_node(self, node, traceback_text: str) -> bool:
        """Return True to resubmit the (re-prepared) copy instead of reporting the failure."""
        return False

    def job_finished(self, node, cached: bool, result=None) -> None:
        """``result``: the ``InterfaceResult`` the worker process sent back (``None`` for a node
        found cached, or run in this process)."""

    def job_failed(self, node) -> None: ...

    # helpers for subclasses ---------------------------------------------------
    def wake(self) -> None:
        self._wake.set()

    def node_of(self, jobid: int):
        return self.procs[jobid]

    def skip_job(self, jobid: int) -> None:
        self.proc_done[jobid] = True
        self.proc_pending[jobid] = True
        self._task_finished_cb(jobid, cached=True)

    def shutdown_pool(self, wait: bool = True) -> None:
        """Wait for jobs still running (a crash ends the loop, not the worker processes); after an
        interrupt (``wait=False``), stop them instead: they run again next time."""
        if wait:
            self.pool.shutdown(wait=True, cancel_futures=True)
        else:
            stop_process_pool(self.pool)

    # Nipype's private hooks ----------------------------------------------------
    def run(self, graph, config, updatehash=False):
        execution = dict(config["execution"])
        self._poll_timeout = float(execution.get("poll_sleep_duration", 2))
        execution["poll_sleep_duration"] = "0"
        # MultiProc calls gc.collect() before every submission round; waking on each finished job
        # means more rounds, and a full collection walks every object the process ever imported
        # (65 ms here). Freezing what exists before the run limits each collection to new objects.
        gc.collect()
        gc.freeze()
        try:
            return super().run(graph, {**config, "execution": execution}, updatehash=updatehash)
        finally:
            gc.unfreeze()

    def _send_procs_to_workers(self, updatehash=False, graph=None):
        self.stop_request.raise_if_requested()
        self._wake.clear()
        super()._send_procs_to_workers(updatehash=updatehash, graph=graph)
        if not any(taskid in self._taskresult for taskid, _ in self.pending_tasks):
            self._wake.wait(self._poll_timeout if self.pending_tasks else 0.01)

    def _local_hash_check(self, jobid, graph):
        if self.prepare_job(jobid):
            return False
        return super()._local_hash_check(jobid, graph)

    def _sort_jobs(self, jobids, scheduler="tsort"):
        return self.order_ready_jobs(list(super()._sort_jobs(jobids, scheduler=scheduler)))

    def _submit_job(self, node, updatehash=False):
        self.prepare_node(node)
        taskid = super()._submit_job(node, updatehash=updatehash)
        self._submitted[taskid] = (node, updatehash)
        future = self._task_obj.get(taskid)
        if future is not None and future.done() and taskid not in self._taskresult:
            # MultiProc attaches the callback before it records the future: a task that failed at
            # once ran the callback when the future could not be found yet; settle it now
            self._async_callback(future)
        return taskid

    def _async_callback(self, args):
        try:
            super()._async_callback(args)
        except BaseException:  # the worker process died, or run_node raised: report it as the task's failure
            # a copy: this runs in the pool's thread while the main loop adds and clears tasks, and a
            # "dictionary changed size" error here would lose the failure (the loop then waits forever)
            for taskid, future in list(self._task_obj.items()):
                if future is args:
                    self._taskresult[taskid] = {"result": None, "traceback": format_exception(*sys.exc_info()), "taskid": taskid}
        finally:
            self._wake.set()

    def _get_result(self, taskid):
        result = super()._get_result(taskid)
        self._result = result.get("result") if result and not result.get("traceback") else None
        if result and result.get("traceback") and taskid in self._submitted:
            node, updatehash = self._submitted[taskid]
            if self.retry_node(node, "".join(result["traceback"])):
                del self._taskresult[taskid]
                future = self.pool.submit(run_node, node, updatehash, taskid)
                self._task_obj[taskid] = future
                future.add_done_callback(self._async_callback)
                return None
        return result

    def _clear_task(self, taskid):
        super()._clear_task(taskid)
        self._submitted.pop(taskid, None)

    def _task_finished_cb(self, jobid, cached=False):
        super()._task_finished_cb(jobid, cached=cached)
        result, self._result = (None if cached else self._result), None
        self.job_finished(self.procs[jobid], cached, result)  # MapNode sub-nodes too (jobid in mapnodesubids)

    def _clean_queue(self, jobid, graph, result=None):
        self.job_failed(self.procs[self.mapnodesubids.get(jobid, jobid)])
        return super()._clean_queue(jobid, graph, result=result)

    def _remove_node_dirs(self):
        """Sea evicts node directories itself, once their consumers finished and flushes committed."""


class EventedTaskLoop(DistributedPluginBase):
    """Nipype's distributed plugin loop (as its SGE and SLURM plugins use) with every ready node
    submitted as one task, MapNodes included (they run their sub-nodes in their own directory,
    where the task runs), in the order the adapter gives, and no check in this process: the
    client may not see the workers' storage, so the task itself asks Nipype's cache check.

    Subclasses implement ``order_ready_jobs``, ``_submit_job``, ``_get_result``, ``task_done``,
    ``job_finished`` and ``job_failed``, and call ``wake`` when a task ends.
    """

    def __init__(self, plugin_args=None):
        super().__init__(plugin_args=plugin_args)
        self._wake = threading.Event()
        self._poll_timeout = 2.0
        self.stop_request = StopRequest(self.wake)  # a stop signal raises at the start of the next round

    def order_ready_jobs(self, jobids: list[int]) -> list[int]:
        return jobids

    def job_finished(self, node) -> None: ...

    def job_failed(self, node) -> None: ...

    def wake(self) -> None:
        self._wake.set()

    def run(self, graph, config, updatehash=False):
        execution = dict(config["execution"])
        self._poll_timeout = float(execution.get("poll_sleep_duration", 2))
        execution["poll_sleep_duration"] = "0"
        return super().run(graph, {**config, "execution": execution}, updatehash=updatehash)

    def before_submitting(self) -> None:
        """Called once per round of the loop, where the adapter may :meth:`requeue` jobs."""

    def requeue(self, jobids: list[int]) -> None:
        """Run these jobs again (their results were lost): not done, not running, and every
        consumer that has not finished waits for them again."""
        again = set(jobids)
        self.pending_tasks[:] = [(taskid, jobid) for taskid, jobid in self.pending_tasks if jobid not in again]
        finished = self.proc_done & ~self.proc_pending
        for jobid in again:
            self.proc_done[jobid] = False
            self.proc_pending[jobid] = False
        for jobid in again:
            for consumer in self._edges.getrowview(jobid).nonzero()[1]:
                if consumer in again or not finished[consumer]:
                    self.depidx[jobid, consumer] = 1

    def _generate_dependency_list(self, graph):
        super()._generate_dependency_list(graph)
        self._edges = self.depidx.copy()  # Nipype clears depidx as jobs finish

    def _send_procs_to_workers(self, updatehash=False, graph=None):
        self.stop_request.raise_if_requested()
        self.before_submitting()
        self._wake.clear()
        ready = [int(j) for j in np.flatnonzero(~self.proc_done & (self.depidx.sum(axis=0) == 0).__array__())]
        for jobid in self.order_ready_jobs(ready):
            self.proc_done[jobid] = True
            self.proc_pending[jobid] = True
            if self._status_callback:
                self._status_callback(self.procs[jobid], "start")
            taskid = self._submit_job(deepcopy(self.procs[jobid]), updatehash=updatehash)
            self.pending_tasks.insert(0, (taskid, jobid))
        if self.pending_tasks and not any(self.task_done(taskid) for taskid, _ in self.pending_tasks):
            self._wake.wait(self._poll_timeout)

    def task_done(self, taskid) -> bool:
        return False

    def _task_finished_cb(self, jobid, cached=False):
        """Nipype's, without its ``refidx`` bookkeeping: that matrix only serves
        ``_remove_node_dirs`` (Sea evicts itself), and clearing a column of it scans every row,
        which made the loop's cost per node grow with the graph (4 ms a node at 2,000 nodes)."""
        logger.info("[Job %d] %s (%s).", jobid, "Cached" if cached else "Completed", self.procs[jobid])
        if self._status_callback:
            self._status_callback(self.procs[jobid], "end")
        self.proc_pending[jobid] = False
        row = self.depidx.getrowview(jobid)
        row[row.nonzero()] = 0
        self.job_finished(self.procs[jobid])

    def _clean_queue(self, jobid, graph, result=None):
        self.job_failed(self.procs[jobid])
        return super()._clean_queue(jobid, graph, result=result)

    def _remove_node_dirs(self):
        """Sea evicts node directories itself."""
