"""Storage tiers and their capacity accounting.

A :class:`Tier` is a directory on node-local storage in which Sea owns a private (0700) directory
with an unpredictable name. The :class:`StorageHierarchy` is the ordered list of tiers, fastest
first, with the home (the workflow's ``base_dir`` on the shared filesystem) as the implicit last
tier that always has room. Room is the smaller of the real free space and the configured cap,
minus what running nodes have reserved: Sea cannot know a node's size in advance, so it reserves an
estimate and settles it when the node finishes.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import stat
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path

import psutil

from . import container
from .config import MIN_CAPACITY, SeaConfig, SeaConfigError, TierSpec, expand_vars, no_room
from .durable import device
from .memory import MemoryBudget, is_ram_backed
from .private import KEPT_FILE, OWNER_FILE, PrivateDir, in_use, pid_namespace, rmtree, seen_by_lock
from .sizes import format_size, parse_fraction, parse_size

logger = logging.getLogger("sea")

DISCOVERY_ORDER = ("$SLURM_TMPDIR", "$TMPDIR", "/dev/shm")


@dataclass
class TierStats:
    """What the report says of a tier."""

    peak_bytes: int = 0
    bytes_written: int = 0
    nodes_placed: int = 0
    spills: int = 0
    bytes_evicted: int = 0


@dataclass(eq=False)  # a tier is itself: compared by identity
class Tier:
    name: str
    root: Path
    workdir: Path  # where Sea writes: the private directory, or the home itself
    capacity: int | None = None
    is_home: bool = False
    used: int = 0  # measured bytes of finished node directories still held here
    reserved: int = 0  # estimates for nodes running here
    stats: TierStats = field(default_factory=TierStats)
    private: PrivateDir | None = None  # Sea's directory on a fast tier, held open
    noexec: bool = False  # mounted noexec: a node that runs a program from its directory fails here
    ram: bool = False  # a tmpfs: what it holds is the job's memory (sea.memory)

    def free_space(self) -> int:
        return psutil.disk_usage(str(self.root)).free

    def room_in_all(self) -> int | None:
        """What the tier may hold at most: its capacity, else its filesystem's size (``None`` if
        the tier is gone: the run says so elsewhere)."""
        if self.capacity is not None:
            return self.capacity
        try:
            return psutil.disk_usage(str(self.root)).total
        except OSError:
            return None

    def room(self) -> int:
        """Bytes a new node may still claim here."""
        if self.is_home:
            return 2**62
        real = self.free_space()
        if self.capacity is not None:
            real = min(real, self.capacity - self.used)
        return real - self.reserved

    def note_usage(self) -> None:
        self.stats.peak_bytes = max(self.stats.peak_bytes, self.used)


class StorageHierarchy:
    """The tiers, fastest first, then the home; thread-safe accounting."""

    def __init__(self, tiers: list[Tier], home: Tier):
        self.fast_tiers = tiers
        self.home = home
        self.lock = threading.RLock()
        self.memory: MemoryBudget | None = None  # set when a tier is RAM: it bounds what RAM tiers hold

    @property
    def all(self) -> list[Tier]:
        return [*self.fast_tiers, self.home]

    # -------------------------------------------------------------- construction
    @classmethod
    def build(cls, config: SeaConfig, home: Path) -> StorageHierarchy:
        """Check every tier against the home and create Sea's private directories."""
        home = Path(home).resolve()
        home_dev = device(home)
        specs = list(config.tiers) if config.tiers is not None else discover_tiers(home)
        checked: list[tuple[TierSpec, Path, int | None]] = []
        seen_devices: dict[int, str] = {}
        for i, spec in enumerate(specs):
            where = f"tiers[{i}]" if config.tiers is not None else "discovered tier"
            spec = replace(spec, path=expand_vars(spec.path, f"{where}.path"))  # on the machine whose tiers these are
            root = Path(spec.path)
            _refuse_planted(root, spec.path, where)
            try:
                root.stat()
            except PermissionError as exc:
                raise SeaConfigError(f"{where}: cannot access {spec.path!r} ({exc.strerror}); check the permissions of it and its parents") from None
            except OSError as exc:
                if exc.errno not in (errno.ENOENT, errno.ENOTDIR):  # a name too long, a link loop, an I/O error
                    raise SeaConfigError(f"{where}: cannot access {spec.path!r} ({exc.strerror}); give a directory on node-local storage") from None
            check_is_directory(spec, where)
            root = root.resolve()
            try:
                _refuse_writable_by_others(root, spec.path, where)
            except SeaConfigError as unsafe:
                if config.tiers is not None:
                    raise
                logger.warning("[Sea] %s; skipped", unsafe)  # found, not asked for: the run goes on without it
                continue
            if root == home or home in root.parents:
                raise SeaConfigError(f"{where}: {spec.path!r} is inside the home {str(home)!r}; a tier must be node-local storage outside the work directory (Nipype's base_dir, Pydra's cache_root)")
            dev = device(root)
            if dev == home_dev:
                raise SeaConfigError(
                    f"{where}: {spec.path!r} is on the same filesystem as the home {str(home)!r}, so it would not take "
                    "any load off it; use node-local storage ($SLURM_TMPDIR, /dev/shm; on a one-disk machine /dev/shm is RAM, "
                    "or mount a tmpfs) or put the work directory (base_dir, cache_root) on another filesystem"
                )
            if dev in seen_devices:
                raise SeaConfigError(f"{where}: {spec.path!r} is on the same filesystem as tier {seen_devices[dev]!r}; list each filesystem once")
            seen_devices[dev] = spec.path
            if not os.access(root, os.W_OK | os.X_OK):
                raise SeaConfigError(f"{where}: {spec.path!r} is not writable by this user; choose a directory you can write to")
            checked.append((spec, root, _capacity(spec, root, where), where))

        tiers: list[Tier] = []
        for i, (spec, root, capacity, where) in enumerate(checked):
            removed, kept = remove_dead_private_dirs(root)
            for stale in removed:
                logger.warning("[Sea] removed %s, left by a run that was killed", stale)
            for held in kept:
                logger.warning("[Sea] %s holds files an earlier run kept (see its %s); `sea recover %s` brings them home", held, KEPT_FILE, held)
            try:
                private = PrivateDir.create(root, owner=f"{os.getpid()} {socket.gethostname()} {home}\n{pid_namespace()}")
            except OSError as exc:  # writable by its mode, yet not (/proc, a full or read-only filesystem)
                if config.tiers is None:  # found, not asked for (a $TMPDIR another user filled): the run goes on without it
                    logger.warning("[Sea] %s: cannot create Sea's directory in %r (%s); skipped", where, spec.path, exc.strerror)
                    continue
                for made in tiers:
                    made.private.remove_all()
                raise SeaConfigError(f"{where}: cannot create Sea's directory in {spec.path!r} ({exc.strerror}); choose a directory you can write to") from None
            noexec = bool(os.statvfs(root).f_flag & os.ST_NOEXEC)
            if noexec:
                logger.warning(
                    "[Sea] %s is mounted noexec: a node that runs a program from its own directory fails there and is rerun on the next tier",
                    spec.path,
                )
            tiers.append(Tier(name=f"tier{i}:{spec.path}", root=root, workdir=private.path, capacity=capacity, private=private, noexec=noexec, ram=is_ram_backed(root)))
        return cls(tiers, Tier(name=f"home:{home}", root=home, workdir=home, is_home=True))

    def close(self, kept: dict[Path, Path] | None = None, by_rule: list[Path] = (), reason: str = "") -> list[Path]:
        """Remove Sea's private directories, but those that hold something kept on purpose: copies
        whose flush failed (``kept``: each one's path on a tier -> where it belongs) or files a
        ``keep`` rule left (in the directories ``by_rule``). Those are marked as kept (no later run
        removes them; ``sea recover`` brings the copies home, removes what only served them and
        leaves what a rule keeps) and returned."""
        kept = kept or {}
        marked = []
        with self.lock:  # the run's end, and a Dask task whose node ran on past it, may close at once
            for tier in self.fast_tiers:
                if not tier.private.reopen():
                    continue  # removed by an earlier close, or gone
                leftovers = tier.private.files()
                if not leftovers:
                    tier.private.remove_all()
                    continue
                copies = [{"from": str(src.relative_to(tier.workdir)), "to": str(dst)} for src, dst in kept.items() if tier.private.contains(src)]
                rule = [str(d.relative_to(tier.workdir)) for d in by_rule if tier.private.contains(d)]
                if not copies and not rule:  # a node still running (a Dask task the client could not stop) wrote them
                    logger.info("[Sea] %d file(s) in %s were written after the run ended: removed when their node ends", len(leftovers), tier.workdir)
                    tier.private.close()  # that node's task removes them and the directory (or the next run, once this process is gone)
                    continue
                tier.private.mark_kept({"home": str(self.home.root), "reason": reason or "kept by a rule", "copies": copies, "rule": rule})
                logger.warning(
                    "[Sea] %d file(s) kept in %s (%s)%s", len(leftovers), tier.workdir, reason or "by a rule",
                    f"; `sea recover {tier.workdir}` brings them home" if copies else "",
                )
                marked.append(tier.workdir)
                tier.private.close()  # let go of it; reopened (and checked) if something there is removed later
        return marked

    def check(self, tier: Tier) -> None:
        """Raise :class:`~sea.private.SeaTierSwapped` if ``tier``'s private directory was swapped."""
        if tier.private is not None:
            tier.private.check()

    def remove(self, path: Path) -> None:
        """Delete ``path``: inside a tier through Sea's descriptor of its private directory (never
        a link followed out of it), in the home as ``rmtree`` does. A missing path is no error."""
        for tier in self.fast_tiers:
            if tier.private.contains(path):
                tier.private.remove(path)
                return
        rmtree(path)

    # -------------------------------------------------------------- accounting
    def choose(self, estimate: int, exclude: set[str] = frozenset()) -> Tier:
        """The fastest tier with room for ``estimate`` bytes (on a RAM tier, room in the job's
        memory too); counts a spill on each tier passed over."""
        with self.lock:
            for tier in self.fast_tiers:
                if tier.name in exclude:
                    continue
                if self._fits(tier, estimate):
                    tier.reserved += estimate
                    tier.stats.nodes_placed += 1
                    return tier
                tier.stats.spills += 1
            self.home.stats.nodes_placed += 1
            return self.home

    def has_room(self, estimate: int) -> bool:
        """Whether :meth:`choose` would find a fast tier for ``estimate`` bytes now (nothing counted)."""
        with self.lock:
            return any(self._fits(tier, estimate, count=False) for tier in self.fast_tiers)

    def _fits(self, tier: Tier, nbytes: int, count: bool = True) -> bool:
        return tier.room() >= nbytes and self.memory_allows(tier, nbytes, count)

    def memory_allows(self, tier: Tier, nbytes: int, count: bool = True) -> bool:
        """Whether the job's memory has room for ``nbytes`` more on ``tier`` (always, off RAM);
        ``count``: a refusal counts as a memory spill."""
        if not tier.ram or self.memory is None:
            return True
        if self.memory.fits(nbytes, *self.ram_bytes()):
            return True
        if count:
            self.memory.spills += 1
        return False

    def ram_bytes(self) -> tuple[int, int]:
        """(bytes held, bytes reserved for running nodes) on the RAM tiers."""
        with self.lock:
            ram = [t for t in self.fast_tiers if t.ram]
            return sum(t.used for t in ram), sum(t.reserved for t in ram)

    def settle(self, tier: Tier, reserved: int, actual: int) -> None:
        """A node finished: its reservation becomes its measured size."""
        with self.lock:
            tier.reserved -= reserved
            tier.used += actual
            tier.stats.bytes_written += actual
            tier.note_usage()

    def resize(self, tier: Tier, before: int, after: int) -> None:
        """A directory held on ``tier`` measured ``after`` bytes, not the ``before`` it was counted at."""
        with self.lock:
            tier.used += after - before
            tier.stats.bytes_written += after - before
            tier.note_usage()

    def release(self, tier: Tier, reserved: int = 0, used: int = 0) -> None:
        with self.lock:
            tier.reserved -= reserved
            tier.used -= used
            tier.stats.bytes_evicted += used

    def tier_of(self, path: Path) -> Tier:
        for tier in self.fast_tiers:
            if tier.workdir == path or tier.workdir in path.parents:
                return tier
        return self.home

    def describe(self) -> str:
        parts = []
        for tier in self.fast_tiers:
            cap = f", cap {format_size(tier.capacity)}" if tier.capacity is not None else ""
            parts.append(f"{tier.root} ({format_size(tier.free_space())} free{cap})")
        return " > ".join(parts + [f"home {self.home.root}"])


def key_in_private_dir(path: Path) -> str | None:
    """``path`` relative to the Sea private directory that contains it, or ``None``.

    Links left in a home by a killed run still resolve into that run's private directory; the
    engine may have recorded the resolved path, and this recovers the node's key from it.
    """
    path = Path(path)
    for parent in path.parents:
        if parent.name.startswith("sea-") and (parent / OWNER_FILE).is_file():
            return str(path.relative_to(parent))
    return None


def dead_private_dirs(root: Path) -> list[Path]:
    """The private directories of this user's runs on this machine, now dead, in ``root`` (real
    directories only: a link or another user's directory named like one is not ours). Dead: no
    process holds its lock (:func:`sea.private.in_use`), and its PID is gone, where that says
    something (this PID namespace: a run in a container sees none of the host's PIDs, nor the host
    a container's). A run in a container with a host name of its own is judged by its lock where
    the tier is this machine's own (:func:`sea.private.seen_by_lock`); where the filesystem has no
    locks, only a PID in this namespace on this host tells."""
    found = []
    for candidate in Path(root).glob("sea-*"):
        try:
            st = os.lstat(candidate)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
                continue
            first, *rest = (candidate / OWNER_FILE).read_text().splitlines()
            pid, host, *_ = first.split()
            namespace = rest[0] if rest else None  # (written since Sea recorded it)
            if seen_by_lock(candidate, host, namespace):
                if in_use(candidate) is not False:
                    continue
            elif host != socket.gethostname() or in_use(candidate) or psutil.pid_exists(int(pid)):
                continue
        except (OSError, ValueError):
            continue
        found.append(candidate)
    return found


def remove_dead_private_dirs(root: Path) -> tuple[list[Path], list[Path]]:
    """Delete what killed runs left in ``root``; returns (removed, kept): a directory marked as
    kept on purpose (:data:`~sea.private.KEPT_FILE`) is never removed."""
    removed, kept = [], []
    for candidate in dead_private_dirs(root):
        if os.path.lexists(candidate / KEPT_FILE):
            kept.append(candidate)
            continue
        rmtree(candidate)
        removed.append(candidate)
    return removed, kept


def discover_tiers(home: Path) -> list[TierSpec]:
    """``$SLURM_TMPDIR``, ``$TMPDIR``, ``/dev/shm``: those that exist, are writable and are not the
    home's filesystem. What was chosen is said once, and why a set one was left out (a warning: a
    ``$SLURM_TMPDIR`` that does not exist, a ``$TMPDIR`` on the shared filesystem). Inside a
    container, a line saying what to bind when what it sees is the container's own or nothing
    (:mod:`sea.container`)."""
    home_dev = device(home)
    found, devices, skipped = [], {}, []
    for candidate in DISCOVERY_ORDER:
        path = os.environ.get(candidate[1:]) if candidate.startswith("$") else candidate
        if not path:
            continue  # not set: nothing to say
        named = f"{candidate} ({path})" if candidate.startswith("$") else path
        if not os.path.isdir(path):
            skipped.append(f"{named}: not a directory that exists")
        elif not os.access(path, os.W_OK | os.X_OK):
            skipped.append(f"{named}: not writable by this user")
        elif (unsafe := _unsafe(Path(path), named)) is not None:
            skipped.append(unsafe)  # before the next one on its filesystem is left out as the same
        elif (dev := device(Path(path))) == home_dev:
            skipped.append(f"{named}: on the home's filesystem")
        elif dev in devices:
            skipped.append(f"{named}: the same filesystem as {devices[dev]}")
        else:
            devices[dev] = path
            found.append(TierSpec(path=path))
    chosen = ", ".join(spec.path for spec in found)
    where = container.runtime()
    said = container.advice(where, os.environ, {spec.path: container.ram_mount(spec.path) for spec in found}, skipped) if where else None
    if said is not None:
        logger.warning("%s", said)  # instead of the lines below: what was found, and what to bind
    elif not found:
        logger.warning(
            "[Sea] no node-local tier usable ($SLURM_TMPDIR, $TMPDIR, /dev/shm%s): this run is home-only, every node runs in the "
            "work directory on the shared filesystem, as under the engine's own plugin; list tiers in the configuration",
            ": " + "; ".join(skipped) if skipped else " not found",
        )
    elif skipped:
        logger.warning("[Sea] tiers found: %s; left out %s (list tiers in the configuration to choose them)", chosen, "; ".join(skipped))
    else:
        logger.info("[Sea] tiers found: %s", chosen)
    return found


def _unsafe(path: Path, named: str) -> str | None:
    """Why a discovered tier is not safe to use (others can write where Sea would), or ``None``."""
    try:
        _refuse_planted(path, str(path), named)
        _refuse_writable_by_others(path.resolve(), str(path), named)
    except SeaConfigError as unsafe:
        return str(unsafe)
    return None


def _refuse_planted(path: Path, written: str, where: str) -> None:
    """In a world-writable directory (``/dev/shm``, ``/tmp``) anyone can create the tier's path
    before us: a symbolic link there could send our files anywhere. Refused, never followed (a
    directory of someone else's there is refused by :func:`_refuse_writable_by_others`)."""
    try:
        st = os.lstat(path)
        parent = os.stat(path.parent)
    except OSError:
        return  # missing: reported as such by the caller
    if not parent.st_mode & stat.S_IWOTH:
        return
    if stat.S_ISLNK(st.st_mode):
        raise SeaConfigError(
            f"{where}: {written!r} is a symbolic link in the world-writable {str(path.parent)!r}, which anyone could "
            "have planted; give the directory it should be, or a tier path you created"
        )


_told_unmapped: set[str] = set()  # directories said to be taken as root's (unmapped_owner), once a process


def unmapped_owner() -> int | None:
    """In a user namespace that maps only some ids (Apptainer without setuid, rootless Podman:
    often the user's own id only), the uid shown as the owner of every file of an id it does not
    map (the kernel's overflow uid, 65534): the host's root's among them (``/``, ``/dev/shm``,
    ``/tmp``, a cluster's ``/localscratch``); ``None`` outside one."""
    try:  # bytes: a process without the standard library's codecs at hand reads them too
        with open("/proc/self/uid_map", "rb") as f:
            if f.read().split() == [b"0", b"0", b"4294967295"]:
                return None
        with open("/proc/sys/kernel/overflowuid", "rb") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def _refuse_writable_by_others(root: Path, written: str, where: str) -> None:
    """Whoever can write a directory can rename what is in it: another user who can write the tier
    root, or any directory above it, could swap Sea's private directory for a link to theirs (and
    have this user's nodes run there, its pickles read from there). So the tier root and every
    directory above it must belong to this user or to root and be writable by no one else, unless it
    is sticky (``/dev/shm``, ``/tmp``: there only an entry's owner may rename it) and owned by root
    or this user. ``root`` is already resolved: no link is left in it.

    Inside a user namespace that does not map root (Apptainer's unprivileged mode), the host's
    directories show an owner the namespace does not map (:func:`unmapped_owner`), which cannot be
    told from another user it does not map: such a directory is taken as root's (the host's system
    directories are), and said once; a tier inside another user's directory is then not refused."""
    me, unmapped = os.getuid(), unmapped_owner()
    taken = []  # owned by an unmapped user, taken as root's
    for directory in (root, *root.parents):
        try:
            st = os.stat(directory)
        except OSError:
            break  # unreadable or gone: the caller's own checks say so
        shared = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if unmapped is not None and st.st_uid == unmapped and st.st_uid not in (me, 0):
            taken.append(str(directory))
        elif st.st_uid not in (me, 0):
            raise SeaConfigError(
                f"{where}: {written!r} is not safe on a shared node: {str(directory)!r} belongs to uid {st.st_uid}, "
                "who could swap Sea's directory under it; use a directory of your own outside theirs"
            )
        if shared and not st.st_mode & stat.S_ISVTX:
            who = "every user" if st.st_mode & stat.S_IWOTH else f"group {st.st_gid}"
            raise SeaConfigError(
                f"{where}: {written!r} is not safe on a shared node: {str(directory)!r} is writable by {who}, "
                f"who could swap Sea's directory under it; use a directory only you can write (chmod go-w {str(directory)!r}, "
                "or a directory of your own in /dev/shm or $SLURM_TMPDIR)"
            )
    if set(taken) - _told_unmapped:
        _told_unmapped.update(taken)
        logger.info(
            "[Sea] %s: %s belong to a user this user namespace does not map (uid %d, as the host's root shows in a container "
            "without privileges): taken as root's", where, ", ".join(map(repr, taken)), unmapped,
        )  # fmt: skip


def check_is_directory(spec: TierSpec, where: str) -> None:
    """A tier named in the configuration must exist: one missing is never skipped (the work would
    silently go elsewhere)."""
    root = Path(spec.path)
    if not root.exists():
        raise SeaConfigError(f"{where}: path {spec.path!r} does not exist; create it or fix the path")
    if not root.is_dir():
        raise SeaConfigError(f"{where}: path {spec.path!r} is not a directory; give a directory on node-local storage")


def _capacity(spec: TierSpec, root: Path, where: str) -> int | None:
    if spec.capacity is None:
        return None
    fraction = parse_fraction(spec.capacity)
    total = psutil.disk_usage(str(root)).total
    capacity = int(fraction * total) if fraction is not None else parse_size(spec.capacity)
    if capacity < MIN_CAPACITY:
        raise no_room(where, spec.capacity)
    if capacity > total:
        logger.warning("[Sea] %s: capacity %s is more than the whole filesystem of %s (%s): its free space is the limit", where, spec.capacity, spec.path, format_size(total))
    return capacity
