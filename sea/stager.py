"""The asynchronous stager: copies files home while compute goes on, atomically.

A copy is written under a hidden temporary name next to its destination, fsync'ed, given the
source's timestamps (so Nipype's timestamp hashing sees the same file), then renamed over the final
name and the directory fsync'ed: a partial file is never visible at its final path, and a reader
either sees nothing or the whole file. Transient errors (and a destination directory removed under
the copy) are retried with backoff; a persistent one is reported with the file's name and the
source is kept, so nothing is lost.

Copies are taken in order of priority: declared outputs (what the run must deliver), then node
directories that must go home (every one with ``checkpoints: all``), then optional checkpoints
(``auto``'s). An optional copy uses only an idle link: it starts when no copy the run needs is
queued or under way, and gives way (stops between chunks, its temporary removed, queued again) as
soon as one is submitted, so a checkpoint never holds up an output; at the end of a run, optional
copies not done yet are abandoned (:meth:`Stager.abandon`), those under way stopped, rather than
waited for.
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import logging
import os
import queue
import secrets
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger("sea")

TMP_MARK = ".sea-tmp-"
NAME_MAX = 255  # bytes in one file name, on every Linux filesystem a home or a tier lives on
DECLARED, KEPT, CHECKPOINT = 0, 1, 2  # priorities, the lowest first: see the module's docstring
TRANSIENT = {errno.EIO, errno.EAGAIN, errno.EBUSY, errno.ETIMEDOUT, errno.EINTR, errno.ESTALE}  # ESTALE: NFS


CHUNK = 4 * 2**20


class Yielded(Exception):
    """A copy stopped part-way by its ``interrupt`` (its temporary file removed): see :class:`Stager`."""


def temporary_name(name: str, tag: str) -> str:
    """The hidden name under which ``name`` is written before it is renamed into place:
    ``.NAME.sea-tmp-TAG``, or, where that would pass the 255 bytes a file name may have (the user's
    name may use them all), ``.sea-tmp-TAG-`` and a hash of the name."""
    full = f".{name}{TMP_MARK}{tag}"
    if len(os.fsencode(full)) <= NAME_MAX:
        return full
    return f"{TMP_MARK}{tag}-{hashlib.sha256(os.fsencode(name)).hexdigest()[:16]}"


def atomic_copy(src: Path, dst: Path, interrupt: Callable[[], bool] | None = None) -> int:
    """Copy ``src`` to ``dst`` through a temporary name; returns the bytes copied. ``interrupt``
    is asked between chunks: if it says so, the copy stops, leaves nothing, and raises :class:`Yielded`."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir() and not src.is_symlink():  # an empty directory: it is part of the outputs too
        dst.mkdir(exist_ok=True)
        shutil.copystat(src, dst)
        fsync_dir(dst.parent)
        return 0
    tmp = dst.parent / temporary_name(dst.name, secrets.token_hex(4))
    try:
        if src.is_symlink():
            os.symlink(os.readlink(src), tmp)
            size = 0
        else:
            with open(src, "rb") as fin, open(tmp, "xb") as fout:
                while chunk := fin.read(CHUNK if interrupt is None else CHUNK // 4):  # an optional copy stops sooner
                    if interrupt is not None and interrupt():
                        raise Yielded(str(src))
                    fout.write(chunk)
                fout.flush()
                os.fsync(fout.fileno())
            shutil.copystat(src, tmp)
            size = tmp.stat().st_size
        os.replace(tmp, dst)
    except BaseException:
        try:
            tmp.unlink()
        except FileNotFoundError:
            pass
        raise
    fsync_dir(dst.parent)
    return size


def _destination_vanished(exc: OSError, src: Path) -> bool:
    """ENOENT with the source still there: someone removed the destination's directory (a user
    cleaning up, another node on the shared filesystem); the next attempt makes it again."""
    return exc.errno == errno.ENOENT and src.exists()


def sweep_temporaries(root: Path) -> int:
    """Remove the temporary copies a killed run left under ``root`` (they never reached a final name)."""
    removed = 0
    for dirpath, dirs, files in os.walk(root):
        for name in [n for n in dirs if TMP_MARK in n]:
            shutil.rmtree(os.path.join(dirpath, name), ignore_errors=True)
            dirs.remove(name)
            removed += 1
        for name in files:
            if TMP_MARK in name:
                os.unlink(os.path.join(dirpath, name))
                removed += 1
    return removed


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class FlushBatch:
    """The files of one node that must reach home; ``on_done`` runs once all are settled."""

    key: str
    files: list[tuple[Path, Path]]  # (source on a tier, destination at home)
    on_done: Callable[[FlushBatch], None]
    committed: list[tuple[Path, int, int]] = field(default_factory=list)  # (dst, size, mtime_ns) as lstat gives them
    errors: list[str] = field(default_factory=list)
    retries: int = 0  # attempts that failed and were tried again
    timings: list[tuple[int, float]] = field(default_factory=list)  # (bytes, seconds) of each file copied
    abandoned: list[tuple[Path, Path]] = field(default_factory=list)  # not copied: the run ended first
    _left: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def bytes(self) -> int:
        return sum(size for size, _ in self.timings)


class Stager:
    """Threads that commit :class:`FlushBatch` es, by priority then in order, and tell the engine
    when each is done."""

    def __init__(self, threads: int, retries: int = 3, backoff: float = 0.2):
        self._threads_wanted = threads
        self._threads: list[threading.Thread] = []  # started with the first copy
        self._queue: queue.PriorityQueue = queue.PriorityQueue()
        self._order = itertools.count()
        self._retries = retries
        self._backoff = backoff
        self._idle = threading.Condition()
        self._in_flight = 0
        self._pending: dict[int, int] = {}  # priority -> files queued or being copied
        self._abandoning: set[int] = set()  # priorities whose copies stop now (see abandon)

    @property
    def queue_length(self) -> int:
        return self._in_flight

    def submit(self, batch: FlushBatch, priority: int = DECLARED) -> None:
        if not batch.files:
            batch.on_done(batch)
            return
        batch._left = len(batch.files)
        with self._idle:
            self._in_flight += len(batch.files)
            self._pending[priority] = self._pending.get(priority, 0) + len(batch.files)
            while len(self._threads) < self._threads_wanted:
                thread = threading.Thread(target=self._work, name=f"sea-stager_{len(self._threads)}", daemon=True)
                thread.start()
                self._threads.append(thread)
        for src, dst in batch.files:
            self._queue.put((priority, next(self._order), batch, src, dst))
        with self._idle:
            self._idle.notify_all()  # an optional copy waiting for an idle link looks again

    def _link_busy(self) -> bool:
        """A copy the run needs (a declared output, a directory that must go home) is queued or under way."""
        return self._pending.get(DECLARED, 0) + self._pending.get(KEPT, 0) > 0

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            priority, _, batch, src, dst = item
            if batch is None:
                return
            if priority == CHECKPOINT and self._link_busy() and priority not in self._abandoning:
                # an optional copy takes the link only when it is idle: back in line until then
                self._queue.put(item)
                with self._idle:
                    self._idle.wait(0.2)  # woken when a copy settles or another is submitted
                continue
            settled = True
            try:
                settled = self._copy_one(batch, src, dst, priority)
            finally:
                if settled:
                    self._file_done(batch, priority)
                else:  # it gave way to a copy the run needs: again later, from the start
                    self._queue.put(item)

    def abandon(self, priority: int) -> int:
        """Take the copies of ``priority`` out of the queue and stop those under way (the run is
        over and they are optional); their batches settle without them (``FlushBatch.abandoned``).
        Returns how many files were dropped from the queue."""
        self._abandoning.add(priority)  # those being copied stop at their next chunk
        kept, dropped = [], []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            (dropped if item[0] == priority and item[2] is not None else kept).append(item)
        for item in kept:
            self._queue.put(item)
        for _, _, batch, src, dst in dropped:
            with batch._lock:
                batch.abandoned.append((src, dst))
            self._file_done(batch, priority)
        return len(dropped)

    def _file_done(self, batch: FlushBatch, priority: int) -> None:
        with batch._lock:
            batch._left -= 1
            last = batch._left == 0
        if last:
            try:
                batch.on_done(batch)
            except Exception:  # noqa: BLE001 - a callback bug must not hang drain()
                logger.exception("[Sea] error while settling the flush of %s", batch.key)
        with self._idle:
            self._in_flight -= 1
            self._pending[priority] -= 1
            self._idle.notify_all()

    def _copy_one(self, batch: FlushBatch, src: Path, dst: Path, priority: int = DECLARED) -> bool:
        """Copy one file, retrying transient errors; ``False`` if an optional copy gave way to one
        the run needs (it is then queued again)."""
        interrupt = None
        if priority == CHECKPOINT:
            def interrupt() -> bool:
                return priority in self._abandoning or self._link_busy()
        for attempt in range(self._retries + 1):
            try:
                start = time.perf_counter()
                size = atomic_copy(src, dst, interrupt)
                seconds = time.perf_counter() - start
                st = dst.lstat()
                with batch._lock:  # as a rerun will find it (a link's size is its target's length)
                    batch.committed.append((dst, st.st_size, st.st_mtime_ns))
                    batch.timings.append((size, seconds))
                break
            except Yielded:
                if priority not in self._abandoning:
                    return False
                with batch._lock:
                    batch.abandoned.append((src, dst))
                break
            except OSError as exc:
                if attempt < self._retries and (exc.errno in TRANSIENT or _destination_vanished(exc, src)):
                    logger.warning("[Sea] copying %s to %s failed (%s); trying again", src, dst, exc.strerror or exc)
                    with batch._lock:
                        batch.retries += 1
                    time.sleep(self._backoff * 4**attempt)
                    continue
                message = f"could not copy {src} to {dst}: {exc.strerror or exc}"
                logger.error("[Sea] %s; the source is kept at %s", message, src)
                with batch._lock:
                    batch.errors.append(message)
                break
        return True

    def drain(self, before: int | None = None) -> float:
        """Block until every submitted copy is settled (``before``: every copy of a priority lower
        than that); returns the seconds waited."""
        start = time.monotonic()
        with self._idle:
            while sum(n for p, n in self._pending.items() if before is None or p < before):
                self._idle.wait()
        return time.monotonic() - start

    def close(self) -> None:
        self.drain()
        for _ in self._threads:
            self._queue.put((float("inf"), next(self._order), None, None, None))
        for thread in self._threads:
            thread.join()
        self._threads.clear()
