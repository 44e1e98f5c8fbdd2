"""Rolling prefetch: the workflow's input files, copied from the shared filesystem to a fast tier
ahead of the nodes that read them, while earlier nodes compute.

The adapter says which files a node will read as soon as it knows (:meth:`Prefetcher.expect`: a
node's own inputs when the graph is given, a data grabber's outputs once it ran); the engine says
which readers come next (:meth:`Prefetcher.advance`, readers in the order the scheduler will start
them, or in the order the adapter gives: a Dask worker runs the nodes sent to it in the order they
were sent). The files of up to ``lookahead`` readers that have not started are copied, in that
order, by as many threads as readers run at once on the machine (``threads``), to the fastest tier
with room, within ``budget`` bytes of copies per tier; the copies' space is reserved on the tier, so node placement sees it. While copies are under way, a reader whose
inputs are not all copied yet waits to be started (:meth:`pending`; the engine is told when a copy
ends), so the adapter's loop goes on meanwhile and no reader reads the shared filesystem beside the
copies. When a reader is about to start, the adapter asks
:meth:`Prefetcher.copies_for`: the copies that are complete (a copy under way is waited for, one
not started yet is dropped: the reader reads the shared filesystem, as without prefetch). A copy
goes once every reader registered for it finished.

With ``enabled: auto`` (the default) prefetch first proves that it pays: reading the shared
filesystem must be clearly slower than reading the tier. Before any copy, the first input file of
at least :data:`MEASURED_BYTES` has its first :data:`PROBE_BYTES` copied to the tier, then that copy
copied again within the tier (the same steps: the same fixed costs per file); if the first took less
than :data:`PAYS_FROM` times the second, no copy is made (a reader reads its files where they are).
Until then files under :data:`MEASURED_BYTES` are read where they are, and the readers that wait for
the measure wait milliseconds on a fast filesystem. Reading a copy back instead measured 5.4x for a
4 MiB file on the local disk in a CI run, where a copy's fixed costs weigh against a read's; timing
the first whole copy instead held the first readers for it and cost 7 to 9% of a run on the local
disk.

A copy keeps its file's name (tools name their outputs after their inputs), in a directory of its
own per source file, with the file's companions: the smaller files next to it with the same stem
(a BIDS ``.json`` sidecar; an Analyze header's ``.img``), which tools look for beside their input. It
is written under a temporary name and renamed (:func:`sea.stager.atomic_copy`), and keeps the
source's timestamps.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from .config import PrefetchSpec
from .sizes import parse_fraction, parse_size
from .stager import CHUNK, atomic_copy, directory_holding, identity, is_temporary, put_back
from .tiers import StorageHierarchy, Tier

logger = logging.getLogger("sea")

PREFETCH_DIR = ".prefetch"
PAYS_FROM = 4.0  # enabled: auto keeps prefetching when a copy takes at least this many times copying it within the tier
MEASURED_BYTES = 2**20  # ... measured on the first input file at least this large (smaller ones: latency more than bandwidth)
PROBE_BYTES = 4 * 2**20  # ... on its first this many bytes


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
    # the copy's files as it was made: name -> (size, mtime, ctime); a reader's change shows in them
    made: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    # the originals as they were copied: name -> (device, inode, size, mtime, ctime); one changed since is not the copy's
    origins: dict[str, tuple[int, int, int, int, int]] = field(default_factory=dict)


@dataclass
class PrefetchStats:
    files: int = 0  # files copied ahead (companions not counted)
    bytes: int = 0
    hits: int = 0  # inputs a reader read from a copy
    written_back: int = 0  # files a reader changed (or wrote) in a copy's directory, put at the original's place
    misses: int = 0  # inputs a reader read from the shared filesystem: the copy was not there in time
    slowdown: float | None = None  # enabled: auto: the measured copy's time over copying it again within the tier
    stopped: bool = False  # ... under PAYS_FROM: prefetch stopped


@dataclass
class Prefetcher:
    """One run's prefetch. ``order(keys)``: the engine's order for readers (best first).
    ``threads``: copies made at once, one per reader running at once (the first copy of each
    reader's files takes the link whole; the next readers' copies follow while they compute)."""

    spec: PrefetchSpec
    hierarchy: StorageHierarchy
    order: Callable[[list[str]], list[str]]
    on_copied: Callable[[], None] = lambda: None  # a copy ended: a reader held for it may start (SeaEngine.may_start)
    threads: int = 2
    headroom: Callable[[], int] = lambda: 0  # room a tier keeps for the next node's directory: a copy takes only what is beyond it
    stats: PrefetchStats = field(default_factory=PrefetchStats)
    _copies: dict[Path, _Copy] = field(default_factory=dict)
    _files: dict[str, list[Path]] = field(default_factory=dict)  # reader -> its sources
    _started: set[str] = field(default_factory=set)
    _gave: dict[str, list[str]] = field(default_factory=dict)  # reader -> the originals it was handed copies of
    _no_write_back: set[str] = field(default_factory=set)  # readers run again on the originals
    _position: dict[str, int] = field(default_factory=dict)  # reader -> its place in the order the adapter gave
    _held: dict[str, int] = field(default_factory=dict)  # tier name -> bytes of copies on it
    _under_way: set[Path] = field(default_factory=set)  # sources whose copy is queued or being made
    _closed: bool = False
    _pays: bool | None = None  # None: enabled: auto, not measured yet
    _probe: Future | None = None  # enabled: auto: the measure under way (see _measure)
    _fds: dict[str, int] = field(default_factory=dict)  # tier name -> its private directory, held open while copies are made (see _through_fd)

    def __post_init__(self) -> None:
        if self.spec.enabled is True:
            self._pays = True
        self._pool = ThreadPoolExecutor(max(1, self.threads), thread_name_prefix="sea-prefetch")
        # the engine's own lock: the engine calls in holding it, and the copies reserve tier room
        # under it; one lock cannot be taken in two orders
        self._lock = self.hierarchy.lock

    # ------------------------------------------------------------------ events
    def expect(self, reader: str, sources: Iterable[Path], position: int | None = None) -> None:
        """``reader`` will read these files (absolute paths on the shared filesystem). ``position``:
        its place in the order readers start here, when the adapter knows it; readers with one come
        first, in that order, before the engine's order."""
        with self._lock:
            if self._closed or reader in self._started:
                return
            if position is not None:
                self._position[reader] = position
            mine = self._files.setdefault(reader, [])
            for source in sources:
                source = Path(source)
                if source in mine:
                    continue
                mine.append(source)
                self._copies.setdefault(source, _Copy(source, set())).readers.add(reader)
        self.advance()

    def advance(self) -> None:
        """Start the copies for the next ``lookahead`` readers that have not started (with
        ``enabled: auto``, not measured yet: the measure instead, on the first file large enough)."""
        with self._lock:
            if self._closed or self._pays is False or self._probe is not None:
                return
            waiting = [r for r in self._files if r not in self._started]
            placed = sorted((r for r in waiting if r in self._position), key=self._position.__getitem__)
            for reader in (placed + self.order([r for r in waiting if r not in self._position]))[: self.spec.lookahead]:
                for source in self._files[reader]:
                    copy = self._copies[source]
                    if copy.future is not None:
                        continue
                    if self._pays is None:
                        if self._start_measure(copy):
                            return  # no copy until it says prefetch pays
                    elif not self._start(copy):
                        return  # no room within the budget: wait for copies to go

    @property
    def active(self) -> bool:
        """It may still copy: on, or ``auto`` not decided yet (stopped, it never copied: see :meth:`_measure`)."""
        return not self._closed and self._pays is not False

    @property
    def copying(self) -> bool:
        """Copies are queued or being made: their ends will come (each calls ``on_copied``)."""
        return bool(self._under_way) or self._probe is not None

    def pending(self, reader: str) -> bool:
        """Whether ``reader`` should wait to start: an input of it has no complete copy yet while
        copies are under way (its own, or those ahead of it: started now, it would read the shared
        filesystem beside them, or wait for its copy in :meth:`copies_for`). With no copy under
        way, it starts and reads what has no copy from the shared filesystem."""
        with self._lock:
            if self._copied(reader):
                return False
            return bool(self._under_way) or self._probe is not None

    def copied(self, reader: str) -> bool:
        """Whether ``reader`` would read no input from the shared filesystem beside a copy: each has
        a complete copy, or is read where it is by decision (or it reads none, or prefetch stopped)."""
        with self._lock:
            return self._copied(reader)

    def _copied(self, reader: str) -> bool:
        if self._pays is False:
            return True
        copies = [self._copies.get(source) for source in self._files.get(reader, ())]
        return all(copy is not None and (copy.ok or copy.skipped) for copy in copies)

    def copies_for(self, reader: str) -> dict[str, str]:
        """``reader`` starts now: source path -> its complete copy, for the inputs that have one."""
        probe = self._probe
        if probe is not None:  # a few MiB: then the reader gets a copy if prefetch pays
            futures_wait([probe])
        with self._lock:
            self._started.add(reader)
            sources = list(self._files.get(reader, []))
            running = [self._copies[s].future for s in sources if self._copies[s].future is not None and not self._copies[s].done]
        for future in running:  # already reading the shared filesystem: finishing it is the quicker
            try:
                future.result()
            except Exception:  # noqa: BLE001 - logged by the copy; the reader reads the original
                pass
        with self._lock:  # the copy's files: the input and its companions (a sidecar another node appended to)
            names = {source: list(self._copies[source].origins) or [source.name] for source in sources}
        now = {source: {name: _identity_of(source.parent / name) for name in names[source]} for source in sources}  # outside the lock
        found = {}
        with self._lock:
            for source in sources:
                copy = self._copies[source]
                if copy.ok and any(now[source].get(name) != as_copied for name, as_copied in copy.origins.items()):
                    copy.ok = False  # stale: its readers from now on read the original (it goes with its last reader)
                if copy.ok:
                    found[str(source)] = str(copy.target)
                    self.stats.hits += 1
                    self._gave.setdefault(reader, []).append(str(source))
                elif not copy.skipped and self._pays:  # stopped (auto), it reads the original by decision
                    self.stats.misses += 1
                    logger.debug("[Sea] prefetch: %s reads %s from the shared filesystem (%s)", reader, source,
                                 "its copy failed" if copy.done else "its copy had not started: no room within the budget")  # fmt: skip
        self.advance()
        return found

    def handed(self, reader: str) -> list[str]:
        """The original files ``reader`` was handed copies of."""
        with self._lock:
            return list(self._gave.get(reader, ()))

    def reads_originals(self, reader: str) -> None:
        """``reader`` runs again on the original files: what its failed attempt changed in its
        copies is not put back at its end."""
        with self._lock:
            self._gave.pop(reader, None)
            self._no_write_back.add(reader)

    def reader_done(self, reader: str) -> None:
        """``reader`` finished (or failed, or was found done): what it changed in its copies is put
        at the originals' place (:meth:`_write_back`), and copies nobody else reads go."""
        with self._lock:
            made = [] if reader in self._no_write_back else [c for s in self._files.get(reader, ()) if (c := self._copies[s]).ok]
        for copy in made:  # still read by ``reader``: not dropped meanwhile
            self._write_back(copy)
        with self._lock:
            self._started.add(reader)
            self._gave.pop(reader, None)
            self._no_write_back.discard(reader)
            self._position.pop(reader, None)
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
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()

    def _through_fd(self, tier: Tier, path: Path) -> Path:
        """``path``, in ``tier``'s private directory, as written: through that directory's
        descriptor, held open (``/proc/self/fd``), not its name. On a tier whose parent another user
        may change (a sticky directory trusted in a user namespace: docs/containers.md), a name
        swapped for a link would take the copies of the user's inputs where that user reads them;
        the descriptor reaches only the directory Sea made (0700: nobody else writes in it)."""
        if not os.path.isdir("/proc/self/fd"):
            return path  # no /proc mounted: by name, as it was checked when the tier was made
        with self._lock:
            if tier.name not in self._fds:
                with tier.private.lock:
                    self._fds[tier.name] = os.dup(tier.private.fd)  # its own: never closed nor reused under a copy
            fd = self._fds[tier.name]
        return Path(f"/proc/self/fd/{fd}") / path.relative_to(tier.workdir)

    def _write_back(self, copy: _Copy) -> None:
        """Without prefetch a reader that changes its input in place (or writes a file beside it)
        changes the original: what a reader changed or added in the copy's directory is put there,
        before the copy may go (a file's ctime moves with any change to it)."""
        try:
            entries = [e for e in os.scandir(copy.target.parent) if e.is_file(follow_symlinks=False) and not is_temporary(e.name)]
        except OSError:
            return
        changed = [e for e in entries if copy.made.get(e.name) != _state(e.stat(follow_symlinks=False))]
        if not changed:
            return
        try:  # the original's directory, by a descriptor checked to hold it: never one put in its place since
            directory = directory_holding(copy.source, copy.origins[copy.source.name][:2])
        except (OSError, KeyError) as exc:
            logger.warning("[Sea] a node changed files beside %s, a prefetched copy of %s, and they could not be put there (%s)", copy.target, copy.source, exc)
            return
        try:
            self._put_changes(copy, changed, Path(f"/proc/self/fd/{directory}"))
        finally:
            os.close(directory)

    def _put_changes(self, copy: _Copy, changed: list[os.DirEntry], directory: Path) -> None:
        for entry in changed:
            now = _state(entry.stat(follow_symlinks=False))
            original = directory / entry.name
            try:
                if entry.name in copy.origins:
                    put_back(Path(entry.path), original, copy.origins[entry.name])
                else:
                    atomic_copy(Path(entry.path), original)
            except OSError as exc:
                logger.warning("[Sea] a node changed %s, a prefetched copy of %s, and the change could not be put there (%s)", entry.path, copy.source.parent / entry.name, exc)
                continue
            copy.made[entry.name] = now
            if entry.name in copy.origins:  # the original is the copy again: fresh for its next readers
                with contextlib.suppress(OSError):
                    copy.origins[entry.name] = identity(os.stat(original))
            self.stats.written_back += 1

    # ------------------------------------------------------------------ copies
    def _start(self, copy: _Copy) -> bool:
        companions = _companions(copy.source)
        try:
            size = sum(p.stat().st_size for p in [copy.source, *companions])
        except OSError:  # gone, or unreadable: the reader will say so
            copy.future = _finished_future()
            copy.done = True
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
        """The fastest tier with room for ``size`` bytes of copies within the budget, beyond the
        room the next node's directory needs there (a copy must not make a node spill)."""
        headroom = self.headroom()
        for tier in self.hierarchy.fast_tiers:
            budget = _budget(self.spec.budget, tier)
            if tier.room() - headroom >= size and self._held.get(tier.name, 0) + size <= budget and self.hierarchy.memory_allows(tier, size):
                tier.reserved += size
                self._held[tier.name] = self._held.get(tier.name, 0) + size
                return tier
        return None

    def _copy(self, copy: _Copy, companions: list[Path]) -> None:
        try:
            origins = {p.name: identity(os.stat(p)) for p in [*companions, copy.source]}
            target = self._through_fd(copy.tier, copy.target)
            for source in companions:
                atomic_copy(source, target.parent / source.name)
            atomic_copy(copy.source, target)
            made = {p.name: os.lstat(p) for p in [*(target.parent / c.name for c in companions), target]}
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
            copy.made = {name: (st.st_size, st.st_mtime_ns, st.st_ctime_ns) for name, st in made.items()}
            copy.origins = origins
            self._under_way.discard(copy.source)
            self.stats.files += 1
            self.stats.bytes += copy.size
            if not copy.readers:  # its last reader finished while it was copied
                self._drop(copy)
        self.on_copied()

    def _start_measure(self, copy: _Copy) -> bool:
        """``enabled: auto``, not measured yet: a file under :data:`MEASURED_BYTES` is read where it
        is (marked skipped: no copy, and its reader does not wait); the first one large enough is
        measured (:meth:`_measure`) before any copy. True once the measure started."""
        try:
            size = copy.source.stat().st_size
        except OSError:  # gone, or unreadable: the reader will say so
            size = 0
        if size < MEASURED_BYTES:
            copy.future = _finished_future()
            copy.done = copy.skipped = True
            return False
        nbytes = min(size, PROBE_BYTES)
        tier = self._tier_for(2 * nbytes)
        if tier is None:
            return False  # no room for it now: asked again as copies go
        self._probe = self._pool.submit(self._measure, copy.source, tier, nbytes)
        return True

    def _measure(self, source: Path, tier: Tier, nbytes: int) -> None:
        """Copy the first ``nbytes`` of ``source`` from the shared filesystem to ``tier``, then that
        copy again within the tier (the same steps, so the same fixed costs: see the module's
        docstring), and keep prefetching only if the first took :data:`PAYS_FROM` times the second.
        A few MiB: the readers held meanwhile wait milliseconds on a fast filesystem."""
        directory = self._through_fd(tier, tier.workdir / PREFETCH_DIR)
        first, again = directory / f".sea-measure-{os.getpid()}", directory / f".sea-measure-{os.getpid()}-again"
        slowdown = None
        try:
            directory.mkdir(exist_ok=True)
            start = time.perf_counter()
            copied = _copy_start(source, first, nbytes)
            middle = time.perf_counter()
            _copy_start(first, again, copied)
            slowdown = (middle - start) / max(time.perf_counter() - middle, 1e-6)
        except OSError as exc:  # the tier or the file: prefetch stops, as where it does not pay
            logger.warning("[Sea] prefetch (auto) could not measure the shared filesystem (%s); it stops", exc)
        finally:
            for path in (first, again):
                path.unlink(missing_ok=True)
        with self._lock:
            self.hierarchy.release(tier, reserved=2 * nbytes)
            self._held[tier.name] -= 2 * nbytes
            self.stats.slowdown = slowdown
            self._pays = slowdown is not None and slowdown >= PAYS_FROM
            self.stats.stopped = not self._pays
            self._probe = None
        if self._pays:
            self.advance()
        elif slowdown is not None:  # else the warning above said why
            logger.info(
                "[Sea] prefetch (auto) stops: a copy from the shared filesystem took %.1fx a copy within the tier, it pays from %gx",
                slowdown, PAYS_FROM,
            )  # fmt: skip
        self.on_copied()

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


def _identity_of(path: Path) -> tuple[int, int, int, int, int] | None:
    """The file at ``path`` now (``None``: gone): a copy is fresh while its original's is the one
    recorded when it was copied (a node that ran since may have changed it through another path:
    its readers then read the original, as without prefetch)."""
    try:
        return identity(os.stat(path))
    except OSError:
        return None


def _state(st: os.stat_result) -> tuple[int, int, int]:
    """What tells a copy a node changed from the copy as made (a file's ctime moves with any change)."""
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns


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
