"""The ``dask`` options of Sea's distributed adapters, and the Dask client they open.

Three ways to get workers, as in ``plugin_args={'dask': ...}``::

    {"address": "tcp://10.0.0.5:8786"}                          # a running scheduler
    {"cluster": "local", "n_workers": 3}                        # worker processes on this machine
    {"cluster": "slurm", "jobs": 4, "jobqueue": {"cores": 8, "memory": "32GB", "walltime": "02:00:00",
                                                 "job_extra_directives": ["--tmp=100G"]}}

Each worker is one machine's worth of Sea storage (see :mod:`sea.dask.node_storage`) and runs one task
at a time: Nipype runs a node in its directory by changing the process's working directory, so
two nodes must not share a process. ``cluster: slurm`` therefore asks dask-jobqueue for one
single-threaded worker process per core (``processes = cores``, ``--nthreads 1``); with a smaller
``processes`` each worker still runs one node at a time, and that node's tools have
``cores / processes`` of the job's cores. The client waits for all ``jobs x processes`` workers,
so the first nodes are spread over every job. See docs/slurm.md.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ..config import SeaConfigError, check_choice, check_positive_number, check_whole_number, only_known_keys, unknown_key


def slurm_cluster_keys() -> list[str]:
    """The keyword arguments of ``dask_jobqueue.SLURMCluster`` a user may give in ``jobqueue``
    (``n_workers``: use ``jobs``; ``dashboard_address`` and ``host`` go in ``scheduler_options``)."""
    try:
        from dask_jobqueue.core import Job, JobQueueCluster
        from dask_jobqueue.slurm import SLURMJob
    except ImportError:
        raise SeaConfigError("plugin_args['dask']: cluster 'slurm' needs dask-jobqueue: pip install dask-jobqueue") from None
    names = {name for c in (SLURMJob, Job, JobQueueCluster) for name in inspect.signature(c.__init__).parameters}
    return sorted(names - {"self", "scheduler", "name", "n_workers", "job_cls", "loop", "asynchronous", "dashboard_address", "host", "base_class_kwargs", "job_kwargs"})


@dataclass(frozen=True)
class DaskOptions:
    address: str | None = field(default=None, metadata={"doc": "a running scheduler, e.g. tcp://10.0.0.5:8786"})
    cluster: str | None = field(default=None, metadata={"doc": "start a cluster instead: local (processes here) or slurm (dask-jobqueue)"})
    n_workers: int = field(default=2, metadata={"doc": "cluster: local: worker processes"})
    jobs: int = field(default=1, metadata={"doc": "cluster: slurm: batch jobs to start; each runs 'processes' workers (default: one per core)"})
    jobqueue: dict = field(default_factory=dict, metadata={"doc": "cluster: slurm: keyword arguments of dask_jobqueue.SLURMCluster"})
    busy_threshold: int = field(default=4, metadata={"doc": "tasks queued on the worker holding a node's inputs before it runs elsewhere"})
    timeout: float = field(default=600.0, metadata={"doc": "seconds to wait for every worker (n_workers, or jobs x processes) to start"})

    @classmethod
    def load(cls, value: Any, what: str = "plugin_args['dask']") -> DaskOptions:
        """``what``: how the user gave them, for the error messages."""
        if value is None:
            return cls(cluster="local")
        if not isinstance(value, Mapping):
            raise SeaConfigError(f"{what} must be a dict such as {{'cluster': 'local', 'n_workers': 3}}, not {value!r}")
        only_known_keys(value, what, [f.name for f in fields(cls)])
        options = cls(**value)
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
        check_positive_number(options.timeout, f"{what}['timeout']")
        if options.cluster == "slurm":
            jobqueue = options.jobqueue
            for key in jobqueue:
                if key not in (known := slurm_cluster_keys()):
                    raise unknown_key(f"{what}['jobqueue']", key, known, valid="SLURMCluster takes")
            if not {"cores", "memory"} <= set(jobqueue):
                raise SeaConfigError(f"{what}['jobqueue'] needs 'cores' and 'memory' (per SLURM job), e.g. {{'cores': 8, 'memory': '32GB'}}")
            cores = check_whole_number(jobqueue["cores"], f"{what}['jobqueue']['cores']", 1)
            check_whole_number(jobqueue.get("processes", cores), f"{what}['jobqueue']['processes'] (worker processes per job, each running one node at a time)", 1, cores)
            memory = jobqueue["memory"]
            if not (isinstance(memory, str) and memory.strip()) and (isinstance(memory, bool) or not isinstance(memory, int) or memory < 1):
                raise SeaConfigError(f"{what}['jobqueue']['memory'] must be the memory of one SLURM job such as '32GB', not {jobqueue['memory']!r}")
            if not isinstance(jobqueue.get("scheduler_options", {}), Mapping):
                raise SeaConfigError(f"{what}['jobqueue']['scheduler_options'] must be a dict of Scheduler arguments, not {jobqueue['scheduler_options']!r}")
        return options

    @property
    def workers_per_job(self) -> int:
        """``cluster: slurm``: the worker processes each SLURM job starts."""
        return self.jobqueue.get("processes", self.jobqueue.get("cores", 1))

    def slurm_cluster_kwargs(self) -> dict:
        """SLURMCluster's arguments: the user's, with one single-threaded worker per core unless
        ``processes`` says otherwise, and the dashboard on a free port unless given."""
        scheduler_options = {"dashboard_address": ":0", **self.jobqueue.get("scheduler_options", {})}
        return {**self.jobqueue, "processes": self.workers_per_job, "scheduler_options": scheduler_options}

    def slurm_cluster(self) -> Any:
        """A ``dask_jobqueue.SLURMCluster`` (its scheduler runs here; no job is submitted yet)
        whose worker processes are single-threaded: ``--nthreads 1`` whatever ``cores / processes``."""
        from dask_jobqueue import SLURMCluster
        from dask_jobqueue.slurm import SLURMJob

        class SingleThreadedSLURMJob(SLURMJob):
            worker_process_threads = 1  # the job keeps --cpus-per-task=cores for the nodes' tools

        return SLURMCluster(job_cls=SingleThreadedSLURMJob, **self.slurm_cluster_kwargs())

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
            cluster = self.slurm_cluster()
            cluster.scale(jobs=self.jobs)
            expected = self.jobs * self.workers_per_job
        with cluster, Client(cluster) as client:
            client.wait_for_workers(expected, timeout=self.timeout)
            yield client
