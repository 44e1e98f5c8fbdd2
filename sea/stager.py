"""The asynchronous stager: copies files home while compute goes on, atomically.

A copy is written under a hidden temporary name next to its destination, given the source's
timestamps (so Nipype's timestamp hashing sees the same file), made durable, then renamed over the
final name, and the directory made durable: a partial file is never visible at its final path, and
a reader either sees nothing or the whole file. Durability is batched (:mod:`sea.durable`): a batch
of many files on a filesystem that honours ``syncfs`` is written whole, synced once, then renamed
(the renames queued ahead of other writes) and synced once more; otherwise each file is fsync'ed
and renamed as it is written, and each directory fsync'ed once at the end of the batch. Either way
the batch's ``on_done`` runs only once all of it is durable. Transient errors (and a destination
directory removed under the copy) are retried with backoff; a persistent one is reported with the
file's name and the source is kept, so nothing is lost.

Copies are taken in order of priority: declared outputs (what the run must deliver), then node
directories that must go home (every one with ``checkpoints: all``), then optional checkpoints
(``auto``'s). An optional copy uses only an idle link: it starts when no copy the run needs is
queued or under way, and gives way (stops between chunks, its temporary removed, queued again) as
soon as one is submitted, so a checkpoint never holds up an output; at the end of a run, optional
copies not done yet are abandoned (:meth:`Stager.abandon`), those under way stopped, rather than
waited for. One optional copy not started yet can also be given up on its own (:meth:`Stager.cancel`:
its directory is done with and the copy cannot start now: it would hold its tier meanwhile).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import hashlib
import itertools
import logging
import os
import queue
import re
import secrets
import shutil
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .console import SeaError
from .durable import BatchSync, fsync_dir
from .pack import PackSource
from .private import rmtree

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


def stage_copy(
    src: Path, dst: Path, interrupt: Callable[[], bool] | None = None, sync: bool = True, guard: Callable[[], None] | None = None
) -> tuple[Path | None, int, os.stat_result]:
    """Write ``src`` under a temporary name next to ``dst`` with its mode and times (its data
    fsync'ed if ``sync``); returns the temporary, the bytes written and the copy's ``lstat`` as a
    rerun will find it. An empty directory is made at ``dst`` itself (``None``: no temporary; it is
    part of the outputs too). ``interrupt`` is asked between chunks: if it says so, the copy stops,
    leaves nothing, and raises :class:`Yielded`. The destination's directory is made if missing,
    once ``guard`` (if given) did not raise: the engine's says the home is still where the run
    started, so that no copy makes a new home in place of one moved away."""
    if isinstance(src, PackSource):
        return _stage_pack(src, dst, interrupt, sync, guard)
    st = os.lstat(src)
    if stat.S_ISDIR(st.st_mode):
        _make_dirs(dst, guard, like=src)
        shutil.copystat(src, dst)
        return None, 0, dst.lstat()
    tmp = dst.parent / temporary_name(dst.name, secrets.token_hex(4))
    if stat.S_ISLNK(st.st_mode):
        _retry_in_new_dir(dst, lambda: os.symlink(os.readlink(src), tmp), guard, src)
        return tmp, 0, tmp.lstat()
    if not stat.S_ISREG(st.st_mode):  # a named pipe, a socket, a device: made as what it is, never opened
        _retry_in_new_dir(dst, lambda: os.mknod(tmp, st.st_mode, st.st_rdev), guard, src)
        os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
        return tmp, 0, tmp.lstat()
    mode = stat.S_IMODE(st.st_mode)
    fin = open_to_read(src)
    try:
        fout = _retry_in_new_dir(dst, lambda: os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode), guard, src)
        try:
            try:
                size = _copy_file(fin, fout, interrupt)
                _copy_xattrs(fin, fout)
                os.utime(fout, ns=(st.st_atime_ns, st.st_mtime_ns))  # after the last write
                copied = os.fstat(fout)
                if stat.S_IMODE(copied.st_mode) != mode:  # the umask took bits off at creation
                    os.fchmod(fout, mode)
                    copied = os.fstat(fout)
                if sync:
                    os.fsync(fout)
            finally:
                os.close(fout)  # its error too (a quota, on NFS) leaves no temporary behind
        except BaseException:
            _unlink(tmp)
            raise
    finally:
        os.close(fin)
    return tmp, size, copied


def _stage_pack(
    src: PackSource, dst: Path, interrupt: Callable[[], bool] | None, sync: bool, guard: Callable[[], None] | None
) -> tuple[Path, int, os.stat_result]:
    """:func:`stage_copy` for a pack (:mod:`sea.pack`): its members written as one file, readable
    by its owner only (it holds the engine's pickles)."""
    tmp = dst.parent / temporary_name(dst.name, secrets.token_hex(4))
    fout = _retry_in_new_dir(dst, lambda: os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600), guard)
    try:
        try:
            size = src.write(fout, interrupt, copy=_copy_data)
            copied = os.fstat(fout)
            if sync:
                os.fsync(fout)
        finally:
            os.close(fout)
    except BaseException:
        _unlink(tmp)
        raise
    return tmp, size, copied


def open_to_read(path: Path) -> int:
    """A descriptor to read the regular file at ``path``: never one that blocks (a named pipe put there
    since it was looked at opens at once, and is refused), never through a link."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except PermissionError:
        # a file its owner made unreadable to all (mode 0000): MultiProc leaves it where it was
        # made; Sea, its owner, reads it once to copy it, its mode as it was
        st = os.lstat(path)
        if st.st_uid != os.geteuid() or not stat.S_ISREG(st.st_mode):
            raise
        os.chmod(path, stat.S_IMODE(st.st_mode) | stat.S_IRUSR, follow_symlinks=True)
        try:
            fd = os.open(path, flags)
        finally:
            os.chmod(path, stat.S_IMODE(st.st_mode))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, f"{path} is not a regular file any more")
    return fd


OVERLAY_XATTRS = ("trusted.overlay.", "user.overlay.")


def _copy_xattrs(fin: int, fout: int) -> None:
    """As ``shutil.copystat`` does: a filesystem without them, or a name not allowed here, is skipped."""
    ignored = (errno.EPERM, errno.ENOTSUP, errno.ENODATA, errno.EINVAL, errno.EACCES)
    try:
        names = os.listxattr(fin)
    except OSError as exc:
        if exc.errno not in ignored:
            raise
        return
    for name in names:
        if name.startswith(OVERLAY_XATTRS):
            continue  # an overlay's own (sea.view's upper layer), never the file's
        try:
            os.setxattr(fout, name, os.getxattr(fin, name))
        except OSError as exc:
            if exc.errno not in ignored:
                raise


def _retry_in_new_dir(dst: Path, make: Callable[[], object], guard: Callable[[], None] | None = None, src: Path | None = None):
    """``make()`` (which creates a file next to ``dst``), after making ``dst``'s directory if it is
    missing (as ``src``'s directories are, see :func:`_make_dirs`)."""
    try:
        return make()
    except FileNotFoundError:
        _make_dirs(dst.parent, guard, like=src.parent if src is not None else None)
        return make()


def _make_dirs(path: Path, guard: Callable[[], None] | None, like: Path | None = None) -> None:
    """``mkdir -p path``, calling ``guard`` first if anything is missing. A directory made in place
    of one of ``like``'s (the same name, as far up as names match) is never open to more than that
    one is: a directory a node made for itself only (``mkdtemp``) stays its owner's."""
    missing = []
    while not path.is_dir():
        missing.append((path, like))
        like = like.parent if like is not None and like.name == path.name else None
        path = path.parent
    if missing and guard is not None:
        guard()
    for directory, source in reversed(missing):
        mode = 0o777
        if source is not None and source.name == directory.name:
            with contextlib.suppress(OSError):
                mode = (stat.S_IMODE(os.lstat(source).st_mode) & 0o777) | 0o700  # its owner writes it now
        try:
            os.mkdir(directory, mode)
        except FileExistsError:
            pass


def _copy_file(fin: int, fout: int, interrupt: Callable[[], bool] | None) -> int:
    """Copy a regular file's bytes into an empty one, its holes kept (a sparse file stays sparse, as
    ``cp`` and MultiProc's own directory leave it): only the ranges ``SEEK_DATA`` finds are copied,
    and the copy is given the file's length. Returns the bytes copied."""
    length = os.fstat(fin).st_size
    try:
        start = os.lseek(fin, 0, os.SEEK_DATA)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # nothing but a hole
            os.ftruncate(fout, length)
            return 0
        return _copy_data(fin, fout, interrupt)  # a filesystem that cannot say where data is
    copied = 0
    while start < length:
        end = os.lseek(fin, start, os.SEEK_HOLE)
        os.lseek(fout, start, os.SEEK_SET)
        copied += _copy_data(fin, fout, interrupt, start, end)
        try:
            start = os.lseek(fin, end, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise
            break
    os.ftruncate(fout, length)
    return copied


def _copy_data(fin: int, fout: int, interrupt: Callable[[], bool] | None, start: int = 0, end: int | None = None) -> int:
    """Copy a file's bytes from ``start`` to ``end`` (its end) to ``fout`` at its position (in the
    kernel where it can), asking ``interrupt`` between chunks; returns the bytes copied."""
    chunk = CHUNK if interrupt is None else CHUNK // 4  # an optional copy stops sooner
    offset = start
    while end is None or offset < end:
        if interrupt is not None and interrupt():
            raise Yielded("a copy the run needs came first")
        try:
            sent = os.sendfile(fout, fin, offset, chunk if end is None else min(chunk, end - offset))
        except OSError as exc:
            if offset > start or exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ESPIPE):
                raise
            break  # this pair of filesystems cannot: by hand
        if not sent:
            return offset - start
        offset += sent
    else:
        return offset - start
    os.lseek(fin, offset, os.SEEK_SET)
    while end is None or offset < end:
        if interrupt is not None and interrupt():
            raise Yielded("a copy the run needs came first")
        data = os.read(fin, chunk if end is None else min(chunk, end - offset))
        if not data:
            break
        view = memoryview(data)
        while view:
            view = view[os.write(fout, view) :]
        offset += len(data)
    return offset - start


def _size(path: Path | PackSource) -> int:
    if isinstance(path, PackSource):
        return path.nbytes
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


def _unlink(path: Path) -> None:
    """Remove a temporary; one that cannot be (the filesystem failing) is said, and left for the
    next run's sweep of temporaries."""
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        logger.warning("[Sea] could not remove the temporary %s (%s)", path, exc.strerror or exc)


def atomic_copy(src: Path, dst: Path, interrupt: Callable[[], bool] | None = None, guard: Callable[[], None] | None = None) -> int:
    """Copy ``src`` to ``dst`` through a temporary name, durably (:func:`stage_copy`, a rename, an
    ``fsync`` of the directory); returns the bytes copied."""
    tmp, size, _ = stage_copy(src, dst, interrupt, guard=guard)
    _put_in_place(tmp, dst)
    fsync_dir(dst.parent)
    return size


def copy_tree_in(source: Path, target: Path, guard: Callable[[], None] | None = None) -> tuple[int, int]:
    """The directory ``source`` copied whole into a temporary beside ``target`` (:func:`atomic_copy`
    for each file, link and empty directory), then put at ``target`` by one rename in place of what
    is there (:func:`swap_in`): a link to ``source``, an earlier run's directory. A partial copy
    never shows at ``target``; a failure leaves ``target`` as it was. Returns bytes and files copied."""
    into = target.parent / temporary_name(target.name, secrets.token_hex(4))
    copied = files = 0
    try:
        os.mkdir(into, 0o700)
        for src in walk_files(source, empty_dirs=True):
            copied += atomic_copy(src, into / src.relative_to(source), guard=guard)
            files += 1
        os.chmod(into, stat.S_IMODE(os.lstat(source).st_mode))
        swap_in(into, target)
    except BaseException:
        rmtree(into)
        raise
    return copied, files


def swap_in(copy: Path, logical: Path) -> None:
    """Put a directory's complete copy at ``logical`` by one rename, in place of what is there (the
    directory an earlier run left, which the engine would have emptied to run the node again there;
    a link to the copy's source), which is then removed."""
    old = None
    if os.path.lexists(logical):
        old = logical.parent / temporary_name(logical.name, "old")
        _remove_entry(old)  # (an earlier swap's, interrupted)
        os.rename(logical, old)
    try:
        os.rename(copy, logical)
    except BaseException:
        if old is not None:
            os.rename(old, logical)  # as it was
        raise
    if old is not None:
        _remove_entry(old)


def _remove_entry(path: Path) -> None:
    """A link, file or directory tree at ``path``, removed; nothing there is no error."""
    if os.path.islink(path) or os.path.isfile(path):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    else:
        rmtree(path)


def identity(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """A file as it was copied, for :func:`put_back`: a change that keeps its size and mtime
    (``touch -r``, ``cp -p``, a coarse-grained mtime) still changes its ctime."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def put_back(src: Path, dst: Path, identity: tuple[int, ...], base: Path | None = None) -> None:
    """Put ``src``, a copy of the file ``dst`` a node changed, at ``dst``, as the node's change would
    have left it there: only if ``dst`` is still the file that was copied (``identity``: its device,
    inode, size, mtime and ctime when copied; not one another user put in its place since), with the
    copy's mode, times and bytes. Bytes appended are appended (the inode kept). A file rewritten is
    written anew beside it and renamed over it (its owner kept), so that a kill leaves the old file
    or the new, never a truncated one; unless it has other names (hard links), which the node's
    rewrite in place kept: then it is rewritten in place too. A rewrite is put there only if nothing
    else changed the original since it was copied: that change is not overwritten. ``base``: the
    copy ``src`` began as, if it is still as it was: ``src`` holding it and more (a node appended to
    its input while another appended to the original) has its own bytes appended after the others'.
    ``dst`` a link to the file copied (a DataLad dataset's file, a link into its annex): the change
    is put at the link's own name, as a node renaming its result over it would, never through it
    (the annex's object, or another user's file, stays as it was)."""
    fd = os.open(dst, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != tuple(identity[:2]) or not stat.S_ISREG(st.st_mode):
            raise OSError(errno.ESTALE, "it is not the file that was copied any more")
        if stat.S_ISLNK(os.lstat(dst).st_mode):
            tmp, _, _ = stage_copy(src, Path(dst))
            _put_in_place(tmp, Path(dst))  # the link replaced, its target untouched
            fsync_dir(Path(dst).parent)
            return
        unchanged = (st.st_size, st.st_mtime_ns, st.st_ctime_ns) == tuple(identity[2:5])
        fin = open_to_read(src)
        try:
            new = os.fstat(fin)
            appended = new.st_size >= st.st_size and _same_bytes(fd, fin, st.st_size)
            start = st.st_size
            if not appended and not unchanged:
                if not _extends(fin, new.st_size, base, identity[2]):
                    raise OSError(errno.ESTALE, "it was changed by something else since it was copied, which the copy's rewrite would undo")
                appended, start = True, identity[2]  # what this node appended goes after what the other did
            if stat.S_IMODE(st.st_mode) != stat.S_IMODE(new.st_mode):
                os.fchmod(fd, stat.S_IMODE(new.st_mode))  # the node's chmod (one making it writable comes first)
            if appended or st.st_nlink > 1:
                fout = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_CLOEXEC)  # this very file, for writing
                try:
                    if appended:
                        os.lseek(fout, 0, os.SEEK_END)
                    else:
                        start = 0
                        os.ftruncate(fout, 0)
                    _copy_data(fin, fout, None, start=start)
                    os.utime(fout, ns=(new.st_atime_ns, new.st_mtime_ns))
                    os.fsync(fout)
                finally:
                    os.close(fout)
                return
        finally:
            os.close(fin)
        parent = directory_holding(dst, (st.st_dev, st.st_ino))
        try:
            real = Path(f"/proc/self/fd/{parent}") / Path(dst).name  # that directory, wherever it is now
            tmp, _, _ = stage_copy(src, real)
            if os.geteuid() == 0:
                own_like(tmp, st.st_uid, st.st_gid, stat.S_IMODE(new.st_mode))  # chown drops setuid and setgid
            _put_in_place(tmp, real)
            fsync_dir(real.parent)
        finally:
            os.close(parent)
    finally:
        os.close(fd)


def directory_holding(path: Path, file: tuple[int, int]) -> int:
    """A descriptor of the directory ``path`` names, checked to hold at ``path``'s name the file
    ``file`` (its device and inode), or a link to it: what is written through it never goes into a directory
    someone put in the place of another meanwhile (``ESTALE`` then)."""
    parent = os.open(Path(path).parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        found = os.stat(Path(path).name, dir_fd=parent, follow_symlinks=False)
        if stat.S_ISLNK(found.st_mode):  # a link to it (a dataset's link into its annex)
            found = os.stat(Path(path).name, dir_fd=parent)
        if (found.st_dev, found.st_ino) != tuple(file):
            raise OSError(errno.ESTALE, f"{path} is not the file that was copied any more")
    except BaseException:
        os.close(parent)
        raise
    return parent


def own_like(path: str | Path, uid: int | None, gid: int | None, mode: int | None = None) -> None:
    """Give the entry at ``path`` this owner (``None``: unchanged) and mode, never through a link
    someone put there meanwhile: what is changed is the entry itself (a link keeps its target's
    owner and mode; a file another user put there instead gets the owner it would have had)."""
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if stat.S_ISLNK(os.fstat(fd).st_mode):
            if uid is not None or gid is not None:
                os.lchown(path, -1 if uid is None else uid, -1 if gid is None else gid)
            return
        this = f"/proc/self/fd/{fd}"  # the entry opened, whatever is at its name now
        if uid is not None or gid is not None:
            os.chown(this, -1 if uid is None else uid, -1 if gid is None else gid)
        if mode is not None:
            os.chmod(this, mode)
    finally:
        os.close(fd)


def _extends(fin: int, size: int, base: Path | None, base_size: int) -> bool:
    """The file ``fin`` (``size`` bytes) is ``base`` (``base_size`` bytes, unchanged) and more."""
    if base is None or size <= base_size:
        return False
    try:
        fbase = open_to_read(base)
    except OSError:
        return False
    try:
        return os.fstat(fbase).st_size == base_size and _same_bytes(fin, fbase, base_size)
    finally:
        os.close(fbase)


def _same_bytes(a: int, b: int, length: int) -> bool:
    """The first ``length`` bytes of the files ``a`` and ``b`` are the same."""
    offset = 0
    while offset < length:
        n = min(CHUNK, length - offset)
        if os.pread(a, n, offset) != os.pread(b, n, offset):
            return False
        offset += n
    return True


def link_beside(target: str | Path, dst: str | Path) -> Path:
    """Another name (a hard link) for the file ``target``, under a temporary name next to ``dst``:
    renamed over ``dst``, it keeps two names of one file one file, as a node made them."""
    tmp = Path(dst).parent / temporary_name(Path(dst).name, secrets.token_hex(4))
    os.link(target, tmp, follow_symlinks=False)  # a link put at ``target`` since is linked as a link, never its target
    if not stat.S_ISREG(os.lstat(tmp).st_mode):
        _unlink(tmp)
        raise OSError(errno.ESTALE, "it is not the file that was made there any more")
    return tmp


def _put_in_place(tmp: Path | None, dst: Path) -> None:
    """Rename a written temporary over its final name (``None``: made in place already)."""
    if tmp is not None:
        try:
            os.replace(tmp, dst)
        except BaseException:
            _unlink(tmp)
            raise


def walk_files(root: Path, empty_dirs: bool = False):
    """Every file and link under ``root``, not following links; ``empty_dirs``: and every empty
    directory below it (MultiProc's DataSink and Nipype's node directories keep them)."""
    stack = [root]
    while stack:
        current = stack.pop()
        try:
            entries = list(os.scandir(current))
        except (FileNotFoundError, NotADirectoryError):
            continue
        if empty_dirs and not entries and current != root:
            yield current
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))
            else:
                yield Path(entry.path)


def _failed(batch: FlushBatch, message: str, files: list[tuple[Path, Path]] = ()) -> None:
    """One of ``batch``'s copies failed for good. An optional copy's failure is no error of the run:
    the batch settles as abandoned, the failure kept in ``failed_optional`` (the caller drops the
    checkpoint and stops making more)."""
    with batch._lock:
        if batch._priority == CHECKPOINT:
            batch.failed_optional = batch.failed_optional or message
            batch.abandoned.extend(files)
        else:
            batch.errors.append(message)


def _destination_vanished(exc: OSError, src: Path) -> bool:
    """ENOENT with the source still there: someone removed the destination's directory (a user
    cleaning up, another node on the shared filesystem); the next attempt makes it again."""
    return exc.errno == errno.ENOENT and src.exists()


TAGS = r"(?:[0-9a-f]{8}|dir|old)"  # what temporary_name is given: a copy's random token, a directory's copy, its old one
TEMPORARY = re.compile(rf"\..+{re.escape(TMP_MARK)}{TAGS}|{re.escape(TMP_MARK)}{TAGS}-[0-9a-f]{{16}}", re.DOTALL)


def is_temporary(name: str) -> bool:
    """``name`` is one :func:`temporary_name` makes (a user's ``notes.sea-tmp-keep.txt`` is not)."""
    return TEMPORARY.fullmatch(name) is not None


def sweep_temporaries(root: Path) -> int:
    """Remove the temporary copies a killed run left under ``root`` (they never reached a final
    name): only what Sea names so and this user owns, and nothing that cannot be removed (another
    user's file in a shared destination) is an error. A temporary directory is one of Sea's copies
    of a node directory: removed whole."""
    removed = 0
    uid = os.getuid()
    for dirpath, dirs, files in os.walk(root):
        for name in [n for n in dirs if is_temporary(n)]:
            dirs.remove(name)
            path = os.path.join(dirpath, name)
            if _owned(path, uid):
                rmtree(path)
                removed += 1
        for name in files:
            path = os.path.join(dirpath, name)
            if is_temporary(name) and _owned(path, uid):
                try:
                    os.unlink(path)
                    removed += 1
                except OSError:
                    pass
    return removed


def _owned(path: str, uid: int) -> bool:
    try:
        return os.lstat(path).st_uid == uid
    except OSError:
        return False


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
    _left: int = 0  # files not written yet, then (see Stager) renames not done yet
    _staged: dict[Path, tuple] = field(default_factory=dict)  # dst -> (src, tmp, bytes, its lstat, seconds): written, sync deferred
    _sync: BatchSync | None = None
    _renaming: bool = False
    _bytes_left: int = 0  # of its files, not committed yet (the stager's backlog)
    _priority: int = DECLARED
    _sync_seconds: float = 0.0
    _writing: int = 0  # of its files, being written by a thread now
    cancelled: bool = False  # given up before any of it was written (Stager.cancel): settled then
    failed_optional: str = ""  # an optional copy that failed (out of space, over quota, I/O): why; it settles abandoned
    links: list[tuple[Path, Path]] = field(default_factory=list)  # (a copied file, another name of it) made by its on_done
    relinks: list[tuple[Path, str]] = field(default_factory=list)  # (a copied symbolic link, where it points in the home) made so by its on_done
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def bytes(self) -> int:
        return sum(size for size, _ in self.timings)


class _Slots:
    """``n`` files written at once, granted in the order asked: a thread that gives its slot back and
    asks again queues behind those already waiting (a semaphore lets it barge in, and a file taken
    from the queue earlier would wait behind files taken after it)."""

    def __init__(self, n: int):
        self._free = n
        self._waiting: collections.deque[threading.Event] = collections.deque()
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        with self._lock:
            if self._free and not self._waiting:
                self._free -= 1
                return
            granted = threading.Event()
            self._waiting.append(granted)
        granted.wait()

    def __exit__(self, *exc_info: object) -> None:
        with self._lock:
            if self._waiting:
                self._waiting.popleft().set()  # handed over: it is never free in between
            else:
                self._free += 1


WRITE, RENAME = 1, 0  # a queued file's step: renames (of a batch all written and synced) go before any write


class Stager:
    """Threads that commit :class:`FlushBatch` es, by priority then in order, and tell the engine
    when each is done."""

    def __init__(self, threads: int, retries: int = 3, backoff: float = 0.2, guard: Callable[[], None] | None = None):
        self._threads_wanted = threads  # files written at once: the streams the link carries
        # Twice as many threads: while ``threads`` of them write, the others make the written
        # batches durable, rename them in place and settle them (metadata only: on a busy shared
        # filesystem each operation waits on its server), so the link never idles for that work.
        self._slots = _Slots(threads)
        self._guard = guard  # called before a copy makes a missing directory: raises a SeaError to refuse
        self._threads: list[threading.Thread] = []  # started with the first copy
        self._queue: queue.PriorityQueue = queue.PriorityQueue()
        self._order = itertools.count()
        self._retries = retries
        self._backoff = backoff
        self._idle = threading.Condition()
        self._in_flight = 0
        self._pending: dict[int, int] = {}  # priority -> files of batches not settled yet
        self._backlog_bytes = 0  # bytes of files submitted and not committed (nor given up) yet
        self._optional_bytes = 0  # of those, the optional checkpoints' (they use only an idle link)
        self.committed_bytes = 0  # bytes copied home so far
        self._abandoning: set[int] = set()  # priorities whose copies stop now (see abandon)
        self._threads_writing = 0  # threads writing a file now

    @property
    def queue_length(self) -> int:
        return self._in_flight

    @property
    def backlog(self) -> tuple[int, int]:
        """(bytes, files) submitted and not settled yet: what waits to go home."""
        with self._idle:
            return max(self._backlog_bytes, 0), self._in_flight

    @property
    def needed_backlog(self) -> int:
        """Bytes the run needs home (declared outputs, directories that must go) not committed yet:
        the backlog without optional checkpoints, which give way to it."""
        with self._idle:
            return max(self._backlog_bytes - self._optional_bytes, 0)

    def submit(self, batch: FlushBatch, priority: int = DECLARED) -> None:
        if not batch.files:
            batch.on_done(batch)
            return
        batch._left = len(batch.files)
        batch._sync = BatchSync(len(batch.files))
        batch._bytes_left = sum(_size(src) for src, _ in batch.files)  # tier files: a cheap lstat each
        batch._priority = priority
        with self._idle:
            self._in_flight += len(batch.files)
            self._backlog_bytes += batch._bytes_left
            if priority == CHECKPOINT:
                self._optional_bytes += batch._bytes_left
            self._pending[priority] = self._pending.get(priority, 0) + len(batch.files)
            while len(self._threads) < 2 * self._threads_wanted:
                thread = threading.Thread(target=self._work, name=f"sea-stager_{len(self._threads)}", daemon=True)
                thread.start()
                self._threads.append(thread)
        for src, dst in batch.files:
            self._put(priority, WRITE, batch, src, dst)
        with self._idle:
            self._idle.notify_all()  # an optional copy waiting for an idle link looks again

    def _put(self, priority: float, step: int, batch: FlushBatch | None, src: Path | None, dst: Path | None) -> None:
        self._queue.put((step, priority, next(self._order), batch, src, dst))

    def _link_busy(self) -> bool:
        """A copy the run needs (a declared output, a directory that must go home) is queued or under way."""
        return self._pending.get(DECLARED, 0) + self._pending.get(KEPT, 0) > 0

    @property
    def optional_waits(self) -> bool:
        """An optional copy submitted now would not start at once: a copy the run needs is queued
        or under way, or every thread is writing."""
        with self._idle:
            return self._link_busy() or self._threads_writing >= self._threads_wanted

    def cancel(self, batch: FlushBatch) -> bool:
        """Give up an optional copy none of which was written yet: it settles now, as abandoned
        (its files stay where they are); ``False`` (nothing done) once a thread has started it. Its
        files still queued are passed over when taken."""
        with batch._lock:
            written = batch._writing or batch.committed or batch._staged or batch.abandoned or batch.errors
            if written or batch.cancelled or batch._priority != CHECKPOINT or batch._left <= 0:
                return False
            batch.cancelled = True
            batch.abandoned = list(batch.files)
            batch._left = 0
        self._settle(batch, CHECKPOINT)
        return True

    def _take(self, batch: FlushBatch) -> bool:
        """A thread is about to write one of ``batch``'s files: ``False`` if it was cancelled."""
        with batch._lock:
            if batch.cancelled:
                return False
            batch._writing += 1
            return True

    def _written(self, batch: FlushBatch, src: Path, dst: Path, priority: int) -> bool:
        """:meth:`_write` between :meth:`_take` and its end."""
        with self._idle:
            self._threads_writing += 1
        try:
            return self._write(batch, src, dst, priority)
        finally:
            with batch._lock:
                batch._writing -= 1
            with self._idle:
                self._threads_writing -= 1

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            step, priority, _, batch, src, dst = item
            if batch is None:
                return
            if step == WRITE and batch.cancelled:
                continue  # given up (cancel): it settled then
            if step == WRITE and batch.failed_optional:  # an optional copy failed: the rest of it is not written
                with batch._lock:
                    batch.abandoned.append((src, dst))
                self._step_done(batch, priority)
                continue
            try:
                if step == RENAME:
                    self._rename(batch, dst)
                elif priority == CHECKPOINT and self._link_busy() and priority not in self._abandoning:
                    # an optional copy takes the link only when it is idle: back in line until then
                    self._queue.put(item)
                    with self._idle:
                        self._idle.wait(0.2)  # woken when a copy settles or another is submitted
                    continue
                else:
                    with self._slots:  # one of the files written at once
                        if not self._take(batch):
                            continue  # cancelled since it was taken from the queue
                        if not self._written(batch, src, dst, priority):
                            self._queue.put(item)  # it gave way to a copy the run needs: again later, from the start
                            continue
            except Exception as exc:  # noqa: BLE001 - a thread that dies would leave its batch unsettled, drain() waiting
                if priority != CHECKPOINT:
                    logger.exception("[Sea] copying %s to %s failed", src, dst)
                _failed(batch, f"could not copy {src} to {dst}: {exc}", [(src, dst)])
            self._step_done(batch, priority)

    def abandon(self, priority: int) -> int:
        """Take the copies of ``priority`` out of the queue and stop those under way (the run is
        over and they are optional); their batches settle without them (``FlushBatch.abandoned``),
        and of such a batch, what waits for its end to be renamed is not (the engine drops what a
        directory's copy already holds). Returns how many files were dropped."""
        self._abandoning.add(priority)  # those being copied stop at their next chunk
        kept, dropped = [], []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item[3] is not None and item[3].cancelled:
                continue  # settled when it was cancelled
            (dropped if item[0] == WRITE and item[1] == priority and item[3] is not None else kept).append(item)
        for item in kept:
            self._queue.put(item)
        for _, _, _, batch, src, dst in dropped:
            with batch._lock:
                batch.abandoned.append((src, dst))
            self._step_done(batch, priority)
        return len(dropped)

    def _step_done(self, batch: FlushBatch, priority: int) -> None:
        """One file's step is over. After a batch's last write, the files whose sync was deferred
        are synced at once and their renames queued; after its last rename (or write), it settles."""
        with batch._lock:
            batch._left -= 1
            if batch._left:
                return
            rename = bool(batch._staged) and not batch._renaming and not batch.abandoned
        if rename:
            start = time.perf_counter()
            try:
                batch._sync.sync_data()
            except OSError as exc:  # nothing of it is known to be durable: none of it goes in place
                if batch._priority != CHECKPOINT:
                    logger.error("[Sea] could not make the copies of %s durable (%s); the sources are kept", batch.key, exc.strerror or exc)
                staged = [(src, dst) for dst, (src, *_) in batch._staged.items()]
                for src, dst in staged:
                    _failed(batch, f"could not copy {src} to {dst}: {exc.strerror or exc}", [(src, dst)])
                rename = False
            batch._sync_seconds += time.perf_counter() - start
        if rename:
            with batch._lock:
                batch._renaming, batch._left = True, len(batch._staged)
                staged = list(batch._staged.items())
            for dst, (src, *_rest) in staged:
                self._put(priority, RENAME, batch, src, dst)
            return
        for _src, tmp, *_ in batch._staged.values():  # the run ended first, or the sync failed
            _unlink(tmp)
        batch._staged.clear()
        self._settle(batch, priority)

    def _settle(self, batch: FlushBatch, priority: int) -> None:
        if not batch.abandoned:
            start = time.perf_counter()
            try:
                batch._sync.sync_dirs()
            except OSError as exc:
                message = f"could not make the copies of {batch.key} durable: {exc.strerror or exc}"
                if batch._priority != CHECKPOINT:
                    logger.error("[Sea] %s", message)
                _failed(batch, message)
            batch._sync_seconds += time.perf_counter() - start
        if batch.timings and batch._sync_seconds:  # each file's share of the batch's syncs (the copy cost model learns it)
            share = batch._sync_seconds / len(batch.timings)
            batch.timings = [(size, seconds + share) for size, seconds in batch.timings]
        try:
            batch.on_done(batch)
        except Exception:  # noqa: BLE001 - a callback bug must not hang drain()
            logger.exception("[Sea] error while settling the flush of %s", batch.key)
        with self._idle:
            self._in_flight -= len(batch.files)
            self._pending[priority] -= len(batch.files)
            self._backlog_bytes -= batch._bytes_left  # what was not copied (abandoned, failed)
            if priority == CHECKPOINT:
                self._optional_bytes -= batch._bytes_left
            batch._bytes_left = 0
            self._idle.notify_all()

    def _write(self, batch: FlushBatch, src: Path, dst: Path, priority: int = DECLARED) -> bool:
        """Write one file under its temporary name and, unless its sync is deferred to the end of
        the batch, sync and rename it; ``False`` if an optional copy gave way to one the run needs
        (it is then queued again)."""
        interrupt = None
        if priority == CHECKPOINT:

            def interrupt() -> bool:
                return priority in self._abandoning or self._link_busy()

        def write() -> None:
            start = time.perf_counter()
            deferred = batch._sync.defer(dst.parent)
            tmp, size, st = stage_copy(src, dst, interrupt, sync=not deferred, guard=self._guard)
            if tmp is not None and deferred:
                with batch._lock:
                    batch._staged[dst] = (src, tmp, size, st, time.perf_counter() - start)
                return
            _put_in_place(tmp, dst)
            self._committed(batch, dst, size, st, time.perf_counter() - start)

        return self._retrying(batch, src, dst, write)

    def _rename(self, batch: FlushBatch, dst: Path) -> None:
        """Put a written and synced file in place; if that fails (its directory was removed under
        it), copy it again on its own, as a single file is."""
        with batch._lock:
            src, tmp, size, st, seconds = batch._staged.pop(dst)
        start = time.perf_counter()
        try:
            os.replace(tmp, dst)
        except OSError:
            _unlink(tmp)

            def copy() -> None:
                size = atomic_copy(src, dst, guard=self._guard)
                self._committed(batch, dst, size, dst.lstat(), seconds + time.perf_counter() - start)

            self._retrying(batch, src, dst, copy)
            return
        self._committed(batch, dst, size, st, seconds + time.perf_counter() - start)

    def _committed(self, batch: FlushBatch, dst: Path, size: int, st: os.stat_result, seconds: float) -> None:
        with batch._lock:  # as a rerun will find it (a link's size is its target's length)
            batch.committed.append((dst, st.st_size, st.st_mtime_ns))
            batch.timings.append((size, seconds))
        with self._idle:
            self.committed_bytes += size
            self._backlog_bytes -= size
            if batch._priority == CHECKPOINT:
                self._optional_bytes -= size
            batch._bytes_left -= size

    def _retrying(self, batch: FlushBatch, src: Path, dst: Path, attempt: Callable[[], None]) -> bool:
        """Run ``attempt`` (one file's copy), again after a transient error; a persistent one is
        recorded in the batch. ``False`` if the copy gave way (:class:`Yielded`) and must be queued again."""
        for tries in range(self._retries + 1):
            try:
                attempt()
                return True
            except Yielded:
                if CHECKPOINT not in self._abandoning:
                    return False
                with batch._lock:
                    batch.abandoned.append((src, dst))
                return True
            except SeaError as exc:  # the guard refused to make a directory: the home moved away
                _failed(batch, f"could not copy {src} to {dst}: {exc}", [(src, dst)])
                return True
            except OSError as exc:
                if batch._priority == CHECKPOINT:  # optional: never tried again, never an error of the run
                    _failed(batch, f"could not copy {src} to {dst}: {exc.strerror or exc}", [(src, dst)])
                    return True
                if tries < self._retries and (exc.errno in TRANSIENT or _destination_vanished(exc, src)):
                    logger.warning("[Sea] copying %s to %s failed (%s); trying again", src, dst, exc.strerror or exc)
                    with batch._lock:
                        batch.retries += 1
                    time.sleep(self._backoff * 4**tries)
                    continue
                message = f"could not copy {src} to {dst}: {exc.strerror or exc}"
                logger.error("[Sea] %s; the source is kept at %s", message, src)
                with batch._lock:
                    batch.errors.append(message)
                return True
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
            self._put(float("inf"), WRITE, None, None, None)
        for thread in self._threads:
            thread.join()
        self._threads.clear()
