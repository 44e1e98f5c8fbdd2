"""The record of what nodes put back beside their directories, shared by the user's runs on a node.

A node that appends a line to ``../notes.txt`` (or to a prefetched input) writes to its own copy
(:mod:`sea.view`); as it returns, its copy is put in the real file, and if another node changed that
file meanwhile, only what this node appended is added (:func:`sea.view._appended`). Both need one
process at a time per file, and the sizes the file had after each put (a copy taken after another
put began as that size). Those nodes may be of different runs: two runs, each with its own work
directory and tier, reading one data directory. So the lock and the sizes are not the run's: they
are in a directory of the user's own on the node, one per file put (named by the device and inode
of its directory and its name), which every run of the user on the node uses.

That directory is in ``/dev/shm`` (else the temporary directory), which other users can write: it
is made mode 0700, and used only if it is a directory of the user's own no one else may write,
opened without following a link (one another user made first is refused, and the run's own
directory is used instead: the runs then do not see each other's puts, as before). Each run holds
a shared lock on its ``active`` file while it runs; the last run to end removes the directory.

>>> import tempfile, pathlib
>>> where = pathlib.Path(tempfile.mkdtemp()) / "puts"
>>> data = tempfile.mkdtemp()
>>> run = PutRecords.shared(where)
>>> with run.record(data, "notes.txt") as noted:
...     _ = noted.write("7 9\\n")
>>> with run.record(data, "notes.txt") as noted:
...     noted.read()
'7 9\\n'
>>> run.close(); where.exists()
False
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import logging
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

logger = logging.getLogger("sea")
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
ACTIVE = "active"


def default_place() -> Path:
    """Where the user's runs on this node share their records: ``/dev/shm/sea-<uid>-puts`` (else
    in the temporary directory)."""
    parent = Path("/dev/shm") if os.path.isdir("/dev/shm") else Path(tempfile.gettempdir())
    return parent / f"sea-{os.geteuid()}-puts"


def _open_own(where: Path) -> int:
    """A descriptor of ``where``, made if need be: ``OSError`` unless it is a directory of the
    user's own that no one else may write (not a link: never followed)."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(where, 0o700)
    fd = os.open(where, _OPEN_DIR)
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        os.close(fd)
        raise OSError(f"it is not a directory of yours that only you may write (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o})")
    return fd


class PutRecords:
    """The records a run's processes use (see the module). Picklable: a worker process opens
    the directory again, and checks it again, for each record."""

    def __init__(self, where: Path):
        self.where = where
        self._active: int | None = None  # the run's shared lock on ``active`` (held by its main process)

    @classmethod
    def shared(cls, where: Path | None = None, fallback: Path | None = None) -> PutRecords | None:
        """The records shared by the user's runs (``where``, :func:`default_place` if ``None``),
        this run counted in them as it runs; the run's own (``fallback``) if that place is
        refused, or none at all (``None``) if both are."""
        for place in (where or default_place(), fallback):
            if place is None:
                continue
            for _attempt in range(10):  # the last run out removes the directory: then made again
                try:
                    fd = _open_own(place)
                except OSError as e:
                    if place != fallback:
                        logger.warning(
                            "[Sea] %s: %s; this run keeps its own record of the files its nodes put back beside their directories, "
                            "not shared with your other runs on this node (remove it if you did not make it)",
                            place, e.strerror or e,
                        )  # fmt: skip
                    break
                records = cls(place)
                try:
                    records._active = os.open(ACTIVE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=fd)
                except OSError:
                    continue
                finally:
                    os.close(fd)
                fcntl.flock(records._active, fcntl.LOCK_SH)
                if os.fstat(records._active).st_nlink > 0:
                    return records
                os.close(records._active)  # removed by the last run out as this one came
        return cls(fallback) if fallback is not None else None

    def __getstate__(self) -> dict:
        return {"where": self.where, "_active": None}

    @contextlib.contextmanager
    def record(self, directory: str, name: str) -> Iterator[io.TextIOBase]:
        """The record of the file ``name`` in ``directory``, locked for this process: one process
        at a time, of any of the user's runs, puts that file back while it is held."""
        st = os.stat(directory)
        key = hashlib.sha256(b"%d:%d/" % (st.st_dev, st.st_ino) + os.fsencode(name)).hexdigest()[:32]
        fd = _open_own(self.where)
        try:
            record = os.open(key, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=fd)
        finally:
            os.close(fd)
        if not stat.S_ISREG(os.fstat(record).st_mode):
            os.close(record)
            raise OSError(f"the record of {name} is not a file")
        with open(record, "a+", encoding="ascii") as noted:
            fcntl.flock(noted.fileno(), fcntl.LOCK_EX)
            noted.seek(0)
            yield noted

    def close(self) -> None:
        """The run ended: if no other run of the user's is under way, the records go, and their
        directory (the lock on ``active`` taken at once or not at all: never waited for)."""
        if self._active is None:
            return
        try:
            fcntl.flock(self._active, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            pass  # another run still puts files: its records stay
        else:
            with contextlib.suppress(OSError):
                fd = _open_own(self.where)
                try:
                    for name in [*(n for n in os.listdir(fd) if n != ACTIVE), ACTIVE]:
                        with contextlib.suppress(OSError):
                            os.unlink(name, dir_fd=fd)
                finally:
                    os.close(fd)
                os.rmdir(self.where)
        finally:
            os.close(self._active)
            self._active = None
