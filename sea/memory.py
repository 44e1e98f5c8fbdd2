"""The job's memory, which a RAM-backed tier shares with the nodes.

Files on a tmpfs (``/dev/shm``, a tmpfs ``$SLURM_TMPDIR``) are memory. Under SLURM with cgroups
(``ConstrainRAMSpace``) their pages are charged to the job, and the kernel OOM-kills one of the
job's processes when tmpfs bytes plus the processes' own memory pass the job's limit. So a RAM
tier's room is not its free space but the job's memory budget (:func:`job_memory_limit`: the
cgroup's limit, else what the engine was told, else physical memory) less what is already
committed, less a headroom; :class:`MemoryBudget` keeps that account, :mod:`sea.tiers` asks it
before placing a directory on a RAM tier, and the adapters ask it before starting a node
(:meth:`MemoryBudget.fits`).

What is committed is the larger of two views: what Sea accounts for (the job's memory when the run
started, the memory each running node reserves: what it declares, or what its kind was measured to
hold, :class:`JobPeak`, if more; every byte on RAM tiers) and what the cgroup is
charged now (its processes' anonymous memory, tmpfs pages, dirty page cache not yet written back)
plus the tier room reserved but not yet written. The first sees a node's memory before the node has
grown to it; the second sees what Sea cannot (memory that is not the nodes', a node larger than
its estimate).

>>> budget = MemoryBudget(MemoryLimit(1000, "a test"), headroom=100, read_charge=lambda: None)
>>> budget.reserve("a", 300); budget.free(ram_used=200, ram_reserved=0)
400
>>> budget.fits(400, ram_used=200, ram_reserved=0), budget.fits(401, ram_used=200, ram_reserved=0)
(True, False)
"""

from __future__ import annotations

import os
import re
import resource
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from .durable import device, filesystem_types, mount_table

RAM_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})
UNLIMITED = 2**60  # cgroup v1 writes "no limit" as a page-rounded 2**63 - 1


@dataclass(frozen=True)
class MemoryLimit:
    """How much memory the job may use, and where that figure comes from."""

    bytes: int
    source: str  # for the report and the log: "cgroup v1 /sys/fs/cgroup/memory/...", "memory_gb", ...
    group: Path | None = None  # the cgroup whose limit it is: its charge is read from there
    v2: bool = False

    def oom_kills(self) -> int:
        """Processes the OOM killer took in the cgroup so far (0 without one, or on a kernel that
        does not count them)."""
        if self.group is None:
            return 0
        try:
            text = (self.group / ("memory.events" if self.v2 else "memory.oom_control")).read_text()
        except OSError:
            return 0
        found = re.search(r"^oom_kill (\d+)", text, re.M)
        return int(found.group(1)) if found else 0

    def charge_reader(self) -> Callable[[], int | None]:
        """A function returning what counts against the limit now (``None``: cannot be read)."""
        if self.group is not None:
            return lambda: cgroup_charge(self.group, self.v2)
        if self.source == "physical memory":
            return _machine_charge
        return lambda: None  # a figure the engine was told: only Sea's own account


def job_memory_limit(declared: int | None = None, proc: Path = Path("/proc/self")) -> MemoryLimit:
    """The tightest memory cgroup limit over this process's groups and their parents; else
    ``declared`` (MultiProc's ``memory_gb``, when the user set it); else physical memory."""
    found = cgroup_limit(proc)
    if found is not None:
        return found
    if declared:
        return MemoryLimit(int(declared), "memory_gb")
    return MemoryLimit(psutil.virtual_memory().total, "physical memory")


def cgroup_limit(proc: Path = Path("/proc/self")) -> MemoryLimit | None:
    """The tightest memory limit of the cgroups ``proc`` is in (v1 ``memory.limit_in_bytes``, v2
    ``memory.max``), with each group's parents up to the hierarchy's root; ``None`` if none is set."""
    try:
        groups = (proc / "cgroup").read_text().splitlines()
        table = mount_table((proc / "mountinfo").read_text())
    except OSError:
        return None
    mounts = {
        "v1": [(m.root, m.mountpoint) for m in table if m.fstype == "cgroup" and "memory" in m.options],
        "v2": [(m.root, m.mountpoint) for m in table if m.fstype == "cgroup2"],
    }
    best: MemoryLimit | None = None
    for line in groups:
        hierarchy, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        v2 = hierarchy == "0" and controllers == ""
        if not v2 and "memory" not in controllers.split(","):
            continue
        for mount_root, mountpoint in mounts["v2" if v2 else "v1"]:
            relative = os.path.relpath(path, mount_root)
            if relative.startswith(".."):
                continue  # the group is outside what this mount shows
            directory = Path(mountpoint, relative).resolve()
            name = "memory.max" if v2 else "memory.limit_in_bytes"
            for group in (directory, *directory.parents):
                if not group.is_relative_to(mountpoint):
                    break
                limit = _read_limit(group / name)
                if limit is not None and (best is None or limit < best.bytes):
                    best = MemoryLimit(limit, f"cgroup {'v2 memory.max' if v2 else 'v1 memory.limit_in_bytes'} of {group}", group, v2)
    return best


def _read_limit(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text.isdigit():
        return None  # "max": no limit
    value = int(text)
    return value if value < UNLIMITED else None


V1_CHARGED = ("total_rss", "total_shmem", "total_dirty", "total_writeback")
V2_CHARGED = ("anon", "shmem", "file_dirty", "file_writeback")


def cgroup_charge(group: Path, v2: bool) -> int | None:
    """What the group holds that the kernel cannot reclaim: its processes' anonymous memory, tmpfs
    pages and page cache not yet written back (clean page cache is dropped before an OOM kill)."""
    wanted = V2_CHARGED if v2 else V1_CHARGED
    try:
        text = (group / "memory.stat").read_text()
    except OSError:
        return None
    total = 0
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in wanted:
            total += int(value)
    return total


def _machine_charge() -> int:
    """Without a cgroup: the machine's memory not available to a new process (tmpfs included)."""
    vm = psutil.virtual_memory()
    return vm.total - vm.available


OOM_SCORE_ADJ = 500  # raised in worker processes: past the memory limit, the kernel kills one of them, not the run


def offer_to_oom_killer() -> None:
    """In a worker process the adapter's pool starts: past the job's memory limit the kernel kills
    this process (whose node the adapter runs again), not the process that drives the run."""
    try:
        with open("/proc/self/oom_score_adj", "w") as fh:
            fh.write(str(OOM_SCORE_ADJ))
    except OSError:
        pass  # not Linux: nothing to raise


class JobPeak:
    """``with JobPeak() as peak:`` around one job in a worker process; then ``peak.bytes``, the most
    memory the process held while the job ran (``None`` where Linux's counters are missing): its
    own peak (``VmHWM``, reset before the job through ``/proc/self/clear_refs``, so from what it
    held then, the interpreter and what earlier jobs left), plus that of the largest child process
    the job waited for (a command-line tool) when it is larger than any child's before in this
    process. The kernel keeps one maximum over a process's children: a job whose tool is smaller
    than an earlier job's is measured short of it, never past what it held.

    >>> with JobPeak() as peak:
    ...     held = bytearray(64 * 2**20)
    >>> peak.bytes is None or peak.bytes >= 64 * 2**20
    True
    """

    def __init__(self) -> None:
        self.bytes: int | None = None
        self._children = 0

    def __enter__(self) -> JobPeak:
        try:
            with open("/proc/self/clear_refs", "w") as fh:
                fh.write("5")  # the peak resident set starts again from what is resident now
        except OSError:
            self._children = -1
        else:
            self._children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        return self

    def __exit__(self, *exc: object) -> None:
        if self._children < 0:
            return
        try:
            found = re.search(r"^VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M)
        except OSError:
            return
        if found is None:
            return
        children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # kB on Linux
        self.bytes = (int(found.group(1)) + (children if children > self._children else 0)) * 1024


def is_ram_backed(path: Path) -> bool:
    """Whether ``path`` is on a tmpfs or ramfs (its files are memory)."""
    return filesystem_types().get(device(Path(path))) in RAM_FILESYSTEMS


CHARGE_EVERY = 0.05  # seconds: the kernel's count of what the job holds is read at most this often


def at_most_every(seconds: float, read: Callable[[], int | None]) -> Callable[[], int | None]:
    """``read``, called again only once ``seconds`` passed since its last call (its value kept
    meanwhile). The charge is asked before every placement and every start, and again for the jobs
    held back each time a job ends: in a Pydra run of 20,000 jobs, reading and parsing
    ``/proc/meminfo`` took a fifth of the main process's time (py-spy). What Sea reserves meanwhile
    counts at once (:meth:`MemoryBudget.committed`).

    >>> calls = []
    >>> read = at_most_every(60, lambda: calls.append(1) or len(calls))
    >>> read(), read(), len(calls)
    (1, 1, 1)
    """
    last: list = [None, None]  # (when, value)

    def read_now() -> int | None:
        now = time.monotonic()
        if last[0] is None or now - last[0] >= seconds:
            last[:] = [now, read()]
        return last[1]

    return read_now


class MemoryBudget:
    """The job's memory, as nodes and RAM tiers share it (see the module's docstring). Thread-safe."""

    def __init__(self, limit: MemoryLimit, headroom: int, read_charge: Callable[[], int | None] | None = None):
        self.limit = limit
        self.headroom = headroom
        self._read_charge = at_most_every(CHARGE_EVERY, read_charge or limit.charge_reader())
        self.base = self._read_charge() or 0  # what the job holds before any node: Sea's own process, the engine's
        self._nodes: dict[str, int] = {}
        self._reserved = 0
        self._lock = threading.Lock()
        self.peak_committed = 0  # the most committed at any decision, either view
        self.peak_charged = 0  # the most the cgroup (or machine) was seen charged at a decision
        self.held: set[str] = set()  # nodes held back because their memory did not fit
        self._oom_kills = self.limit.oom_kills()
        self.spills = 0  # placements a RAM tier had free space for but not memory

    @property
    def room(self) -> int:
        """The memory nodes and RAM tiers may share: the limit less the headroom."""
        return self.limit.bytes - self.headroom

    def reserve(self, key: str, nbytes: int) -> None:
        """Node ``key`` runs, and may use ``nbytes`` of memory."""
        with self._lock:
            self._reserved += nbytes - self._nodes.get(key, 0)
            self._nodes[key] = nbytes

    def release(self, key: str) -> None:
        with self._lock:
            self._reserved -= self._nodes.pop(key, 0)

    def committed(self, ram_used: int, ram_reserved: int) -> int:
        """What is committed now (see the module's docstring), given the bytes held on RAM tiers and
        the room reserved there for running nodes."""
        accounted = self.base + self._reserved + ram_used + ram_reserved
        charged = self._read_charge()
        if charged is None:
            committed = accounted
        else:
            self.peak_charged = max(self.peak_charged, charged)
            committed = max(accounted, charged + ram_reserved)
        self.peak_committed = max(self.peak_committed, committed)
        return committed

    def free(self, ram_used: int, ram_reserved: int) -> int:
        """Memory not committed: what a node, or a RAM tier's new directory, may still take."""
        return self.room - self.committed(ram_used, ram_reserved)

    def fits(self, nbytes: int, ram_used: int, ram_reserved: int) -> bool:
        return nbytes <= self.free(ram_used, ram_reserved)

    def oom_kills(self) -> int:
        """Processes of the job's cgroup the OOM killer took since the budget was made."""
        return self.limit.oom_kills() - self._oom_kills
