"""How much the home (the shared filesystem) can still take: its free space and the user's quota.

Checkpoints are optional: they stop well before either runs out (:mod:`sea.checkpoint`), so that
declared outputs always find room. The free space is the filesystem's (``statvfs``), read again
at most every :data:`REREAD` seconds (on Lustre a ``statfs`` asks every storage target). The quota
is read once per run, where a command can tell it: ``lfs quota`` on Lustre, ``quota`` elsewhere
(NFS, GPFS with quotas exported, local disks); what the run writes since is subtracted. A command
that is missing, slow or unreadable means no quota is known: never an error.

    >>> parse_lfs_quota(LFS_SAMPLE)
    Quota(used=4096000, limit=10240000, files_used=1200, files_limit=1000000)
    >>> parse_quota(QUOTA_SAMPLE, "/dev/sdb1")
    Quota(used=2097152000, limit=4194304000, files_used=52, files_limit=0)
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REREAD = 5.0  # seconds between two statvfs of the home
TIMEOUT = 5.0  # seconds a quota command may take
FILES_LEFT_MIN = 1000  # fewer files left than this in the quota: no more checkpoints

LFS_SAMPLE = """Disk quotas for usr alice (uid 1000):
     Filesystem  kbytes   quota   limit   grace   files   quota   limit   grace
       /scratch    4000       0   10000       -    1200       0 1000000       -
"""
QUOTA_SAMPLE = """Disk quotas for user alice (uid 1000):
     Filesystem  blocks   quota   limit   grace   files   quota   limit   grace
      /dev/sdb1 2048000 4096000 4200000              52       0       0
"""


@dataclass(frozen=True)
class Quota:
    used: int  # bytes
    limit: int  # bytes; 0: none
    files_used: int = 0
    files_limit: int = 0  # 0: none

    @property
    def bytes_left(self) -> int | None:
        return max(self.limit - self.used, 0) if self.limit else None

    @property
    def files_left(self) -> int | None:
        return max(self.files_limit - self.files_used, 0) if self.files_limit else None


def _number(text: str) -> int:
    return int(text.rstrip("*"))  # over quota: lfs and quota mark the figure with a star


def _row(fields: list[str]) -> Quota | None:
    """kbytes quota limit grace files quota limit grace (grace may be missing when not over)."""
    try:
        used, soft, hard = (_number(f) for f in fields[:3])
        rest = [f for f in fields[3:] if re.fullmatch(r"\d+\*?", f)]
        files, files_soft, files_hard = (_number(f) for f in rest[:3]) if len(rest) >= 3 else (0, 0, 0)
    except (ValueError, IndexError):
        return None
    limit = min(v for v in (soft, hard) if v) if soft or hard else 0
    files_limit = min(v for v in (files_soft, files_hard) if v) if files_soft or files_hard else 0
    return Quota(used * 1024, limit * 1024, files, files_limit)


def parse_lfs_quota(text: str) -> Quota | None:
    """``lfs quota -u USER PATH``'s figures (KiB), from its first row of numbers."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        fields = line.split()
        if len(fields) == 1 and i + 1 < len(lines):  # a long path alone on its line, the figures on the next
            fields = fields + lines[i + 1].split()
        if len(fields) >= 4 and fields[0].startswith("/") and re.fullmatch(r"\d+\*?", fields[1]):
            return _row(fields[1:])
    return None


def parse_quota(text: str, source: str) -> Quota | None:
    """``quota -w -u``'s row for the filesystem ``source`` (the device or ``server:/export`` the home
    is mounted from), in 1 KiB blocks."""
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[0] == source:
            return _row(fields[1:])
    return None


def mount_of(path: Path) -> tuple[str, str, str] | None:
    """(source, mount point, filesystem type) of the mount holding ``path``."""
    path = Path(path).resolve()
    best = None
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        point = Path(parts[1].replace("\\040", " "))
        if (path == point or point in path.parents) and (best is None or len(point.parts) > len(best[1].parts)):
            best = (parts[0], point, parts[2])
    return (best[0], str(best[1]), best[2]) if best else None


def read_quota(home: Path) -> Quota | None:
    """The user's quota on the filesystem of ``home``, if a command can tell it."""
    mount = mount_of(home)
    if mount is None:
        return None
    source, point, fstype = mount
    user = str(os.getuid())
    try:
        if fstype == "lustre" and shutil.which("lfs"):
            done = subprocess.run(["lfs", "quota", "-u", user, point], capture_output=True, text=True, timeout=TIMEOUT)
            return parse_lfs_quota(done.stdout) if done.returncode == 0 else None
        if shutil.which("quota"):
            done = subprocess.run(["quota", "-w", "-u", user], capture_output=True, text=True, timeout=TIMEOUT)
            return parse_quota(done.stdout, source)  # it exits 1 when over quota: the figures still count
    except (OSError, subprocess.SubprocessError):
        return None
    return None


class HomeSpace:
    """What the home can still take, in bytes (:meth:`room`), and why it is short (:attr:`reason`)."""

    def __init__(self, home: Path, quota: Quota | None = None):
        self.home = Path(home)
        self.quota = quota
        self._written = 0  # bytes written to the home since the quota was read
        self._since_read = 0  # ... since its free space was read
        self._free: int | None = None
        self._read_at = -REREAD
        self._lock = threading.Lock()

    @classmethod
    def read(cls, home: Path) -> HomeSpace:
        return cls(home, read_quota(home))

    def wrote(self, nbytes: int) -> None:
        with self._lock:
            self._written += nbytes
            self._since_read += nbytes

    def free(self) -> int | None:
        now = time.monotonic()
        with self._lock:
            if now - self._read_at >= REREAD:
                self._read_at, self._since_read = now, 0
                try:
                    st = os.statvfs(self.home)
                    self._free = st.f_bavail * st.f_frsize
                except OSError:
                    self._free = None
            return None if self._free is None else max(self._free - self._since_read, 0)

    def room(self) -> int | None:
        """The smaller of the free space and what the quota leaves (``None``: neither is known);
        0 when the quota's files are nearly all used."""
        free = self.free()
        quota = self.quota
        if quota is None:
            return free
        files_left = quota.files_left
        if files_left is not None and files_left < FILES_LEFT_MIN:
            return 0
        left = quota.bytes_left
        if left is not None:
            left = max(left - self._written, 0)
            free = left if free is None else min(free, left)
        return free
