"""SeaWorker: Pydra's concurrent-futures worker with Sea's configuration.

``Submitter(worker="sea", cache_root="/shared/work", sea={"tiers": [{"path": "/dev/shm"}]}, n_procs=4)``
or ``Submitter(worker=SeaWorker(sea="sea.yml"))``. ``sea`` takes what SeaMultiProc's ``plugin_args['sea']``
takes (a dict, a YAML path, or nothing for ``$SEA_CONFIG``); a bad one fails in the Submitter's
constructor, with the same one-line error, before any task runs.

This first step runs tasks exactly as Pydra's ``cf`` worker does; placement on the tiers, staging
and eviction through the core come next (see the module's tests for what is covered).
"""

from __future__ import annotations

import typing as ty

import attrs
from pydra.workers import cf

from sea import SeaConfig


def _load(value: ty.Any) -> SeaConfig:
    return SeaConfig.load(value)


@attrs.define
class SeaWorker(cf.ConcurrentFuturesWorker):
    """``n_procs`` as for ``cf``; ``sea``: the Sea configuration (dict, YAML path or ``$SEA_CONFIG``)."""

    _plugin_name = "sea"  # the name Submitter(worker=...) uses (this module is outside pydra.workers)

    sea: SeaConfig = attrs.field(default=None, converter=_load)

    # attrs would generate these for this slotted subclass and drop cf's, which leave out the
    # process pool and the event loop (neither can be pickled with a workflow job)
    def __getstate__(self) -> dict[str, ty.Any]:
        return super().__getstate__()

    def __setstate__(self, state: dict[str, ty.Any]) -> None:
        super().__setstate__(state)
