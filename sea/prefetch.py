"""Rolling prefetch: the workflow's input files, copied from the shared filesystem to a fast tier
ahead of the nodes that read them, while earlier nodes compute.

The adapter says which files a node will read as soon as it knows (:meth:`Prefetcher.expect`: a
node's own inputs when the graph is given, a data grabber's outputs once it ran); the engine says
which readers come next (:meth:`Prefetcher.advance`, readers in the order the scheduler will start
them). The files of up to ``lookahead`` readers that have not started are copied, by two threads,
to the fastest tier with room, within ``budget`` bytes of copies per tier; the copies' space is
reserved on the tier, so node placement sees it. While copies are under way, a reader whose
inputs are not all copied yet waits to be started (:meth:`pending`; the engine is told when a copy
ends), so the adapter's loop goes on meanwhile and no reader reads the shared filesystem beside the
copies. When a reader is about to start, the adapter asks
:meth:`Prefetcher.copies_for`: the copies that are complete (a copy under way is waited for, one
not started yet is dropped: the reader reads the shared filesystem, as without prefetch). A copy
goes once every reader registered for it finished.

With ``enabled: auto`` (the default) prefetch first proves that it pays: reading the shared
filesystem must be clearly slower than reading the tier. Until then files smaller than
:data:`MEASURED_BYTES` are not copied (their readers read them where they are: a workflow of small
inputs runs as without prefetch). The first copy of at least :data:`MEASURED_BYTES` is timed, then
copied again within its tier (the same steps: the same fixed costs per file); if the first took less
than :data:`PAYS_FROM` times the second, the copies not started are dropped and no more are made (a
reader reads its files where they are). Reading the copy back instead measured 5.4x for a 4 MiB
file on the local disk in a CI run, where a copy's fixed costs weigh against a read's.

A copy keeps its file's name (tools name their outputs after their inputs), in a directory of its
own per source file, with the file's companions: the smaller files next to it with the same stem
(a BIDS ``.json`` sidecar; an Analyze header's ``.img``), which tools look for beside their input. It
is written under a temporary name and renamed (:func:`sea.stager.atomic_copy`), and keeps the
source's timestamps.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from .config import PrefetchSpec
from .sizes import parse_fraction, parse_size
from .stager import CHUNK, atomic_copy
from .tiers import StorageHierarchy, Tier

logger = logging.getLogger("sea")

PREFETCH_DIR = ".prefetch"
PAYS_FROM = 4.0  # enabled: auto keeps prefetching when a copy takes at least this many times copying it within the tier
MEASURED_BYTES = 2**20  # ... measured on the first copy at least this large (smaller ones: latency more than bandwidth)
MEASURED_AT_MOST = 64 * 2**20  # ... copied again within the tier up to this much (a 4 GiB image is not copied twice)


@dataclass
class _Copy:
    source: Path
    readers: set[str]
    tier: Tier | None = None
    target: Path | None = None  # the copy of ``source``, once placed
    size: int = 0  # reserved on ``tier``: the file and its companions
    future: Future | None = None
    done: bool = False  # the copy ended
    ok: bool = False  # ... and ``target`` is complete
    skipped: bool = False  # not copied: under MEASURED_BYTES while enabled: auto had not measured


@dataclass
class PrefetchStats:
    files: int = 0  # files copied ahead (companions not counted)
    bytes: int = 0
    hits: int = 0  # inputs a reader read from a copy
    misses: int = 0  # inputs a reader read from the shared filesystem: the copy was not there in time
    slowdown: float | None = None  # enabled: auto: the measured copy's time over copying it again within the tier
    stopped: bool = False  # ... under PAYS_FROM: prefetch stopped


@dataclass
class Prefetcher:
    """One run's prefetch. ``order(keys)``: the engine's order for readers (best first)."""

    spec: PrefetchSpec
    hierarchy: StorageHierarchy
    order: Callable[[list[str]], list[str]]
    on_copied: Callable[[], None] = lambda: None  # a copy ended: a reader held for it may start (SeaEngine.may_start)
    stats: PrefetchStats = field(default_factory=PrefetchStats)
    _copies: dict[Path, _Copy] = field(default_factory=dict)
    _files: dict[str, list[Path]] = field(default_factory=dict)  # reader -> its sources
    _started: set[str] = field(default_factory=set)
    _held: dict[str, int] = field(default_factory=dict)  # tier name -> bytes of copies on it
    _under_way: set[Path] = field(default_factory=set)  # sources whose copy is queued or being made
    _pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(2, thread_name_prefix="sea-prefetch"))
    _closed: bool = False
    _pays: bool | None = None  # None: enabled: auto, not measured yet

    def __post_init__(self) -> None:
        if self.spec.enabled is True:
            self._pays = True
        # the engine's own lock: the engine calls in holding it, and the copies reserve tier room
        # under it; one lock cannot be taken in two orders
        self._lock = self.hierarchy.lock

    # ------------------------------------------------------------------ events
    def expect(self, reader: str, sources: Iterable[Path]) -> None:
        """``reader`` will read these files (absolute paths on the shared filesystem)."""
        with self._lock:
            if self._closed or reader in self._started:
                return
            mine = self._files.setdefault(reader, [])
            for source in sources:
                source = Path(source)
                if source in mine:
                    continue
                mine.append(source)
                self._copies.setdefault(source, _Copy(source, set())).readers.add(reader)
        self.advance()

    def advance(self) -> None:
        """Start the copies for the next ``lookahead`` readers that have not started."""
        with self._lock:
            if self._closed or self._pays is False:
                return
            waiting = [r for r in self._files if r not in self._started]
            for reader in self.order(waiting)[: self.spec.lookahead]:
                for source in self._files[reader]:
                    copy = self._copies[source]
                    if copy.future is None and not self._start(copy):
                        return  # no room within the budget: wait for copies to go

    @property
    def copying(self) -> bool:
        """Copies are queued or being made: their ends will come (each calls ``on_copied``)."""
        return bool(self._under_way)

    def pending(self, reader: str) -> bool:
        """Whether ``reader`` should wait to start: an input of it has no complete copy yet while
        copies are under way (its own, or those ahead of it: started now, it would read the shared
        filesystem beside them, or wait for its copy in :meth:`copies_for`). With no copy under
        way, it starts and reads what has no copy from the shared filesystem."""
        with self._lock:
            if self._pays is False:
                return False
            copies = [self._copies.get(source) for source in self._files.get(reader, ())]
            if all(copy is not None and (copy.ok or copy.skipped) for copy in copies):
                return False
            return bool(self._under_way)

    def copies_for(self, reader: str) -> dict[str, str]:
        """``reader`` starts now: source path -> its complete copy, for the inputs that have one."""
        with self._lock:
            self._started.add(reader)
            sources = list(self._files.get(reader, []))
            running = [self._copies[s].future for s in sources if self._copies[s].future is not None and not self._copies[s].done]
        for future in running:  # already reading the shared filesystem: finishing it is the quicker
            try:
                future.result()
            except Exception:  # noqa: BLE001 - logged by the copy; the reader reads the original
                pass
        found = {}
        with self._lock:
            for source in sources:
                copy = self._copies[source]
                if copy.ok:
                    found[str(source)] = str(copy.target)
                    self.stats.hits += 1
                elif not copy.skipped:
                    self.stats.misses += 1
        self.advance()
        return found

    def reader_done(self, reader: str) -> None:
        """``reader`` finished (or failed, or was found done): copies nobody else reads go."""
        with self._lock:
            self._started.add(reader)
            for source in self._files.pop(reader, []):
                copy = self._copies[source]
                copy.readers.discard(reader)
                if not copy.readers:
                    self._drop(copy)
        self.advance()

    def close(self) -> None:
        """The run ends: copies not started are dropped, those under way finish, all are removed."""
        with self._lock:
            self._closed = True
            for copy in self._copies.values():
                if copy.future is not None and copy.future.cancel():
                    self._under_way.discard(copy.source)
        self._pool.shutdown(wait=True)
        with self._lock:
            for copy in list(self._copies.values()):
                self._drop(copy)

    # ------------------------------------------------------------------ copies
    def _start(self, copy: _Copy) -> bool:
        companions = _companions(copy.source)
        try:
            size = sum(p.stat().st_size for p in [copy.source, *companions])
        except OSError:  # gone, or unreadable: the reader will say so
            copy.future = _finished_future()
            copy.done = True
            return True
        if self._pays is None and size < MEASURED_BYTES:  # auto, not measured: a small file is read where it is
            copy.future = _finished_future()
            copy.done = copy.skipped = True
            return True
        tier = self._tier_for(size)
        if tier is None:
            return False
        copy.tier, copy.size = tier, size
        digest = hashlib.sha1(str(copy.source).encode()).hexdigest()[:16]
        copy.target = tier.workdir / PREFETCH_DIR / digest / copy.source.name
        self._under_way.add(copy.source)
        copy.future = self._pool.submit(self._copy, copy, companions)
        return True

    def _tier_for(self, size: int) -> Tier | None:
        for tier in self.hierarchy.fast_tiers:
            budget = _budget(self.spec.budget, tier)
            if tier.room() >= size and self._held.get(tier.name, 0) + size <= budget and self.hierarchy.memory_allows(tier, size):
                tier.reserved += size
                self._held[tier.name] = self._held.get(tier.name, 0) + size
                return tier
        return None

    def _copy(self, copy: _Copy, companions: list[Path]) -> None:
        try:
            for source in companions:
                atomic_copy(source, copy.target.parent / source.name)
            start = time.perf_counter()
            atomic_copy(copy.source, copy.target)
            seconds = time.perf_counter() - start
            if self._pays is None and copy.size >= MEASURED_BYTES:
                self._measure(copy.target, seconds / copy.target.stat().st_size)
        except OSError as exc:
            logger.warning("[Sea] prefetch of %s failed (%s); its readers read it from the shared filesystem", copy.source, exc)
            with self._lock:
                copy.done = True
                self._under_way.discard(copy.source)
                if not copy.readers:
                    self._drop(copy)
            self.on_copied()
            return
        with self._lock:
            copy.done = copy.ok = True
            self._under_way.discard(copy.source)
            self.stats.files += 1
            self.stats.bytes += copy.size
            if not copy.readers:  # its last reader finished while it was copied
                self._drop(copy)
        self.on_copied()

    def _measure(self, target: Path, per_byte: float) -> None:
        """``enabled: auto``: keep prefetching only if copying ``target`` from the shared filesystem
        took :data:`PAYS_FROM` times (``per_byte`` seconds) copying it again within its tier: the
        same steps, so the same fixed costs (see the module's docstring), or for a file larger than
        :data:`MEASURED_AT_MOST`, that much of it, whose bytes outweigh the fixed costs."""
        again = target.with_name(f"{target.name}.sea-measure")
        start = time.perf_counter()
        try:
            copied = atomic_copy(target, again) if target.stat().st_size <= MEASURED_AT_MOST else _copy_start(target, again, MEASURED_AT_MOST)
        except OSError:  # gone meanwhile (its readers finished): the next copy is measured
            return
        finally:
            again.unlink(missing_ok=True)
        slowdown = per_byte * copied / max(time.perf_counter() - start, 1e-6)
        with self._lock:
            if self._pays is not None:  # the other thread measured first
                return
            self.stats.slowdown = slowdown
            self._pays = slowdown >= PAYS_FROM
            if self._pays:
                return
            self.stats.stopped = True
            for copy in self._copies.values():  # those not started: their readers read the originals
                if copy.future is not None and not copy.done and copy.future.cancel():
                    copy.done = True
                    self._under_way.discard(copy.source)
                    self._release(copy)
        logger.info(
            "[Sea] prefetch (auto) stops: a copy from the shared filesystem took %.1fx a copy within the tier, it pays from %gx",
            slowdown, PAYS_FROM,
        )  # fmt: skip

    def _release(self, copy: _Copy) -> None:
        """Give back the tier room ``copy`` held, removing what it wrote."""
        if copy.tier is not None:
            if copy.target is not None:
                self.hierarchy.remove(copy.target.parent)
            self.hierarchy.release(copy.tier, reserved=copy.size)
            self._held[copy.tier.name] -= copy.size
            copy.tier = None

    def _drop(self, copy: _Copy) -> None:
        if copy.future is not None and not copy.done:
            if not copy.future.cancel():
                return  # copying now: dropped when the copy ends (see _copy)
            self._under_way.discard(copy.source)
        self._release(copy)
        self._copies.pop(copy.source, None)


def _copy_start(source: Path, target: Path, nbytes: int) -> int:
    """Write the first ``nbytes`` of ``source`` to a new file ``target``, synced; the bytes written."""
    fin = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fout = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            written = 0
            while written < nbytes and (sent := os.sendfile(fout, fin, written, min(CHUNK, nbytes - written))):
                written += sent
            os.fsync(fout)
        finally:
            os.close(fout)
    finally:
        os.close(fin)
    return written


def _companions(source: Path) -> list[Path]:
    """The files next to ``source`` with its stem (up to the first dot) that tools look for beside
    it: its sidecars, the smaller ones (an image's ``.json``, not a sidecar's image), and an Analyze
    header's ``.img``."""
    stem = source.name.split(".", 1)[0]
    try:
        size = source.stat().st_size
        found = []
        for path in sorted(source.parent.glob(f"{stem}.*")):
            if path == source or not path.is_file():
                continue
            if path.stat().st_size <= size or (source.suffix == ".hdr" and path.suffix == ".img"):
                found.append(path)
        return found
    except OSError:
        return []


def _budget(budget: str, tier: Tier) -> int:
    share = parse_fraction(budget)
    if share is None:
        return parse_size(budget)
    total = tier.capacity if tier.capacity is not None else psutil.disk_usage(str(tier.root)).total
    return int(share * total)


def _finished_future() -> Future:
    future: Future = Future()
    future.set_result(None)
    return future
