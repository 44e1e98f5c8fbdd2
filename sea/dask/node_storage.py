"""A Dask worker's own storage: its tiers, its stager, its evictions.

Registered on every worker of the cluster (:meth:`distributed.Client.register_plugin`), the plugin
builds a :class:`~sea.engine.SeaEngine` for the machine the worker runs on: the configuration is
read there, so ``${SLURM_TMPDIR}`` is that compute node's. Node directories of tasks run by the
worker live on its tiers; its stager commits their declared outputs to the shared home; it evicts
a directory once the client says every consumer finished, wherever they ran. Directories a
consumer here needs from another worker arrive as bytes through Dask, packed as a checkpoint is
(:mod:`sea.pack`; :func:`pack` there, :meth:`NodeStorage.unpack` here): no worker ever opens another
worker's tier.

The adapter's task function runs on the worker and calls :func:`current` to reach this plugin.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from distributed import WorkerPlugin, get_worker

from ..config import SeaConfig
from ..engine import SeaEngine, SeaFlushError
from ..graph import NodeSpec, WorkflowGraph
from ..pack import directory_members, pack_bytes, unpack

NAME = "sea-node-storage"  # each run's plugin is registered as ``NAME-<run token>`` (:func:`plugin_name`)
logger = logging.getLogger("sea")


class NodeStorage(WorkerPlugin):
    """One run's storage on one worker. ``sea``: the configuration as the user gave it (a dict or a
    YAML path, loaded on the worker); ``home``: the shared base directory; ``specs``: the graph."""

    idempotent = False  # each run registers its own (see plugin_name), removed at its end (teardown)

    def __init__(self, sea: Any, home: Path, specs: list[NodeSpec], relocate: Callable[[Path, dict[Path, Path]], object] | None = None):
        """``relocate(directory, {old: new})``: rewrite the paths a node directory's result files
        record, once a copy made at ``old`` is unpacked at ``new`` (an engine whose results name
        absolute paths), and for a directory that goes home (see :class:`~sea.engine.SeaEngine`)."""
        self.sea, self.home, self.specs, self.relocate = sea, Path(home), specs, relocate
        self.engine: SeaEngine | None = None
        self.worker_name = ""

    def setup(self, worker) -> None:
        self.worker_name = str(worker.name)
        machine = self.worker_name.replace("/", "_")
        slots = worker.state.nthreads  # the nodes it runs at once
        self.engine = SeaEngine(SeaConfig.load(self.sea), self.home, log=logger, machine=machine, relocate=self.relocate, slots=slots)
        try:
            self.engine.update_graph(WorkflowGraph.from_specs(self.specs), plan_resume=False)
        except BaseException:
            self.engine.abort()
            raise

    def teardown(self, worker) -> None:
        if self.engine is not None and not self.engine.closed:
            self.engine.close(success=False, interrupted=True)  # the run was abandoned

    # ------------------------------------------------------------------ used by tasks and the client
    def unpack(self, key: str, packed: bytes, source: str) -> None:
        """Make another worker's copy of ``key``'s directory (made at ``source`` there) available here."""
        if self.engine.holds(key):
            return
        target = self.engine.place_replica(key, len(packed))
        unpack(packed, target)
        if self.relocate is not None:
            self.relocate(target, {Path(source): target})

    def close(self, success: bool, interrupted: bool = False) -> dict:
        """End the run here: wait for the flushes, evict, report. Never raises: a flush error is
        returned. ``interrupted``: the client was stopped (Ctrl-C, SIGTERM); nodes running here are
        dropped, they run again next time."""
        error = None
        try:
            report = self.engine.close(success=success, interrupted=interrupted)
        except SeaFlushError as exc:
            report, error = self.engine.report, str(exc)
        return {"worker": self.worker_name, "report": report, "flush_error": error}


def plugin_name(token: str) -> str:
    """The name of the plugin of the run ``token`` names (one of its own, as its tasks' keys have):
    runs sharing a cluster (two users' on one scheduler, or two of one user's at once) each have
    their own, on every worker."""
    return f"{NAME}-{token}"


def current(name: str) -> NodeStorage:
    """The plugin ``name`` (its run's) of the worker this task runs on."""
    return get_worker().plugins[name]


def pack(name: str, key: str) -> tuple[bytes, str]:
    """``key``'s directory on this worker (run ``name``'s) as an uncompressed tar, and where it is
    here, for a consumer on another worker."""
    storage = current(name)
    directory = storage.engine.physical_dir(key)
    if directory is None:
        raise FileNotFoundError(f"{key} is not on worker {storage.worker_name}")
    return pack_bytes(directory_members(directory), [str(directory)]), str(directory)


async def finished_elsewhere(name: str, key: str, dask_worker=None) -> None:
    """Run by the client of run ``name`` on the workers holding an input of ``key`` (``Client.run``,
    without waiting: a coroutine, in the worker's event loop)."""
    engine = dask_worker.plugins[name].engine
    if not engine.closed:  # an event that arrives after the run's end changes nothing
        engine.finished_elsewhere(key)


async def expect_reads(name: str, key: str, paths: list[str], position: int, dask_worker=None) -> None:
    """Run by the client on the worker it sends node ``key`` to, as it sends it (``Client.run``,
    without waiting): the files the node will read. Those on the shared filesystem are copied to this
    worker's tiers by its prefetch while the tasks queued before the node run, in the order they were
    sent (``position``), which is the order the worker runs them
    (:meth:`~sea.engine.SeaEngine.expect_reads`; in a thread: it looks at the files)."""
    engine = dask_worker.plugins[name].engine
    if not engine.closed and engine.prefetching:
        await asyncio.to_thread(engine.expect_reads, key, paths, position)


def close_run(name: str, success: bool, interrupted: bool = False, dask_worker=None) -> dict:
    return dask_worker.plugins[name].close(success, interrupted)
