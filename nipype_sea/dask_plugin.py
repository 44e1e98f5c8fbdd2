"""``workflow.run(plugin='SeaDask', plugin_args={'sea': ..., 'dask': {...}})``: Sea on Dask distributed.

Each Dask worker has its own tiers (:class:`sea.node_storage.NodeStorage`, set up on every
worker); the client keeps the graph and sends each ready node to the worker that holds its inputs
(:class:`sea.locality.LocalityPlanner`). A node that must run where its inputs are not gets them
first, copied worker to worker through Dask. The task (:func:`run_node_on_worker`) runs on the
worker: Nipype's cache check against the home, placement on the worker's tiers, the node, and the
worker's engine stages the declared outputs home and evicts what nobody needs any more.
"""

from __future__ import annotations

import logging
import traceback
from itertools import count
from pathlib import Path

from sea import SeaConfig, SeaConfigError, SeaFlushError, WorkflowGraph
from sea.config import unknown_key
from sea.dask_options import DaskOptions
from sea.locality import LocalityPlanner
from sea.node_storage import NAME, NodeStorage, close_run, current, finished_elsewhere, pack
from sea.report import RunReport, merge_reports

from . import _nipype_internals as nx_
from .graph import node_specs

logger = logging.getLogger("nipype.workflow")

DASK_PLUGIN_ARGS = ("sea", "dask", "status_callback")


def run_node_on_worker(node, key: str, fetched: dict, updatehash: bool) -> dict:
    """On the worker: copy in the inputs other workers hold, run ``node`` on this worker's tiers."""
    storage = current()
    engine = storage.engine
    for producer, (packed, source) in fetched.items():
        storage.unpack(producer, packed, source)

    def here(logical: Path) -> Path | None:
        try:
            return engine.physical_dir(engine.key_for(logical))
        except ValueError:
            return None

    nx_.read_inputs_from(node, here)
    if not engine.is_fresh(key) and nx_.cached_in_home(node):
        engine.node_cached(key)
        return {"cached": True, "size": 0, "worker": storage.worker_name, "traceback": None}
    placement = engine.place(key, link=False)
    while True:
        nx_.set_run_dir(node, placement.physical)
        if placement.staging is not None:
            nx_.redirect_sink(node, placement.staging)
        try:
            node.run(updatehash=updatehash)
            break
        except Exception:  # noqa: BLE001 - reported to the client as MultiProc reports it
            text = traceback.format_exc()
            placement = engine.retry_elsewhere(key, text, link=False)
            if placement is None:
                engine.node_failed(key)
                return {"cached": False, "size": 0, "worker": storage.worker_name, "traceback": [text]}
    engine.node_finished(key)
    return {"cached": False, "size": engine.held_bytes(key), "worker": storage.worker_name, "traceback": None}


def check_dask_plugin_args(plugin_args) -> dict:
    plugin_args = dict(plugin_args or {})
    for key in plugin_args:
        if key not in DASK_PLUGIN_ARGS:
            raise unknown_key("plugin_args", key, list(DASK_PLUGIN_ARGS), valid="SeaDask takes")
    return plugin_args


class SeaDaskPlugin(nx_.EventedTaskLoop):
    """Nipype on Dask distributed, each worker with its own node-local tiers (see the module)."""

    def __init__(self, plugin_args=None):
        plugin_args = check_dask_plugin_args(plugin_args)
        self.sea = plugin_args.get("sea")
        SeaConfig.load(self.sea)  # checked here; loaded again on each worker, where its ${VARS} are set
        self.dask = DaskOptions.load(plugin_args.get("dask"))
        super().__init__(plugin_args=plugin_args)
        self.report: RunReport | None = None
        self._ids = count()
        self._futures: dict[int, tuple[str, object]] = {}  # taskid -> (key, future)
        self._keys: dict[int, str] = {}
        self._client = None
        self.planner: LocalityPlanner | None = None

    def run(self, graph, config, updatehash=False):
        home = nx_.workflow_home(graph)
        if home is None:
            raise SeaConfigError("the workflow has no base_dir: set workflow.base_dir = '/path/to/work' (on the shared filesystem) before run()")
        self.home = home
        config_ = SeaConfig.load(self.sea)
        specs = node_specs(graph, home, config_.sinks)
        with self.dask.client() as client:
            self._client = client
            client.register_plugin(NodeStorage(self.sea, home, specs, relocate=nx_.relocate_results), name=NAME)
            slots = {w["name"] if isinstance(w["name"], str) else str(w["name"]): 1 for w in client.scheduler_info()["workers"].values()}
            self._address = {str(w["name"]): address for address, w in client.scheduler_info()["workers"].items()}
            self.planner = LocalityPlanner(WorkflowGraph.from_specs(specs), slots, busy_threshold=self.dask.busy_threshold)
            success = False
            try:
                result = super().run(graph, config, updatehash=updatehash)
                success = True
                return result
            finally:
                outcomes = client.run(close_run, success)
                self.report = merge_reports([o["report"] for o in outcomes.values()], self.planner.rows.values())
                self.report.success = success and not any(o["flush_error"] for o in outcomes.values())
                self.report.to_json(home / config_.report)
                logger.info("%s", self.report.to_text())
                errors = [o["flush_error"] for o in outcomes.values() if o["flush_error"]]
                if errors and success:
                    raise SeaFlushError(errors[0])

    # ------------------------------------------------------------------ Nipype's loop
    def _key(self, jobid: int) -> str:
        if jobid not in self._keys:
            self._keys[jobid] = str(nx_.logical_dir(self.procs[jobid]).relative_to(self.home))
        return self._keys[jobid]

    def order_ready_jobs(self, jobids: list[int]) -> list[int]:
        by_key = {self._key(j): j for j in jobids}
        return [by_key[k] for k in self.planner.order(list(by_key))]

    def _submit_job(self, node, updatehash=False):
        key = str(nx_.logical_dir(node).relative_to(self.home))
        assignment = self.planner.assign(key)
        where = self._address[assignment.worker]
        if assignment.fetch:
            logger.info("[Sea] %s runs on %s; copying there first: %s", key, assignment.worker, ", ".join(f"{p} from {w}" for p, w in assignment.fetch.items()))
        fetched = {
            producer: self._client.submit(pack, producer, workers=[self._address[holder]], allow_other_workers=False, pure=False)
            for producer, holder in assignment.fetch.items()
        }
        future = self._client.submit(
            run_node_on_worker, node, key, fetched, updatehash, workers=[where], allow_other_workers=False, pure=False, key=f"sea-{node.name}-{next(self._ids)}"
        )
        future.add_done_callback(lambda _: self.wake())
        taskid = next(self._ids)
        self._futures[taskid] = (key, future)
        return taskid

    def task_done(self, taskid) -> bool:
        return self._futures[taskid][1].done()

    def _get_result(self, taskid):
        key, future = self._futures[taskid]
        if not future.done():
            return None
        try:
            outcome = future.result()
        except Exception:  # noqa: BLE001 - the task itself failed (a worker died, a pickling error)
            self.planner.failed(key)
            return {"result": None, "traceback": traceback.format_exc().splitlines(keepends=True)}
        if outcome["traceback"]:
            self.planner.failed(key)
        else:
            self.planner.finished(key, outcome["worker"], outcome["size"])
            tell = [self._address[w] for w in self.planner.workers_to_tell(key) if w != outcome["worker"]]
            if tell:
                self._client.run(finished_elsewhere, key, workers=tell, wait=False)
        return {"result": None, "traceback": outcome["traceback"]}

    def _clear_task(self, taskid):
        self._futures.pop(taskid, None)
