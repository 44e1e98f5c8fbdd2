"""``Submitter(worker="sea", sea=..., dask={...})``: Pydra with Sea on Dask distributed.

Pydra's submitter hashes a job's inputs where it expands the workflow (the client), reading the
files its upstream jobs wrote; so every file that passes between two nodes of a workflow the
client expands must be where the client can read it: the shared home. What one machine's tiers
can hold is the inside of a *nested* workflow. So the unit sent to a Dask worker is a nested
workflow job, e.g. one subject's chain (``workflow.add(Subject(...).split(subject=...))``): the
worker runs it whole with its own :class:`~pydra_sea.worker.SeaWorker` on that machine's tiers
(the configuration is loaded there, so ``${SLURM_TMPDIR}`` is that node's), its jobs one at a time
in the worker's process; the jobs' directories live and die on the worker's tiers, the nested
workflow's outputs come home through its stager, as in a local run. A subject's chain therefore
never leaves its machine, and no machine ever reads another's tier. A task job of the workflow the
client expands runs on a worker with its directory in the home, as with Pydra's own workers.

A worker lost mid-run: Dask runs its nested workflow again on another worker, which reuses what
the lost one had committed home (Pydra's cache) and recomputes the rest, counted in the report as
``nodes_recomputed``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import Any

import cloudpickle as cp

from sea import SeaConfig, WorkflowGraph
from sea.dask.locality import WorkerRow
from sea.dask.options import DaskOptions
from sea.journal import Journal
from sea.lock import RunLock
from sea.progress import Progress, Snapshot
from sea.report import RunReport, announce, combine_tiers, merge_reports
from sea.resume import sweep_partial_copies
from sea.tiers import StorageHierarchy

from . import _pydra_internals as px_

logger = logging.getLogger("sea")

RUNNING = Path(".sea") / "running"  # <home>/.sea/running/<checksum>: the worker running a nested workflow now


# ---------------------------------------------------------------------- on a worker
def _this_worker() -> tuple[str, str]:
    from distributed import get_worker

    name = str(get_worker().name)
    return name, name.replace("/", "_")


def check_storage(sea: SeaConfig, home: str) -> None:
    """Run on every worker before any job: its tiers exist and can be used (one SeaConfigError)."""
    StorageHierarchy.build(sea, Path(home)).close()


def run_task(job_pkl: bytes, rerun: bool, worker: type) -> dict:
    """A task job of the workflow the client expands, in its directory in the home; ``worker``:
    the client's worker class (:class:`~pydra_sea.worker.SeaWorker`, which uses this module)."""
    return {"result": worker.uncloudpickle_and_run(job_pkl, rerun).result, "worker": _this_worker()[0]}  # (its memory: no engine here to tell)


def run_nested_workflow(job_pkl: bytes, sea: SeaConfig, rerun: bool, worker: type) -> dict:
    """A nested workflow job, whole, on this worker's tiers (see the module), by a ``worker``
    (the client's worker class) of its own."""
    from concurrent.futures import ThreadPoolExecutor

    from pydra.engine.submitter import Submitter

    name, machine = _this_worker()
    job = cp.loads(job_pkl)
    home = Path(job.cache_root)
    running = home / RUNNING / job.checksum
    lost = running.read_text().split() if running.exists() else []  # an attempt on a worker since lost
    px_.remove_side_files(job, home)  # the lock that attempt held
    running.parent.mkdir(parents=True, exist_ok=True)
    running.write_text(" ".join([*lost, machine]))
    # a Dask worker's process may not start processes of its own (Dask's workers are daemonic), and
    # it runs one task at a time: the nested workflow's jobs run one by one in a thread of it
    local = worker(sea=sea, n_procs=1)
    local.pool.shutdown()
    local.pool, local._machine = ThreadPoolExecutor(1, thread_name_prefix="sea-job"), machine
    with Submitter(worker=local, cache_root=home) as submitter:
        px_.submit_through(job, submitter)
        result = submitter.loop.run_until_complete(local.submit(job, rerun=rerun))
    running.unlink(missing_ok=True)
    done_before = {key for m in lost for key, record in Journal.read(home / ".sea" / f"journal-{m}.jsonl").items() if record.done}
    ran = local.last_run
    return {
        "result": result,
        "worker": name,
        "report": ran.report,
        "with_inputs_held": ran.with_inputs_held,
        "recomputed": len(done_before & set(ran.keys)),
    }


# ---------------------------------------------------------------------- on the client
@dataclass
class DaskRun:
    """The client's side of one run: the Dask client, and what came back from the workers."""

    options: DaskOptions
    sea: SeaConfig
    home: Path
    client: Any = None
    reports: list[RunReport] = field(default_factory=list)
    rows: dict[str, WorkerRow] = field(default_factory=dict)
    recomputed: int = 0
    jobs_in_home: int = 0  # task jobs of the workflow the client expands
    _stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    _ids: count = field(default_factory=count)
    _token: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    _running: dict = field(default_factory=dict)  # Dask key -> the job's name, while on a worker
    _done: int = 0
    _started: float = field(default_factory=time.monotonic)
    _progress: Progress | None = None

    def __enter__(self) -> DaskRun:
        lock = self._stack.enter_context(RunLock.acquire(self.home))  # one run per home
        try:
            if lock.killed_run is not None:
                px_.remove_killed_runs_locks(self.home, lock.killed_run, logger)
            sweep_partial_copies(WorkflowGraph(), self.home, logger)  # before any worker flushes
            self.client = self._stack.enter_context(self.options.client())
            self.client.run(check_storage, self.sea, str(self.home))
            self._progress = Progress(self._progress_snapshot, self.sea.progress, logger).start()  # the workers' engines show none
            self._stack.callback(self._progress.stop)
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, kind, error, traceback) -> None:
        try:
            self._progress.stop()  # the report follows
            self._write_report(success=kind is None)
        finally:
            self._stack.close()

    def _progress_snapshot(self) -> Snapshot:
        """Jobs done and those on a worker (the total grows as Pydra expands the workflow)."""
        running = list(self._running.values())
        return Snapshot(time.monotonic() - self._started, self._done, self._done + len(running), True, running)

    async def run(self, function, job, *args) -> Any:
        """``function(pickled job, *args)`` on a worker; its result once it is back."""
        loop = asyncio.get_running_loop()
        outcome = loop.create_future()
        key = f"sea-{job.name}-{self._token}-{next(self._ids)}"  # runs sharing a scheduler never share a task
        future = self.client.submit(function, cp.dumps(job), *args, pure=False, key=key)
        self._running[key] = job.name

        def settle(done) -> None:  # in Dask's callback thread: fetch at once, then hand it to the loop
            try:
                value, failure = done.result(), None
            except BaseException as exc:  # noqa: BLE001 - the job's own error, or the worker's loss, for Pydra to see
                value, failure = None, exc
            loop.call_soon_threadsafe(_set, outcome, value, failure)

        future.add_done_callback(settle)
        try:
            value = await outcome
        finally:
            self._running.pop(key, None)
            self._done += 1
        self._count(value)
        return value["result"]

    def _count(self, value: dict) -> None:
        row = self.rows.setdefault(value["worker"], WorkerRow(value["worker"]))
        if "report" not in value:  # a task job, in the home
            row.nodes_run += 1
            self.jobs_in_home += 1
            return
        report = value["report"]
        self.reports.append((value["worker"], report))
        row.nodes_run += report.nodes_run
        row.with_inputs_held += value["with_inputs_held"]
        row.local_hits += value["with_inputs_held"]  # a nested workflow's jobs all ran on its worker
        self.recomputed += value["recomputed"]

    def _write_report(self, success: bool) -> None:
        report = merge_reports(self.reports, self.rows.values())
        report.tiers = combine_tiers(report.tiers)  # a worker ran several nested workflows
        report.nodes_total = sum(r.nodes_total for _, r in self.reports) + self.jobs_in_home
        report.nodes_run += self.jobs_in_home
        report.nodes_recomputed = self.recomputed
        report.success = success and not report.flush_errors
        report.save(self.home / self.sea.report, self.home)
        announce(report, logger)


def _set(outcome: asyncio.Future, value: Any, failure: BaseException | None) -> None:
    if outcome.done():  # cancelled meanwhile
        return
    if failure is not None:
        outcome.set_exception(failure)
    else:
        outcome.set_result(value)
