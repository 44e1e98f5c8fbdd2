"""slowfs: a throttled passthrough FUSE filesystem standing in for a busy shared filesystem (Lustre).

``python -m benchmarks.slowfs BACKING MOUNTPOINT --write-mbps 30 --read-mbps 200 --meta-latency-ms 5``
serves BACKING at MOUNTPOINT in the foreground until Ctrl-C or SIGTERM, then unmounts. From Python,
``with SlowFS(backing, mountpoint, write_mbps=30) as fs:`` does the same in a child process.

Why each part exists:

* Bandwidth: one token bucket per direction (write, read) for the whole mount, shared by every
  process that uses it, because a Lustre's bandwidth is the filesystem's, not a client's. A transfer
  books its slot in the bucket under a lock and sleeps outside it, so concurrent transfers queue up
  as on a saturated link without one sleeper blocking the others' bookkeeping. The bucket holds no
  burst: N bytes at R MB/s take at least N/R seconds. MB = 10**6 bytes; 0 = unthrottled.
* Metadata latency (``--meta-latency-ms``): a fixed sleep in every namespace operation (lookup and
  getattr, readdir, open, create, mkdir, rmdir, unlink, rename, (sym)link, readlink, chmod, chown,
  utimens): Lustre's metadata server, which makes many small files slow even when bandwidth is fine.
  The kernel caches no attribute (``attr_timeout=0``), so every ``stat`` reaches the "server", but it
  keeps the names it has looked up (``entry_timeout=60``), as a Lustre client keeps its dentries under
  the metadata server's locks: one ``stat`` is one metadata operation, not one per path component
  (measured: ``stat`` 5.5 ms, ``realpath`` of a 4-deep path 29 ms; with entry caching off they were
  27.7 ms and 82 ms, which charged path depth, not metadata traffic). Failed lookups are not cached.
  ``--entry-timeout-s 0`` turns entry caching off, so that a change made in the backing directory
  (standing for another client, which on Lustre revokes our dentries) is seen by the next lookup.
* Busy writers (``--busy-share S``): a background thread books the share S of both buckets as time
  passes (S * rate * elapsed bytes, every 50 ms): other users' jobs keep that share of the link busy,
  so ours get the rest, 1 - S. It books but never waits, so it takes exactly its share, no more.
* Error injection, for reliability tests: ``--fail-pattern GLOB --fail-errno EIO`` fails writes,
  creates and renames onto paths matching GLOB (``fnmatch`` on the path relative to the mount root,
  where ``*`` also matches ``/``); with ``--fail-count N`` only the first N such operations fail, a
  transient fault that a retry gets past. ``--fail-after-bytes N --fail-errno ENOSPC`` fails any
  write that would take the bytes written since the faults were (re)set above N. Faults change at
  run time through a JSON control file (``--control FILE``; ``SlowFS.set_faults`` writes it
  atomically) that the server re-reads before every write, create and rename, so a change applies
  to the very next operation.
* Slow renames (``--rename-latency-ms``): a rename waits this long on top of the metadata latency,
  as on a metadata server under load; the commit of every staged file is a rename.
* Mounted with ``direct_io``: the kernel's page cache can neither absorb writes nor serve reads, so
  every byte passes the bucket and a writer sees errors at ``write()``. Times are served in
  nanoseconds (``use_ns``) and inode numbers passed through (``use_ino``): Nipype hashes files by
  mtime, and hard links must look like one file.
* The page cache mode (``--page-cache``, ``Throttle(page_cache=True)``), for tools that memory-map
  their files (MRtrix3): ``direct_io`` refuses shared memory maps (``mmap`` fails with ENODEV, "No
  such device"; libfuse 3.14 predates FUSE_CAP_DIRECT_IO_ALLOW_MMAP, 3.16), while Lustre, GPFS and
  NFS clients allow them, with a page cache. This mode mounts without ``direct_io`` and keeps the
  rest of the kernel's caching off, so it is what a client's cache can do within one open, no more:
  without ``writeback_cache``, ``write()`` is write-through (each call passes the write bucket
  before it returns, and its errors still reach the writer); pages written through a memory map go
  to the server, through the same bucket, at the latest when the map is synced or unmapped (a fault is
  then seen by ``msync``/``fsync``, not by the store); without ``kernel_cache`` (``keep_cache``), every
  ``open`` drops the file's cached pages, so the first read of each open passes the read bucket
  and no open sees stale data; only re-reads within one open (or one map) come from the page cache,
  as on a Lustre client (which keeps them across opens too: this mode is the more pessimistic).
  The kernel's check of the attributes before each ``read()`` (``auto_inval_data``) is turned
  off: with ``attr_timeout=0`` it would charge one metadata latency per ``read()`` call, which no
  Lustre client pays (measured: 60 reads of 1 MiB took 0.63 s with it, 0.32 s without). It is off
  by default; only the benchmark's ``dwi_mrtrix`` workload uses it.

Measured on the project's machine (2 cores, kernel 6.18, fuse3 3.14, mfusepy 3.1.1; backing dir on
/var/tmp; ``python -m benchmarks.slowfs B MNT --write-mbps 30 --read-mbps 200 --meta-latency-ms 5``)::

    dd if=/dev/zero of=MNT/x bs=1M count=60 oflag=direct   ->  62914560 bytes, 2.19 s, 28.7 MB/s
    dd if=/dev/zero of=MNT/x bs=1M count=60                ->  62914560 bytes, 2.18 s, 28.8 MB/s
    dd if=MNT/x of=/dev/null bs=1M                         ->  62914560 bytes, 0.40 s, 158 MB/s
    the same with --busy-share 0.5: write 4.14 s, 15.2 MB/s; read 0.74 s, 84.8 MB/s
    unthrottled (no flags): write 0.037 s, 1.7 GB/s (0.033 s without oflag=direct); read 0.025 s, 2.5 GB/s
    50 os.stat of one file: 0.27 s (a getattr each, 5 ms apiece; the lookup is cached)
    with --page-cache (two runs each, same flags otherwise):
    dd if=/dev/zero of=MNT/x bs=1M count=60 oflag=direct   ->  2.17 s, 29.0 MB/s
    dd if=/dev/zero of=MNT/x bs=1M count=60                ->  2.20 s, 28.6 MB/s (write-through)
    dd if=MNT/x of=/dev/null bs=1M                         ->  0.32 s, 195 MB/s (a fresh open: from the server)
    the same file read twice in one open: 0.32 s, then 0.021 s (the page cache; direct_io: 0.38 s twice)
    mmap of a 60 MB file, one byte per page read: 0.32 s; 30 MB stored into a new file's map,
    then msync: 1.27 s (the write bucket; the direct_io default: mmap fails, ENODEV)

The page cache does not hide the throttle (the run without ``oflag=direct`` is as slow); the rest of
the gap to the configured rate is FUSE's own cost per request, and the opening's metadata operations.
Reads in the page cache mode come closer to the rate than with ``direct_io`` (195 against 165 MB/s):
the kernel's readahead keeps two requests of 128 KiB in flight, where ``direct_io`` sends one of 1 MiB
at a time (counted in the server during ``dd``).

Control file (``--control FILE``), e.g. ``{"fail_pattern": "out/*.nii", "fail_errno": "ENOSPC",
"fail_after_bytes": null}``: the fields of :class:`Faults`; write it whole and atomically (a
temporary file, then a rename). A file that does not parse is ignored until it does.

The server runs in its own process and session (:class:`SlowFS` starts it), so the test's or
benchmark's Python threads never compete with FUSE's for a GIL, and Ctrl-C reaches the owner, which
then unmounts in order. No stale mount survives: ``SlowFS`` unmounts on leaving its block (also on an
exception or Ctrl-C), an ``atexit`` hook and SIGTERM/SIGHUP handlers catch a process that leaves
without leaving the block, the server unmounts itself when its owner dies (even by ``kill -9``), and
a server killed by ``kill -9`` leaves a dead mount that the owner unmounts on exit. Only when both
die by ``kill -9`` does a dead mount stay, until the next ``SlowFS`` or ``serve`` at that mount point
clears it (:func:`clear_dead_mount`).

Limits, none of which the project's workflows meet: a file unlinked while open lives on as
``.fuse_hidden*`` until closed (libfuse's default, so its directory cannot be removed meanwhile);
``renameat2`` flags (RENAME_NOREPLACE, RENAME_EXCHANGE) are dropped by mfusepy; extended
attributes are not supported (ENOTSUP, which ``shutil.copystat`` ignores). libfuse 3.14 prints
"Ignoring invalid max threads value" at start: harmless, it keeps its default of 10 threads.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import errno
import fnmatch
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import IO, Any

MB = 10**6
FSNAME = "slowfs"  # device and subtype in /proc/mounts: "slowfs MNT fuse.slowfs ..."
UTIME_NOW, UTIME_OMIT = (1 << 30) - 1, (1 << 30) - 2  # tv_nsec markers libfuse passes to utimens
FUSE_CAP_AUTO_INVAL_DATA = 1 << 12  # fuse_common.h: the kernel asks for the attributes before every read()


@dataclass(frozen=True)
class Throttle:
    """How slow the filesystem is; fixed for the life of a mount."""

    write_mbps: float = 0.0  # MB = 10**6 bytes per second, for the whole mount; 0 = unthrottled
    read_mbps: float = 0.0
    meta_latency_ms: float = 0.0  # per namespace operation
    busy_share: float = 0.0  # share of both bandwidths that other users' jobs keep busy
    rename_latency_ms: float = 0.0  # added to a rename's metadata latency: a metadata server under load
    entry_timeout_s: float = 60.0  # how long the kernel trusts a name it looked up (see the module's docstring)
    page_cache: bool = False  # mount without direct_io: memory maps work, a read may come from the page cache within an open

    def __post_init__(self) -> None:
        if min(self.write_mbps, self.read_mbps, self.meta_latency_ms, self.rename_latency_ms, self.entry_timeout_s) < 0 or not 0 <= self.busy_share < 1:
            raise ValueError(f"rates and latency must be >= 0 and busy_share in [0, 1): {self}")


@dataclass(frozen=True)
class Faults:
    """Which writes fail; changeable while mounted (:meth:`SlowFS.set_faults`)."""

    fail_pattern: str | None = None  # fnmatch glob on the path relative to the mount root
    fail_errno: str = "EIO"  # an errno name: EIO, ENOSPC, ...
    fail_after_bytes: int | None = None  # writes fail once this many bytes were written since the faults were set
    fail_count: int | None = None  # the pattern fails only this many operations, then lets them pass: a transient fault

    def __post_init__(self) -> None:
        if not isinstance(getattr(errno, self.fail_errno, None), int):
            raise ValueError(f"not an errno name: {self.fail_errno!r}")

    @property
    def code(self) -> int:
        return getattr(errno, self.fail_errno)


def _flags(settings: Throttle | Faults) -> list[str]:
    """Command-line flags for the fields that differ from their defaults."""
    out: list[str] = []
    for field in fields(settings):
        value = getattr(settings, field.name)
        if value != field.default:
            flag = f"--{field.name.replace('_', '-')}"
            out += [flag] if isinstance(value, bool) else [flag, str(value)]  # a switch (False is the default)
    return out


# --- the server side ------------------------------------------------------------------------


class TokenBucket:
    """A link of ``rate`` bytes/s shared by all threads: each transfer books the next free interval.

    Booking happens under the lock, sleeping outside it, so many transfers wait at once and none
    holds up another's bookkeeping; no burst is kept, so N bytes take at least N / rate seconds.
    """

    def __init__(self, rate: float):
        self.rate = rate
        self._lock = threading.Lock()
        self._free_at = time.monotonic()

    def book(self, nbytes: int) -> float:
        """Reserve the link for ``nbytes``; returns when that transfer completes (monotonic s)."""
        with self._lock:
            self._free_at = max(time.monotonic(), self._free_at) + nbytes / self.rate
            return self._free_at

    def take(self, nbytes: int) -> None:
        """Block until ``nbytes`` have passed the link (no-op when unthrottled)."""
        if self.rate > 0 and nbytes > 0:
            delay = self.book(nbytes) - time.monotonic()
            if delay > 0:
                time.sleep(delay)


def _busy_writers(buckets: list[TokenBucket], share: float, period: float = 0.05) -> None:
    """Other users' traffic: books ``share`` of each bucket's rate as time passes, forever."""
    last = time.monotonic()
    while True:
        time.sleep(period)
        now = time.monotonic()
        for bucket in buckets:
            bucket.book(int(bucket.rate * share * (now - last)))
        last = now


class FaultInjector:
    """Decides whether a write or create fails; re-reads the control file before each decision.

    The file is tiny and read whole (tens of microseconds), which makes a change visible to the
    very next operation without signals or a socket; a missing file keeps the current faults.
    """

    def __init__(self, faults: Faults, control: Path | None = None):
        self.faults = faults
        self._control = control
        self._raw: bytes | None = None
        self._written = 0
        self._failed = 0  # operations failed by the pattern since the faults were set
        self._lock = threading.Lock()

    def _reload(self) -> None:
        if self._control is None:
            return
        try:
            raw = self._control.read_bytes()
        except FileNotFoundError:
            return
        if raw != self._raw:
            try:
                self.faults = Faults(**json.loads(raw))
            except (ValueError, TypeError):  # a half-written hand edit: keep the current faults until it parses
                return
            self._raw = raw
            self._written = self._failed = 0

    def check(self, path: str, nbytes: int) -> None:
        """Raise the injected error for writing ``nbytes`` to ``path``, or count the bytes."""
        with self._lock:
            self._reload()
            faults = self.faults
            if faults.fail_pattern is not None and fnmatch.fnmatchcase(path.lstrip("/"), faults.fail_pattern):
                if faults.fail_count is None or self._failed < faults.fail_count:
                    self._failed += 1
                    raise OSError(faults.code, f"slowfs: injected {faults.fail_errno}", path)
            if faults.fail_after_bytes is not None and self._written + nbytes > faults.fail_after_bytes:
                raise OSError(faults.code, f"slowfs: injected {faults.fail_errno}", path)
            self._written += nbytes


STAT_KEYS = ("st_mode", "st_ino", "st_nlink", "st_uid", "st_gid", "st_rdev", "st_size", "st_blksize", "st_blocks")
STATVFS_KEYS = ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree", "f_favail", "f_flag", "f_namemax")


class Passthrough:
    """The FUSE operations (mfusepy's interface): everything passes to ``root``, slowed down.

    OSError raised here reaches the caller as its errno (mfusepy translates it).
    """

    use_ns = True  # st_*time and utimens in nanoseconds: Nipype hashes files by mtime

    def __init__(self, root: Path, throttle: Throttle, faults: FaultInjector):
        self.root = str(root)
        self.writes = TokenBucket(throttle.write_mbps * MB)
        self.reads = TokenBucket(throttle.read_mbps * MB)
        self.latency = throttle.meta_latency_ms / 1000
        self.rename_latency = throttle.rename_latency_ms / 1000
        self.faults = faults
        self.page_cache = throttle.page_cache
        buckets = [b for b in (self.writes, self.reads) if b.rate > 0]
        if throttle.busy_share > 0 and buckets:
            threading.Thread(target=_busy_writers, args=(buckets, throttle.busy_share), daemon=True).start()

    def init_with_config(self, conn: Any, config: Any) -> None:
        """In the page cache mode, no getattr before each read() (see the module's docstring)."""
        if self.page_cache and conn is not None:
            conn.want &= ~FUSE_CAP_AUTO_INVAL_DATA

    def _meta(self, path: str) -> str:
        """Pay the metadata server's latency; the backing path of ``path``."""
        if self.latency:
            time.sleep(self.latency)
        return self.root + path

    # namespace operations: each pays the metadata latency

    def getattr(self, path: str, fh: int | None = None) -> dict[str, int]:
        full = self._meta(path)
        st = os.fstat(fh) if fh is not None else os.lstat(full)
        attrs = {key: getattr(st, key) for key in STAT_KEYS}
        attrs.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
        return attrs

    def readdir(self, path: str, fh: int) -> list[tuple[str, dict[str, int], int]]:
        """Names with their inode numbers: with ``use_ino``, an entry without one (0) is skipped by readdir(3)."""
        full = self._meta(path)
        entries = [(".", os.lstat(full)), ("..", os.lstat(os.path.join(full, "..")))]
        with os.scandir(full) as scan:
            entries += [(entry.name, entry.stat(follow_symlinks=False)) for entry in scan]
        return [(name, {"st_ino": st.st_ino, "st_mode": st.st_mode}, 0) for name, st in entries]

    def mkdir(self, path: str, mode: int) -> None:
        os.mkdir(self._meta(path), mode)

    def rmdir(self, path: str) -> None:
        os.rmdir(self._meta(path))

    def unlink(self, path: str) -> None:
        os.unlink(self._meta(path))

    def rename(self, old: str, new: str) -> None:
        self.faults.check(new, 0)
        time.sleep(self.rename_latency)
        os.rename(self._meta(old), self.root + new)

    def symlink(self, target: str, source: str) -> None:  # mfusepy: target is the new link
        os.symlink(source, self._meta(target))

    def link(self, target: str, source: str) -> None:  # mfusepy: target is the new name
        os.link(self._meta(source), self.root + target)

    def readlink(self, path: str) -> str:
        return os.readlink(self._meta(path))

    def chmod(self, path: str, mode: int) -> None:
        os.chmod(self._meta(path), mode)

    def chown(self, path: str, uid: int, gid: int) -> None:
        os.lchown(self._meta(path), uid, gid)

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> None:
        full = self._meta(path)
        if times is None:
            os.utime(full, follow_symlinks=False)
            return
        now, old = time.time_ns(), None
        ns = []
        for i, value in enumerate(times):  # libfuse passes touch's "now" and "leave alone" as markers
            if value == UTIME_NOW:
                value = now
            elif value == UTIME_OMIT:
                old = old or os.lstat(full)
                value = (old.st_atime_ns, old.st_mtime_ns)[i]
            ns.append(value)
        os.utime(full, ns=(ns[0], ns[1]), follow_symlinks=False)

    def open(self, path: str, flags: int) -> int:
        return os.open(self._meta(path), flags & ~os.O_DIRECT)  # the backing file needs no aligned I/O

    def create(self, path: str, mode: int, flags: int) -> int:
        full = self._meta(path)
        self.faults.check(path, 0)
        return os.open(full, (flags & ~os.O_DIRECT) | os.O_CREAT, mode)

    # data and the rest: no metadata latency

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        data = os.pread(fh, size, offset)
        self.reads.take(len(data))
        return data

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        self.faults.check(path, len(data))
        self.writes.take(len(data))
        return os.pwrite(fh, data, offset)

    def truncate(self, path: str, length: int, fh: int | None = None) -> None:
        os.truncate(fh if fh is not None else self.root + path, length)

    def fsync(self, path: str, datasync: int, fh: int) -> None:
        os.fdatasync(fh) if datasync else os.fsync(fh)

    def flush(self, path: str, fh: int) -> None:
        pass

    def release(self, path: str, fh: int) -> None:
        os.close(fh)

    def statfs(self, path: str) -> dict[str, int]:
        st = os.statvfs(self.root)
        return {key: getattr(st, key) for key in STATVFS_KEYS}


def _canonical(path: Path | str) -> str:
    """The absolute path as /proc/mounts spells it, without touching the path itself (it may be a dead mount)."""
    path = os.path.abspath(path)
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


def mounts() -> dict[str, str]:
    """Mount point -> filesystem type, from /proc/self/mounts (octal escapes undone)."""
    table = {}
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _device, mountpoint, fstype, *_ = line.split(" ")
        table[re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), mountpoint)] = fstype
    return table


def unmount(mountpoint: Path | str) -> None:
    """Unmount if mounted: ``fusermount3 -u``, or a lazy ``umount -l`` when that fails (e.g. busy).

    Checks /proc/self/mounts, not ``os.path.ismount``: a mount whose server died answers stat with
    ENOTCONN, so ``ismount`` says False although the dead mount is still there.
    """
    target = _canonical(mountpoint)
    errors = []
    for command in (["fusermount3", "-u", target], ["umount", "-l", target]):
        if target not in mounts():
            return
        try:
            result = subprocess.run(command, capture_output=True, text=True)
            errors.append(f"{command[0]}: {result.stderr.strip()}")
        except FileNotFoundError as exc:
            errors.append(str(exc))
    if target in mounts():
        raise RuntimeError(f"cannot unmount {target}: {'; '.join(errors)}")


def clear_dead_mount(mountpoint: Path | str) -> None:
    """Unmount a slowfs mount at ``mountpoint`` whose server is gone (both processes were killed)."""
    if mounts().get(_canonical(mountpoint)) != f"fuse.{FSNAME}":
        return
    try:
        os.stat(mountpoint)
    except OSError as exc:
        if exc.errno == errno.ENOTCONN:
            unmount(mountpoint)


def _unmount_when_orphaned(mountpoint: Path, parent_pid: int, control: Path | None) -> None:
    """The owner died without unmounting (kill -9): unmount, which ends the FUSE loop, and remove
    the control file and its directory, which the owner made for this mount and can no longer remove."""
    while os.getppid() == parent_pid:
        time.sleep(0.2)
    with contextlib.suppress(RuntimeError):
        unmount(mountpoint)
    if control is not None:
        with contextlib.suppress(OSError):
            control.unlink(missing_ok=True)
            control.parent.rmdir()


def serve(
    backing: Path,
    mountpoint: Path,
    throttle: Throttle,
    faults: Faults = Faults(),
    control: Path | None = None,
    parent_pid: int | None = None,
) -> None:
    """Mount and serve in the foreground until unmounted or SIGINT/SIGTERM/SIGHUP, then make sure it is unmounted."""
    import mfusepy

    clear_dead_mount(mountpoint)
    mountpoint.mkdir(parents=True, exist_ok=True)
    operations = Passthrough(backing.resolve(), throttle, FaultInjector(faults, control))
    if parent_pid is not None:
        threading.Thread(target=_unmount_when_orphaned, args=(mountpoint, parent_pid, control), daemon=True).start()
    try:
        mfusepy.FUSE(
            operations,
            str(mountpoint),
            foreground=True,
            nothreads=False,
            fsname=FSNAME,
            subtype=FSNAME,
            direct_io=not throttle.page_cache,  # the page cache mode: kernel_cache and writeback_cache stay off
            use_ino=True,
            allow_other=True,
            attr_timeout=0,
            entry_timeout=throttle.entry_timeout_s,
            negative_timeout=0,
        )
    except RuntimeError as exc:
        if exc.args != (8,):  # fuse_main's 8: the loop ended by SIGINT/SIGTERM/SIGHUP, the normal way out
            raise
    finally:
        unmount(mountpoint)


# --- the owner side -------------------------------------------------------------------------

_LIVE: list[SlowFS] = []  # mounts this process owns, for the atexit and signal safety nets


def _close_all() -> None:
    for fs in list(_LIVE):
        if fs.owner_pid == os.getpid():  # a forked child (Nipype's MultiProc workers) owns none of them
            try:
                fs.close()
            except Exception as exc:  # a safety net reports and goes on with the others
                print(f"slowfs: cleaning up {fs.path}: {exc}", file=sys.stderr)


def _on_fatal_signal(signum: int, frame: Any) -> None:
    """SIGTERM/SIGHUP would end the process without unwinding: unmount first, then die of the signal."""
    _close_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_safety_net() -> None:
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(signum) is signal.SIG_DFL:  # never replace a handler someone else set
                signal.signal(signum, _on_fatal_signal)


atexit.register(_close_all)


class SlowFS:
    """``with SlowFS(backing, mountpoint, write_mbps=30) as fs:`` mounts ``backing`` at ``fs.path``.

    Settings are a :class:`Throttle` (positional, or its fields as keywords) and :class:`Faults`
    (``faults=``, or its fields as keywords). The server is a child process in its own session;
    leaving the block (normally, on an exception or on Ctrl-C) unmounts and stops it.
    """

    def __init__(
        self,
        backing: Path | str,
        mountpoint: Path | str,
        throttle: Throttle | None = None,
        *,
        faults: Faults | None = None,
        timeout: float = 10.0,
        **settings: Any,
    ):
        throttle_keys = {f.name for f in fields(Throttle)}
        fault_keys = {f.name for f in fields(Faults)}
        unknown = set(settings) - throttle_keys - fault_keys
        if unknown:
            raise TypeError(f"unknown SlowFS settings: {sorted(unknown)}")
        self.throttle = replace(throttle or Throttle(), **{k: v for k, v in settings.items() if k in throttle_keys})
        self.faults = replace(faults or Faults(), **{k: v for k, v in settings.items() if k in fault_keys})
        self.backing, self.path, self.timeout = Path(backing), Path(mountpoint), timeout
        self.owner_pid = os.getpid()
        self._process: subprocess.Popen[bytes] | None = None
        self._scratch: Path | None = None  # holds the control file
        self._log: IO[bytes] | None = None  # the server's output, for errors

    @property
    def control_file(self) -> Path:
        assert self._scratch is not None, "not mounted"
        return self._scratch / "faults.json"

    @property
    def pid(self) -> int | None:
        """The server's process id."""
        return None if self._process is None else self._process.pid

    def __enter__(self) -> SlowFS:
        self.backing.mkdir(parents=True, exist_ok=True)
        clear_dead_mount(self.path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.path = Path(_canonical(self.path))
        self._scratch = Path(tempfile.mkdtemp(prefix="slowfs-"))
        command = [
            sys.executable,
            "-m",
            "benchmarks.slowfs",
            str(self.backing),
            str(self.path),
            *_flags(self.throttle),
            *_flags(self.faults),
            "--control",
            str(self.control_file),
            "--parent-pid",
            str(os.getpid()),
        ]
        repo = str(Path(__file__).resolve().parents[1])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))}
        _install_safety_net()
        _LIVE.append(self)
        self._log = tempfile.TemporaryFile()
        self._process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + self.timeout
        while not os.path.ismount(self.path):
            if self._process.poll() is not None or time.monotonic() > deadline:
                code = self._process.poll()
                why = f"the server exited with code {code}" if code is not None else f"not mounted after {self.timeout:g} s"
                output = self._server_output()
                self.close()
                raise RuntimeError(f"slowfs did not mount {self.path}: {why}; the server said:\n{output}")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def set_faults(self, faults: Faults | None = None, **fields_: Any) -> None:
        """Replace the injected faults; the next write or create sees them, and the byte count restarts."""
        self.faults = replace(faults or Faults(), **fields_)
        temporary = self.control_file.with_suffix(".tmp")
        temporary.write_text(json.dumps(asdict(self.faults)))
        os.replace(temporary, self.control_file)

    def clear_faults(self) -> None:
        self.set_faults(Faults())

    def _server_output(self) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-4000:]

    def close(self) -> None:
        """Unmount (the server's loop then ends by itself), stop the server, remove the scratch dir. Idempotent."""
        if self not in _LIVE:
            return
        try:
            unmount(self.path)
        finally:
            if self._process is not None:
                try:
                    self._process.wait(timeout=2)  # its loop ends with the mount
                except subprocess.TimeoutExpired:  # it never mounted, or hangs
                    self._process.terminate()
                    try:
                        self._process.wait(timeout=self.timeout)
                    except subprocess.TimeoutExpired:
                        self._process.kill()
                        self._process.wait()
                unmount(self.path)  # the server may have died before unmounting: never leave its mount
            if self in _LIVE:
                _LIVE.remove(self)
            if self._scratch is not None:
                shutil.rmtree(self._scratch, ignore_errors=True)
            if self._log is not None:
                self._log.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.slowfs", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("backing", type=Path, help="the directory whose contents the mount shows")
    parser.add_argument("mountpoint", type=Path)
    parser.add_argument("--write-mbps", type=float, default=0.0, help="write bandwidth of the whole mount, MB/s (0: unthrottled)")
    parser.add_argument("--read-mbps", type=float, default=0.0, help="read bandwidth of the whole mount, MB/s (0: unthrottled)")
    parser.add_argument("--meta-latency-ms", type=float, default=0.0, help="added to every namespace operation")
    parser.add_argument("--busy-share", type=float, default=0.0, help="share of both bandwidths taken by other users' jobs")
    parser.add_argument("--entry-timeout-s", type=float, default=60.0, help="how long the kernel trusts a looked-up name (0: changes in the backing dir are seen at once)")
    parser.add_argument("--rename-latency-ms", type=float, default=0.0, help="added to every rename, on top of the metadata latency")
    parser.add_argument(
        "--page-cache", action="store_true", help="mount without direct_io, so that memory maps work (MRtrix3); writes stay write-through"
    )
    parser.add_argument("--fail-pattern", help="writes, creates and renames onto paths matching this glob fail")
    parser.add_argument("--fail-errno", default="EIO", help="errno of injected failures (EIO, ENOSPC, ...)")
    parser.add_argument("--fail-after-bytes", type=int, help="writes fail once this many bytes were written")
    parser.add_argument("--fail-count", type=int, help="the pattern fails only this many operations, then lets them pass")
    parser.add_argument("--control", type=Path, help="JSON file of Faults fields, re-read before each write, create and rename")
    parser.add_argument(
        "--parent-pid", type=int, help="SlowFS's own: unmount, exit and remove the control file when this process, our parent, is gone"
    )
    args = vars(parser.parse_args(argv))
    try:
        throttle = Throttle(**{f.name: args[f.name] for f in fields(Throttle)})
        faults = Faults(**{f.name: args[f.name] for f in fields(Faults)})
    except ValueError as exc:
        parser.error(str(exc))
    serve(args["backing"], args["mountpoint"], throttle, faults, args["control"], args["parent_pid"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
