"""A memory cgroup for one child process, as SLURM's ``ConstrainRAMSpace`` makes one for a job.

``with MemoryCgroup(450 * 2**20) as cg: subprocess.run(cmd, preexec_fn=cg.enter)`` runs ``cmd`` (and
everything it starts) with 450 MiB of memory, pages it writes to a tmpfs (``/dev/shm``) included:
past the limit the kernel's OOM killer kills one of its processes. Only the child enters the group,
never the process that made it (a test runner stays out). cgroup v1 (``memory.limit_in_bytes``, as
on the project's machines) or v2 (``memory.max``, where the ``memory`` controller is delegated);
:func:`writable_memory_cgroup` says why neither can be made here.
"""

from __future__ import annotations

import os
import re
import signal
import time
import uuid
from pathlib import Path

V1_ROOT = Path("/sys/fs/cgroup/memory")
V2_ROOT = Path("/sys/fs/cgroup")


def writable_memory_cgroup() -> str | None:
    """``None`` if a memory cgroup can be made here, else why not (a skip reason)."""
    if (V1_ROOT / "memory.limit_in_bytes").exists():
        root = V1_ROOT
    elif "memory" in _read(V2_ROOT / "cgroup.subtree_control").split():
        root = V2_ROOT
    else:
        return "no memory cgroup controller is mounted writable here (cgroup v1 memory, or v2 with memory delegated)"
    if not os.access(root, os.W_OK):
        return f"{root} is not writable by this user (making a memory cgroup needs root or a delegated subtree)"
    return None


class MemoryCgroup:
    """A fresh memory cgroup limited to ``limit`` bytes (no swap), removed on exit with whatever
    still runs in it."""

    def __init__(self, limit: int, name: str | None = None):
        self.limit = limit
        self.v1 = (V1_ROOT / "memory.limit_in_bytes").exists()
        self.path = (V1_ROOT if self.v1 else V2_ROOT) / (name or f"sea-test-{uuid.uuid4().hex[:8]}")

    def __enter__(self) -> MemoryCgroup:
        self.path.mkdir()
        if self.v1:
            (self.path / "memory.limit_in_bytes").write_text(str(self.limit))
            if (self.path / "memory.memsw.limit_in_bytes").exists():
                (self.path / "memory.memsw.limit_in_bytes").write_text(str(self.limit))
        else:
            (self.path / "memory.max").write_text(str(self.limit))
            (self.path / "memory.swap.max").write_text("0")
        return self

    def enter(self) -> None:
        """Move the calling process into the group (``preexec_fn`` of the child)."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    # what happened in it ------------------------------------------------------------
    def peak(self) -> int:
        """The most memory charged to the group at once (tmpfs pages included)."""
        name = "memory.max_usage_in_bytes" if self.v1 else "memory.peak"
        return int(_read(self.path / name) or 0)

    def oom_kills(self) -> int:
        """Processes the OOM killer killed in the group."""
        text = _read(self.path / ("memory.oom_control" if self.v1 else "memory.events"))
        found = re.search(r"^oom_kill (\d+)", text, re.M)
        return int(found.group(1)) if found else 0

    def __exit__(self, *exc) -> None:
        for _ in range(50):
            pids = [int(p) for p in _read(self.path / "cgroup.procs").split()]
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        try:
            self.path.rmdir()
        except OSError:
            pass  # a process stuck in the kernel: the directory stays, empty of anything of ours


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
