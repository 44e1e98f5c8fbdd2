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

import contextlib
import gc
import io
import logging
import multiprocessing
import os
import pickle
import re
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from copy import deepcopy
from pathlib import Path
from traceback import format_exception

import nipype
from nipype.interfaces.base import File
from nipype.pipeline.engine import MapNode
from nipype.pipeline.engine.utils import topological_sort
from nipype.pipeline.plugins.base import DistributedPluginBase
from nipype.pipeline.plugins.multiproc import MultiProcPlugin, process_initializer, run_node
from nipype.pipeline.plugins.tools import report_nodes_not_run

from sea import view as sea_view
from sea.config import SeaConfigError, check_bool, check_choice, check_positive_number, check_whole_number
from sea.graph import paths_named
from sea.interrupt import StopRequest, die_on_terminate, stop_process_pool
from sea.memory import JobPeak, offer_to_oom_killer
from sea.ordering import HELD_PER_ROUND, ReadyQueue
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
    """The workflow's ``base_dir`` (every execution node carries it), or ``None`` if unset.
    ``SeaConfigError`` for a name that is not UTF-8 text: Nipype's workers do not find the results
    they write there (a ``FileNotFoundError`` in the worker), and MultiProc then waits for good."""
    base_dirs = {node.base_dir for node in graph.nodes()}
    if len(base_dirs) != 1 or None in base_dirs:
        return None
    home = Path(base_dirs.pop()).resolve()
    try:
        str(home).encode("utf-8")
    except UnicodeEncodeError:
        from sea.config import SeaConfigError

        raise SeaConfigError(
            f"base_dir {str(home)!r} has a name that is not UTF-8 text (bytes of another encoding), in which Nipype's "
            "workers do not find the results they write (MultiProc waits for them for good); give it a UTF-8 name"
        ) from None
    return home


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


KEEP_SETTINGS = (("remove_unnecessary_outputs", False), ("keep_inputs", True))  # what they are when they mean "keep"


def keep_settings(node) -> list[str]:
    """The execution settings by which Nipype is told to keep ``node``'s directory as it ran
    (``remove_unnecessary_outputs = false``, ``keep_inputs = true``, as ``enable_debug_mode`` sets
    them); the node's own configuration, as ``Workflow.run`` merged it, else Nipype's."""
    from nipype import config as global_config
    from nipype.utils.misc import str2bool

    execution = (node.config or {}).get("execution", {}) if isinstance(node.config, dict) else {}
    found = []
    for name, keeps in KEEP_SETTINGS:
        value = execution.get(name, global_config.get("execution", name))
        try:
            if str2bool(value) is keeps:
                found.append(f"{name} = {str(keeps).lower()}")
        except ValueError:
            continue
    return found


def keeps_directory(node) -> bool:
    return bool(keep_settings(node))


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
    return output_files(directory, read_outputs(connections, consumer))


def read_outputs(connections, consumer) -> list[str]:
    """The producer's outputs, among ``connections`` (an execution graph edge's ``connect`` list of
    (output, input)), whose files ``consumer`` reads (not those it takes as names only)."""
    return sorted({source for source, target in connections if isinstance(source, str) and _reads(consumer, target)})


def output_files(directory: Path, names) -> list[str]:
    """The files the outputs ``names`` of the finished node in ``directory`` name, from its saved result."""
    from nipype.pipeline.engine.utils import loadpkl

    results = sorted(Path(directory).glob("result_*.pklz"))
    if not results or not names:
        return []
    outputs = getattr(loadpkl(results[0]), "outputs", None)
    if outputs is None:
        return []
    # a Node's outputs are a traited spec; a MapNode's, a Bunch of lists
    values = outputs.get() if hasattr(outputs, "copyable_trait_names") else dict(outputs.dictcopy())
    return [p for name in names for p in _paths_in(values.get(name))]


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
    return _rewrite_inputs(node, lambda path: copies.get(path, path), linked_too=False)


def read_originals(node, copies: dict[str, str]) -> None:
    """Point the node's inputs back at the files :func:`read_copies` gave it copies of."""
    originals = {copy: original for original, copy in copies.items()}
    _rewrite_inputs(node, lambda path: originals.get(path, path), linked_too=False)


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
    """The node's unconnected inputs with their hashes, as Nipype hashes them, as text; a node
    that must run every time (``overwrite=True``) never has the same (Nipype runs it again)."""
    if getattr(node, "overwrite", None):
        return f"overwrite {os.urandom(8).hex()}"
    hash_method = (node.config or {}).get("execution", {}).get("hash_method", "timestamp")
    try:
        hashed, _ = node.inputs.get_hashval(hash_method=hash_method)
    except Exception:  # noqa: BLE001 - an input Nipype cannot hash: never treat the node as done
        return f"unhashable {os.urandom(8).hex()}"
    return repr([(name, value) for name, value in hashed if name not in node.input_source])


LISTING_GRABBERS = ("DataGrabber", "SelectFiles", "FreeSurferSource")  # Nipype's grabbers that search local directories


def grabbed_now(node) -> str:
    """What a grabber (:data:`LISTING_GRABBERS`) would hand on if it ran now, as text: Nipype runs
    one on every run (``always_run``), so a file added since the last run that its pattern matches
    reaches its consumers; Sea's journal must not take them as done. ``''`` for other nodes, and
    where it cannot be told before the run (an input another node gives it)."""
    if interface_name(node) not in LISTING_GRABBERS or is_mapnode(node) or node.overwrite is False:
        return ""
    try:
        return repr(sorted(node.interface._list_outputs().items()))
    except Exception:  # noqa: BLE001 - an input not known yet, no file matching: the run says so
        return ""


def inputs_set(node) -> str:
    """The inputs the node has before the run (set, or given it by the iterables of the nodes
    Nipype removed), with their hashes, as text: two nodes in one directory that differ here are
    different nodes (iterable values Nipype names alike)."""
    specs = [node.inputs] + ([node._interface.inputs] if is_mapnode(node) else [])  # a MapNode keeps the rest in its interface's
    try:
        return repr([spec.get_hashval(hash_method="content")[0] for spec in specs])
    except Exception:  # noqa: BLE001 - one Nipype cannot hash: as if different
        return f"unhashable {os.urandom(8).hex()}"


def paths_read(result) -> list[str]:
    """The absolute paths among the inputs a node ran with (its ``InterfaceResult.inputs``)."""
    return paths_named(getattr(result, "inputs", None) or {})


def paths_given(result) -> list[str]:
    """The absolute paths among a node's outputs (its ``InterfaceResult.outputs``): what its
    consumers will read, which may be in its producers' directories (``Merge`` hands them on)."""
    outputs = getattr(result, "outputs", None)
    if outputs is None:
        return []
    from traits.api import HasTraits

    return paths_named(outputs.get() if isinstance(outputs, HasTraits) else dict(vars(outputs)))  # a MapNode's: a Bunch


def declared_memory(node) -> int:
    """The bytes of memory a node (a MapNode: each of its sub-nodes) declares: its ``mem_gb``, in
    MultiProc's GB (2**30 bytes; Nipype's default is 0.2)."""
    return int(float(getattr(node, "mem_gb", 0) or 0) * 2**30)


def interface_name(node) -> str:
    return type(node.interface).__name__


def is_mapnode(node) -> bool:
    return isinstance(node, MapNode)


def sink_base_directory(node) -> Path | None:
    """Where a DataSink delivers: a relative ``base_directory`` is in the sink's own directory, as
    the DataSink resolves it when it runs there (not in the directory the run was started from)."""
    value = getattr(node.inputs, "base_directory", None)
    if isinstance(value, str) and value:
        return (Path(node.output_dir()) / value).resolve()
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


def point_at_home(node, home: Path, key: str) -> None:
    """``node`` (about to be saved in its crash file) names its directory and where it reads its
    inputs in the home, not on a tier (:func:`read_inputs_from`, :func:`set_run_dir`): Sea brings
    them home for ``nipypecli crash -r``. A path on a tier is one under a ``sea-*`` private directory."""
    from sea.tiers import key_in_private_dir

    node._output_dir = str(Path(home) / key)
    for field, (result, out) in list(node.input_source.items()):
        producer = key_in_private_dir(Path(result).parent)
        if producer is not None:
            node.input_source[field] = (str(Path(home) / producer / Path(result).name), out)


def cached_in_home(node) -> bool:
    """Nipype's own check (``_local_hash_check``) that ``node`` is done in its directory in the
    home and need not run: its hash file is there and up to date, and it is not forced to rerun."""
    try:
        cached, updated = node.is_cached()
    except Exception:  # noqa: BLE001 - Nipype forces a rerun when it cannot check
        return False
    overwrite, always_run = node.overwrite, node.interface.always_run
    return cached and updated and (overwrite is False or (overwrite is None and not always_run))


def workflow_report_files(graph, home: Path) -> list[Path]:
    """The files ``Workflow.run`` wrote in the home beside the node directories before the plugin
    ran (``execution.create_report``: ``<base_dir>/<workflow>/index.html``, ``d3.js``, ``graph*.json``)."""
    names = {Path(node.output_dir()).relative_to(home).parts[0] for node in graph.nodes() if Path(node.output_dir()).is_relative_to(home)}
    return [p for name in names for p in (home / name).glob("*") if p.suffix in (".html", ".js", ".json") and p.is_file()]


def record_files(directory: Path) -> list[Path]:
    """What Nipype records of a node in its directory (:mod:`sea.records`): its result file."""
    return sorted(Path(directory).glob("result_*.pklz"))


def read_results_from_records() -> None:
    """``Node.result`` (``Workflow.run`` returns the graph: users read each node's result) falls back
    to Sea's records (:mod:`sea.records`) when the node's directory is not in the home: Sea evicted
    it. The record's paths are rewritten for the home first, as a checkpoint's are."""
    from nipype.pipeline.engine.nodes import Node

    from sea import records

    if getattr(Node.result.fget, "_sea", False):
        return
    original = Node.result.fget

    def result(self):
        try:
            return original(self)
        except FileNotFoundError:
            path = Path(self.output_dir()) / f"result_{self.name}.pklz"
            found = records.load(path)
            if found is None:
                raise
            home, data, made_under = found
            return result_from_record(data, {Path(d): home for d in made_under})

    result._sea = True
    result.__doc__ = original.__doc__
    Node.result = property(result)


def relocate_results(directory: Path, moves: dict[Path, Path]) -> list[str]:
    """A node directory (and the sub-node directories in it) made under the old paths of ``moves``
    (old directory -> new directory) is now at ``directory``: rewrite the paths its ``result_*.pklz``
    files give (Nipype saves them absolute unless ``use_relative_paths``) and its links point at.
    Returns the new paths written (they may name other nodes' directories)."""
    moved = _mover(moves)
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

    written: list[str] = []
    for path in result_files:
        header, result, loader, new = _read_unvalidated(Path(path).read_bytes(), rewrite)
        if not new:
            continue
        written += new
        buffer = io.BytesIO()
        _StatesKept(buffer, loader.states).dump(result)
        tmp = Path(path).with_name(f".{Path(path).name}.relocating")
        with open(tmp, "wb") as fh:
            fh.write(gzip.compress(header + buffer.getvalue()))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    return written


def _read_unvalidated(data: bytes, rewrite) -> tuple[bytes, object, _Unvalidated, list[str]]:
    """A result file's bytes read without validating its traited objects (:class:`_Unvalidated`),
    the path strings its outputs give rewritten with ``rewrite``: (its versioning header, the
    result, the loader holding the traited objects' states, the new paths)."""
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

    data = gzip.decompress(data)
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
    if id(outputs) in states:
        states[id(outputs)] = moved(states[id(outputs)])
    elif outputs is not None:
        outputs.__dict__.update(moved(dict(outputs.__dict__)))  # a MapNode's outputs: a Bunch
    return header, result, loader, written


def result_from_record(data: bytes, moves: dict[Path, Path]):
    """The ``InterfaceResult`` a result file's bytes hold, its outputs' paths moved by ``moves``
    (old directory -> new one), its traits set without validation: the files a record of an evicted
    node names exist no more (``load_resultfile`` would refuse an output ``File(exists=True)``)."""
    return _built(data, _mover(moves))


def _mover(moves: dict[Path, Path]):
    """A path rewriter: under an old directory of ``moves``, the longest first, to its new one."""
    prefixes = sorted(((str(old), str(new)) for old, new in moves.items()), key=lambda pair: -len(pair[0]))

    def moved(path: str) -> str:
        for old, new in prefixes:
            if path == old or path.startswith(old + os.sep):
                return new + path[len(old) :]
        return path

    return moved


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
        self.objects: dict[int, object] = {}

    def _build(self):
        from traits.api import HasTraits

        state = self.stack.pop()
        if isinstance(self.stack[-1], HasTraits):
            self.states[id(self.stack[-1])] = state
            self.objects[id(self.stack[-1])] = self.stack[-1]
            return
        self.stack.append(state)
        pickle._Unpickler.load_build(self)

    dispatch[pickle.BUILD[0]] = _build


# ------------------------------------------------------------------------- plugin hooks
REQUEUE = {"requeue": True}  # what _get_result returns for a task whose job goes back to the ready queue


class _IncrementalLoop:
    """Nipype's ``DistributedPluginBase.run`` with its bookkeeping kept per job, so that a round
    costs what happened in it, not the size of the graph.

    Nipype's loop finds ready jobs by summing a dependency matrix each round and clears a sparse
    row per finished job (MultiProc adds a scan of every job and ``gc.collect()`` per round): at
    2,000 nodes that cost more than the nodes. Here each job keeps how many producers it still
    waits for and its consumers; a finished job counts its consumers down and those that reach zero
    go into the adapter's ready queue (:meth:`ready_queue`, a heap in the core's order). A round
    settles the tasks that ended, then starts ready jobs (``_start_ready``, the subclass's); it
    waits for a task to end (``wake``), ``poll_sleep_duration`` at most. The attributes Nipype's
    helpers use (``procs``, ``proc_done``, ``proc_pending``, ``pending_tasks``, ``mapnodes``,
    ``mapnodesubids``) keep their meaning.
    """

    def _init_loop(self) -> None:
        self._wake = threading.Event()
        self._poll_timeout = 2.0
        self.stop_request = StopRequest(self.wake)  # a stop signal raises at the start of the next round
        self.loop_seconds = 0.0  # the last run's loop, of which ...
        self.waited_seconds = 0.0  # ... waiting for a task to end: the rest is this process's work

    # for subclasses -----------------------------------------------------------
    def ready_queue(self) -> ReadyQueue:
        """The queue ready jobs wait in, best first (called once the run's jobs are known);
        by default Nipype's order (topological)."""
        return ReadyQueue(lambda key: (int(key),))

    def ready_key(self, jobid: int) -> str:
        """The key ``ready_queue`` ranks ``jobid`` by."""
        return str(jobid)

    def wake(self) -> None:
        self._wake.set()

    def make_ready(self, jobid: int) -> None:
        self._ready.push(jobid, self.ready_key(jobid))

    def before_submitting(self) -> None:
        """Called once per round of the loop, before ready jobs start."""

    def task_done(self, taskid) -> bool:
        """Whether the task ended (its result can be collected without waiting)."""
        return False

    def _start_ready(self, graph, updatehash) -> list[dict]:
        raise NotImplementedError

    # the loop -------------------------------------------------------------------
    def run(self, graph, config, updatehash=False):
        """``DistributedPluginBase.run``'s contract: run every job, then raise the first error."""
        self._run_errors = []
        self._config = config
        self._poll_timeout = float(config["execution"]["poll_sleep_duration"])
        logger.info("Running in parallel.")
        self._prerun_check(graph)
        self._make_jobs(graph)
        notrun: list[dict] = []
        self.waited_seconds = 0.0
        gc.collect()  # what exists before the run is never garbage of it: leave it out of collections
        gc.freeze()
        start = time.perf_counter()
        try:
            while True:
                self.stop_request.raise_if_requested()
                self._wake.clear()
                notrun += self._settle_ended(graph)
                self.before_submitting()
                if len(self.pending_tasks) < self.max_jobs:
                    notrun += self._start_ready(graph, updatehash)
                if not self.pending_tasks and not self._ready:
                    break
                if not self.pending_tasks or not any(self.task_done(taskid) for taskid, _ in self.pending_tasks):
                    # nothing ended yet; or nothing runs and the adapter holds every ready job (it wakes the loop)
                    waited = time.perf_counter()
                    self._wake.wait(self._poll_timeout)
                    self.waited_seconds += time.perf_counter() - waited
        finally:
            gc.unfreeze()
            self.loop_seconds = time.perf_counter() - start
        report_nodes_not_run(notrun)
        self._postrun_check()
        if self._run_errors:  # as Nipype: the first error, or how many there were with the first as cause
            error, cause = self._run_errors[0], None
            if isinstance(error, (str, list)):
                error = RuntimeError(error)
            if len(self._run_errors) > 1:
                error, cause = RuntimeError(f"{len(self._run_errors)} raised. Re-raising first."), error
            raise error from cause

    def _make_jobs(self, graph) -> None:
        self.procs, _ = topological_sort(graph)
        self._jobid = {node: jobid for jobid, node in enumerate(self.procs)}
        self._consumers = [[self._jobid[c] for c in graph.successors(node)] for node in self.procs]
        self._waiting = [graph.in_degree(node) for node in self.procs]  # producers not finished yet
        self.proc_done = [False] * len(self.procs)  # Nipype's meaning: started (or settled)
        self.proc_pending = [False] * len(self.procs)  # ... and not ended
        self.pending_tasks = []
        self.mapnodes, self.mapnodesubids = [], {}
        self._ready = self.ready_queue()
        for jobid, waiting in enumerate(self._waiting):
            if not waiting:
                self.make_ready(jobid)

    def _settle_ended(self, graph) -> list[dict]:
        """Settle the tasks that ended (the body of Nipype's loop)."""
        notrun, running = [], []
        for taskid, jobid in self.pending_tasks:
            try:
                result = self._get_result(taskid)
            except Exception as exc:
                notrun.append(self._clean_queue(jobid, graph))
                self._run_errors.append(exc)
                continue
            if result is REQUEUE:  # to run again, when the loop starts it
                self._clear_task(taskid)
                self.proc_done[jobid] = self.proc_pending[jobid] = False
                self.make_ready(jobid)
                continue
            if not result:
                running.append((taskid, jobid))
                continue
            if result["traceback"]:
                notrun.append(self._clean_queue(jobid, graph, result=result))
                self._run_errors.append("".join(result["traceback"]))
            else:
                self._task_finished_cb(jobid)
            self._clear_task(taskid)
        self.pending_tasks[:] = running
        return notrun

    def _count_down(self, jobid: int) -> None:
        """``jobid`` finished: its consumers wait for one producer less."""
        self.proc_pending[jobid] = False
        for consumer in self._consumers[jobid]:
            self._waiting[consumer] -= 1
            if not self._waiting[consumer] and not self.proc_done[consumer]:
                self.make_ready(consumer)

    def _remove_node_deps(self, jobid, crashfile, graph):
        """Nipype's, with each dependent's job found in a dict (Nipype searches the job list)."""
        import networkx as nx

        dependents = list(nx.dfs_preorder_nodes(graph, self.procs[jobid]))
        for node in dependents:
            self.proc_done[self._jobid[node]] = True
            self.proc_pending[self._jobid[node]] = False
        return dict(node=self.procs[jobid], dependents=dependents, crashfile=crashfile)

    def _remove_node_dirs(self):
        """Sea evicts node directories itself, once their consumers finished and flushes committed."""


class EventedMultiProc(_IncrementalLoop, MultiProcPlugin):
    """MultiProc's scheduling with its private hooks turned into events for an adapter, in
    :class:`_IncrementalLoop`. It keeps what MultiProc does: ``n_procs``, ``memory_gb``,
    ``n_gpu_procs``, ``max_jobs`` (read before each round), ``raise_insufficient`` (MultiProc's
    ``_prerun_check``), the hash check before a job starts, ``run_without_submitting`` and
    ``updatehash`` jobs run in this process, MapNodes expanded into sub-node jobs, crash files,
    ``stop_on_first_crash``, the status callback and its log lines.

    Subclasses implement ``ready_queue`` and ``ready_key`` (the order), ``admit_job``,
    ``prepare_job``, ``prepare_node``, ``retry_node``, ``job_finished`` and ``job_failed``; they
    call ``skip_job`` to mark a job done without running it and ``make_ready`` to queue a job they
    held back.
    """

    def __init__(self, plugin_args=None):
        super().__init__(plugin_args=plugin_args)
        self._init_loop()
        self._submitted: dict[int, tuple[object, bool]] = {}
        self._result = None  # the result _get_result just returned, for the _task_finished_cb that follows
        self._memory = None  # ... and the most memory its node held (run_measured)
        self.pool.shutdown(wait=False)  # MultiProc's, which started no process yet: ours marks its workers
        self._new_pool()

    def _new_pool(self) -> None:
        """MultiProc's pool, its workers the OOM killer's first choice over the loop (:func:`_worker_init`)."""
        context = multiprocessing.get_context(self.plugin_args.get("mp_context"))
        self.pool = ProcessPoolExecutor(max_workers=self.processors, initializer=_worker_init, initargs=(self._cwd,), mp_context=context)

    def _usable_pool(self):
        """The pool, replaced by a new one if a worker process died (a broken pool takes no task)."""
        if getattr(self.pool, "_broken", False):
            logger.warning("[MultiProc] a worker process died (killed by the OOM killer?); starting new worker processes")
            self.pool.shutdown(wait=True, cancel_futures=True)  # its processes gone, and their memory with them
            self._new_pool()
        return self.pool

    # events (defaults: every job runs) --------------------------------------------
    def admit_job(self, jobid: int) -> bool:
        """``jobid`` is next to start: return False to leave it out (the subclass skipped it, or
        holds it back and queues it again with :meth:`make_ready`)."""
        return True

    def may_start(self, jobid: int) -> bool:
        """Whether ``jobid`` may start now: a job held back waits for the next round. An adapter
        that holds a job while nothing runs must :meth:`wake` the loop when it may start."""
        return True

    def max_running(self) -> int | None:
        """The most jobs to run at once, if fewer than the resources allow."""
        return None

    def prepare_job(self, jobid: int) -> bool:
        """About to run ``jobid`` (it fits the resources). Return True when the adapter knows nothing
        of it can be cached (Nipype's own hash check, on the shared filesystem, is then skipped)."""
        return False

    def prepare_node(self, node) -> None:
        """``node`` is the copy about to be sent to a worker process."""

    def retry_node(self, node, traceback_text: str) -> bool:
        """Return True to resubmit the (re-prepared) copy instead of reporting the failure."""
        return False

    def rerun_lost(self, node) -> bool:
        """``node``'s worker process died under it (the OOM killer): return True to queue its job
        again (it starts as any ready job, within :meth:`max_running`) instead of reporting it."""
        return False

    def job_finished(self, node, cached: bool, result=None, memory: int | None = None) -> None:
        """``result``: the ``InterfaceResult`` the worker process sent back (``None`` for a node
        found cached, or run in this process); ``memory``: the most it held there (:func:`run_measured`)."""

    def job_failed(self, node) -> None: ...

    def view_of(self, node):
        """How the node, about to be submitted, sees the home (:class:`sea.view.View`), or ``None``."""
        return None

    def view_refused(self, reason: str) -> None: ...

    # helpers for subclasses ---------------------------------------------------
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

    # a round --------------------------------------------------------------------
    def _make_jobs(self, graph) -> None:
        self._expanded: set[int] = set()
        self._stats = None
        super()._make_jobs(graph)

    def task_done(self, taskid) -> bool:
        return taskid in self._taskresult

    def _start_ready(self, graph, updatehash) -> list[dict]:
        """Start ready jobs, best first, while they fit (MultiProc's ``_send_procs_to_workers``).
        A job that does not fit waits for the next round; when nothing runs, the next job fits
        (MultiProc clamps each job's needs to the totals)."""
        free_gb, free_th, free_gpu = self._check_resources(self.pending_tasks)
        self._log_resources(free_gb, free_th, free_gpu)
        notrun, held = [], []
        cap = self.max_running() or len(self.procs)
        try:
            while self._ready:
                if self.pending_tasks and (free_gb < 0.01 or free_th <= 0 or len(self.pending_tasks) >= cap):
                    break
                jobid = self._ready.pop()
                if self.proc_done[jobid] or not self.admit_job(jobid):
                    continue
                node = self.procs[jobid]
                if isinstance(node, MapNode) and jobid not in self._expanded:
                    try:
                        expand = node.num_subnodes() > 1
                    except Exception:
                        traceback = format_exception(*sys.exc_info())
                        self._run_errors.append(traceback)  # MultiProc writes the crash file, but its run returns
                        notrun.append(self._clean_queue(jobid, graph, result={"result": None, "traceback": traceback}))
                        self.proc_pending[jobid] = False
                        continue
                    if expand:
                        self._expand_mapnode(jobid)
                        continue
                gb = min(getattr(node, "mem_gb_runtime", node.mem_gb), self.memory_gb)
                th = min(node.n_procs, self.processors)
                gpu = node.is_gpu_node()
                gpu_th = min(node.n_procs, self.n_gpu_procs) if gpu else 0
                if (self.pending_tasks and (th > free_th or gb > free_gb or gpu_th > free_gpu)) or not self.may_start(jobid):
                    held.append(jobid)
                    if len(held) > HELD_PER_ROUND:
                        break  # the best jobs wait: no need to ask the whole queue this round
                    continue
                self.proc_done[jobid] = True
                self.proc_pending[jobid] = True
                if self._local_hash_check(jobid, graph):
                    continue  # found cached: finished already
                if node.run_without_submitting or (updatehash and self._stale_hash(node)):
                    notrun += self._run_here(jobid, graph, updatehash)
                    continue
                free_gb, free_th, free_gpu = free_gb - gb, free_th - th, free_gpu - gpu_th
                if self._status_callback:
                    self._status_callback(node, "start")
                self.pending_tasks.insert(0, (self._submit_job(deepcopy(node), updatehash=updatehash), jobid))
                self._stats = None
        finally:
            for jobid in held:
                self.make_ready(jobid)
        return notrun

    @staticmethod
    def _stale_hash(node) -> bool:
        cached, updated = node.is_cached()
        return cached and not updated

    def _run_here(self, jobid: int, graph, updatehash: bool) -> list[dict]:
        """A ``run_without_submitting`` job (or one whose hash is only updated), in this process."""
        logger.debug("Running node %s on master thread", self.procs[jobid])
        try:
            self.procs[jobid].run(updatehash=updatehash)
        except Exception:
            traceback = format_exception(*sys.exc_info())
            self._run_errors.append(traceback)
            return [self._clean_queue(jobid, graph, result={"result": None, "traceback": traceback})]
        self._task_finished_cb(jobid)
        self._stats = None
        return []

    def _expand_mapnode(self, jobid: int) -> None:
        """A MapNode's sub-nodes become jobs of their own, ready now; the MapNode waits for them
        (then runs, collecting their results)."""
        self._expanded.add(jobid)
        self.mapnodes.append(jobid)
        subnodes = list(self.procs[jobid].get_subnodes())
        logger.debug("Adding %d jobs for mapnode %s", len(subnodes), self.procs[jobid])
        first = len(self.procs)
        self.procs.extend(subnodes)
        for subid in range(first, len(self.procs)):
            self.mapnodesubids[subid] = jobid
            self.proc_done.append(False)
            self.proc_pending.append(False)
            self._waiting.append(0)
            self._consumers.append([jobid])
        self._waiting[jobid] = len(subnodes)
        for subid in range(first, len(self.procs)):
            self.make_ready(subid)

    def _log_resources(self, free_gb: float, free_th: int, free_gpu: int) -> None:
        """MultiProc's line on what runs and what is free, when it changed."""
        stats = (len(self.pending_tasks), len(self._ready), free_gb, free_th, free_gpu)
        if stats == self._stats:
            return
        self._stats = stats
        running = ""
        if self.pending_tasks and logger.isEnabledFor(logging.INFO):
            running = "\n" + " " * 21 + "Currently running:\n" + "\n".join(" " * 21 + f"  * {self.procs[j].fullname}" for _, j in self.pending_tasks)
        logger.info(
            "[MultiProc] Running %d tasks, and %d jobs ready. Free memory (GB): %0.2f/%0.2f, Free processors: %d/%d, Free GPU slot:%d/%d.%s",
            len(self.pending_tasks), len(self._ready), free_gb, self.memory_gb, free_th, self.processors, free_gpu, self.n_gpu_procs, running,
        )  # fmt: skip

    # Nipype's private hooks ----------------------------------------------------
    def _local_hash_check(self, jobid, graph):
        if self.prepare_job(jobid):
            return False
        return super()._local_hash_check(jobid, graph)

    def _submit_job(self, node, updatehash=False):
        """MultiProc's, with the node run by :func:`run_measured`, and its future recorded before
        the callback is attached (MultiProc attaches it first: a task that failed at once ran the
        callback when its future could not be found yet)."""
        self.prepare_node(node)
        self._taskid += 1
        taskid = self._taskid
        if getattr(node.interface, "terminal_output", "") == "stream":  # as MultiProc: no streaming outputs
            node.interface.terminal_output = "allatonce"
        self._submitted[taskid] = (node, updatehash)
        self._task_obj[taskid] = future = self._usable_pool().submit(run_measured, node, updatehash, taskid, self.view_of(node))
        future.add_done_callback(self._async_callback)
        logger.debug("[MultiProc] Submitted task %s (taskid=%d).", node.fullname, taskid)
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
        self._memory = result.get(MEASURED) if result else None
        if result and result.get(VIEW_REFUSED):
            self.view_refused(result[VIEW_REFUSED])
        if result and result.get("traceback") and taskid in self._submitted:
            node, updatehash = self._submitted[taskid]
            text = "".join(result["traceback"])
            if lost_worker(text) and self.rerun_lost(node):
                del self._taskresult[taskid]
                return REQUEUE
            if self.retry_node(node, text):
                del self._taskresult[taskid]
                future = self._usable_pool().submit(run_measured, node, updatehash, taskid, self.view_of(node))
                self._task_obj[taskid] = future
                future.add_done_callback(self._async_callback)
                return None
        return result

    def _clear_task(self, taskid):
        super()._clear_task(taskid)
        self._submitted.pop(taskid, None)

    def _task_finished_cb(self, jobid, cached=False):
        """Nipype's (its log line, the status callback), then the consumers count it down."""
        logger.info("[Job %d] %s (%s).", jobid, "Cached" if cached else "Completed", self.procs[jobid])
        if self._status_callback:
            self._status_callback(self.procs[jobid], "end")
        result, self._result = (None if cached else self._result), None
        memory, self._memory = (None if cached else self._memory), None
        self.job_finished(self.procs[jobid], cached, result, memory)  # MapNode sub-nodes too (jobid in mapnodesubids)
        self._count_down(jobid)

    def _clean_queue(self, jobid, graph, result=None):
        self.job_failed(self.procs[self.mapnodesubids.get(jobid, jobid)])
        return super()._clean_queue(jobid, graph, result=result)


MEASURED = "sea_memory"  # the key run_measured adds to run_node's result


VIEW_REFUSED = "sea_view_refused"  # ... and, when the node could not be shown its view, why


def run_measured(node, updatehash, taskid, view=None) -> dict:
    """MultiProc's ``run_node``, in the worker process, with the most memory the node held there
    (:class:`sea.memory.JobPeak`) in its result under :data:`MEASURED`; in its ``view``
    (:class:`sea.view.View`) when one is given and this process may make it."""
    with JobPeak() as peak:
        refused = view and (sea_view.enter() or _run_in_view(node, updatehash, taskid, view))
        result = run_node(node, updatehash, taskid) if view is None or isinstance(refused, str) else refused
    if isinstance(refused, str):
        result[VIEW_REFUSED] = refused
    result[MEASURED] = peak.bytes
    return result


def _run_in_view(node, updatehash, taskid, view) -> dict | str:
    """``run_node`` at the node's path in the home (see :mod:`sea.view`): its inputs name its
    producers' and its prefetched copies' paths as the home names them, its hash is Nipype's own
    for those paths (as MultiProc computes it), and what it hands on names their real paths again.
    The reason, if the view could not be made."""
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(view.mounted())
        except OSError as e:
            return f"a node's view could not be mounted ({e.strerror or e})"
        node._get_inputs()
        if _rewrite_inputs(node, view.to_logical):
            node._hashvalue = node._hashed_inputs = None  # taken again, with the paths the node sees
        node._output_dir = str(view.logical)
        stack.enter_context(_bound_directory_not_removed_quietly(str(view.logical)))
        result = run_node(node, updatehash, taskid)
    _rewrite_results(Path(view.physical).glob("result_*.pklz"), view.to_physical)
    if result.get("result") is not None:
        # what it hands on, as its result file now says (a re-pickled copy of the result in memory
        # lost the outputs of some nodes: the core saw no path given, and kept no reader's input)
        saved = Path(view.physical) / f"result_{node.name}.pklz"
        result["result"] = _loadpkl(saved) if saved.is_file() else _rewritten(result["result"], view.to_physical)
    return result


@contextlib.contextmanager
def _bound_directory_not_removed_quietly(directory: str):
    """Nipype empties a node's directory before it runs it (``nipype.utils.filemanip.emptydirs``),
    and removes the directory itself when it is already empty: in the view the directory is a bind
    mount (``EBUSY``), and Nipype warns for every node "An exception was raised trying to remove old
    <dir>, but the path seems empty. Is it an NFS mount?". Nothing is amiss (the directory is empty,
    as Nipype wanted): that one warning, for that directory, is not shown."""
    import logging

    def shown(record: logging.LogRecord) -> bool:
        return not (record.msg.startswith("An exception was raised trying to remove old") and record.args and record.args[0] == directory)

    log = logging.getLogger("nipype.utils")
    log.addFilter(shown)
    try:
        yield
    finally:
        log.removeFilter(shown)


def _rewrite_inputs(node, rewrite, linked_too: bool = True) -> int:
    """Rewrite with ``rewrite`` the path strings the node's inputs name (not those of inputs whose
    files the interface links into its directory, ``copyfile=False``, unless ``linked_too``);
    the number of inputs changed."""
    def swapped(value):
        if isinstance(value, str):
            return rewrite(value)
        if isinstance(value, (list, tuple)):
            return type(value)(swapped(v) for v in value)
        return value

    changed = 0
    traits = node.inputs.traits()
    for name, value in node.inputs.get().items():
        if not linked_too and traits[name].copyfile is False:
            continue
        new = swapped(value)
        if new != value:
            setattr(node.inputs, name, new)
            changed += 1
    return changed


def _loadpkl(path: Path):
    from nipype.pipeline.engine.utils import loadpkl

    return loadpkl(path)


def _rewritten(result, rewrite):
    """An ``InterfaceResult`` with the paths its outputs give rewritten (as :func:`_rewrite_results`)."""
    import gzip

    return _built(gzip.compress(pickle.dumps(result)), rewrite)


def _built(data: bytes, rewrite):
    """The ``InterfaceResult`` a result file's bytes hold, its outputs' paths rewritten with
    ``rewrite``, its traits set without validation."""
    _, result, loader, _ = _read_unvalidated(data, rewrite)
    for key, state in loader.states.items():
        loader.objects[key].__dict__.update(state)  # a traited object's values live in its __dict__
    return result


def _worker_init(cwd) -> None:
    """MultiProc's ``process_initializer``; then the process offers itself to the OOM killer first,
    so that a job past its memory loses a worker (whose node runs again), not the whole run, and
    dies when the pool terminates it."""
    process_initializer(cwd)
    offer_to_oom_killer()
    die_on_terminate()


def lost_worker(traceback_text: str) -> bool:
    """Whether a task failed because its worker process died (not because its node raised)."""
    return "BrokenProcessPool" in traceback_text


class EventedTaskLoop(_IncrementalLoop, DistributedPluginBase):
    """The loop of Nipype's distributed plugins (as its SGE and SLURM plugins use), in
    :class:`_IncrementalLoop`, with every ready node submitted as one task, MapNodes included (they
    run their sub-nodes in their own directory, where the task runs), in the adapter's order, and
    no check in this process: the client may not see the workers' storage, so the task itself asks
    Nipype's cache check.

    Subclasses implement ``ready_queue``/``ready_key``, ``_submit_job``, ``_get_result``,
    ``task_done``, ``job_finished`` and ``job_failed``, and call ``wake`` when a task ends.
    """

    def __init__(self, plugin_args=None):
        super().__init__(plugin_args=plugin_args)
        self._init_loop()

    def job_finished(self, node) -> None: ...

    def job_failed(self, node) -> None: ...

    def requeue(self, jobids: list[int]) -> None:
        """Run these jobs again (their results were lost): not done, not running, and every
        consumer that has not finished waits for them again."""
        again = set(jobids)
        self.pending_tasks[:] = [(taskid, jobid) for taskid, jobid in self.pending_tasks if jobid not in again]
        counted = [j for j in again if self.proc_done[j] and not self.proc_pending[j]]  # finished: counted down
        waiting_again = {c for j in counted for c in self._consumers[j] if c in again or not (self.proc_done[c] and not self.proc_pending[c])}
        for jobid in again:
            self.proc_done[jobid] = False
            self.proc_pending[jobid] = False
        for jobid in counted:
            for consumer in self._consumers[jobid]:
                if consumer in waiting_again:
                    self._waiting[consumer] += 1
                    self._ready.discard(consumer)
        for jobid in again:
            if not self._waiting[jobid]:
                self.make_ready(jobid)

    def _start_ready(self, graph, updatehash) -> list[dict]:
        while self._ready:
            jobid = self._ready.pop()
            if self.proc_done[jobid]:
                continue
            self.proc_done[jobid] = True
            self.proc_pending[jobid] = True
            if self._status_callback:
                self._status_callback(self.procs[jobid], "start")
            taskid = self._submit_job(deepcopy(self.procs[jobid]), updatehash=updatehash)
            self.pending_tasks.insert(0, (taskid, jobid))
        return []

    def _task_finished_cb(self, jobid, cached=False):
        """Nipype's, without its ``refidx`` bookkeeping (that matrix only serves
        ``_remove_node_dirs``: Sea evicts itself)."""
        logger.info("[Job %d] %s (%s).", jobid, "Cached" if cached else "Completed", self.procs[jobid])
        if self._status_callback:
            self._status_callback(self.procs[jobid], "end")
        self._count_down(jobid)
        self.job_finished(self.procs[jobid])

    def _clean_queue(self, jobid, graph, result=None):
        self.job_failed(self.procs[jobid])
        return super()._clean_queue(jobid, graph, result=result)
