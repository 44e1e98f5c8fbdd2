"""SeaWorker: Pydra's concurrent-futures worker with Sea's data placement.

``Submitter(worker="sea", cache_root="/shared/work", sea={"tiers": [{"path": "/dev/shm"}]}, n_procs=4)``
or ``Submitter(worker=SeaWorker(sea="sea.yml"))``. ``sea`` takes what SeaMultiProc's ``plugin_args['sea']``
takes (a dict, a YAML path, or nothing for ``$SEA_CONFIG``). A malformed configuration fails in the
Submitter's constructor; a tier that cannot be used (missing, unwritable, on the home's filesystem)
fails when the run starts, against the Submitter's ``cache_root`` (the home), before any task runs.
Both are one :class:`~sea.SeaConfigError` line, as with SeaMultiProc.

What the worker does with a workflow's jobs (the decisions are the core's, :class:`~sea.SeaEngine`):

- each job's directory (``<cache_root>/<checksum>`` under Pydra's own worker) is created on the
  fastest tier with room instead, by pointing the job's ``cache_root`` there; consumers find its
  result there through the same job object;
- a job's directory is evicted once every job of every successor node finished (Pydra starts a node
  only when all its predecessors finished, so that is when no consumer can appear any more); jobs
  of the nodes that give the workflow its outputs are kept until the workflow finished, because
  Pydra then copies those outputs into the workflow's own directory, in the home.

Not yet: the outputs reach the home through Pydra's copy at the end of the workflow, not through
Sea's background stager; nested workflows' own directories stay in the home; a job that runs out of
space is not moved to the next tier. What Pydra 1.0a12 does not let a worker decide: the order of
jobs across nodes (a node starts when every job of every predecessor node is done, see
``NodeExecution.get_runnable_tasks``), so SeaMultiProc's depth-first ordering needs that changed
upstream first.
"""

from __future__ import annotations

import asyncio
import logging
import typing as ty
import warnings
from pathlib import Path

import attrs
from pydra.workers import cf

from sea import NodeSpec, SeaConfig, SeaEngine, WorkflowGraph

from . import _pydra_internals as px_

logger = logging.getLogger("pydra.worker")


def _load(value: ty.Any) -> SeaConfig:
    return SeaConfig.load(value)


@attrs.define
class SeaWorker(cf.ConcurrentFuturesWorker):
    """``n_procs`` as for ``cf``; ``sea``: the Sea configuration (dict, YAML path or ``$SEA_CONFIG``)."""

    _plugin_name = "sea"  # the name Submitter(worker=...) uses (this module is outside pydra.workers)

    sea: SeaConfig = attrs.field(default=None, converter=_load)
    engine: SeaEngine | None = attrs.field(default=None, init=False, repr=False, eq=False)
    _workflows: list = attrs.field(factory=list, init=False, repr=False, eq=False)  # workflow jobs being expanded
    _registered: set = attrs.field(factory=set, init=False, repr=False, eq=False)  # id() of NodeExecutions seen
    _held: dict = attrs.field(factory=dict, init=False, repr=False, eq=False)  # id(workflow job) -> output job keys
    _slots: asyncio.Semaphore | None = attrs.field(default=None, init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        if not px_.pydra_version_supported():
            warnings.warn(f"SeaWorker is tested with pydra {'-'.join(px_.TESTED_RANGE)}, not {px_.pydra_version()}", stacklevel=3)

    # ------------------------------------------------------------------ the run
    async def submit(self, job, rerun: bool = False):
        top = self.engine is None
        if top:
            px_.forget_mount_table()  # the tiers may have been mounted after this process started
            self.engine = SeaEngine(self.sea, Path(job.cache_root), log=logger)  # checks the tiers: nothing ran yet
            self.engine.update_graph(WorkflowGraph())
        self._workflows.append(job)
        success = False
        try:
            result = await super().submit(job, rerun=rerun)
            success = True
            return result
        finally:
            self._workflows.remove(job)
            held = self._held.pop(id(job), [])
            if held and self.engine is not None:
                self.engine.seal(held)  # Pydra has copied them into the workflow's directory
            if top:
                engine, self.engine = self.engine, None
                self._registered.clear()
                self._slots = None  # bound to this run's event loop
                await asyncio.get_running_loop().run_in_executor(None, engine.close, success)

    async def run(self, job, rerun: bool = False):
        found = self._locate(job)
        if found is None:  # a lone task, not part of a workflow: nothing to place
            return await super().run(job, rerun=rerun)
        workflow_job, graph, node = found
        self._register(workflow_job, graph, node)
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.n_procs)
        # Pydra hands over every runnable job at once: place one only when a process is free for
        # it, so tier room is reserved by jobs that run, not by jobs waiting in the pool's queue
        async with self._slots:
            key = job.checksum
            placement = self.engine.place(key, link=False)
            job.cache_root = placement.physical.parent
            try:
                result = await super().run(job, rerun=rerun)
            except BaseException:
                self.engine.node_failed(key)
                raise
            self.engine.node_finished(key)
        return result

    # ------------------------------------------------------------------ translation
    def _locate(self, job):
        for workflow_job in reversed(self._workflows):
            graph = px_.exec_graph(workflow_job)
            node = px_.node_holding(graph, job) if graph is not None else None
            if node is not None:
                return workflow_job, graph, node
        return None

    def _register(self, workflow_job, graph, node) -> None:
        """Tell the core about every job of ``node`` (Pydra creates them together) and seal the
        predecessors whose successor nodes have all started: no more consumers of theirs can come."""
        if id(node) in self._registered:
            return
        self._registered.add(id(node))
        name, jobs = px_.name_of(node), px_.jobs_of(node)
        producers = tuple((j.checksum, "in") for p in px_.predecessors(graph, node) for j in px_.jobs_of(p) if j.checksum in self.engine.graph)
        specs = [NodeSpec(key=j.checksum, kind=f"{type(j.task).__name__}:{name}", upstream=producers) for j in jobs]
        is_output = name in px_.output_node_names(workflow_job)
        self.engine.add_nodes(specs, open_ended=is_output or bool(px_.successors(graph, node)))
        held = self._held.setdefault(id(workflow_job), [])
        if is_output:
            held.extend(spec.key for spec in specs)
        for pred in px_.predecessors(graph, node):
            if all(id(s) in self._registered for s in px_.successors(graph, pred)):
                self.engine.seal([j.checksum for j in px_.jobs_of(pred) if j.checksum in self.engine.graph and j.checksum not in held])

    # ------------------------------------------------------------------ pickling
    # attrs would generate these for this slotted subclass and drop cf's, which leave out the
    # process pool and the event loop (neither can be pickled with a workflow job)
    def __getstate__(self) -> dict[str, ty.Any]:
        state = super().__getstate__()
        state.update(engine=None, _workflows=[], _registered=set(), _held={}, _slots=None)  # owned by the submitting process
        return state

    def __setstate__(self, state: dict[str, ty.Any]) -> None:
        super().__setstate__(state)
