"""Durability on the home: what makes a copy survive a crash of the machine, for one file or many.

A copy home is written under a temporary name, its data made durable, renamed into place, and its
directory made durable: after a crash, a reader (or a rerun) finds the whole file or none. For one
file that is an ``fsync`` of the file and one of its directory. For a batch of many small files
(a sink of 10,000), a sync per file costs a journal commit each on ext4 or XFS, an RPC each on
NFS: there, one ``syncfs(2)`` of the filesystem once all the files are written does the work of
all their ``fsync`` s, and one more after the renames that of their directories'
(:class:`BatchSync`).

``syncfs`` is trusted only on filesystems whose kernel driver writes back and waits on it
(:data:`SYNCFS_TRUSTED`); on the rest (FUSE, where it does not reach the daemon; CIFS; anything
unknown) every file is synced before its rename, and each directory once per batch. A batch of
fewer than :data:`SYNCFS_MIN_FILES` files is synced file by file too: ``syncfs`` also waits for
whatever else was written to that filesystem from this machine.

>>> import tempfile
>>> from pathlib import Path
>>> with tempfile.TemporaryDirectory(dir="/var/tmp") as d:
...     sync = BatchSync(files=100)
...     deferred = sync.defer(Path(d))  # on ext4 or XFS: the file's data waits for sync_data()
...     _ = (Path(d) / "a.tmp").write_text("x")
...     sync.sync_data()
...     _ = (Path(d) / "a.tmp").rename(Path(d) / "a")
...     sync.sync_dirs()
"""

from __future__ import annotations

import ctypes
import os
import re
import threading
from pathlib import Path
from typing import NamedTuple

SYNCFS_TRUSTED = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "nfs", "nfs4", "lustre", "gpfs", "tmpfs"})
SYNCFS_MIN_FILES = 16

_libc = ctypes.CDLL(None, use_errno=True)


def _through_dir(path: Path, call) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        call(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """``fsync`` of the directory ``path``: the names renamed into it are durable."""
    _through_dir(path, os.fsync)


def _syncfs(fd: int) -> None:
    if _libc.syncfs(fd) != 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))


def syncfs(path: Path) -> None:
    """``syncfs(2)`` of the filesystem ``path`` (a directory) is on."""
    _through_dir(path, _syncfs)


class Mount(NamedTuple):
    """One line of a mount table (``/proc/<pid>/mountinfo``)."""

    device: int  # st_dev of what is mounted
    root: str  # the directory of the filesystem shown at the mount point
    mountpoint: str
    fstype: str
    options: tuple[str, ...]  # the filesystem's own (super) options
    source: str = ""  # what is mounted, as the mount names it ("shm": Docker's and Podman's own /dev/shm)


def mount_table(mountinfo: str | None = None) -> list[Mount]:
    """This process's mounts (or those ``mountinfo``'s text gives), paths unescaped."""
    if mountinfo is None:
        mountinfo = Path("/proc/self/mountinfo").read_text(encoding="utf-8", errors="surrogateescape")  # a mount point named in other bytes
    mounts = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        major, minor = fields[2].split(":")
        options = tuple(fields[sep + 3].split(",")) if len(fields) > sep + 3 else ()
        source = _unescape(fields[sep + 2]) if len(fields) > sep + 2 else ""
        mounts.append(Mount(os.makedev(int(major), int(minor)), _unescape(fields[3]), _unescape(fields[4]), fields[sep + 1], options, source))
    return mounts


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def filesystem_types() -> dict[int, str]:
    """Device number (``st_dev``) -> filesystem type, from this process's mount table."""
    return {mount.device: mount.fstype for mount in mount_table()}


class BatchSync:
    """How the copies of one batch are made durable: each file before its rename (``defer`` says
    False), or all of a filesystem's at once by :meth:`sync_data` (``defer`` says True); then every
    directory a copy was renamed into, by :meth:`sync_dirs`. Thread-safe: the stager's threads
    write the batch's files."""

    def __init__(self, files: int):
        self._batched = files >= SYNCFS_MIN_FILES
        self._lock = threading.Lock()
        self._types: dict[int, str] | None = None
        self._dirs: dict[Path, int | None] = {}  # directory -> its device when syncfs covers it, else None

    def defer(self, directory: Path) -> bool:
        """Whether a file written into ``directory`` may leave its sync to :meth:`sync_data`."""
        with self._lock:
            if directory not in self._dirs:
                synced_with = None
                if self._batched:
                    if self._types is None:
                        self._types = filesystem_types()
                    st_dev = device(directory)
                    synced_with = st_dev if self._types.get(st_dev) in SYNCFS_TRUSTED else None
                self._dirs[directory] = synced_with
            return self._dirs[directory] is not None

    def sync_data(self) -> None:
        """Make durable the files whose sync was deferred: one ``syncfs`` per filesystem, through
        any of its directories that still exists."""
        with self._lock:
            by_device: dict[int, list[Path]] = {}
            for path, device in self._dirs.items():
                if device is not None:
                    by_device.setdefault(device, []).append(path)
        for paths in by_device.values():
            for path in paths:
                try:
                    syncfs(path)
                    break
                except FileNotFoundError:  # never made, or removed since: another of them will do
                    continue

    def sync_dirs(self) -> None:
        """Make durable the renames into every directory seen: ``syncfs`` where trusted, else ``fsync``."""
        self.sync_data()
        with self._lock:
            others = [path for path, device in self._dirs.items() if device is None]
        for path in others:
            _unless_gone(fsync_dir, path)


def device(directory: Path) -> int:
    """The device of ``directory``, or of its nearest existing parent (one not made yet)."""
    path = directory
    while True:
        try:
            return os.stat(path).st_dev
        except FileNotFoundError:
            if path.parent == path:
                raise
            path = path.parent


def _unless_gone(sync, path: Path) -> None:
    """A directory never made (its first copy failed) or removed since: nothing of it to sync,
    and the copies' own errors say what happened."""
    try:
        sync(path)
    except FileNotFoundError:
        pass
