"""SeaWorker: Pydra's concurrent-futures worker with Sea's data placement.

``Submitter(worker="sea", cache_root="/shared/work", sea={"tiers": [{"path": "/dev/shm"}]}, n_procs=4)``
or ``Submitter(worker=SeaWorker(sea="sea.yml"))``. ``sea`` takes what SeaMultiProc's ``plugin_args['sea']``
takes (a dict, a YAML path, or nothing for ``$SEA_CONFIG``). A malformed configuration fails in the
Submitter's constructor; a tier that cannot be used (missing, unwritable, on the home's filesystem)
fails when the run starts, against the Submitter's ``cache_root`` (the home), before any task runs.
Both are one :class:`~sea.SeaConfigError` line, as with SeaMultiProc.

What the worker does with a workflow's jobs (the decisions are the core's, :class:`~sea.SeaEngine`):

- each job's directory (``<cache_root>/<checksum>`` under Pydra's own worker) is created on the
  fastest tier with room instead, by pointing the job's ``cache_root`` there, when a process is free
  for it, or a few jobs ahead of the free processes where a tier has room (queued in the pool, as
  ``cf`` queues every job there: Pydra's loop then turns once per batch of jobs, not once per job);
  which waiting job gets a place is the core's order (inputs on the fastest tier first, then the
  deepest); a job that runs out of space runs again on the next tier;
- a job no other node reads (it gives the workflow an output) persists: once it finished, Sea's
  stager copies its directory home in the background, the core has its ``_result.pklz`` rewritten
  for the home, and the copy replaces the job's path there in one rename; the job returns to Pydra
  only then, so the workflow hard-links its outputs from the home instead of copying them from a
  tier at the end, and a later run finds the job in Pydra's cache;
- any other job's directory is evicted once every job of every successor node finished (Pydra
  starts a node only when all its predecessors finished, so that is when no consumer can appear
  any more); an output that other nodes also read stays on its tier until the workflow copied it;
- a job Pydra's cache holds in the home (an earlier run) is not placed nor run;
- the files a job's consumers take are hashed in its process as it ends, into Pydra's persistent
  hash cache: Pydra, making the next node's jobs, finds their hashes there instead of reading every
  file again in its event loop, one after another, while the processes wait (what ``cf`` does);
- with ``prefetch: {enabled: true}``, the files a waiting job's inputs name on the shared
  filesystem (the workflow's inputs) are copied to a tier while earlier jobs compute, for the next
  ``lookahead`` jobs in the order processes are handed out; the job runs on the copies with its
  checksum unchanged (Pydra hashes a file by its bytes and the names of its files relative to their
  stem, its extensions, which a copy keeps), and its saved result names the originals.

Not yet: nested workflows' own directories stay in the home. What Pydra 1.0a12 does not let a
worker decide: the order of jobs across nodes (a node starts when every job of every predecessor
node is done, see ``NodeExecution.get_runnable_tasks``), so SeaMultiProc's depth-first ordering
across subjects needs that changed upstream first.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
import typing as ty
import warnings
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import attrs
import cloudpickle as cp
from pydra.workers import cf

from sea import NodeSpec, SeaConfig, SeaEngine, SeaFlushError, WorkflowGraph, console
from sea import view as sea_view
from sea.config import check_whole_number
from sea.dask.options import DaskOptions
from sea.interrupt import StopSignals, die_on_terminate, raise_in_loop, stop_process_pool
from sea.memory import JobPeak, offer_to_oom_killer
from sea.ordering import HELD_PER_ROUND, ReadyQueue
from sea.report import RunReport

from . import _pydra_internals as px_
from .dask import DaskRun, run_nested_workflow, run_task
from .watchdog import Watchdog

logger = logging.getLogger("sea")


def _load(value: ty.Any) -> SeaConfig:
    console.attach()  # the first thing of Sea's a Submitter makes
    return SeaConfig.load(value)


def _load_dask(value: ty.Any) -> DaskOptions | None:
    if value is None or isinstance(value, DaskOptions):  # none, or set again when unpickled
        return value
    return DaskOptions.load(value, what="SeaWorker dask")


@attrs.define
class LastRun:
    """What a run did, for the Dask task that ran it (:mod:`pydra_sea.dask`)."""

    report: RunReport
    keys: list[str]  # the jobs run (not found done)
    with_inputs_held: int  # ... of which read another job's directory on a tier


@attrs.define
class SeaWorker(cf.ConcurrentFuturesWorker):
    """``n_procs`` as for ``cf``; ``sea``: the Sea configuration (dict, YAML path or ``$SEA_CONFIG``);
    ``dask``: run on Dask distributed instead, as SeaDask's ``plugin_args['dask']`` (see :mod:`pydra_sea.dask`)."""

    _plugin_name = "sea"  # the name Submitter(worker=...) uses (this module is outside pydra.workers)

    sea: SeaConfig = attrs.field(default=None, converter=_load)
    dask: DaskOptions | None = attrs.field(default=None, converter=_load_dask)
    # cf's pool, made once n_procs is checked (and sea loaded): attrs runs validators only after
    # every default is made, and cf's pool takes any n_procs (0: ValueError, '2': TypeError, 2.5: made)
    pool: ProcessPoolExecutor = attrs.field(eq=False, init=False, hash=False, repr=False)
    engine: SeaEngine | None = attrs.field(default=None, init=False, repr=False, eq=False)
    _workflows: list = attrs.field(factory=list, init=False, repr=False, eq=False)  # workflow jobs being expanded
    _registered: set = attrs.field(factory=set, init=False, repr=False, eq=False)  # id() of NodeExecutions seen
    _held: dict = attrs.field(factory=dict, init=False, repr=False, eq=False)  # id(workflow job) -> output job keys
    _slots: _Processes | None = attrs.field(default=None, init=False, repr=False, eq=False)
    _persisted: set = attrs.field(factory=set, init=False, repr=False, eq=False)  # keys whose directory comes home
    _waiting: dict = attrs.field(factory=dict, init=False, repr=False, eq=False)  # (key, quiet) -> futures waiting for it to settle (see _settled)
    _loop_of_run: asyncio.AbstractEventLoop | None = attrs.field(default=None, init=False, repr=False, eq=False)
    _running: dict = attrs.field(factory=dict, init=False, repr=False, eq=False)  # key -> (job, root) in a process now
    _interrupt: StopSignals = attrs.field(factory=StopSignals, init=False, repr=False, eq=False)
    _machine: str | None = attrs.field(default=None, init=False, repr=False, eq=False)  # on a Dask worker: its name
    _dask_run: ty.Any = attrs.field(default=None, init=False, repr=False, eq=False)  # the client's DaskRun
    _ran: list = attrs.field(factory=list, init=False, repr=False, eq=False)  # (key, read a tier) of jobs run
    _claimed: dict = attrs.field(factory=dict, init=False, repr=False, eq=False)  # checksum -> the job Sea places
    _ended: dict = attrs.field(factory=dict, init=False, repr=False, eq=False)  # checksum -> future done once that job ended
    _twins: dict = attrs.field(factory=dict, init=False, repr=False, eq=False)  # id(job) -> its run in the home (see _twin)
    _located: dict = attrs.field(factory=dict, init=False, repr=False, eq=False)  # id(job) -> (job, workflow job, graph, node)
    _watch: Watchdog | None = attrs.field(default=None, init=False, repr=False, eq=False)  # fails Sea's waits if nothing can wake them
    _retiring: tuple | None = attrs.field(default=None, init=False, repr=False, eq=False)  # (broken pool, future done once its processes are gone)
    _memory: dict = attrs.field(factory=dict, init=False, repr=False, eq=False)  # checksum -> (the most memory its job held in its process, when it began and ended there)
    _consumed: dict = attrs.field(factory=dict, init=False, repr=False, eq=False)  # checksum -> its output fields other nodes take (px_.consumed_outputs)
    last_run: LastRun | None = attrs.field(default=None, init=False, repr=False, eq=False)

    @pool.default
    def _checked_pool(self) -> ProcessPoolExecutor:
        check_whole_number(self.n_procs, "SeaWorker n_procs", 1)
        return self._new_pool()

    def _new_pool(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(self.n_procs, initializer=_process_init)

    def __attrs_post_init__(self) -> None:
        if not px_.pydra_version_supported():
            warnings.warn(f"SeaWorker is tested with pydra {'-'.join(px_.TESTED_RANGE)}, not {px_.pydra_version()}", stacklevel=3)

    # ------------------------------------------------------------------ the run
    async def submit(self, job, rerun: bool = False):
        if self.dask is not None:
            return await self._submit_on_dask(job, rerun)
        top = self.engine is None
        if top:
            self._loop_of_run = asyncio.get_running_loop()
            # a batch system's SIGTERM stops the run as Ctrl-C does, raised by the loop (see close)
            self._interrupt.install(stop=raise_in_loop(self._loop_of_run))
            px_.forget_mount_table()  # the tiers may have been mounted after this process started
            if Path(job.cache_root) == px_.default_cache_root():
                logger.warning(
                    "[Sea] the Submitter was given no cache_root: the home (outputs, Sea's report and checkpoints) is Pydra's "
                    "default cache %s, in your home directory; give Submitter(cache_root=...) a directory on the work "
                    "filesystem", job.cache_root,
                )  # fmt: skip
            self.engine = SeaEngine(self.sea, Path(job.cache_root), log=logger, on_event=self._on_flush, relocate=px_.relocate_result, machine=self._machine)
            self._ran = []
            self._workarounds(True)
            self._watch = Watchdog(self._waits, busy=self._moving)
            self._watch.start()
            try:
                if (killed := self.engine.killed_run) is not None:
                    px_.remove_killed_runs_locks(Path(job.cache_root), killed, logger)
                self.engine.update_graph(WorkflowGraph(), keys_like=px_.job_dir_names_like())
            except BaseException:  # e.g. a rule that matches nothing: undo the start, nothing ran
                self.engine.abort()
                self.engine = None
                self._workarounds(False)
                self._watch.stop()
                self._interrupt.restore()
                raise
        self._workflows.append(job)
        success, stopped = False, False
        try:
            result = await super().submit(job, rerun=rerun)
            success = True
            return result
        except (KeyboardInterrupt, SystemExit):
            stopped = True
            raise
        finally:
            if not success:
                px_.discard_unfinished_result(job)
            if job in self._workflows:
                self._workflows.remove(job)
            held = self._held.pop(id(job), [])
            if held and self.engine is not None:
                self.engine.seal(held)  # Pydra has copied them into the workflow's directory
            if top and self.engine is not None and (stopped or self._interrupt.received is not None):
                # the stop came through this coroutine (a job's error after the signal, say)
                self._stop_run()
            elif top and self.engine is not None:  # None: close() ended an interrupted run already
                engine, interrupted = self._forget_run()
                self.last_run = LastRun(engine.report, [k for k, _ in self._ran], sum(held for _, held in self._ran))
                try:
                    await asyncio.get_running_loop().run_in_executor(None, functools.partial(engine.close, success, interrupted=interrupted))
                except SeaFlushError:  # an output is not home: the workflow is not done
                    px_.discard_result(job)
                    raise
                finally:
                    self._interrupt.restore()

    def _workarounds(self, on: bool) -> None:
        """What of Pydra's loop this run changes while it lives (``_pydra_internals``), or puts back."""
        px_.find_results_on_tiers(self._result_dir if on else None)  # a job with a placed job's checksum waits for its result
        px_.look_only_at_free_jobs(on)  # Pydra's loop looks at a node's whole queue each turn
        px_.split_in_linear_time(on)  # Pydra flattens a split's whole input once per job
        px_.fetch_finished_by_event(on)  # a turn of Pydra's loop waits on every pending job

    def _forget_run(self) -> tuple[SeaEngine, bool]:
        """End the run's state; the engine to close, and whether a stop signal came."""
        self._interrupt.quiet()  # a second Ctrl-C must not cut the final flushes short
        engine, self.engine = self.engine, None
        self._workarounds(False)
        self._registered.clear()
        self._persisted.clear()
        self._claimed.clear()
        self._ended.clear()
        self._twins.clear()
        self._located.clear()
        self._memory.clear()
        self._consumed.clear()
        if self._watch is not None:
            self._watch.stop()
        self._slots = self._loop_of_run = self._watch = None  # bound to this run's event loop
        return engine, self._interrupt.received is not None

    def close(self) -> None:
        """Submitter's exit. A run still open here was stopped by Ctrl-C or SIGTERM: the loop raised
        the KeyboardInterrupt from a callback, which left the loop and never finished the coroutine."""
        if self.engine is not None:
            self._stop_run()
        super().close()

    def _stop_run(self) -> None:
        """End a run stopped by Ctrl-C or SIGTERM. The running jobs are dropped (they run again next
        time), with the side files Pydra keeps next to their directories; the flushes under way
        commit. Synchronous on purpose: the event loop must not hand out more jobs meanwhile."""
        self._interrupt.quiet()
        stop_process_pool(self.pool)
        self.pool = self._new_pool()  # for a later run of this Submitter (no process yet)
        for job, root in self._running.values():
            px_.remove_side_files(job, root)
        for tier in self.engine.hierarchy.fast_tiers:  # also those of jobs the stop caught between two states
            px_.remove_stray_side_files(tier.workdir)
        self._running.clear()
        self._workflows.clear()
        self._waiting.clear()
        loop = self._loop_of_run
        try:
            self._forget_run()[0].close(success=False, interrupted=True)
        finally:
            try:
                _cancel_what_is_left(loop)
            finally:
                self._interrupt.restore()

    async def _submit_on_dask(self, job, rerun: bool):
        if self._dask_run is None:  # the top workflow: expanded here, its nodes go to the workers
            with DaskRun(self.dask, self.sea, Path(job.cache_root)) as self._dask_run:
                try:
                    return await super().submit(job, rerun=rerun)
                finally:
                    self._dask_run = None
        return await self._dask_run.run(run_nested_workflow, job, self.sea, rerun, type(self))  # whole, on one worker

    async def run(self, job, rerun: bool = False):
        px_.job_taken(job)
        try:
            return await self._run(job, rerun)
        finally:
            px_.job_returned(job)

    async def _run(self, job, rerun: bool):
        if self._dask_run is not None:  # a task of the workflow the client expands: in the home
            return await self._dask_run.run(run_task, job, rerun, type(self))
        found = self._locate(job)
        if found is None:  # a lone task, not part of a workflow: nothing to place
            return await self._in_process(job, rerun, placed=False)
        workflow_job, graph, node = found
        self._register(workflow_job, graph, node)
        key, home = job.checksum, Path(self._workflows[0].cache_root)
        if self._claimed.setdefault(key, job) is not job:
            return await self._twin(job, rerun)
        try:
            return await self._run_claimed(job, key, home, rerun)
        finally:
            ended = self._ended.setdefault(key, asyncio.get_running_loop().create_future())
            if not ended.done():
                ended.set_result(None)

    def _twin(self, job, rerun: bool = False) -> asyncio.Future:
        """Run ``job``, which has the checksum of a job Sea placed (the same task and inputs in
        another node, state or nested workflow), once: cf runs both in one directory, the second
        waiting for the first's lock, then finding its result. Here it waits until the first ended
        and nothing of it moves into the home any more (a copy home replaces the directory at its
        path), then runs as cf would, in the home, where Pydra's cache holds the first's result if
        it went home (else it runs again there). Pydra may submit it too (another nested workflow)."""
        if id(job) not in self._twins:
            self._twins[id(job)] = asyncio.ensure_future(self._run_twin(job, rerun))
        return self._twins[id(job)]

    async def _run_twin(self, job, rerun: bool):
        key = job.checksum
        await self._ended.setdefault(key, asyncio.get_running_loop().create_future())
        if self.engine is not None:
            await self._settled(key, quiet=True)
        return await self._in_process(job, rerun)

    async def _in_process(self, job, rerun: bool, view=None, placed: bool = True):
        """Run the job in one of cf's processes, in its ``view`` (:class:`sea.view.View`) if given.
        A lone task (not ``placed``) has its checksum asked for after the run, as under cf: the
        Submitter then looks for its result under the checksum of its inputs as they are then (a job
        that changed its input file finds none, and the Submitter raises, as under cf).
        A process that died under it (the OOM killer) broke the pool for every job in it: the pool is
        replaced for the jobs to come, and the error goes to the caller (a job Sea placed runs again,
        see :meth:`_run_placed`)."""
        pool = self.pool
        with self._watching():
            try:
                measured = await asyncio.get_running_loop().run_in_executor(
                    pool, functools.partial(self.uncloudpickle_and_run, consumed=self._consumed.get(job.checksum) if placed else None, view=view), cp.dumps(job), rerun
                )
            except BrokenProcessPool:
                await self._retire(pool)
                raise
        if placed:
            self._memory[job.checksum] = (measured.memory, measured.started, measured.ended)
        if measured.view_refused and self.engine is not None:
            self.engine.view_refused(measured.view_refused)
        return measured.result

    async def _retire(self, pool: ProcessPoolExecutor) -> None:
        """Replace the broken ``pool`` (once, for all its jobs) and wait until its processes are gone,
        and their memory with them: the pool terminates the processes the OOM killer left, whose jobs
        run again in directories they must no longer write into."""
        if self._retiring is None or self._retiring[0] is not pool:
            logger.warning("[Sea] a worker process died (killed by the OOM killer?); starting new worker processes")
            if self.pool is pool:
                self.pool = self._new_pool()
            self._retiring = (pool, asyncio.get_running_loop().run_in_executor(None, stop_process_pool, pool))
        await asyncio.shield(self._retiring[1])

    def _watching(self):
        return self._watch.running() if self._watch is not None else contextlib.nullcontext()

    def _waits(self) -> dict[str, list[asyncio.Future]]:
        """Sea's waits, by the name of the job each is for (its task and node)."""
        waits: dict[str, list[asyncio.Future]] = {}

        def add(key: str, future: asyncio.Future) -> None:
            spec = self.engine.graph.nodes.get(key) if self.engine is not None else None
            waits.setdefault(spec.kind if spec is not None else key, []).append(future)

        for (key, _), futures in self._waiting.items():
            for future in futures:
                add(key, future)
        for key, future in (self._slots.waiting if self._slots is not None else {}).items():
            add(key, future)
        for key, future in self._ended.items():
            add(key, future)
        return waits

    async def _run_claimed(self, job, key: str, home: Path, rerun: bool):
        engine = self.engine
        if not rerun and engine.is_fresh(key):  # an earlier run packed it (a checkpoint): unpacked and linked, Pydra's cache finds it
            await asyncio.get_running_loop().run_in_executor(None, engine.restore, key)
        if not rerun and (not engine.is_fresh(key) or px_.readonly_caches(job)) and (cached := px_.cached_result(job, home)) is not None:
            engine.node_cached(key)  # done by an earlier run (here or in a read-only cache): Pydra would not run it either
            return cached
        if self._slots is None:
            self._slots = _Processes(self.n_procs, engine.ready_queue(), engine.may_start, AHEAD_PER_PROCESS * self.n_procs, engine.may_go_ahead)
        # Pydra hands over every runnable job at once: place one only when a process is free for
        # it or, a few ahead (AHEAD_PER_PROCESS), where a tier has room for it beside what runs, so
        # tier room is reserved by jobs that run or are about to; which waiting job gets a place is
        # the core's choice (locality, then depth)
        if engine.prefetching:  # its input files on the shared filesystem, copied ahead
            engine.expect_reads(key, [str(p) for p in px_.input_files(job)])
        async with self._slots.one_for(key):
            result = await self._run_prefetched(job, key, rerun)
            self._ran.append((key, any(engine.physical_dir(p) is not None for p in engine.graph.producers(key))))
            tier = engine.physical_dir(key).parent
            if key in self._persisted:  # its directory will move home: Pydra must not read it on the way
                px_.look_in_home(job, home, tier)
            memory, began, ended = self._memory.pop(key, (None, None, None))
            engine.node_finished(key, gives=px_.output_paths(result), memory=memory, started=began, ended=ended)
        self._wake_waiters()  # a job with the same checksum may wait for a directory this evicted
        if key in self._persisted:
            # the workflow copies this job's outputs into its own directory once every job
            # returned: by then the job's directory must be home (a hard link, not a copy), with
            # those of the jobs whose files its outputs name (a task returning its input file)
            await self._settled(key)
            for lender in engine.sent_home_with(key):
                await self._settled(lender, quiet=True)  # its copy home in place (a workflow's output too: it stays on its tier meanwhile)
            if engine.physical_dir(key) is not None and not (home / key).is_dir():
                px_.run_under(job, tier)  # its copy home failed (the run ends in SeaFlushError): the tier's
        return result

    async def _run_prefetched(self, job, key: str, rerun: bool):
        """Run the job on the copies prefetch made of its input files, if any; its task and its
        saved result name the originals again afterwards (a copy goes after its last reader)."""
        engine = self.engine
        if not engine.prefetching:  # off, or auto found it does not pay: no copy was made
            return await self._run_placed(job, key, rerun)
        with self._watching():
            copies = await asyncio.get_running_loop().run_in_executor(None, engine.prefetched, key)  # may wait for a copy
        originals, copy_dirs = px_.read_copies(job, copies)
        try:
            result = await self._run_placed(job, key, rerun, copy_dirs, on_originals=lambda: px_.put_back_inputs(job, originals))
        finally:
            px_.put_back_inputs(job, originals)
        px_.restore_originals(Path(job.cache_dir), copy_dirs)
        return result

    async def _run_placed(self, job, key: str, rerun: bool, copy_dirs: dict[Path, Path] | None = None, on_originals=None):
        """``copy_dirs``: the directories of the prefetched copies its inputs name -> the originals';
        ``on_originals`` points its inputs at the originals again: a job run again elsewhere (one that
        could not replace its input in the view, say) reads them."""
        engine = self.engine
        placement = engine.place(key, link=False)
        copies = {str(original / f.name): str(f) for copy, original in (copy_dirs or {}).items() for f in copy.iterdir()}
        while True:
            px_.run_under(job, placement.physical.parent)
            self._running[key] = (job, placement.physical.parent)  # until its process is done with it
            try:
                result = await self._in_process(job, rerun, engine.view(key, copies, whole_home=True))
                self._running.pop(key, None)
                return result
            except BrokenProcessPool:  # its process died (the OOM killer): it runs again, fewer at a time
                self._running.pop(key, None)
                px_.remove_side_files(job, placement.physical.parent)
                running = min(len(self._running) + 1, self.n_procs)  # (the others wait in the pool's queue)
                if self._interrupt.received is not None or not engine.worker_lost(key, running=running):
                    engine.node_failed(key)
                    raise
                self._slots.limit(engine.concurrency_cap)
                await self._slots.again(key)
                placement = engine.place(key, link=False)
            except Exception as error:
                self._running.pop(key, None)
                px_.remove_side_files(job, placement.physical.parent)
                placement = engine.retry_elsewhere(key, f"{error!r} {error}", link=False)
                if placement is None:
                    engine.node_failed(key)
                    raise
                if copies and on_originals is not None:
                    on_originals()
                    copies = {}
            except (KeyboardInterrupt, SystemExit):  # a stop: left running, the run's stop drops it
                raise
            except BaseException:  # cancelled: its process may still hold it (close() cleans up)
                if self.engine is engine:
                    engine.node_failed(key)
                raise

    @classmethod
    def uncloudpickle_and_run(cls, job_pkl: bytes, rerun: bool, consumed: dict[str, tuple] | None = None, view=None) -> _Measured:
        """In the pool's process: the job's result, and the most memory it held (:class:`sea.memory.JobPeak`).
        A job that failed while saving (out of space) leaves the process in its directory, which Sea
        then removes; Pydra's next job there starts by ``os.getcwd()``. The files of its outputs other
        nodes take (``consumed``) are hashed here, while other processes compute, for Pydra's cache
        (:func:`~pydra_sea._pydra_internals.hash_outputs`): Pydra's event loop would hash them one
        after another when the next node starts, with every process waiting."""
        began = time.monotonic()  # the clock every process of the machine shares
        try:
            os.getcwd()
        except FileNotFoundError:
            os.chdir("/")
        with JobPeak() as peak:
            refused = view and (sea_view.enter() or px_.run_in_view(job_pkl, rerun, view))
            result = super().uncloudpickle_and_run(job_pkl, rerun) if view is None or isinstance(refused, str) else refused
        if consumed:
            with contextlib.suppress(Exception):  # what is not in the cache, Pydra hashes as it would
                px_.hash_outputs(result, consumed)
        return _Measured(result, peak.bytes, refused if isinstance(refused, str) else "", began, time.monotonic())

    async def _settled(self, key: str, quiet: bool = False) -> None:
        """Until the job's directory settled (``SeaEngine.is_settled``), or with ``quiet``, until
        nothing of it moves into the home any more (``SeaEngine.is_quiet``)."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.setdefault((key, quiet), []).append(waiter)
        self._wake_waiters()
        await waiter

    def _moving(self) -> bool:
        """Something outside the event loop will bring an event: a copy home, or a prefetch copy."""
        engine = self.engine
        return engine is not None and (engine.stager.queue_length > 0 or (engine.prefetcher is not None and engine.prefetcher.copying))

    def _wake_waiters(self) -> None:
        if self.engine is None:  # the run ended
            return
        self._watch.event()
        if self._slots is not None:  # a job held back (memory, the link home, its input's copy) may start now
            self._slots.retry()
        ready = [(k, quiet) for k, quiet in self._waiting if (self.engine.is_quiet(k) if quiet else self.engine.is_settled(k))]
        for entry in ready:
            for waiter in self._waiting.pop(entry):
                if not waiter.done():
                    waiter.set_result(None)

    def _on_flush(self) -> None:  # called from a stager thread
        loop = self._loop_of_run
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._wake_waiters)

    # ------------------------------------------------------------------ translation
    def _locate(self, job):
        """(workflow job, execution graph, node) of the workflow being expanded that made ``job``.
        The jobs of a node are indexed together, the first time one of them is asked for: a node
        split N ways would otherwise be searched N times, for N jobs."""
        for workflow_job in [None, *reversed(self._workflows)]:  # None: what is indexed already
            if workflow_job is not None and (graph := px_.exec_graph(workflow_job)) is not None:
                for other, node in px_.jobs_named(graph, job.name):
                    self._located[id(other)] = (other, workflow_job, graph, node)
            found = self._located.get(id(job))
            if found is not None and found[0] is job:
                return found[1:]
        return None

    def _register(self, workflow_job, graph, node) -> None:
        """Tell the core about every job of ``node`` (Pydra creates them together) and seal the
        predecessors whose successor nodes have all started: no more consumers of theirs can come."""
        if id(node) in self._registered:
            return
        self._registered.add(id(node))
        name = px_.name_of(node)
        # a job with the checksum of one already known runs in the home, not placed (see run)
        jobs, seen = [], set()
        for j in px_.jobs_of(node):
            if j.checksum not in self.engine.graph and j.checksum not in seen:
                jobs.append(j)
                seen.add(j.checksum)
            else:  # Pydra submits no job whose checksum another job of the workflow has: it waits for
                # its result in cache_root, where a job placed on a tier may never be; run it there
                self._twin(j)
        producers = tuple((j.checksum, "in") for p in px_.predecessors(graph, node) for j in px_.jobs_of(p) if self._placed_here(j))
        is_output, consumed = name in px_.output_node_names(workflow_job), bool(px_.successors(graph, node))
        taken = px_.consumed_outputs(graph, node) if consumed else {}
        # a job no other node reads (it gives the workflow an output, or nothing reads it at all)
        # persists: the stager copies its directory home while the rest runs, and Pydra's cache
        # keeps it as under cf; an output also read by other nodes stays on its tier until the
        # workflow has copied its outputs
        persist = not consumed
        kind = f"{type(jobs[0].task).__name__}:{name}" if jobs else name
        specs = [
            NodeSpec(key=j.checksum, kind=kind, upstream=producers, persist_dir=persist, label=kind + (f"[{i}]" if len(jobs) > 1 else ""))
            for i, j in enumerate(jobs)
        ]
        self.engine.add_nodes(specs, open_ended=consumed)
        if taken:
            self._consumed.update((spec.key, taken) for spec in specs)
        held = self._held.setdefault(id(workflow_job), [])
        if persist:
            self._persisted.update(spec.key for spec in specs)
        elif is_output:
            held.extend(spec.key for spec in specs)
        for pred in px_.predecessors(graph, node):
            if all(id(s) in self._registered for s in px_.successors(graph, pred)):
                self.engine.seal([j.checksum for j in px_.jobs_of(pred) if self._placed_here(j) and j.checksum not in held])

    def _result_dir(self, checksum: str) -> Path | None:
        """Where the job of ``checksum`` Sea placed keeps its result, on a tier, if Pydra may read
        it there (not on its way home: see :func:`~pydra_sea._pydra_internals.look_in_home`)."""
        engine = self.engine
        if engine is None or checksum in self._persisted or checksum not in engine.graph or not engine.holds(checksum):
            return None  # not finished as far as Sea knows: Pydra learns of it when Sea's worker returns
        return engine.physical_dir(checksum)

    def _placed_here(self, job) -> bool:
        """The job is the core's node of its checksum: not one that ran in the home because another
        job with the same checksum had it (see run); only its own consumers hold that directory."""
        return job.checksum in self.engine.graph and self._claimed.get(job.checksum, job) is job

    # ------------------------------------------------------------------ pickling
    # attrs would generate these for this slotted subclass and drop cf's, which leave out the
    # process pool and the event loop (neither can be pickled with a workflow job)
    def __getstate__(self) -> dict[str, ty.Any]:
        state = super().__getstate__()
        # what the submitting process owns (every field not given to __init__, each made anew; cf's pool is cf's own):
        # a job pickled for a process carries its submitter's worker, never the jobs it holds
        state.update({f.name: f.default.factory() if isinstance(f.default, attrs.Factory) else f.default for f in attrs.fields(type(self)) if not f.init and f.name != "pool"})
        return state

    def __setstate__(self, state: dict[str, ty.Any]) -> None:
        super().__setstate__(state)


def _cancel_what_is_left(loop: asyncio.AbstractEventLoop | None) -> None:
    """Cancel, and let unwind, the coroutines a stop left suspended in ``loop`` (Pydra's expansion
    of the workflows, the jobs waiting for a process), while the loop can still run them: left to the
    garbage collector, they unwind after the Submitter closed the loop, and Pydra records the
    'Event loop is closed' error that follows as the workflow's crash, which the next run reports
    as a failure."""
    if loop is None or loop.is_closed() or loop.is_running():
        return
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))


class _Measured(ty.NamedTuple):
    """What a pool process sends back: the job's result, the most memory the job held there."""

    result: ty.Any
    memory: int | None
    view_refused: str = ""  # why the job could not be shown its view (sea.view), if it could not
    started: float | None = None  # when the job began in the process (time.monotonic): it may have waited in the pool's queue since it was placed
    ended: float | None = None  # when it ended there: its result may wait for Pydra's loop, busy with other jobs, before the engine hears of it


def _process_init() -> None:
    """Each pool process: the OOM killer's first choice over the run's own process, and killed by
    the pool's ``terminate()`` (see :func:`sea.interrupt.die_on_terminate`)."""
    offer_to_oom_killer()
    die_on_terminate()


# jobs placed and queued in the pool beyond its processes, per process: cf queues every runnable
# job there, so that a process that ends one starts the next while Pydra's loop, which asks each
# queued job whether it is done after every turn (its cost grows with the graph), is busy; handing
# a job over only when a process was free made that loop turn once per job, the processes waiting
# for it (2.6x cf's time on 500 trivial tasks, 3.7x on 1,000; issue 36). 16 fed the processes up to
# ~1,000 jobs; beyond, one turn of that loop outlasts 16 jobs a process, which then wait: at 3,000
# trivial tasks 78-85 s against 61-67 s with 64 (cf: 62-65 s); 128 and 256, each a burst of jobs
# placed and pickled in one turn of the loop, were slower again (77-96 s)
AHEAD_PER_PROCESS = 64

# jobs refused a place ahead (no fast tier has room beside what is placed) before a round stops
# asking: each asks the tiers' room and the job's memory, and a round comes with every event
AHEAD_REFUSED_PER_ROUND = 2


class _Processes:
    """``n`` processes for the jobs waiting for one, and ``ahead`` more jobs queued for them; a
    freed place goes to the job the core ranks first (``SeaEngine.ready_queue``: locality, then
    depth) among those the core lets start now (``SeaEngine.may_start``: its memory fits, the link
    home keeps up, its input files' copies are done; for a place ahead, ``may_go_ahead``: a fast
    tier has room for it), not to the one that asked first; a job held back is asked about again at
    the next event (:meth:`retry`: a job's end, a copy home or a prefetch copy ending). :meth:`limit`
    lowers ``n`` (a process lost to the OOM killer: fewer jobs at once, none ahead)."""

    def __init__(
        self,
        n: int,
        queue: ReadyQueue,
        may_start: ty.Callable[[str, int], bool] = lambda key, running: True,
        ahead: int = 0,
        may_go_ahead: ty.Callable[[str], bool] = lambda key: True,
    ):
        self._n, self._ahead, self._busy = n, ahead, 0
        self._queue = queue  # keys of the jobs waiting, best first
        self._may_start, self._may_go_ahead = may_start, may_go_ahead
        self._waiting: dict[str, asyncio.Future] = {}

    @property
    def waiting(self) -> dict[str, asyncio.Future]:
        """The jobs waiting for a process."""
        return self._waiting

    def limit(self, n: int | None) -> None:
        """At most ``n`` jobs in processes from now on (those running go on)."""
        if n is not None:
            self._n, self._ahead = max(1, min(self._n, n)), 0

    @contextlib.asynccontextmanager
    async def one_for(self, key: str):
        await self._acquire(key)
        try:
            yield
        finally:
            self._hand_on()

    async def again(self, key: str) -> None:
        """``key``, holding a process, gives it up and waits for one in its turn (within the limit)."""
        self._hand_on()
        try:
            await self._acquire(key)
        except asyncio.CancelledError:
            self._busy += 1  # it holds none now: what one_for gives back on its way out
            raise

    async def _acquire(self, key: str) -> None:
        granted = self._waiting[key] = asyncio.get_running_loop().create_future()
        self._queue.push(key, key)
        self.retry()
        try:
            await granted
        except asyncio.CancelledError:
            if self._waiting.get(key) is granted:
                del self._waiting[key]
                self._queue.discard(key)
            elif granted.done() and not granted.cancelled():
                self._hand_on()  # granted and cancelled at once: pass the process on
            raise

    def _hand_on(self) -> None:
        self._busy -= 1
        self.retry()

    def retry(self) -> None:
        """Hand the free processes to the waiting jobs, best first, that may start now."""
        held, refused_ahead = [], 0
        while self._queue and self._busy < self._n + self._ahead:
            key = self._queue.pop()
            granted = self._waiting.get(key)
            if granted is None or granted.done():  # cancelled while waiting
                self._waiting.pop(key, None)
                continue
            if self._busy >= self._n and not self._may_go_ahead(key):
                held.append(key)
                refused_ahead += 1
                if refused_ahead >= AHEAD_REFUSED_PER_ROUND:
                    break  # every process is busy and the tiers have no room to spare: the next jobs wait too
                continue
            if not self._may_start(key, self._busy):
                held.append(key)
                if len(held) > HELD_PER_ROUND:
                    break  # the best jobs wait: no need to ask the whole queue
                continue
            del self._waiting[key]
            self._busy += 1
            granted.set_result(None)
        for key in held:
            self._queue.push(key, key)
