"""Sea's private directory on a tier, held by file descriptor.

On a shared node a tier's parent directory (``/dev/shm``, ``/tmp``) is writable by every user. Sea
works in a directory of its own there, made by :func:`tempfile.mkdtemp` (mode 0700, an unpredictable
name), and holds it open from the moment it exists. Every removal goes through that descriptor and
never follows a link (``openat`` with ``O_NOFOLLOW`` component by component), so nothing Sea deletes
can be outside the directory it created, whatever was planted or renamed meanwhile; and the path is
checked against the descriptor (``st_dev``/``st_ino``) before nodes are sent into it, so a directory
swapped under it is refused, never followed.

The descriptor also holds an exclusive ``flock`` on the directory for as long as the run lives (the
kernel lets it go when the last process holding it ends, however it ends): another run sweeping
what killed runs left (:func:`in_use`) tells a live directory from a dead one by it, whatever PID
namespace each runs in (two containers binding the host's ``/dev/shm`` see none of each other's
PIDs, and share the host's name).

Several threads use it at once (a Dask worker's event loop ends the run while a task's thread
removes what its node wrote): every use of the descriptor holds the directory's lock, so that none
goes through a descriptor another thread closed, whose number may already be another file's.

>>> import tempfile, pathlib
>>> root = pathlib.Path(tempfile.mkdtemp())
>>> private = PrivateDir.create(root, owner="1 host /home")
>>> (private.path / "wf" / "node").mkdir(parents=True)
>>> private.remove(private.path / "wf")
>>> private.check(); sorted(p.name for p in private.path.iterdir())
['.sea-owner']
>>> private.remove_all(); root.rmdir()
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import stat
import tempfile
import threading
from pathlib import Path

from .console import SeaError

OWNER_FILE = ".sea-owner"
KEPT_FILE = ".sea-kept"  # what a run kept here on purpose, and where it belongs: see mark_kept
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class SeaTierSwapped(SeaError, RuntimeError):
    """Sea's private directory on a tier is no longer the one it created."""


class PrivateDir:
    """A directory Sea created and holds open; see the module's docstring."""

    def __init__(self, path: Path, fd: int):
        self.path = path
        self.fd = fd
        st = os.fstat(fd)
        self.identity = (st.st_dev, st.st_ino)
        self.removed = False
        self.lock = threading.RLock()  # held by every use of fd (see the module)

    def reopen(self) -> bool:
        """Hold the directory again after :meth:`close` (something kept there may still be removed
        later): ``False`` if it is gone or removed, :class:`SeaTierSwapped` if it is another one."""
        with self.lock:
            if not self.closed:
                return True
            if self.removed:
                return False
            try:
                fd = os.open(self.path, _OPEN_DIR)
            except OSError:
                return False
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != self.identity:
                os.close(fd)
                raise SeaTierSwapped(f"Sea's directory {str(self.path)!r} was replaced by another; Sea stops rather than follow it")
            self.fd = fd
            return True

    @classmethod
    def create(cls, root: Path, owner: str) -> PrivateDir:
        path = Path(tempfile.mkdtemp(prefix="sea-", dir=root))  # 0700, unpredictable
        try:
            fd = os.open(path, _OPEN_DIR)
        except OSError:
            os.rmdir(path)
            raise
        private = cls(path, fd)
        try:
            private.check()  # swapped between mkdtemp and open
            fcntl.flock(fd, fcntl.LOCK_EX)  # before the owner file: a sweep (in_use) judges only a directory that has one
            made = os.open(OWNER_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=fd)
            with os.fdopen(made, "w", encoding="utf-8", errors="surrogateescape") as f:  # a home named in other bytes
                f.write(owner + "\n")
        except BaseException:
            private.remove_all()
            raise
        return private

    def check(self) -> None:
        """Raise :class:`SeaTierSwapped` unless ``path`` is still the directory held open."""
        try:
            st = os.lstat(self.path)
        except OSError as exc:
            raise SeaTierSwapped(
                f"Sea's directory {str(self.path)!r} is gone ({exc.strerror}): the tier was emptied or unmounted under the run; "
                "what was committed home stays, and the same command resumes the run"
            ) from None
        if not stat.S_ISLNK(st.st_mode) and st.st_dev != self.identity[0]:
            raise SeaTierSwapped(
                f"Sea's directory {str(self.path)!r} is no longer on the filesystem it was made on: the tier was unmounted under "
                "the run; what was committed home stays, and the same command resumes the run"
            )
        if stat.S_ISDIR(st.st_mode) and st.st_ino != self.identity[1] and st.st_uid == os.geteuid():
            # made again by this user, after it was removed: a node still running writes its
            # directory (os.makedirs) into the emptied tier; nobody else can make a directory ours
            raise SeaTierSwapped(
                f"Sea's directory {str(self.path)!r} was removed under the run (what is there now was made again since): the tier "
                "was emptied or unmounted under the run; what was committed home stays, and the same command resumes the run"
            )
        if stat.S_ISLNK(st.st_mode) or (st.st_dev, st.st_ino) != self.identity:
            raise SeaTierSwapped(
                f"Sea's directory {str(self.path)!r} was replaced by another "
                f"({'a symbolic link' if stat.S_ISLNK(st.st_mode) else 'a different directory'}): someone who can write "
                f"{str(self.path.parent)!r} swapped it; Sea stops rather than follow it"
            )

    def contains(self, path: Path) -> bool:
        return path == self.path or self.path in Path(path).parents

    def remove(self, path: Path) -> None:
        """Delete ``path`` (a file, link or tree) inside this directory, through the descriptor:
        never a link followed, never anything outside. A path already gone is no error."""
        parts = Path(path).relative_to(self.path).parts
        if not parts:
            raise ValueError("remove_all() removes the directory itself")
        with self.lock:
            if not self.reopen():
                return  # removed whole already, or gone
            fd = os.dup(self.fd)  # this walk's own: the directory may be closed meanwhile
        try:
            for part in parts[:-1]:
                inner = os.open(part, _OPEN_DIR, dir_fd=fd)
                os.close(fd)
                fd = inner
            _remove_at(fd, parts[-1])
        except OSError:
            pass  # gone, not a directory, not ours to remove: left, as rmtree(ignore_errors=True) leaves it
        finally:
            os.close(fd)

    def remove_all(self) -> None:
        """Remove everything inside, then the directory itself (if it is still ours), and let go of it."""
        with self.lock:
            if not self.reopen():
                return
            for name in os.listdir(self.fd):
                try:
                    _remove_at(self.fd, name)
                except OSError:
                    pass  # written to meanwhile (a node still running): left, as remove() leaves it
            try:
                self.check()
                os.rmdir(self.path)
                self.removed = True
            except FileNotFoundError:
                self.removed = True
            except (SeaTierSwapped, OSError):
                pass  # swapped, or written to meanwhile: reopened if removed again later
            self.close()

    def mark_kept(self, record: dict) -> None:
        """Say, in the directory itself, that what is left in it is kept on purpose (a flush that
        failed, a ``keep`` rule): no later run removes it, ``sea recover`` brings it home."""
        with self.lock:
            made = os.open(KEPT_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=self.fd)
        with os.fdopen(made, "w") as f:
            json.dump(record, f, indent=1)
            f.flush()
            os.fsync(f.fileno())

    def files(self, empty_dirs: bool = False) -> list[str]:
        """Every file left inside (relative paths), the owner file aside, read through the
        descriptor; ``empty_dirs``: and every empty directory."""
        found: list[str] = []
        with self.lock:
            _walk_at(self.fd, "", found, empty_dirs)
        return [f for f in found if f not in (OWNER_FILE, KEPT_FILE)]

    @property
    def closed(self) -> bool:
        return self.fd < 0

    def close(self) -> None:
        with self.lock:
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1


LOCAL_FILESYSTEMS = frozenset({"tmpfs", "ramfs", "ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs"})


def pid_namespace() -> str | None:
    """This process's PID namespace (``pid:[4026531836]``): a PID names the same process only in
    the namespace it was read in. ``None`` where it cannot be read."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def seen_by_lock(path: Path, host: str, namespace: str | None) -> bool:
    """Whether :func:`in_use` tells a live holder of ``path`` (a run recorded as on ``host``, in PID
    ``namespace``) from a dead one where its PID cannot: it ran in another PID namespace (a
    container), on this machine. On this host name; or under a host name of its own (a container's
    default: Docker's and Podman's without ``--network=host``) where ``path`` is on a filesystem
    only this machine serves (a tmpfs, a local disk), whose locks every process that can reach it
    shares (another machine's lock on a network filesystem, or this one's exported, may not show).
    A namespace recorded as this one's under another host name is a killed container's whose
    namespace number a later container got (Podman's reuse them: the sixteenth adversarial pass):
    its PID says nothing here either."""
    here = socket.gethostname()
    if namespace is None or (namespace == pid_namespace() and host == here):
        return False  # its PID says it (here), or another machine's run: neither the lock alone
    if host == here:
        return True
    from .durable import filesystem_types

    try:
        return filesystem_types().get(os.stat(path, follow_symlinks=False).st_dev) in LOCAL_FILESYSTEMS
    except OSError:
        return False


def in_use(path: Path) -> bool | None:
    """Whether a live process holds ``path``'s ``flock``: a private directory's (see the module),
    or a run lock's (:mod:`sea.lock`); ``None`` where its filesystem has no ``flock``, or it
    cannot be opened. Never follows a link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # shared: two sweeps may look at once
    except BlockingIOError:
        return True
    except OSError:
        return None
    else:
        return False
    finally:
        os.close(fd)  # (and with it the shared lock)


def _remove_at(dir_fd: int, name: str) -> None:
    try:
        st = os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        _ignore_missing(os.unlink, name, dir_fd)
        return
    if st.st_uid == os.geteuid() and st.st_mode & 0o700 != 0o700:
        # a tree a node made read-only (a dataset's copy): its owner may empty it all the same;
        # inside Sea's own directory, nobody else can have swapped it since the look
        os.chmod(name, stat.S_IMODE(st.st_mode) | 0o700, dir_fd=dir_fd)
    try:
        fd = os.open(name, _OPEN_DIR, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    try:
        if (os.fstat(fd).st_dev, os.fstat(fd).st_ino) != (st.st_dev, st.st_ino):
            return  # changed between the look and the open: leave it
        for entry in os.listdir(fd):
            _remove_at(fd, entry)
    finally:
        os.close(fd)
    _ignore_missing(os.rmdir, name, dir_fd)


def _walk_at(dir_fd: int, prefix: str, found: list[str], empty_dirs: bool = False) -> None:
    names = os.listdir(dir_fd)
    if empty_dirs and not names and prefix:
        found.append(prefix.rstrip("/"))
    for name in names:
        st = os.lstat(name, dir_fd=dir_fd)
        if stat.S_ISDIR(st.st_mode):
            fd = os.open(name, _OPEN_DIR, dir_fd=dir_fd)
            try:
                _walk_at(fd, f"{prefix}{name}/", found, empty_dirs)
            finally:
                os.close(fd)
        else:
            found.append(prefix + name)


def _ignore_missing(op, name: str, dir_fd: int) -> None:
    try:
        op(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


def rmtree(path: Path) -> None:
    """``shutil.rmtree(path, ignore_errors=True)``, through the directories of it its owner made
    read-only too (a dataset's copy a node made): the owner may remove what they made."""
    def writable(function, failed, _exc):
        unlisted = function in (os.open, os.scandir, os.listdir)  # a directory it could not read
        target = failed if unlisted else os.path.dirname(failed)
        try:
            st = os.lstat(target)
            if st.st_uid != os.geteuid() or not stat.S_ISDIR(st.st_mode) or st.st_mode & 0o700 == 0o700:
                return
            os.chmod(target, stat.S_IMODE(st.st_mode) | 0o700)
            rmtree(failed) if unlisted else function(failed)
        except OSError:
            pass

    shutil.rmtree(path, onerror=writable)
