"""A node's view: it runs at its directory's path in the home while its bytes live on a tier.

Programs that record their command line or working directory in what they write (MRtrix3's
``command_history``, AFNI's ``HISTORY_NOTE``) would otherwise record a tier path that is gone once
the node is evicted, where the engine's own plugin records the home's. So a worker process enters a
private mount namespace once (:func:`enter`; unprivileged, through a user namespace that maps only
the user's own ids), and for each node mounts, visible to that process and its children only:

- an overlay at the workflow's directory in the home (``<home>/<top>``) whose lower layers are
  the tiers' copies of it (their private directories mirror the home) and then the home's own:
  the node's producers, wherever they are, appear at their paths in the home, read-only;
- the node's real directory, bound at its path in the home: it writes there;
- each prefetched copy of an input seen at the original: an overlay at the original's directory
  whose lower layers are the copies' directories, then the directory itself. What the node does
  there (``sed -i``'s rename over its input, a ``derivatives/`` it makes beside it, a log it appends
  to) goes to an upper layer on a tier and is done in the real directory once, as the node returns
  (:meth:`View._keep_input_changes`). Where that directory holds the home or a tier, they are
  bound again over its overlay. Where that overlay cannot be made, the copy is bound over the
  original file (a rename over it then fails with EBUSY, and the node runs again on the originals:
  :meth:`sea.engine.SeaEngine.retry_elsewhere`).

Nothing is written in the home (the overlay's upper layer is on a tier) and everything is unmounted
when the node returns: each node's mounts are made in a copy of the process's namespace
(:func:`_node_namespace`), which the process leaves as the node returns and a thread of its own
then lets go, with every mount in it. Unmounting an overlay waits for the kernel (an RCU grace
period, 2 ms a node on a busy machine): it is no longer on the node's path. Where namespaces are not allowed (a container's seccomp profile, a kernel
without unprivileged overlays), the node runs at its tier path, as without a view, and
:func:`enter` gives the reason, said once in the report.

>>> view = View(home=Path("/h"), logical=Path("/h/wf/n"), physical=Path("/t/sea-1/wf/n"), roots=(Path("/t/sea-1"),), scratch=Path("/t/sea-1/.views"))
>>> view.to_logical("/t/sea-1/wf/p/out.nii"), view.to_logical("/data/raw.nii")
('/h/wf/p/out.nii', '/data/raw.nii')
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import queue
import shutil
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .durable import mount_table
from .puts import PutRecords
from .stager import identity, link_beside, own_like, put_back, stage_copy

_CLONE_NEWNS, _CLONE_NEWUSER = 0x00020000, 0x10000000
_MS_BIND, _MS_REC, _MS_SLAVE = 0x1000, 0x4000, 0x80000
_MNT_DETACH = 2
_PR_GET_DUMPABLE, _PR_SET_DUMPABLE = 3, 4
_libc = ctypes.CDLL(None, use_errno=True)
VIEWS_DIR = ".sea-views"  # in a tier's private directory: each worker's overlay scratch
_entered: str | None = None  # "" once this process is in its own namespace, else why not
_base: int | None = None  # this process's namespace as enter() made it (a descriptor), -1 where it cannot be kept
_let_go: queue.SimpleQueue | None = None  # descriptors of the namespaces nodes left, closed by a thread of their own
_cwd: int | None = None  # the directory the process was in as its node's namespace was made


def _check(result: int, what: str) -> None:
    if result != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"{what}: {os.strerror(number)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def c(text):
        return os.fsencode(text) if text is not None else None

    _check(_libc.mount(c(source), c(target), c(fstype), flags, c(data)), f"mount on {target}")


def _umount(target: str) -> None:
    _libc.umount2(os.fsencode(target), _MNT_DETACH)


def enter() -> str | None:
    """Put this process in a mount namespace of its own (once; it must have one thread): ``None``
    when it is, else the reason it cannot be."""
    global _entered
    if _entered is None:
        _entered = _enter()
    return _entered or None


def _enter() -> str:
    uid, gid = os.getuid(), os.getgid()
    try:
        if uid == 0:
            _check(_libc.unshare(_CLONE_NEWNS), "unshare")
        else:
            # a process that dropped root's ids without exec is not dumpable: its /proc files are
            # root's, and it could not write its own id maps; it is, while it writes them
            dumpable = _libc.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0)
            _check(_libc.unshare(_CLONE_NEWNS | _CLONE_NEWUSER), "unshare")
            _libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)
            try:
                for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
                    with open(f"/proc/self/{name}", "w") as f:
                        f.write(text)
            finally:
                _libc.prctl(_PR_SET_DUMPABLE, dumpable, 0, 0, 0)
        # mounts made later outside still appear here; ours never leave this process's namespace
        _mount(None, "/", None, _MS_REC | _MS_SLAVE)
    except OSError as e:
        if e.errno == errno.EINVAL and uid != 0:
            return "the worker processes have threads (mp_context spawn or forkserver, with a library that starts threads on import): a user namespace needs a process of one thread; use mp_context: fork"
        return f"private mount namespaces are not allowed here ({e.strerror or e})"
    return ""


def _node_namespace() -> bool:
    """Put the calling thread in a copy of the process's namespace, for one node's mounts: ``False``
    where it cannot be (the node's mounts are then made, and unmounted, in the process's own)."""
    global _base, _let_go, _cwd
    if _base is None:
        _base = -1
        try:
            base = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return False
        let_go = queue.SimpleQueue()
        try:
            threading.Thread(target=_close_each, args=(let_go,), name="sea-view-namespaces", daemon=True).start()
        except RuntimeError:  # no thread to be had (a limit on processes): every node's mounts here, as before
            os.close(base)
            return False
        _base, _let_go = base, let_go
    if _base < 0:
        return False
    try:
        _cwd = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)  # setns sets it to the root: put back after
    except OSError:
        _cwd = None
    if _libc.unshare(_CLONE_NEWNS) != 0:
        _forget_cwd()
        return False
    return True


def _leave_node_namespace() -> bool:
    """Back to the process's namespace (:func:`_node_namespace`) and the directory the process was
    in; the node's namespace is let go by the thread, with its mounts. ``False`` where it is not
    left: it could not be, or threads or processes the node started still run in it (a thread
    pool, joblib's workers), which later nodes may use. The node's mounts are then unmounted here,
    and the process makes every later node's in this namespace, which those see, as before."""
    global _base
    try:
        node = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        node = None
    if node is None or _others_in(node) or _libc.setns(_base, _CLONE_NEWNS) != 0:
        if node is not None:
            os.close(node)
        os.close(_base)
        _base = -1  # from now on as before: one namespace, the node's mounts unmounted as it returns
        _forget_cwd()
        return False
    _let_go.put(node)
    if _cwd is not None:
        with contextlib.suppress(OSError):
            os.fchdir(_cwd)
    _forget_cwd()
    return True


def _others_in(namespace: int) -> bool:
    """Whether a thread besides this one and Sea's, or a process this one started, is in the mount
    namespace ``namespace`` (a descriptor of it)."""
    if threading.active_count() > 2:  # (this thread and the one that lets namespaces go)
        return True
    ino = os.fstat(namespace).st_ino
    pending, seen = [str(os.getpid())], set()
    while pending:
        pid = pending.pop()
        for task in _listdir(f"/proc/{pid}/task"):
            for child in _read(f"/proc/{pid}/task/{task}/children").split():
                if child in seen:
                    continue
                seen.add(child)
                with contextlib.suppress(OSError):
                    if os.stat(f"/proc/{child}/ns/mnt").st_ino == ino:
                        return True
                pending.append(child)
    return False


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _forget_cwd() -> None:
    global _cwd
    if _cwd is not None:
        os.close(_cwd)
        _cwd = None


def _close_each(descriptors: queue.SimpleQueue) -> None:
    while True:
        os.close(descriptors.get())  # the last hold on a node's namespace: its mounts go, the kernel waits here


def _escaped(path: Path) -> str:
    """A path as overlay's mount options read it."""
    return str(path).replace("\\", "\\\\").replace(",", "\\,").replace(":", "\\:")


@dataclass(frozen=True)
class View:
    """How one node sees the home (see the module's docstring). ``roots``: directories laid out
    as the home (the tiers' private directories), looked up in order, before the home."""

    home: Path
    logical: Path
    physical: Path
    roots: tuple[Path, ...]
    scratch: Path  # a directory of the run's own on a tier: each process mounts its overlay's scratch there
    copies: tuple[tuple[str, str], ...] = ()  # (original, prefetched copy): the copy is seen at the original
    whole_home: bool = False  # the overlay covers the home, not only the workflow's directory in it
    home_identity: tuple[int, int] | None = None  # the home's (st_dev, st_ino) as the run started: a home moved away is never viewed
    submounts: tuple[str, ...] = ()  # filesystems mounted inside the home: bound again over the overlay, which hides them
    puts: PutRecords | None = None  # the record of the files put back beside node directories (sizes, a lock), the user's runs' on this node

    @property
    def at(self) -> Path:
        """The directory the overlay covers."""
        return self.home if self.whole_home else self.home / self.logical.relative_to(self.home).parts[0]

    def to_logical(self, path: str) -> str:
        """``path`` as the node sees it: a path in a root's copy of the workflow is the home's;
        a prefetched copy is its original."""
        if self.physical != self.logical and _within(path, self.physical):
            return str(self.logical) + path[len(str(self.physical)) :]
        for original, copy in self.copies:
            if path == copy:
                return original
        below = self.at.relative_to(self.home)
        for root in self.roots:
            if _within(path, root / below):
                return str(self.home) + path[len(str(root)) :]
        return path

    def to_physical(self, path: str) -> str:
        """The inverse, for what the node hands on: the first root that has it, else the home."""
        if _within(path, self.logical):
            return str(self.physical) + path[len(str(self.logical)) :]
        if _within(path, self.at):
            rest = path[len(str(self.home)) :]
            for root in self.roots:
                if os.path.lexists(str(root) + rest):
                    return str(root) + rest
        return path

    @contextlib.contextmanager
    def mounted(self) -> Iterator[None]:
        """The node's view, for the ``with`` block (:func:`enter` first). Raises ``OSError`` when it
        cannot be made; nothing is left mounted then."""
        at, below = self.at, self.at.relative_to(self.home)
        st = os.stat(self.home)
        if self.home_identity is not None and (st.st_dev, st.st_ino) != self.home_identity:
            raise FileNotFoundError(errno.ENOENT, "the home is not the directory the run started in", str(self.home))
        if at != self.home:
            at.mkdir(exist_ok=True)  # the workflow's directory (the engine makes it too); never a home moved away
        scratch = self.scratch / str(os.getpid())
        scratch.mkdir(parents=True, exist_ok=True)
        lowers = [root / below for root in self.roots if (root / below).is_dir()] + [at]
        if _within(str(self.physical), self.home):  # a node placed in the home (no tier had room): its directory
            self.physical.mkdir(parents=True, exist_ok=True)  # made now, as the engine would make it, to bind it
        own = _node_namespace()  # first: a mount may be bound only from the namespace it is in
        try:
            source = os.open(self.physical, os.O_PATH | os.O_DIRECTORY)  # it may be in the home, under the overlay
            real_at = os.open(at, os.O_PATH | os.O_DIRECTORY)
        except BaseException:
            if own:
                _leave_node_namespace()  # (nothing mounted yet)
            raise
        subs = []  # (mount point, its filesystem as it is now): taken before the overlay hides it
        for point in self.submounts:
            if _within(point, at) and not _within(point, self.logical):
                with contextlib.suppress(OSError):
                    subs.append((point, os.open(point, os.O_PATH | os.O_DIRECTORY)))
        mounted: list[str] = []
        inputs: list[_InputOverlay] = []  # overlaid inputs' directories (_overlay_inputs)
        started = time.time_ns()
        sizes = _sizes_beside(self.logical.parent, at)  # of the files a node may append to, as it starts
        try:
            # the overlay's scratch: a file system of this namespace's own, so that no layer holds another
            _mount("tmpfs", str(scratch), "tmpfs", 0, "mode=700")
            mounted.append(str(scratch))
            upper, work = scratch / "u", scratch / "w"
            (upper / self.logical.relative_to(at)).mkdir(parents=True)  # where the node's directory is bound
            work.mkdir()
            options = f"lowerdir={':'.join(_escaped(p) for p in lowers)},upperdir={_escaped(upper)},workdir={_escaped(work)}"
            _mount("overlay", str(at), "overlay", 0, options)
            mounted.append(str(at))
            _mount(f"/proc/self/fd/{source}", str(self.logical), None, _MS_BIND)
            for point, fd in subs:
                _mount(f"/proc/self/fd/{fd}", point, None, _MS_BIND | _MS_REC)
                mounted.append(point)
            for directory, pairs in _by_directory(self.copies).items():
                try:
                    inputs.append(self._overlay_inputs(directory, pairs, scratch / f"in{len(inputs)}"))
                except _ReadOriginals:
                    continue  # the node reads its inputs there where they are, as under the engine's own plugin
                except OSError:  # not here (an original's directory holding the home, a filesystem overlay refuses)
                    for original, copy in pairs:
                        with contextlib.suppress(OSError):  # an original gone: the node reads its copy's path
                            _mount(copy, original, None, _MS_BIND)
                            mounted.append(original)
            yield
        finally:
            for overlay in reversed(inputs):
                # first unmounted: the node's changes then go to the real directory
                failed_in = overlay.detach() or self._keep_input_changes(overlay, started)
                os.close(overlay.real)
                if failed_in:
                    logging.getLogger("sea").warning(
                        "[Sea] %s: %d of its changes in its inputs' directory %s could not be made (%s)",
                        self.logical, len(failed_in), overlay.directory, "; ".join(failed_in[:3]),
                    )  # fmt: skip
            try:
                failed = self._keep_writes_outside(upper, f"/proc/self/fd/{real_at}", started, sizes) if str(at) in mounted else []
            except OSError as e:  # never left mounted for the next node of this process
                failed = [f"{upper}: {e.strerror or e}"]
            if failed:
                logging.getLogger("sea").warning(
                    "[Sea] %s: %d of the entries it wrote outside its directory could not be kept (%s)",
                    self.logical,
                    len(failed),
                    "; ".join(failed[:3]),
                )
            os.close(source)
            os.close(real_at)
            for _point, fd in subs:
                os.close(fd)
            if not (own and _leave_node_namespace()):
                for target in reversed(mounted):
                    _umount(target)
                with contextlib.suppress(OSError):
                    scratch.rmdir()
            # else the scratch stays, for the process's next node: removed now, the mount on it in
            # the namespace just left would be unmounted here, the kernel's wait with it

    def _overlay_inputs(self, directory: str, pairs: list[tuple[str, str]], scratch: Path) -> _InputOverlay:
        """Mount the overlay that shows the prefetched copies (``pairs``: original, copy) at their
        originals in ``directory``, its upper layer in ``scratch`` (on the view's own tmpfs), and
        return it for :meth:`_keep_input_changes`. It is attached to the directory by descriptor
        and unmounted by its own (:func:`_attach_overlay`): another user who renames the directory
        or puts a link in its place meanwhile changes neither. The home and the tiers in the
        directory (an input beside the work directory) are bound again over it, as the node sees
        them. ``OSError`` where it cannot be: the directory is in the home or a tier, or holds
        them and another filesystem (an overlay would hide it: :class:`_ReadOriginals`),
        the run's user may not write there (the overlay would let the node), it is not the run's
        user's own or others may write in it, or a copy is not named as its original. (What the node
        did is made again through descriptors, never through a link put in the place of a directory,
        :meth:`_keep_input_changes`; but between Sea writing an entry and giving it its owner and
        mode, another user who may write there could put their own file at its name, and Sea would
        give it root's owner and the node's mode: the thirteenth adversarial pass made a setuid-root
        program so.)"""
        def real(*paths: Path) -> list[Path]:
            return [Path(os.path.realpath(p)) for p in paths]

        resolved = os.path.realpath(directory)
        if any(_within(resolved, p) for p in real(self.home, self.at, self.physical, self.scratch, *self.roots)):
            raise OSError(errno.EXDEV, "the directory is the home or a tier, or is in one")
        # the home and the tiers in it (an input beside the work directory): bound again over its
        # overlay, as the node sees them now (their own views in them), so that the overlay hides none
        on_top = _bound_on_top(resolved, real(self.home, self.scratch, *self.roots))
        if any(os.path.basename(original) != os.path.basename(copy) for original, copy in pairs):
            raise OSError(errno.EINVAL, "a copy is not named as its original")
        real = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            if not os.access(f"/proc/self/fd/{real}", os.W_OK):
                raise OSError(errno.EACCES, "the run's user may not write in the directory")
            st = os.fstat(real)
            if st.st_uid != os.geteuid() or st.st_mode & 0o022:
                raise OSError(errno.EPERM, "another user may change the directory")
            overlay = _InputOverlay(directory, real, scratch / "u", _sizes_in(real))
            for original, copy in pairs:
                st = os.stat(os.path.basename(original), dir_fd=real)
                overlay.originals[os.path.basename(original)] = (
                    identity(st),
                    Path(copy),
                )
            overlay.upper.mkdir(parents=True)
            (scratch / "w").mkdir()
            # each layer by a descriptor: a few inputs' copies named by their tier paths passed the
            # 256 bytes the kernel takes for an option's value (no overlay, and the node's sed -i failed)
            copies: list[int] = []
            held = []  # what goes on top of the overlay, opened before it covers them
            try:
                for d in dict.fromkeys(os.path.dirname(c) for _o, c in pairs):
                    copies.append(os.open(d, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
                held = [(path, os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)) for path in on_top]
                lowers = [f"/proc/self/fd/{fd}" for fd in [*copies, real]]
                overlay.mount = _attach_overlay(real, lowers, {"upperdir": str(overlay.upper), "workdir": str(scratch / "w")})
                try:
                    for path, fd in held:  # unmounted with the overlay (detach)
                        _mount(f"/proc/self/fd/{fd}", str(path), None, _MS_BIND | _MS_REC)
                except OSError:
                    overlay.detach()
                    raise
            finally:
                for fd in copies + [fd for _p, fd in held]:
                    os.close(fd)
        except BaseException:
            os.close(real)
            raise
        return overlay

    def _keep_input_changes(self, overlay: _InputOverlay, started: int) -> list[str]:
        """What the node did in its inputs' overlaid directory, done in the real one, its overlay
        unmounted (through a descriptor of it: another user's rename or link changes nothing). A
        prefetched input it changed is put back (:func:`~sea.stager.put_back`: bytes appended are
        appended, also after another node's appends since; only to the file that was copied; never
        over another's rewrite); anything else as beside its own directory (:meth:`_keep_one`,
        with the sizes the files had when the node started). Returns what could not be.

        Each entry is put through a descriptor of its directory, opened from the one above without
        following a link: a directory the node made there, swapped for a link as it is made again,
        is said, and nothing of it is written anywhere else (twelfth adversarial pass, X2)."""
        failed: list[str] = []
        real = f"/proc/self/fd/{overlay.real}"
        linked: dict[tuple[int, int], str] = {}
        opened = {".": overlay.real}  # a directory of the upper layer -> a descriptor of the real one
        try:
            for dirpath, dirs, files in os.walk(overlay.upper):
                rel_dir = os.path.normpath(os.path.relpath(dirpath, overlay.upper))
                parent = opened.get(rel_dir)
                if parent is None:  # it could not be made or opened: said once, as its entry
                    dirs[:] = []
                    continue
                for name in list(dirs) + files:
                    rel = os.path.normpath(os.path.join(rel_dir, name))
                    src, dst = os.path.join(dirpath, name), f"/proc/self/fd/{parent}/{name}"
                    try:
                        st = os.lstat(src)
                        if rel in overlay.originals and stat.S_ISREG(st.st_mode):
                            put_input_back(self.puts, real, rel, src, dst, *overlay.originals[rel])
                        else:
                            self._keep_one(src, dst, started, overlay.sizes.get(rel), linked)
                            if stat.S_ISDIR(st.st_mode):
                                opened[rel] = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
                    except OSError as e:
                        failed.append(f"{rel}: {e.strerror or e}")
        finally:
            for rel, fd in opened.items():
                if rel != ".":
                    os.close(fd)
        return failed

    def _keep_writes_outside(self, upper: Path, real_at: str, started: int, sizes: dict[str, int]) -> list[str]:
        """What the node did in the view outside its own directory (wrote ``../shared.txt``,
        removed or renamed a file beside it, replaced a link or a directory) went to the overlay's
        upper layer: done again where it would be without Sea (a producer's directory on its tier,
        else the home), entry by entry, before the layer goes. A removal is done only to what has
        not changed since the node started (``started``, ns): another node may have made it again
        meanwhile, as it would have under the engine's own plugin. A link there is replaced, never
        followed; a file is written beside its name and renamed over it (a hard link of the old one
        elsewhere keeps its bytes), as what it is (a named pipe is made, never opened; holes and hard
        links between the entries kept); the overlay's own attributes stay behind. One entry that
        cannot be kept does not stop the others: returns what could not be, one line each."""
        own = self.logical.relative_to(self.at).parts
        skeleton = {os.path.join(*own[:i]) for i in range(1, len(own) + 1)}
        linked: dict[tuple[int, int], str] = {}  # (dev, ino) in the upper layer -> where it was put
        failed = []
        for dirpath, dirs, files in os.walk(upper):
            rel_dir = os.path.relpath(dirpath, upper)
            for name in list(dirs) + files:
                rel = os.path.normpath(os.path.join(rel_dir, name))
                if rel in skeleton:
                    continue  # the way to the node's own directory (bound: nothing of it is here)
                try:
                    where = self.to_physical(str(self.at / rel))
                    dst = where if not _within(where, self.at) else os.path.join(real_at, rel)
                    self._keep_one(os.path.join(dirpath, name), dst, started, sizes.get(rel), linked)
                except OSError as e:
                    failed.append(f"{rel}: {e.strerror or e}")
        return failed

    def _keep_one(self, src: str, dst: str, started: int, size: int | None, linked: dict[tuple[int, int], str]) -> None:
        """One entry of an upper layer (``src``), put at ``dst``.
        A file there that another node changed too while this one ran (both appended to
        ``../log.txt``): what this node added after the bytes the file had when it started
        (``size``, if known) is added to the other's; if this node changed those bytes, the other's
        file stays and this is said."""
        st = os.lstat(src)
        try:
            there = os.lstat(dst)
        except FileNotFoundError:
            there = None
        whiteout = _is_whiteout(st)
        if there is not None and (whiteout or (stat.S_ISDIR(st.st_mode) and _is_opaque(src)) or _replaced(st, there)):
            # the node removed it, or made something else of that name; but what another
            # made or changed since this node started stays (a link never does: not followed)
            if not (there.st_ctime_ns >= started and (whiteout or stat.S_ISDIR(there.st_mode))):
                _remove(dst)
        if whiteout:
            return
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if stat.S_ISDIR(st.st_mode):
            os.makedirs(dst, exist_ok=True)  # its entries follow, one by one
            _same_owner(dst, st)
            own_like(dst, None, None, stat.S_IMODE(st.st_mode))  # a link put there meanwhile is not followed
            os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
            return
        if stat.S_ISREG(st.st_mode) and st.st_nlink > 1 and (st.st_dev, st.st_ino) in linked:
            tmp = link_beside(linked[st.st_dev, st.st_ino], dst)  # another name of a file it made: one file, as it made it
        elif stat.S_ISREG(st.st_mode) and (there is None or stat.S_ISREG(there.st_mode)) and self.puts is not None:
            self._put_file(src, dst, st, started, size)
            if st.st_nlink > 1:
                linked.setdefault((st.st_dev, st.st_ino), dst)
            return
        else:
            tmp, _, _ = stage_copy(Path(src), Path(dst), sync=False)  # a link as a link, a pipe made, holes kept
        _same_owner(tmp, st)
        os.replace(tmp, dst)  # dst is no directory here: removed above if it was
        if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
            linked.setdefault((st.st_dev, st.st_ino), dst)

    def _put_file(self, src: str, dst: str, st: os.stat_result, started: int, size: int | None) -> None:
        """Put the node's copy of a file beside its directory at ``dst``, one process at a time for
        that file, of any of the user's runs on this node (a lock on its record: :mod:`sea.puts`). If another node changed it since this
        one started (both appended to ``../log.txt``), what this node appended is added to it
        (:func:`_appended`): its copy was taken when it first wrote, as the file was then, which is
        as one of the recorded sizes left it (each put notes the size before and after) or as it
        was at the node's start (``size``)."""
        with self.puts.record(os.path.dirname(dst), os.path.basename(dst)) as noted:
            sizes = {int(x) for line in noted for x in line.split()} | ({size} if size is not None else set())
            try:
                there = os.lstat(dst)
            except FileNotFoundError:
                there = None
            if there is None or there.st_ctime_ns < started:  # as the node found it: its copy is the file
                tmp, _, _ = stage_copy(Path(src), Path(dst), sync=False)
            else:
                tmp = _appended(src, dst, sizes)
            _same_owner(tmp, st)
            after = os.lstat(tmp).st_size
            os.replace(tmp, dst)
            noted.write(f"{there.st_size if there is not None else 0} {after}\n")


def put_input_back(puts: PutRecords | None, directory: str, rel: str, src: str, dst: str, as_copied: tuple[int, ...], copy: Path | None) -> None:
    """Put a node's changed copy ``src`` of a prefetched input back at ``dst`` (``rel`` in
    ``directory``; :func:`~sea.stager.put_back`), its record held: one node at a time, of any of
    the user's runs. Two nodes appending to one input and returning at once would each append at
    the end it saw, the later over the other's bytes (the eleventh adversarial pass, N2)."""
    with puts.record(directory, rel) if puts is not None else contextlib.nullcontext():
        put_back(Path(src), Path(dst), as_copied, base=copy)


@dataclass
class _InputOverlay:
    """An overlay of a prefetched input's directory in a node's view (:meth:`View._overlay_inputs`)."""

    directory: str  # as the node names it
    real: int  # a descriptor of the real directory, opened before the overlay covered it
    upper: Path  # what the node did there
    sizes: dict[str, int]  # the sizes of the files there as the node started (a log it appends to)
    originals: dict[str, tuple[tuple[int, ...], Path]] = field(default_factory=dict)  # name -> (as copied, the copy)
    mount: int | None = None  # a descriptor of the overlay's own root

    def detach(self) -> list[str]:
        """Unmount it, by its own descriptor; what went wrong (nothing is done in the directory then)."""
        if self.mount is None:
            return []
        result = _libc.umount2(os.fsencode(f"/proc/self/fd/{self.mount}"), _MNT_DETACH)
        number = ctypes.get_errno()
        os.close(self.mount)
        self.mount = None
        return [f"its overlay could not be unmounted: {os.strerror(number)}"] if result != 0 else []


_SYS_MOVE_MOUNT, _SYS_FSOPEN, _SYS_FSCONFIG, _SYS_FSMOUNT = 429, 430, 431, 432  # the same on every architecture
_FSCONFIG_SET_STRING, _FSCONFIG_CMD_CREATE = 1, 6
_MOVE_MOUNT_F_EMPTY_PATH, _MOVE_MOUNT_T_EMPTY_PATH = 0x4, 0x40


def _syscall(number: int, *args, what: str) -> int:
    result = _libc.syscall(number, *args)
    if result < 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")
    return result


def _attach_overlay(directory_fd: int, lowers: list[str], options: dict[str, str]) -> int:
    """Mount an overlay (``lowers``, the top layer first; ``options``: upperdir, workdir) on the
    directory ``directory_fd`` is open on, with the kernel's mount API (no path is looked up again);
    a descriptor of it. The layers go one by one (``lowerdir+``, Linux 6.8) where the kernel takes
    them so, else as one ``lowerdir`` value (at most 256 bytes)."""
    fs = _syscall(_SYS_FSOPEN, b"overlay", ctypes.c_uint(1), what="fsopen overlay")  # FSOPEN_CLOEXEC
    try:
        try:
            _set_option(fs, "lowerdir+", lowers[0])
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            options = {"lowerdir": ":".join(_escaped(Path(p)) for p in lowers), **options}
        else:
            for lower in lowers[1:]:
                _set_option(fs, "lowerdir+", lower)
        for key, value in options.items():
            _set_option(fs, key, value)
        _syscall(_SYS_FSCONFIG, fs, ctypes.c_uint(_FSCONFIG_CMD_CREATE), None, None, ctypes.c_int(0), what="overlay")
        mount = _syscall(_SYS_FSMOUNT, fs, ctypes.c_uint(1), ctypes.c_uint(0), what="fsmount")  # FSMOUNT_CLOEXEC
    finally:
        os.close(fs)
    try:
        flags = ctypes.c_uint(_MOVE_MOUNT_F_EMPTY_PATH | _MOVE_MOUNT_T_EMPTY_PATH)
        _syscall(_SYS_MOVE_MOUNT, mount, b"", directory_fd, b"", flags, what="move_mount")
    except OSError:
        os.close(mount)
        raise
    return mount


def _set_option(fs: int, key: str, value: str) -> None:
    _syscall(_SYS_FSCONFIG, fs, ctypes.c_uint(_FSCONFIG_SET_STRING), key.encode(), os.fsencode(value), ctypes.c_int(0), what=f"overlay {key}")


SIZES_AT_MOST = 256  # files in an input's directory whose sizes a node's view notes as it starts


def _sizes_in(directory_fd: int) -> dict[str, int]:
    """The sizes of the regular files in the directory ``directory_fd`` (``O_PATH``) is open on, by
    name; none in a directory of more than :data:`SIZES_AT_MOST` entries (a flat dataset of
    thousands of files on a slow filesystem: a stat of each for every node would cost more than
    it saves; appends of two nodes at once to a file there are then merged only through the record
    each put leaves, :meth:`View._put_file`)."""
    sizes = {}
    try:
        fd = os.open(f"/proc/self/fd/{directory_fd}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return sizes
    try:
        with os.scandir(fd) as entries:
            for n, entry in enumerate(entries):
                if n >= SIZES_AT_MOST:
                    return {}
                with contextlib.suppress(OSError):
                    if entry.is_file(follow_symlinks=False):
                        sizes[entry.name] = entry.stat(follow_symlinks=False).st_size
    except OSError:
        pass
    finally:
        os.close(fd)
    return sizes


def _by_directory(copies: tuple[tuple[str, str], ...]) -> dict[str, list[tuple[str, str]]]:
    """The (original, copy) pairs by the original's directory."""
    out: dict[str, list[tuple[str, str]]] = {}
    for original, copy in copies:
        out.setdefault(os.path.dirname(original), []).append((original, copy))
    return out


def _same_owner(path: str, st: os.stat_result) -> None:
    """As root, ``path`` gets the owner the node's entry has (a colleague's log it appended to stays
    theirs, a file it gave away stays given): the overlay keeps them, a copy is root's. A user
    without privileges owns all they can make."""
    if os.geteuid() == 0:  # chown drops setuid and setgid: the mode again; a link put at its name is not followed
        own_like(path, st.st_uid, st.st_gid, None if stat.S_ISLNK(st.st_mode) else stat.S_IMODE(st.st_mode))


_files_beside: dict[str, tuple[int, list[str]]] = {}  # directory -> (its mtime, the files in it), per worker process


def _sizes_beside(directory: Path, at: Path) -> dict[str, int]:
    """The sizes of the files in ``directory`` (the node directory's parent), by their paths
    relative to ``at``: what a node appending to one of them found there. Its listing is taken
    again only when the directory changed: a node's cost is a stat of each file there, not a read
    of the directory. None in a directory of more than :data:`SIZES_AT_MOST` subdirectories (its
    link count tells), as in :func:`_sizes_in`: a Pydra cache, or a big workflow's directory,
    changes as each job's directory is made, and a read of its thousands of entries for every node
    made a run's cost grow with the square of its jobs (18 ms a node at 20,000); appends of two
    nodes at once to a file there are then merged through the record each put leaves."""
    try:
        st = os.stat(directory)
    except OSError:
        return {}
    if st.st_nlink - 2 > SIZES_AT_MOST:  # "." and its own name; a filesystem that counts no subdirectory says 1
        return {}
    mtime = st.st_mtime_ns
    listed = _files_beside.get(str(directory))
    if listed is None or listed[0] != mtime:
        with contextlib.suppress(OSError), os.scandir(directory) as entries:
            listed = (mtime, [entry.name for entry in entries if entry.is_file(follow_symlinks=False)])
            _files_beside[str(directory)] = listed
    sizes = {}
    for name in listed[1] if listed is not None else ():
        with contextlib.suppress(OSError):
            sizes[os.path.relpath(os.path.join(directory, name), at)] = os.lstat(os.path.join(directory, name)).st_size
    return sizes


MERGED_AT_MOST = 256 * 2**20  # a file two nodes changed at once is merged in memory up to this size


def _appended(mine: str, theirs: str, sizes: set[int]) -> str:
    """A temporary beside ``theirs`` (the home's file, which other nodes changed while this one
    ran) holding it and what this node appended (``mine``: its copy, taken when it first wrote,
    then appended to). The copy began as the file was then: as long as one of ``sizes`` (the
    sizes it had at the node's start and after each node put it home), and as ``theirs`` begins;
    the longest such start shorter than the copy is taken. ``OSError`` if none is (the node
    changed bytes it found, not only appended): the other's is kept, and said."""
    if os.path.getsize(mine) > MERGED_AT_MOST:
        raise OSError(
            errno.EFBIG, "another node changed it while this one changed it too, and it is too large to merge: the other's is kept"
        )
    with open(mine, "rb") as a:
        ours = a.read()
    with open(os.open(theirs, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as b:  # never through a link
        if not stat.S_ISREG(os.fstat(b.fileno()).st_mode):
            raise OSError(errno.EINVAL, "it is not a regular file any more")
        current = b.read()
    shared = _common_prefix_length(ours, current)
    starts = [n for n in sizes if n <= shared and n < len(ours)]
    if not starts:
        raise OSError(errno.EBUSY, "another node changed it while this one changed it too: the other's is kept")
    tmp, _, _ = stage_copy(Path(theirs), Path(theirs), sync=False)
    with open(os.open(tmp, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC), "ab") as out:
        out.write(ours[max(starts) :])  # what this node added, after the other's
    return str(tmp)


def _common_prefix_length(a: bytes, b: bytes, chunk: int = 1 << 16) -> int:
    """How many bytes ``a`` and ``b`` share from their start (compared a chunk at a time, then
    halving within the first chunk that differs: no loop over single bytes)."""
    n, i = min(len(a), len(b)), 0
    while i < n and a[i : i + chunk] == b[i : i + chunk]:
        i = min(i + chunk, n)
    lo, hi = i, min(i + chunk, n)  # they agree up to lo; the first difference is before hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[i:mid] == b[i:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _is_whiteout(st: os.stat_result) -> bool:
    """What an overlay's upper layer marks as removed: a character device 0/0."""
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def _is_opaque(directory: str) -> bool:
    """An upper directory that hides the lower ones' entries (the node removed the directory and
    made it again): ``trusted.overlay.opaque`` as root, ``user.overlay.opaque`` in a user namespace."""
    for name in ("trusted.overlay.opaque", "user.overlay.opaque"):
        with contextlib.suppress(OSError):
            if os.getxattr(directory, name, follow_symlinks=False) == b"y":
                return True
    return False


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _replaced(upper: os.stat_result, there: os.stat_result) -> bool:
    """The node made something of another kind where ``there`` is (a file for a link or a
    directory, a directory for a file)."""
    kind = lambda st: stat.S_IFMT(st.st_mode)  # noqa: E731
    return kind(upper) != kind(there) or stat.S_ISLNK(there.st_mode)


class _ReadOriginals(OSError):
    """An input directory a node's view neither overlays nor binds copies in: a copy bound over its
    original makes the original's path a mount point, where a node replacing its input (``sed -i``
    in a subprocess) fails with an ``EBUSY`` only that subprocess names; here the node may well
    write (the work directory is in it), so it reads and changes the originals, as without prefetch."""


def _outermost(paths: list[Path]) -> list[Path]:
    """``paths`` less those in another of them."""
    return [p for p in paths if not any(q != p and _within(str(p), q) for q in paths)]


def _bound_on_top(directory: str, kept: list[Path]) -> list[Path]:
    """What to bind again over an overlay of ``directory`` for it to hide none of ``kept`` (the
    home, the tiers' directories: real paths): those in it, each widened to a filesystem mounted in
    ``directory`` that holds it (a tier's tmpfs there). ``OSError`` if another filesystem is
    mounted in it (its mounts are not the node's to bind again)."""
    inside = [p for p in kept if _within(str(p), Path(directory))]
    if not inside:
        return []
    for point in (mount.mountpoint for mount in mount_table()):
        if point == directory or not _within(point, Path(directory)) or any(_within(point, p) for p in inside):
            continue
        if not any(_within(str(p), Path(point)) for p in inside):
            raise _ReadOriginals(errno.EXDEV, "another filesystem is mounted in the directory, which holds the home or a tier")
        inside.append(Path(point))  # a tier's own filesystem: bound whole
    return _outermost(inside)


def _within(path: str, directory: Path) -> bool:
    d = str(directory)
    return path == d or path.startswith(d + "/")
