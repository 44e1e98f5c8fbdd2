"""SeaMultiProc: Nipype's MultiProc with Sea's data placement.

``workflow.run(plugin='SeaMultiProc', plugin_args={'n_procs': 4, 'sea': 'sea.yml'})``: the same
keys as MultiProc, plus ``sea`` (a YAML path or a dict; ``$SEA_CONFIG`` when absent). Each node's
working directory runs on the fastest node-local tier with room, linked from its usual place in
``base_dir``; sinks write to a fast tier and the stager copies their outputs home in the
background; a node's directory is evicted once all its consumers finished.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import nipype

from sea import SeaConfig, SeaConfigError, SeaEngine, WorkflowGraph, console
from sea.config import Checkpoints, unknown_key
from sea.interrupt import StopSignals
from sea.memory import job_memory_limit

from . import _nipype_internals as nx_
from .graph import node_specs

logger = logging.getLogger("sea")


def check_plugin_args(plugin_args) -> dict:
    """``plugin_args`` as a dict, once every key is one MultiProc (or Sea) reads and every value is
    of the kind it needs: a typo or a wrong type fails before any node, as one line."""
    if plugin_args is None:
        return {}
    problems = _problems(plugin_args)
    if problems:
        raise problems[0]
    return dict(plugin_args)


def _problems(plugin_args) -> list[SeaConfigError]:
    if not isinstance(plugin_args, Mapping):
        return [SeaConfigError(f"plugin_args must be a dict such as {{'n_procs': 4, 'sea': 'sea.yml'}}, not {plugin_args!r}")]
    known, problems = list(nx_.MULTIPROC_ARGS), []
    for key, value in plugin_args.items():
        try:
            if key not in nx_.MULTIPROC_ARGS:
                raise unknown_key("plugin_args", key, known, valid="SeaMultiProc takes")
            nx_.MULTIPROC_ARGS[key](value, f"plugin_args[{key!r}]")
        except SeaConfigError as problem:
            problems.append(problem)
    return problems


def plugin_file_problems(plugin_args) -> list[str]:
    """What ``sea check`` says of a ``--use-plugin`` file's ``plugin_args`` for SeaMultiProc (its
    ``sea`` part aside: the core checks it), one line each: every key and value as
    :func:`check_plugin_args` checks them, and a ``memory_gb`` more than this machine (or the job's
    cgroup) has, with which MultiProc would start more than fits."""
    problems = [str(p) for p in _problems(plugin_args)]
    memory = plugin_args.get("memory_gb") if isinstance(plugin_args, Mapping) else None
    if not any("['memory_gb']" in problem for problem in problems) and memory is not None:  # the others' problems aside
        limit = job_memory_limit()
        if memory * 2**30 > limit.bytes:
            problems.append(
                f"plugin_args['memory_gb'] {memory} is more than the {limit.bytes / 2**30:.1f} GiB of memory here ({limit.source}): "
                f"MultiProc would start nodes that together do not fit; give at most {limit.bytes / 2**30:.1f} (check on the machine the job runs on)"
            )
    return problems


class SeaMultiProcPlugin(nx_.EventedMultiProc):
    """MultiProc plus Sea: accepts every MultiProc key (``n_procs``, ``memory_gb``,
    ``raise_insufficient``, ``scheduler``, ...) and ``sea``."""

    def __init__(self, plugin_args=None):
        console.attach()
        plugin_args = check_plugin_args(plugin_args)
        self.sea_config = SeaConfig.load(plugin_args.get("sea"))  # a bad config fails here, before any node
        if not nx_.nipype_version_supported():
            warnings.warn(f"SeaMultiProc is tested with nipype {'-'.join(nx_.TESTED_RANGE)}, not {nipype.__version__}", stacklevel=2)
        super().__init__(plugin_args=plugin_args)
        self.engine: SeaEngine | None = None
        self._graph = None
        self._copies: dict[str, dict[str, str]] = {}  # key -> the copies a running node reads
        self._keys: dict[int, str] = {}
        self._runs: dict[str, int] = {}  # key -> the job that runs in that directory (two may share one)
        self._done: set[str] = set()  # keys whose job finished (a second job there is its twin)
        self._failed: set[str] = set()
        self._twins: dict[str, list[int]] = {}  # key -> jobs waiting for the one running in its directory
        self.home: Path | None = None
        self.report = None

    # ------------------------------------------------------------------ run
    def run(self, graph, config, updatehash=False):
        if graph.number_of_nodes() == 0:  # MultiProc fails too (a networkx traceback)
            raise console.SeaError("the workflow has no nodes to run: add them with workflow.add_nodes([...]) or workflow.connect(...)")
        home = nx_.workflow_home(graph)
        if home is None:  # Nipype would give each node a temporary directory of its own
            home = nx_.use_temporary_home(graph)
            logger.warning("[Sea] the workflow has no base_dir: its node directories go to %s, kept after the run (set workflow.base_dir to choose)", home)
        self.home = home
        if nx_.forget_stale_links(graph, home):
            logger.warning("[Sea] links left in %s by a killed run were removed; their nodes run again", home)
        saved = nx_.run_dirs(graph)
        try:
            return self._run(graph, config, updatehash, home)
        finally:
            nx_.restore_run_dirs(saved)  # the nodes Workflow.run returns name their directories in the home

    def _run(self, graph, config, updatehash, home: Path):
        if nx_.writes_provenance(config) and self.sea_config.checkpoint_mode is not Checkpoints.ALL:
            # provenance reads every node's result after the run: keep every directory
            logger.warning("[Sea] execution.write_provenance reads every node's result after the run: node directories are kept (checkpoints: all)")
            self.sea_config = replace(self.sea_config, checkpoints=Checkpoints.ALL)
        kept = [node for node in graph.nodes() if nx_.keeps_directory(node)]
        if kept and self.sea_config.checkpoint_mode is not Checkpoints.ALL:  # Nipype is told to keep them: Sea does too
            settings = sorted({setting for node in kept for setting in nx_.keep_settings(node)})
            logger.warning(
                "[Sea] execution.%s: %d of %d node directories are kept in base_dir, as Nipype keeps them (as with checkpoints: all)",
                " and ".join(settings), len(kept), graph.number_of_nodes(),
            )  # fmt: skip
        told = self.plugin_args.get("memory_gb")  # else MultiProc's default, 90% of the machine's: the core reads the machine itself
        nx_.read_results_from_records()  # node.result on the graph Workflow.run returns, for evicted nodes
        self.engine = SeaEngine(
            self.sea_config, home, log=logger, on_event=self.wake, relocate=nx_.relocate_results,
            memory=int(told * 2**30) if told else None, records=nx_.record_files, engine_files=nx_.workflow_report_files(graph, home),
        )  # fmt: skip
        try:
            self.engine.update_graph(WorkflowGraph.from_specs(node_specs(graph, home, self.sea_config.sinks)))
        except BaseException:
            self.engine.abort()  # leave no private directory behind on the tiers
            self.shutdown_pool()
            raise
        self._graph = graph
        if self.engine.prefetching:  # the raw data each node names itself
            for node in graph.nodes():
                self.engine.expect_reads(self._node_key(node), nx_.unconnected_input_files(node))
        success = False
        stop = StopSignals().install(stop=self.stop_request)  # a batch system's SIGTERM stops the run as Ctrl-C does
        try:
            result = super().run(graph, config, updatehash=updatehash)
            success = True
            return result
        finally:
            stop.quiet()
            interrupted = stop.received is not None
            self.shutdown_pool(wait=not interrupted)  # interrupted: the running nodes run again next time
            try:
                self.report = self.engine.close(success=success, interrupted=interrupted)
            finally:
                stop.restore()

    def _node_key(self, node) -> str:
        return self.engine.key_for(nx_.logical_dir(node))

    def _job_key(self, jobid: int) -> str:
        """Keys of ready jobs are asked for every round: remember them (job ids never change)."""
        if jobid not in self._keys:
            self._keys[jobid] = self._node_key(self.node_of(jobid))
        return self._keys[jobid]

    # ------------------------------------------------------------------ events
    def ready_queue(self):
        return self.engine.ready_queue()  # the core's order: inputs on the fastest tier, then depth-first

    def ready_key(self, jobid: int) -> str:
        return self._job_key(jobid)

    def may_start(self, jobid: int) -> bool:
        return self.engine.may_start(self._job_key(jobid), running=len(self.pending_tasks))

    def admit_job(self, jobid: int) -> bool:
        key = self._job_key(jobid)
        if self._runs.setdefault(key, jobid) != jobid:  # a twin: another job has its directory
            if key in self._failed:  # ... and failed there: this one runs, as Linear would run it
                self._runs[key] = jobid
                self._failed.discard(key)
            elif key in self._done:  # the same node (its directory names its inputs): done once the other one is
                self.skip_job(jobid)
                return False
            else:  # ... still running: it waits for it
                self._twins.setdefault(key, []).append(jobid)
                return False
        if self.engine.is_skipped(key):
            self.skip_job(jobid)
            return False
        if nx_.is_mapnode(self.node_of(jobid)) and key in self.engine.graph:
            nx_.read_inputs_from(self.node_of(jobid), self._physical_dir)  # read before the hash check
            if self.engine.is_fresh(key):  # its sub-nodes and report are written inside it
                self.engine.place(key)  # (one with a directory in the home reruns in it, as under MultiProc)
        return True

    def prepare_job(self, jobid: int) -> bool:
        key, node = self._job_key(jobid), self.node_of(jobid)
        nx_.read_inputs_from(node, self._physical_dir)
        if not self.engine.is_fresh(key) or nx_.is_mapnode(node):
            return False
        # Nothing of it in the home: place it now, without a link there, and let Nipype's checks in
        # this process look at its real directory; consumers are pointed there too.
        placement = self.engine.place(key, link=False)
        nx_.set_run_dir(node, placement.physical)
        return True

    def _physical_dir(self, logical: Path) -> Path | None:
        try:
            return self.engine.physical_dir(self.engine.key_for(logical))
        except ValueError:
            return None

    def prepare_node(self, node) -> None:
        nx_.read_inputs_from(node, self._physical_dir)
        key = self._node_key(node)
        placement = self.engine.place(key)  # a MapNode's sub-node becomes a part of it
        nx_.set_run_dir(node, placement.physical)
        if placement.staging is not None:
            nx_.redirect_sink(node, placement.staging)
        copies = self.engine.prefetched(key)  # its input files, copied ahead to a tier
        if nx_.read_copies(node, copies):
            self._copies[key] = copies

    def view_of(self, node):
        key = self._node_key(node)
        return self.engine.view(key, self._copies.get(key))

    def view_refused(self, reason: str) -> None:
        self.engine.view_refused(reason)

    def max_running(self) -> int | None:
        return self.engine.concurrency_cap

    def rerun_lost(self, node) -> bool:
        if self.stop_request.signum is not None:  # a stop signal to the process group took its process: the run stops
            return False
        return self.engine.worker_lost(self._node_key(node), running=len(self.pending_tasks))

    def retry_node(self, node, traceback_text: str) -> bool:
        key = self._node_key(node)
        placement = self.engine.retry_elsewhere(key, traceback_text)
        if placement is None:
            return False
        if copies := self._copies.pop(key, None):  # it reruns on the original files (one it could not replace, say)
            nx_.read_originals(node, copies)
        nx_.set_run_dir(node, placement.physical)
        spec = self.engine.graph.nodes.get(key)  # None: a MapNode's sub-node
        destination = placement.staging or (spec.sink_destination if spec is not None else None)  # placed home now: its own
        if destination is not None:
            nx_.redirect_sink(node, destination)
        return True

    def job_finished(self, node, cached: bool, result=None, memory: int | None = None) -> None:
        key = self._node_key(node)
        if key in self._done:  # a twin, done when the other one was
            return
        self._done.add(key)
        for twin in self._twins.pop(key, []):
            self.skip_job(twin)
        copies = self._copies.pop(key, {})
        if copies:  # before its consumers read its outputs, and before the copies go
            nx_.restore_originals(self._physical_dir(nx_.logical_dir(node)) or nx_.logical_dir(node), copies)
        if self.engine.prefetching and not self.engine.is_skipped(key):
            self._expect_reads_after(node, key)
        if self.engine.is_skipped(key):
            self.engine.node_skipped(key)
        elif cached:
            self.engine.node_cached(key)
        else:
            originals = {copy: original for original, copy in copies.items()}
            self.engine.node_finished(key, reads=[originals.get(p, p) for p in nx_.paths_read(result)], gives=nx_.paths_given(result), memory=memory)

    def _expect_reads_after(self, node, key: str) -> None:
        """A data grabber (or any node) finished: the shared files it hands its consumers are
        copied ahead of them."""
        if node not in self._graph:  # a MapNode's sub-node: its MapNode hands on its outputs
            return
        directory = self._physical_dir(nx_.logical_dir(node)) or nx_.logical_dir(node)
        for consumer, connections in nx_.consumers_with_connections(self._graph, node):
            files = nx_.connected_output_files(directory, connections, consumer)
            if files:
                self.engine.expect_reads(self._node_key(consumer), files)

    def job_failed(self, node) -> None:
        key = self._node_key(node)
        self._failed.add(key)
        for twin in self._twins.pop(key, []):  # one of them runs it again
            self.make_ready(twin)
        self._copies.pop(key, None)
        if key in self.engine.graph:
            self.engine.node_failed(key)  # its directory and its producers' come home: its crash file names them
            nx_.point_at_home(node, self.home, key)
