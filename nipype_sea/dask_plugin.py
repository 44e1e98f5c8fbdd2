"""``workflow.run(plugin='SeaDask', plugin_args={'sea': ..., 'dask': {...}})``: Sea on Dask distributed.

Each Dask worker has its own tiers (:class:`sea.dask.node_storage.NodeStorage`, set up on every
worker); the client keeps the graph and sends each ready node to the worker that holds its inputs
(:class:`sea.dask.locality.LocalityPlanner`). A node that must run where its inputs are not gets them
first, copied worker to worker through Dask. The task (:func:`run_node_on_worker`) runs on the
worker: Nipype's cache check against the home, placement on the worker's tiers, the node, and the
worker's engine stages the declared outputs home and evicts what nobody needs any more.

Prefetch: every ready node is sent to its worker at once, where it waits in the worker's queue; as
it is sent, the client tells that worker which files it will read (its own inputs, and the files a
finished data grabber hands it), and the worker's prefetch copies them from the shared filesystem to
its tiers while the tasks queued before it run (:func:`sea.dask.node_storage.expect_reads`).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
import traceback
from collections.abc import Mapping
from pathlib import Path

from sea import SeaConfig, SeaConfigError, SeaFlushError, WorkflowGraph, console
from sea.config import unknown_key
from sea.dask.locality import LocalityPlanner
from sea.dask.node_storage import NodeStorage, close_run, current, expect_reads, finished_elsewhere, pack, plugin_name
from sea.dask.options import DaskOptions
from sea.interrupt import StopSignals
from sea.journal import Journal
from sea.lock import RunLock
from sea.ordering import ReadyQueue
from sea.progress import Progress, Snapshot
from sea.report import RunReport, announce, merge_reports
from sea.resume import sweep_partial_copies

from . import _nipype_internals as nx_
from .dask_tasks import DaskTaskLoop
from .graph import node_specs

logger = logging.getLogger("sea")

DASK_PLUGIN_ARGS = ("sea", "dask", "status_callback")
WORKER_CHECK_SECONDS = 0.5  # how often the client looks for workers lost or restarted


def run_node_on_worker(
    storage: str,
    node,
    key: str,
    fetched: dict,
    updatehash: bool,
    consumers: list[str],
    hands: dict[str, list[str]] | None = None,
    reads: tuple[list[str], int] | None = None,
) -> dict:
    """On the worker: copy in the inputs other workers hold, run ``node`` on this worker's tiers
    (those of the run's plugin, named ``storage``).
    ``consumers``: the nodes that will read its directory (not finished yet, wherever they run).
    ``hands``: consumer -> the outputs of ``node`` whose files it reads; with prefetch on here, the
    outcome's ``hands`` gives those files, for the client to tell the consumers' workers.
    ``reads``: the files it reads and its position, as the client told this worker ahead of it
    (:func:`~sea.dask.node_storage.expect_reads`, not waited for): told again here, in case that
    message comes after the node starts."""
    storage = current(storage)
    engine = storage.engine
    engine.expect_run(key, consumers)
    if reads is not None:
        engine.expect_reads(key, *reads)  # nothing new if the message came first
    for producer, (packed, source) in fetched.items():
        storage.unpack(producer, packed, source)

    def here(logical: Path) -> Path | None:
        try:
            return engine.physical_dir(engine.key_for(logical))
        except ValueError:
            return None

    def outcome(size: int = 0, traceback: list[str] | None = None, **more) -> dict:
        return {"cached": False, "size": size, "worker": storage.worker_name, "traceback": traceback, "prefetching": engine.prefetching, **more}

    nx_.read_inputs_from(node, here)
    if not engine.is_fresh(key) and nx_.cached_in_home(node):
        engine.node_cached(key)
        return {**outcome(), "cached": True}
    placement = engine.place(key, link=False)
    copies = engine.prefetched(key)  # its input files, copied ahead to this machine's tiers
    nx_.read_copies(node, copies)
    while True:
        nx_.set_run_dir(node, placement.physical)
        if placement.staging is not None:
            nx_.redirect_sink(node, placement.staging)
        try:
            node.run(updatehash=updatehash)
            break
        except Exception:  # noqa: BLE001 - reported to the client as MultiProc reports it
            text = traceback.format_exc()
            if engine.closed:
                break
            placement = engine.retry_elsewhere(key, text, link=False)
            if placement is None:
                engine.node_failed(key)
                return outcome(traceback=[text])
    if copies:  # before its consumers read its outputs, and before the copies go
        nx_.restore_originals(placement.physical, copies)
    # input data it hands on (a data grabber's): the files in node directories are not prefetched
    handed = {c: engine.shared_inputs(nx_.output_files(placement.physical, names)) for c, names in (hands or {}).items()} if engine.prefetching else {}
    engine.node_finished(key)  # does nothing if the client closed the run meanwhile
    if engine.closed:
        # the client stopped the run while the node ran: its directory was dropped, and what the
        # node wrote since (Nipype makes its directories again) goes too, up to Sea's own directory
        engine.hierarchy.remove(placement.physical)
        engine.hierarchy.close()  # Sea's private directories go too, unless something is kept there by rule
        return outcome(traceback=["the run was stopped while this node ran"])
    return outcome(size=engine.held_bytes(key), hands={c: files for c, files in handed.items() if files})


def workers_by_name(dask_scheduler=None) -> dict[str, str]:
    """On the scheduler: name -> address of every worker."""
    return {str(ws.name): address for address, ws in dask_scheduler.workers.items()}


def check_dask_plugin_args(plugin_args) -> dict:
    plugin_args = dict(plugin_args or {})
    for key in _unknown(plugin_args):
        raise unknown_key("plugin_args", key, list(DASK_PLUGIN_ARGS), valid="SeaDask takes")
    return plugin_args


def _unknown(plugin_args) -> list:
    return [key for key in plugin_args if key not in DASK_PLUGIN_ARGS]


def plugin_file_problems(plugin_args) -> list[str]:
    """What ``sea check`` says of a ``--use-plugin`` file's ``plugin_args`` for SeaDask (its ``sea``
    part aside), one line each: unknown keys, and the ``dask`` part."""
    if not isinstance(plugin_args, Mapping):
        return [f"plugin_args must be a mapping (sea, dask), not {plugin_args!r}"]
    problems = [str(unknown_key("plugin_args", key, list(DASK_PLUGIN_ARGS), valid="SeaDask takes")) for key in _unknown(plugin_args)]
    try:
        DaskOptions.load(plugin_args.get("dask"))
    except SeaConfigError as problem:
        problems.append(str(problem))
    return problems


class SeaDaskPlugin(DaskTaskLoop):
    """Nipype on Dask distributed, each worker with its own node-local tiers (see the module)."""

    def __init__(self, plugin_args=None):
        console.attach()
        plugin_args = check_dask_plugin_args(plugin_args)
        self.sea = plugin_args.get("sea")
        SeaConfig.load(self.sea)  # checked here; loaded again on each worker, where its ${VARS} are set
        self.dask = DaskOptions.load(plugin_args.get("dask"))
        super().__init__(plugin_args=plugin_args)
        self.report: RunReport | None = None
        self._keys: dict[int, str] = {}
        self.planner: LocalityPlanner | None = None
        self.prefetch = False  # tell workers what the nodes sent to them will read (see the module)
        self._hands: dict[str, dict[str, list[str]]] = {}  # node -> consumer -> the outputs whose files it reads
        self._handed: dict[str, list[str]] = {}  # node -> files finished producers handed it
        self._no_prefetch: set[str] = set()  # workers whose prefetch stopped (auto) or is off
        self._sent = itertools.count()  # nodes sent, in order: each worker runs those sent to it in that order

    def run(self, graph, config, updatehash=False):
        home = nx_.workflow_home(graph)
        if home is None:
            raise SeaConfigError("the workflow has no base_dir: set workflow.base_dir = '/path/to/work' (on the shared filesystem) before run()")
        self.home = home
        config_ = SeaConfig.load(self.sea)
        specs = node_specs(graph, home, config_.sinks)
        self.prefetch = bool(config_.prefetch.enabled)
        if self.prefetch:
            self._hands = self._read_outputs(graph)
        stop = StopSignals()
        try:
            with RunLock.acquire(home), self.dask.client() as client:  # one run per home, then as on one machine
                sweep_partial_copies(WorkflowGraph.from_specs(specs), home, logger)  # before any worker flushes
                self.client = client
                self.storage = plugin_name(self.token)  # this run's, beside other runs' on the cluster
                client.register_plugin(NodeStorage(self.sea, home, specs, relocate=nx_.relocate_results), name=self.storage)
                self._address = self._workers_now()
                self.planner = LocalityPlanner(WorkflowGraph.from_specs(specs), dict.fromkeys(self._address, 1), busy_threshold=self.dask.busy_threshold)
                self._checked = self._started = time.monotonic()
                success = False
                progress = Progress(self._progress_snapshot, config_.progress, logger).start()  # the workers' engines show none
                stop.install(stop=self.stop_request)  # SIGTERM (a batch system's) as Ctrl-C
                try:
                    result = super().run(graph, config, updatehash=updatehash)
                    success = True
                    return result
                finally:
                    stop.quiet()
                    interrupted = stop.received is not None
                    if interrupted:  # nodes not started yet never will; those running are dropped by close_run
                        client.cancel([future for _, future in self.running().values()])
                    try:
                        outcomes = client.run(close_run, self.storage, success, interrupted)
                    finally:
                        with contextlib.suppress(Exception):  # (a cluster going away)
                            client.unregister_worker_plugin(self.storage)
                        stop.restore(resend=False)
                        progress.stop()
                    self.report = merge_reports([(o["worker"], o["report"]) for o in outcomes.values()], self.planner.rows.values())
                    self.report.nodes_recomputed = self.planner.recomputed
                    self.report.success = success and not any(o["flush_error"] for o in outcomes.values())
                    self.report.save(home / config_.report, home)
                    announce(self.report, logger)
                    errors = [o["flush_error"] for o in outcomes.values() if o["flush_error"]]
                    if errors and success:
                        raise SeaFlushError(errors[0])
        finally:
            stop.resend()  # a SIGTERM: once the cluster is closed, the process ends on it, as MultiProc's does

    def _progress_snapshot(self) -> Snapshot:
        """What the driver knows: nodes done of the total and those running, by worker (the tiers
        are the workers'; each worker's figures are in the report)."""
        running = [f"{key}@{self.planner.worker_of(key)}" for key, _ in self.running().values()]
        return Snapshot(time.monotonic() - self._started, len(self.planner.done), len(self.planner.graph), False, running)

    def _read_outputs(self, graph) -> dict[str, dict[str, list[str]]]:
        """node -> consumer -> the node's outputs whose files the consumer reads (for prefetch)."""
        key = {node: str(nx_.logical_dir(node).relative_to(self.home)) for node in graph.nodes()}
        hands: dict[str, dict[str, list[str]]] = {}
        for node in graph.nodes():
            for consumer, connections in nx_.consumers_with_connections(graph, node):
                names = nx_.read_outputs(connections, consumer)
                if names:
                    hands.setdefault(key[node], {})[key[consumer]] = names
        return hands

    def _tell_reads(self, node, key: str, worker: str, position: int) -> tuple[list[str], int] | None:
        """Prefetch: tell ``worker``, which ``key`` is sent to as its ``position``-th node, the files
        the node will read; what was told (the node's task carries it too)."""
        files = nx_.unconnected_input_files(node) + self._handed.get(key, [])
        if not files or worker in self._no_prefetch:
            return None
        # a worker gone meanwhile (its job cancelled) is not told: before_submitting sees it lost
        self.client.run(expect_reads, self.storage, key, files, position, workers=[self._address[worker]], wait=False, on_error="ignore")
        return files, position

    # ------------------------------------------------------------------ workers coming and going
    def _workers_now(self) -> dict[str, str]:
        # asked of the scheduler itself: Client.scheduler_info() returns a cache that Dask's own
        # periodic refresh may replace with one listing no worker at all
        return self.client.run_on_scheduler(workers_by_name)

    def before_submitting(self) -> None:
        if time.monotonic() - self._checked < WORKER_CHECK_SECONDS:
            return
        self._checked = time.monotonic()
        now = self._workers_now()
        for name in [n for n, address in self._address.items() if now.get(n) != address]:
            self._worker_lost(name)  # gone, or restarted by its nanny with empty tiers
        for name in now:
            if self._address.get(name) != now[name]:
                self.planner.worker_joined(name)
        self._address = now

    def _worker_lost(self, name: str) -> None:
        journal = Journal.read(self.home / ".sea" / f"journal-{name.replace('/', '_')}.jsonl")
        running, again = self.planner.worker_lost(name, committed=lambda key: bool(journal.get(key) and journal[key].flushed))
        logger.warning("[Sea] worker %s was lost: %d running node(s) start again elsewhere, %d finished node(s) whose data was lost run again", name, len(running), len(again))
        jobs = {key: jobid for jobid, key in self._keys.items()}
        self.cancel([taskid for taskid, (key, _) in self.running().items() if key in running])
        self.requeue([jobs[key] for key in running | again])
        self._ready.rerank(self._ready.keys())  # the inputs the lost worker held are held no more

    # ------------------------------------------------------------------ Nipype's loop
    def _key(self, jobid: int) -> str:
        if jobid not in self._keys:
            self._keys[jobid] = str(nx_.logical_dir(self.procs[jobid]).relative_to(self.home))
        return self._keys[jobid]

    def ready_queue(self) -> ReadyQueue:
        return ReadyQueue(self.planner.rank)  # inputs held by some worker, then depth-first

    def ready_key(self, jobid: int) -> str:
        return self._key(jobid)

    def _submit_job(self, node, updatehash=False):
        key = str(nx_.logical_dir(node).relative_to(self.home))
        assignment = self.planner.assign(key)
        where = self._address[assignment.worker]
        if assignment.fetch:
            logger.info("[Sea] %s runs on %s; copying there first: %s", key, assignment.worker, ", ".join(f"{p} from {w}" for p, w in assignment.fetch.items()))
        fetched = {
            producer: self.client.submit(pack, self.storage, producer, workers=[self._address[holder]], allow_other_workers=False, pure=False)
            for producer, holder in assignment.fetch.items()
        }
        consumers = [c for c in self.planner.graph.consumers(key) if c not in self.planner.done]
        position = next(self._sent)
        reads = self._tell_reads(node, key, assignment.worker, position) if self.prefetch else None
        # a worker runs the nodes sent to it in the order they were sent (Sea's), which its prefetch
        # follows: Dask's own order of tasks submitted together may differ
        return self.submit_task(
            run_node_on_worker, self.storage, node, key, fetched, updatehash, consumers, self._hands.get(key), reads,
            tag=key, name=f"sea-{node.name}", workers=[where], allow_other_workers=False, priority=-position,
        )  # fmt: skip

    def _get_result(self, taskid):
        outcome = self.take_outcome(taskid)
        if outcome is None:
            return None
        key = self.tag_of(taskid)
        if isinstance(outcome, BaseException):
            worker = self.planner.worker_of(key)
            if worker is not None and self._workers_now().get(worker) != self._address.get(worker):
                self.put_back(taskid, outcome)  # its worker is gone: requeued at the next round
                return None
            self.planner.failed(key)
            return {"result": None, "traceback": traceback.format_exception(outcome)}
        if not outcome.get("prefetching", True):
            self._no_prefetch.add(outcome["worker"])
        for consumer, files in outcome.get("hands", {}).items():
            self._handed.setdefault(consumer, []).extend(files)
        if outcome["traceback"]:
            self.planner.failed(key)
        else:
            self._handed.pop(key, None)
            self.planner.finished(key, outcome["worker"], outcome["size"])
            tell = [self._address[w] for w in self.planner.workers_to_tell(key) if w != outcome["worker"]]
            if tell:
                self.client.run(finished_elsewhere, self.storage, key, workers=tell, wait=False, on_error="ignore")  # one gone is not told
        return {"result": None, "traceback": outcome["traceback"]}

