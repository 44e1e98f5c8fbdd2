"""The ``dask`` options of Sea's distributed adapters, and the Dask client they open.

Three ways to get workers, as in ``plugin_args={'dask': ...}``::

    {"address": "tcp://10.0.0.5:8786"}                          # a running scheduler
    {"cluster": "local", "n_workers": 3}                        # worker processes on this machine
    {"cluster": "slurm", "jobs": 4, "jobqueue": {"cores": 8, "memory": "32GB", "walltime": "02:00:00",
                                                 "job_extra_directives": ["--tmp=100G"]}}

Each worker is one machine's worth of Sea storage (see :mod:`sea.node_storage`) and runs one task
at a time: Nipype runs a node in its directory by changing the process's working directory, so
two nodes must not share a process. ``cluster: slurm`` therefore asks dask-jobqueue for one worker
process per core (``processes = cores``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from .config import SeaConfigError, check_choice, check_whole_number, unknown_key


@dataclass(frozen=True)
class DaskOptions:
    address: str | None = field(default=None, metadata={"doc": "a running scheduler, e.g. tcp://10.0.0.5:8786"})
    cluster: str | None = field(default=None, metadata={"doc": "start a cluster instead: local (processes here) or slurm (dask-jobqueue)"})
    n_workers: int = field(default=2, metadata={"doc": "cluster: local: worker processes"})
    jobs: int = field(default=1, metadata={"doc": "cluster: slurm: batch jobs to start (each runs 'cores' workers)"})
    jobqueue: dict = field(default_factory=dict, metadata={"doc": "cluster: slurm: keyword arguments of dask_jobqueue.SLURMCluster"})
    busy_threshold: int = field(default=4, metadata={"doc": "tasks queued on the worker holding a node's inputs before it runs elsewhere"})
    timeout: float = field(default=600.0, metadata={"doc": "seconds to wait for the first workers to start"})

    @classmethod
    def load(cls, value: Any) -> DaskOptions:
        if value is None:
            return cls(cluster="local")
        if not isinstance(value, Mapping):
            raise SeaConfigError(f"plugin_args['dask'] must be a dict such as {{'cluster': 'local', 'n_workers': 3}}, not {value!r}")
        known = [f.name for f in fields(cls)]
        for key in value:
            if key not in known:
                raise unknown_key("plugin_args['dask']", key, known)
        options = cls(**value)
        what = "plugin_args['dask']"
        if (options.address is None) == (options.cluster is None):
            raise SeaConfigError(f"{what}: give either 'address' (a running scheduler) or 'cluster' (local or slurm), not {dict(value)!r}")
        if options.address is not None and not isinstance(options.address, str):
            raise SeaConfigError(f"{what}['address'] must be a scheduler address such as 'tcp://10.0.0.5:8786', not {options.address!r}")
        if options.cluster is not None:
            check_choice(options.cluster, f"{what}['cluster']", ["local", "slurm"])
        check_whole_number(options.n_workers, f"{what}['n_workers']", 1)
        check_whole_number(options.jobs, f"{what}['jobs']", 1)
        check_whole_number(options.busy_threshold, f"{what}['busy_threshold']", 0)
        if not isinstance(options.jobqueue, Mapping):
            raise SeaConfigError(f"{what}['jobqueue'] must be a dict of SLURMCluster arguments (cores, memory, walltime, ...), not {options.jobqueue!r}")
        if options.cluster == "slurm" and not {"cores", "memory"} <= set(options.jobqueue):
            raise SeaConfigError(f"{what}['jobqueue'] needs 'cores' and 'memory' (per SLURM job), e.g. {{'cores': 8, 'memory': '32GB'}}")
        return options

    def slurm_cluster_kwargs(self) -> dict:
        """SLURMCluster's arguments: the user's, with one single-threaded worker per core."""
        return {"processes": self.jobqueue["cores"], **self.jobqueue}

    @contextlib.contextmanager
    def client(self) -> Iterator[Any]:
        """A connected ``distributed.Client``; a cluster started here is stopped on leaving."""
        from distributed import Client, LocalCluster

        if self.address is not None:
            with Client(self.address, timeout=self.timeout) as client:
                yield client
            return
        if self.cluster == "local":
            cluster = LocalCluster(n_workers=self.n_workers, threads_per_worker=1, processes=True, dashboard_address=None)
            expected = self.n_workers
        else:
            from dask_jobqueue import SLURMCluster

            cluster = SLURMCluster(**self.slurm_cluster_kwargs())
            cluster.scale(jobs=self.jobs)
            expected = 1
        with cluster, Client(cluster) as client:
            client.wait_for_workers(expected, timeout=self.timeout)
            yield client
