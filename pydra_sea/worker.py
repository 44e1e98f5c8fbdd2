"""SeaWorker: Pydra's concurrent-futures worker with Sea's configuration and tiers.

``Submitter(worker="sea", cache_root="/shared/work", sea={"tiers": [{"path": "/dev/shm"}]}, n_procs=4)``
or ``Submitter(worker=SeaWorker(sea="sea.yml"))``. ``sea`` takes what SeaMultiProc's ``plugin_args['sea']``
takes (a dict, a YAML path, or nothing for ``$SEA_CONFIG``). A malformed configuration fails in the
Submitter's constructor; a tier that cannot be used (missing, unwritable, on the home's filesystem)
fails when the run starts, against the Submitter's ``cache_root`` (the home), before any task runs.
Both are one :class:`~sea.SeaConfigError` line, as with SeaMultiProc.

This step sets up and removes Sea's private tier directories around the run and runs tasks exactly
as Pydra's ``cf`` worker does; placing task directories on the tiers, staging and eviction through
the core come next.
"""

from __future__ import annotations

import logging
import typing as ty
from pathlib import Path

import attrs
from pydra.workers import cf

from sea import SeaConfig
from sea.tiers import StorageHierarchy

logger = logging.getLogger("pydra.worker")


def _load(value: ty.Any) -> SeaConfig:
    return SeaConfig.load(value)


@attrs.define
class SeaWorker(cf.ConcurrentFuturesWorker):
    """``n_procs`` as for ``cf``; ``sea``: the Sea configuration (dict, YAML path or ``$SEA_CONFIG``)."""

    _plugin_name = "sea"  # the name Submitter(worker=...) uses (this module is outside pydra.workers)

    sea: SeaConfig = attrs.field(default=None, converter=_load)
    tiers: StorageHierarchy | None = attrs.field(default=None, init=False, repr=False, eq=False)

    def start(self, home: Path) -> StorageHierarchy:
        """Check the tiers against the home and make Sea's private directories on them, once per run."""
        if self.tiers is None:
            self.tiers = StorageHierarchy.build(self.sea, home)
            logger.info("[Sea] tiers: %s", self.tiers.describe())
        return self.tiers

    async def submit(self, job, rerun: bool = False):
        self.start(job.cache_root)  # the top-level job comes first: nothing has run yet
        return await super().submit(job, rerun=rerun)

    async def run(self, job, rerun: bool = False):
        self.start(job.cache_root)  # a lone task is run, not submitted
        return await super().run(job, rerun=rerun)

    def close(self) -> None:
        super().close()
        if self.tiers is not None:
            self.tiers.close()
            self.tiers = None

    # attrs would generate these for this slotted subclass and drop cf's, which leave out the
    # process pool and the event loop (neither can be pickled with a workflow job)
    def __getstate__(self) -> dict[str, ty.Any]:
        state = super().__getstate__()
        state["tiers"] = None  # owned by the process that runs the submitter
        return state

    def __setstate__(self, state: dict[str, ty.Any]) -> None:
        super().__setstate__(state)
