"""slowfs: a throttled passthrough FUSE filesystem standing in for a busy shared filesystem.

``python -m benchmarks.slowfs BACKING MOUNTPOINT --write-mbps 30 --read-mbps 200 --meta-latency-ms 5``

Why each part exists (background.md, section 1):

* One token bucket per direction for the whole mount, shared by every process that uses it: the
  bandwidth of a Lustre is the filesystem's, not a client's. A transfer reserves its slot in the
  bucket under a lock and sleeps outside it, so concurrent transfers queue up as on a saturated link.
* A fixed latency on metadata operations (open, create, stat, mkdir, rename, unlink, readdir, ...):
  Lustre's metadata server, which makes many small files slow even when bandwidth is fine.
* ``--busy-share S``: a background thread reserves the share S of both buckets continuously: other
  users' jobs, the seeds' "busy writers".
* ``--fail-pattern GLOB --fail-errno EIO|ENOSPC`` and ``--fail-after-bytes N``: writes (and creates)
  fail with that errno, for reliability tests.
* Mounted with ``direct_io``: the kernel's page cache cannot absorb writes or serve reads, so the
  throttle is what a process sees. Measured here (30 MB/s write, 200 MB/s read, 5 ms metadata):
  ``dd if=/dev/zero of=MNT/x bs=1M count=60`` -> 62.9 MB copied in 2.20 s, 28.6 MB/s;
  ``dd if=MNT/x of=/dev/null bs=1M`` -> 0.39 s, 161 MB/s (FUSE's own cost on top of the bucket);
  50 ``os.stat`` calls -> 0.55 s (a lookup and a getattr each reach the "metadata server").

The server runs in its own process (:class:`SlowFS` starts it), so a test's or benchmark's Python
threads never compete with FUSE's for the GIL, and a crash of one cannot hang the other.
"""

from __future__ import annotations

import argparse
import errno
import fnmatch
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Throttle:
    write_mbps: float = 0.0  # MB = 10**6 bytes; 0 = unthrottled
    read_mbps: float = 0.0
    meta_latency_ms: float = 0.0
    busy_share: float = 0.0  # share of both bandwidths eaten by other users' jobs
    fail_pattern: str | None = None  # glob on the path inside the mount
    fail_errno: str = "EIO"
    fail_after_bytes: int | None = None

    def args(self) -> list[str]:
        out = []
        for key, value in asdict(self).items():
            if value not in (None, 0, 0.0) and not (key == "fail_errno" and value == "EIO"):
                out += [f"--{key.replace('_', '-')}", str(value)]
        return out


class TokenBucket:
    """A shared link of ``rate`` bytes/s: each transfer books the next free interval."""

    def __init__(self, rate: float):
        self.rate = rate
        self._lock = threading.Lock()
        self._free_at = time.monotonic()

    def book(self, nbytes: int) -> float:
        """Reserve ``nbytes``; returns when the transfer completes (monotonic seconds)."""
        with self._lock:
            start = max(time.monotonic(), self._free_at)
            self._free_at = start + nbytes / self.rate
            return self._free_at

    def take(self, nbytes: int) -> None:
        if self.rate > 0:
            delay = self.book(nbytes) - time.monotonic()
            if delay > 0:
                time.sleep(delay)


def _busy_writers(buckets: list[TokenBucket], share: float, period: float = 0.05) -> None:
    while True:
        for bucket in buckets:
            if bucket.rate > 0:
                bucket.book(int(bucket.rate * share * period))
        time.sleep(period)


def make_operations(root: Path, throttle: Throttle):
    """The passthrough operations over ``root`` (imported lazily: mfusepy needs libfuse3)."""
    import mfusepy as fuse

    write_bucket = TokenBucket(throttle.write_mbps * 1e6)
    read_bucket = TokenBucket(throttle.read_mbps * 1e6)
    if throttle.busy_share > 0:
        threading.Thread(target=_busy_writers, args=([write_bucket, read_bucket], throttle.busy_share), daemon=True).start()
    latency = throttle.meta_latency_ms / 1000
    fail_errno = getattr(errno, throttle.fail_errno)
    written = [0]
    written_lock = threading.Lock()

    def meta() -> None:
        if latency:
            time.sleep(latency)

    def check_failure(path: str, nbytes: int) -> None:
        if throttle.fail_pattern and fnmatch.fnmatch(path.lstrip("/"), throttle.fail_pattern):
            raise fuse.FuseOSError(fail_errno)
        if throttle.fail_after_bytes is not None:
            with written_lock:
                written[0] += nbytes
                if written[0] > throttle.fail_after_bytes:
                    raise fuse.FuseOSError(fail_errno)

    class Passthrough(fuse.Operations):
        use_ns = True  # getattr returns st_*time in nanoseconds: Nipype hashes mtimes

        def _full(self, path: str) -> str:
            return os.path.join(root, path.lstrip("/"))

        def __call__(self, op, *args):
            try:
                return super().__call__(op, *args)
            except OSError as exc:
                if isinstance(exc, fuse.FuseOSError):
                    raise
                raise fuse.FuseOSError(exc.errno or errno.EIO) from None

        # metadata: each pays the metadata server's latency
        def getattr(self, path, fh=None):
            meta()
            st = os.lstat(self._full(path))
            attrs = {k: getattr(st, k) for k in ("st_mode", "st_nlink", "st_size", "st_uid", "st_gid", "st_blocks")}
            attrs.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
            return attrs

        def readdir(self, path, fh):
            meta()
            return [".", "..", *os.listdir(self._full(path))]

        def mkdir(self, path, mode):
            meta()
            return os.mkdir(self._full(path), mode)

        def rmdir(self, path):
            meta()
            return os.rmdir(self._full(path))

        def unlink(self, path):
            meta()
            return os.unlink(self._full(path))

        def rename(self, old, new):
            meta()
            return os.rename(self._full(old), self._full(new))

        def symlink(self, target, source):
            meta()
            return os.symlink(source, self._full(target))

        def link(self, target, source):
            meta()
            return os.link(self._full(source), self._full(target))

        def readlink(self, path):
            meta()
            return os.readlink(self._full(path))

        def chmod(self, path, mode):
            meta()
            return os.chmod(self._full(path), mode)

        def chown(self, path, uid, gid):
            meta()
            return os.lchown(self._full(path), uid, gid)

        def utimens(self, path, times=None):
            meta()
            return os.utime(self._full(path), ns=times, follow_symlinks=False) if times else os.utime(self._full(path))

        def open(self, path, flags):
            meta()
            return os.open(self._full(path), flags)

        def create(self, path, mode, fi=None):
            meta()
            check_failure(path, 0)
            return os.open(self._full(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)

        def truncate(self, path, length, fh=None):
            return os.truncate(fh if fh is not None else self._full(path), length)

        def statfs(self, path):
            sv = os.statvfs(self._full(path))
            keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")
            return {k: getattr(sv, k) for k in keys}

        # data: through the shared buckets
        def read(self, path, size, offset, fh):
            data = os.pread(fh, size, offset)
            read_bucket.take(len(data))
            return data

        def write(self, path, data, offset, fh):
            check_failure(path, len(data))
            write_bucket.take(len(data))
            return os.pwrite(fh, data, offset)

        def fsync(self, path, datasync, fh):
            return os.fdatasync(fh) if datasync else os.fsync(fh)

        def flush(self, path, fh):
            return 0

        def release(self, path, fh):
            return os.close(fh)

    return Passthrough()


def serve(backing: Path, mountpoint: Path, throttle: Throttle) -> None:
    """Mount and serve in the foreground until SIGINT/SIGTERM (libfuse unmounts on exit)."""
    import mfusepy as fuse

    fuse.FUSE(make_operations(backing.resolve(), throttle), str(mountpoint), foreground=True, nothreads=False,
              direct_io=True, allow_other=True, default_permissions=False,
              attr_timeout=0, entry_timeout=0, negative_timeout=0)  # every stat reaches the "metadata server"  # fmt: skip


def unmount(mountpoint: Path) -> None:
    if os.path.ismount(mountpoint):
        if subprocess.run(["fusermount3", "-u", str(mountpoint)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True)


class SlowFS:
    """``with SlowFS(backing, mountpoint, Throttle(write_mbps=30)) as fs:`` -- ``fs.path`` is the mount.

    The server is a child process; leaving the block (normally, on an exception or Ctrl-C) stops it
    and unmounts, so no stale mount survives a failed test.
    """

    def __init__(self, backing: Path, mountpoint: Path, throttle: Throttle = Throttle(), timeout: float = 10.0):
        self.backing, self.path, self.throttle, self.timeout = Path(backing), Path(mountpoint), throttle, timeout
        self._process: subprocess.Popen | None = None
        self._log = None

    def __enter__(self) -> SlowFS:
        self.backing.mkdir(parents=True, exist_ok=True)
        self.path.mkdir(parents=True, exist_ok=True)
        self._log = tempfile.TemporaryFile()
        command = [sys.executable, "-m", "benchmarks.slowfs", str(self.backing), str(self.path), *self.throttle.args()]
        repo = Path(__file__).resolve().parents[1]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))}
        self._process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + self.timeout
        while not os.path.ismount(self.path):
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.__exit__(None, None, None)
                raise RuntimeError(f"slowfs did not mount {self.path}: {self._output()}")
            time.sleep(0.02)
        return self

    def _output(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-2000:]

    def __exit__(self, *exc) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
            try:
                self._process.wait(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        unmount(self.path)
        if self._log is not None:
            self._log.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.slowfs", description=__doc__.split("\n\n")[0])
    parser.add_argument("backing", type=Path)
    parser.add_argument("mountpoint", type=Path)
    parser.add_argument("--write-mbps", type=float, default=0.0)
    parser.add_argument("--read-mbps", type=float, default=0.0)
    parser.add_argument("--meta-latency-ms", type=float, default=0.0)
    parser.add_argument("--busy-share", type=float, default=0.0)
    parser.add_argument("--fail-pattern")
    parser.add_argument("--fail-errno", default="EIO", choices=["EIO", "ENOSPC"])
    parser.add_argument("--fail-after-bytes", type=int)
    args = parser.parse_args(argv)
    throttle = Throttle(**{k: v for k, v in vars(args).items() if k not in ("backing", "mountpoint")})
    args.mountpoint.mkdir(parents=True, exist_ok=True)
    try:
        serve(args.backing, args.mountpoint, throttle)
    finally:
        unmount(args.mountpoint)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["SlowFS", "Throttle", "TokenBucket", "serve"]
