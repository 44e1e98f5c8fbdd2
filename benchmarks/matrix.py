"""What the benchmark measures: sizes, workloads, shared-filesystem throttles and configurations.

Plain data, shared by the orchestrating process (``benchmarks.run``), the worker process that runs
one configuration once, and the tables (``benchmarks.tables``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path

SHARED_PARENT = Path("/var/tmp")  # the shared filesystem's backing disk (throttled by slowfs, or as is)
TMPFS_PARENT = Path("/dev/shm")  # node-local fast storage
PROCESSES = 2  # n_procs of every configuration
TUNED_POLL = 0.05  # seconds; Nipype's default is 2 s


@dataclass(frozen=True)
class Size:
    name: str
    units: int  # chunks (incrementation) or subjects (filtering)
    unit_mib: float  # one chunk, or one subject's 4D image
    iterations: int  # incrementation's chain length (filtering always has 3 steps)
    timeout_seconds: float  # per run: a hung worker must not hang the benchmark
    settle_seconds: float = 0.0  # a pause before each run, after os.sync(), for the disk to absorb the runs before it


SIZES = {
    "smoke": Size("smoke", units=2, unit_mib=4, iterations=2, timeout_seconds=300),
    "full": Size("full", units=8, unit_mib=32, iterations=5, timeout_seconds=1800, settle_seconds=1.0),
}
WORKLOADS = ("incrementation", "filtering")  # the default
# --workloads fmri_preproc,dwi_mrtrix: the fMRIPrep-like example (8 steps per subject) and the
# MRtrix3 one (the tools must be installed)
# many_files: one DataSink of many small files (issue 16's 10,000), where a copy costs its metadata
# read_compute: a first step that reads its input and computes twice as long (issue 20's prefetch case)
EXTRA_WORKLOADS = ("fmri_preproc", "dwi_mrtrix", "many_files", "read_compute")
FMRI_MATRIX = 64  # voxels per axis of the fmri_preproc runs; their length makes one run unit_mib
DWI_MATRIX = 48  # voxels per axis of the dwi_mrtrix runs; their directions make one run unit_mib
# Workloads whose tools memory-map their files (MRtrix3): on the busy filesystem, slowfs serves them in
# its page cache mode, since its default direct_io refuses memory maps (see benchmarks/slowfs.py)
PAGE_CACHE_WORKLOADS = ("dwi_mrtrix",)


def many_files(size: Size) -> int:
    """many_files: the files of its one sink output."""
    return 10_000 if size.name == "full" else 500


def steps(workload: str, size: Size) -> int:
    """Nodes per chain that write a unit-sized file (the declared output is the last one's)."""
    return {"incrementation": size.iterations, "fmri_preproc": 6, "dwi_mrtrix": 4, "read_compute": 0}.get(workload, 3)


def describe_workload(workload: str, size: Size) -> str:
    if workload == "incrementation":
        return f"incrementation, {size.units} chunks x {size.unit_mib:g} MiB x {size.iterations} iterations"
    if workload == "read_compute":
        from benchmarks.read_compute import compute_seconds

        return (f"read_compute, {size.units} subjects x {size.unit_mib:g} MiB read whole by a first step that then computes "
                f"{compute_seconds(size.unit_mib):.2f} s (twice its read at 30 MB/s), a 1 MiB summary, a DataSink")  # fmt: skip
    if workload == "many_files":
        return f"many_files, one node writing {many_files(size)} text files of about 1.4 KiB, one DataSink of their directory"
    if workload == "dwi_mrtrix":
        return (f"dwi_mrtrix, {size.units} subjects x {2 * dwi_directions(size) + 2} volumes of {DWI_MATRIX}^3 ({size.unit_mib:g} MiB), "
                "MRtrix3 mrconvert + dwidenoise + mrdegibbs + dwi2mask + dwi2tensor + tensor2metric")  # fmt: skip
    if workload == "fmri_preproc":
        return (f"fmri_preproc, {size.units} subjects x {fmri_volumes(size)} volumes of {FMRI_MATRIX}^3 ({size.unit_mib:g} MiB), "
                "reorient + slice timing + motion + mask + smooth + clean + parcels + connectivity, 5 derivatives each")  # fmt: skip
    return f"filtering, {size.units} subjects x {size.unit_mib:g} MiB 4D image, smooth + band-pass + z-score"


def fmri_volumes(size: Size) -> int:
    return max(8, int(size.unit_mib * 2**20 / (4 * FMRI_MATRIX**3)))


def dwi_directions(size: Size) -> int:
    """Directions per shell (two shells and two b=0 volumes) for a run of unit_mib."""
    return max(6, (int(size.unit_mib * 2**20 / (4 * DWI_MATRIX**3)) - 2) // 2)


@dataclass(frozen=True)
class Throttle:
    """How busy the shared filesystem is: ``None`` rates mean the bare disk, no FUSE at all."""

    name: str
    write_mbps: float | None = None
    read_mbps: float | None = None
    meta_latency_ms: float = 0.0

    @property
    def throttled(self) -> bool:
        return self.write_mbps is not None

    def describe(self, workload: str | None = None) -> str:
        if not self.throttled:
            return f"the bare local disk under {SHARED_PARENT} (no FUSE, no throttle; the page cache absorbs writes)"
        text = (
            f"benchmarks.slowfs over {SHARED_PARENT}: {self.write_mbps:g} MB/s write, {self.read_mbps:g} MB/s read, "
            f"{self.meta_latency_ms:g} ms per metadata operation, one bucket for all processes"
        )
        if workload in PAGE_CACHE_WORKLOADS:
            text += "; page cache mode (no direct_io, so that memory maps work; writes still write-through, every open reads anew)"
        return text

    def slowfs_settings(self, workload: str) -> dict:
        """The ``benchmarks.slowfs.Throttle`` fields of this filesystem's mount for ``workload``."""
        assert self.throttled, f"{self.name} is the bare disk, not a slowfs mount"
        return {"write_mbps": self.write_mbps, "read_mbps": self.read_mbps, "meta_latency_ms": self.meta_latency_ms,
                "page_cache": workload in PAGE_CACHE_WORKLOADS}  # fmt: skip


THROTTLES = {
    "busy": Throttle("busy", write_mbps=30, read_mbps=200, meta_latency_ms=5),
    # issue 20's: reads as slow as writes (a busy Lustre's, an object store's), where prefetch should pay
    "slow-reads": Throttle("slow-reads", write_mbps=30, read_mbps=30, meta_latency_ms=5),
    "unloaded": Throttle("unloaded"),
}


@dataclass(frozen=True)
class Configuration:
    key: str
    name: str
    plugin: str
    poll: float = TUNED_POLL
    work_on_tmpfs: bool = False  # base_dir on /dev/shm instead of the shared filesystem
    out_on_tmpfs: bool = False  # the DataSink directory too
    sea: str | None = None  # "tiers": the node-local tiers; "fast": a tmpfs of its own; None: no Sea
    checkpoints: str = "auto"  # Sea's checkpoints: auto (the default), none or all
    checkpoint_factor: float = 1.0  # auto's factor (sea.checkpoint)
    prefetch: bool | str = "auto"  # Sea's prefetch of the input files: auto (the default), true or false (sea.prefetch)
    backpressure: bool = True  # Sea's back-pressure on the link home (sea.backpressure)
    tier_capacity: str | None = None  # one tier only, /dev/shm with this cap: what it cannot hold goes home
    engine: str = "nipype"  # or "pydra": plugin is then the Submitter's worker, outputs stay in its cache
    durable_outputs: bool = False  # the workflow's outputs fsync'ed inside the timing, as Sea makes its own durable
    logical_paths: bool = True  # Sea's view: each node runs at its home path (sea.view); False: at its tier path

    @property
    def file_key(self) -> str:
        return self.key.replace("'", "p")


CONFIGURATIONS = (
    Configuration("A2", "MultiProc, default 2 s poll", "MultiProc", poll=2.0),
    Configuration("A", "MultiProc, tuned 0.05 s poll", "MultiProc"),
    Configuration("B", "MultiProc, work dir on tmpfs by hand", "MultiProc", work_on_tmpfs=True),
    Configuration("C", "SeaMultiProc", "SeaMultiProc", sea="tiers"),
    Configuration("CN", "SeaMultiProc, checkpoints: none", "SeaMultiProc", sea="tiers", checkpoints="none"),
    Configuration("C'", "SeaMultiProc, checkpoints: all", "SeaMultiProc", sea="tiers", checkpoints="all"),
    # auto's factor measured (benchmarks.reruns --configs A,CN,C,C2,C4,C'): C's is 1, the default
    Configuration("C2", "SeaMultiProc, auto, factor 2", "SeaMultiProc", sea="tiers", checkpoint_factor=2.0),
    Configuration("C4", "SeaMultiProc, auto, factor 4", "SeaMultiProc", sea="tiers", checkpoint_factor=4.0),
    Configuration("CB", "SeaMultiProc, back-pressure off", "SeaMultiProc", sea="tiers", backpressure=False),
    Configuration("CP", "SeaMultiProc, prefetch on", "SeaMultiProc", sea="tiers", prefetch=True),
    Configuration("CA", "SeaMultiProc, prefetch auto", "SeaMultiProc", sea="tiers", prefetch="auto"),  # C since prefetch: auto became the default
    Configuration("C0", "SeaMultiProc, prefetch off", "SeaMultiProc", sea="tiers", prefetch=False),  # C before it
    # half of C's tier peak on the busy incrementation (287 MiB, issue 20), and nothing after it but the home
    Configuration("CH", "SeaMultiProc, one tier of 144 MiB", "SeaMultiProc", sea="tiers", tier_capacity="144MiB"),
    Configuration("CH0", "SeaMultiProc, one tier of 144 MiB, prefetch off", "SeaMultiProc", sea="tiers", tier_capacity="144MiB", prefetch=False),
    Configuration("T", "MultiProc, all on tmpfs", "MultiProc", work_on_tmpfs=True, out_on_tmpfs=True),
    Configuration("S", "SeaMultiProc, all on tmpfs", "SeaMultiProc", work_on_tmpfs=True, out_on_tmpfs=True, sea="fast"),
    # Pydra 1.0 (incrementation only): the cache_root on the shared filesystem; the workflow's outputs
    # are what Pydra puts in the workflow's directory, copied to tmpfs after the timing to compare them
    Configuration("P", "Pydra cf worker", "cf", out_on_tmpfs=True, engine="pydra"),
    Configuration("PS", "Pydra SeaWorker", "sea", out_on_tmpfs=True, sea="tiers", engine="pydra"),
    Configuration("PSP", "Pydra SeaWorker, prefetch on", "sea", out_on_tmpfs=True, sea="tiers", prefetch=True, engine="pydra"),
    # cf, then its outputs made durable (what Sea does before a run returns): the least a durable run costs
    Configuration("PD", "Pydra cf worker, outputs fsync'ed", "cf", out_on_tmpfs=True, durable_outputs=True, engine="pydra"),
    Configuration("PSN", "Pydra SeaWorker, checkpoints: none", "sea", out_on_tmpfs=True, sea="tiers", checkpoints="none", engine="pydra"),
    Configuration("PSB", "Pydra SeaWorker, back-pressure off", "sea", out_on_tmpfs=True, sea="tiers", backpressure=False, engine="pydra"),
    Configuration("PSV", "Pydra SeaWorker, no view (logical_paths: false)", "sea", out_on_tmpfs=True, sea="tiers", logical_paths=False, engine="pydra"),
    Configuration("CV", "SeaMultiProc, no view (logical_paths: false)", "SeaMultiProc", sea="tiers", logical_paths=False),
)
BY_KEY = {c.key: c for c in CONFIGURATIONS}
DEFAULT_CONFIGURATIONS = tuple(k for k in BY_KEY if k not in ("C2", "C4", "CB", "CH", "CH0", "CA", "C0", "PD", "PSN", "PSB"))  # C2, C4: for benchmarks.reruns; the rest: issue 20's


def sea_tiers(config: Configuration, throttle: Throttle, fast_tmpfs: Path) -> list[dict]:
    """Sea's tiers for a run: /dev/shm, then the local disk when the home is not on that disk
    (Sea refuses a tier on the home's filesystem); for S, a tmpfs mounted for the benchmark,
    since its home is on /dev/shm."""
    if config.sea == "fast":
        return [{"path": str(fast_tmpfs)}]
    if config.tier_capacity is not None:
        return [{"path": str(TMPFS_PARENT), "capacity": config.tier_capacity}]
    tiers = [{"path": str(TMPFS_PARENT)}]
    if throttle.throttled:
        tiers.append({"path": str(SHARED_PARENT)})
    return tiers


def build_workflow(workload: str, size: Size, data: Path, work: Path, out: Path, **params):
    """``params``: the workload's own parameters (fmri_preproc: ``fwhm``, ``high_hz``)."""
    if workload == "incrementation":
        from example_workflows.incrementation import build_workflow

        return build_workflow(data, size.units, size.iterations, work, out, **params)
    if workload == "read_compute":
        from benchmarks.read_compute import build_workflow

        return build_workflow(data, size.units, size.unit_mib, work, out)
    if workload == "many_files":
        from example_workflows.many_files import build_workflow

        return build_workflow(data, work, out, many_files(size))
    if workload in ("fmri_preproc", "dwi_mrtrix"):
        module = import_module(f"example_workflows.{workload}")
        return module.build_workflow(data, [f"{i + 1:02d}" for i in range(size.units)], work, out, **params)
    from example_workflows.filtering import build_workflow

    return build_workflow(data, size.units, work, out)


STARTED = "SEA_BENCH_STARTED"  # where record_start appends the nodes a run sends to a worker process


def record_start(node, status) -> None:
    """MultiProc's ``status_callback`` (SeaMultiProc takes it too): one line per node executed."""
    if status == "start" and os.environ.get(STARTED):
        with open(os.environ[STARTED], "a") as fh:
            fh.write(f"{node.fullname}\n")


def make_inputs(workload: str, size: Size, data: Path) -> None:
    if workload == "incrementation":
        from example_workflows.incrementation import make_chunks

        make_chunks(data, size.units, size.unit_mib)
    elif workload == "read_compute":
        from benchmarks.read_compute import make_inputs as make

        make(data, size.units, size.unit_mib)
    elif workload == "many_files":
        from example_workflows.many_files import make_atlas

        make_atlas(data, many_files(size))
    elif workload == "fmri_preproc":
        from example_workflows.fmri_preproc import make_dataset

        make_dataset(data, size.units, fmri_volumes(size), FMRI_MATRIX)
    elif workload == "dwi_mrtrix":
        from example_workflows.dwi_mrtrix import make_dataset

        make_dataset(data, size.units, DWI_MATRIX, dwi_directions(size))
    else:
        from example_workflows.filtering import make_images

        make_images(data, size.units, size.unit_mib)
