"""Result records: what the engine records of each node (Nipype's ``result_<name>.pklz``, Pydra's
``_result.pklz``), kept in one file in the home once the node's directory left its tier.

Under the engine's own plugin every node directory stays in the work directory, and so does its
record: ``node.result`` on the graph ``Workflow.run`` returns reads it. Sea evicts directories, and
the shared filesystem is not the place for a file per node. So as a directory goes, its record is
appended to ``.sea/results.tar`` (written under a temporary name as the run goes, put in place at
its end with the records of earlier runs that this one did not replace); :func:`load` finds a
record there by the path it had (its node's path in the home). A record names the paths where its
node ran (a tier's, gone since); each member carries the directories it was made under
(``SEA.made_under``), so the adapter can rewrite them for the home, as for a checkpoint.

    >>> import pathlib, tempfile
    >>> home = pathlib.Path(tempfile.mkdtemp()); node = home / "wf" / "a"; node.mkdir(parents=True)
    >>> _ = (node / "result_a.pklz").write_bytes(b"pickled")
    >>> records = Records(home, lambda d: [d / "result_a.pklz"])
    >>> records.keep("wf/a", node, made_under=["/tier/sea-x"])
    >>> records.close(keys={"wf/a"})
    >>> load(home / "wf" / "a" / "result_a.pklz") == (home, b"pickled", ["/tier/sea-x"])
    True
    >>> load(home / "wf" / "b" / "result_b.pklz") is None
    True
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import queue
import secrets
import tarfile
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from .pack import MADE_UNDER, MTIME_NS
from .stager import temporary_name

RESULTS = Path(".sea") / "results.tar"
KEY = "SEA.key"
logger = logging.getLogger("sea")


class Records:
    """One run's records. ``files(directory)``: the record files of a node directory (the adapter's)."""

    def __init__(self, home: Path, files: Callable[[Path], Iterable[Path]]):
        self.home = Path(home)
        self.path = self.home / RESULTS
        self._files = files
        self._tmp = self.path.with_name(temporary_name(self.path.name, secrets.token_hex(4)))
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self._out = None
        self._kept: set[str] = set()  # keys recorded in this run
        self.failed = ""  # why the records could not be written, if they could not: optional, the run goes on
        try:  # what the records will take in the home: the earlier runs' (kept, unless replaced) and this one's
            self.bytes = os.stat(self.path).st_size
        except OSError:
            self.bytes = 0

    def keep(self, key: str, directory: Path, made_under: Iterable[str] = ()) -> None:
        """``key``'s directory is about to go: read its records now (small files), write them later."""
        if self.failed:
            return
        entries = []
        for path in self._files(Path(directory)):
            try:
                st = os.lstat(path)
                data = Path(path).read_bytes()
            except OSError:
                continue
            entries.append((f"{key}/{Path(path).relative_to(directory)}", data, st.st_mode, st.st_mtime_ns))
        if not entries:
            return
        self._kept.add(key)
        self.bytes += sum(len(data) + 3 * tarfile.BLOCKSIZE for _, data, _, _ in entries)  # a pax header and a header per member
        if self._writer is None:
            self._writer = threading.Thread(target=self._write, name="sea-records", daemon=True)
            self._writer.start()
        self._queue.put((key, entries, list(map(str, made_under))))

    def _write(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if self.failed:
                continue
            key, entries, made_under = item
            try:
                if self._out is None:
                    self.path.parent.mkdir(exist_ok=True)  # never the home itself: moved away, it stays so
                    self._out = tarfile.open(self._tmp, "w", format=tarfile.PAX_FORMAT)
                for name, data, mode, mtime_ns in entries:
                    _add(self._out, name, data, mode, mtime_ns, key, made_under)
            except OSError as exc:
                self.failed = f"{self._tmp}: {exc.strerror or exc}"

    def close(self, keys: set[str]) -> None:
        """Put the records in place, with those of earlier runs for ``keys`` (the graph's nodes)
        that this run did not record again."""
        if self._writer is None:
            return
        self._queue.put(None)
        self._writer.join()
        try:
            if self.failed or self._out is None:
                raise OSError(self.failed or "no record written")
            for member, data in _members(self.path):
                key = member.pax_headers.get(KEY, "")
                if key in keys and key not in self._kept:
                    self._out.addfile(member, data)
            self._out.close()
            with open(self._tmp, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(self._tmp, self.path)
        except (OSError, tarfile.TarError) as exc:
            logger.warning("[Sea] the nodes' result records could not be kept in %s (%s); node.result reads only directories in the home", self.path, exc)
            if self._out is not None:
                with contextlib.suppress(OSError, tarfile.TarError):  # the home refusing writes refuses this one too
                    self._out.close()
            with contextlib.suppress(OSError):
                Path(self._tmp).unlink(missing_ok=True)


def _add(out: tarfile.TarFile, name: str, data: bytes, mode: int, mtime_ns: int, key: str, made_under: list[str]) -> None:
    import io

    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode & 0o7777, mtime_ns // 10**9
    info.pax_headers = {MTIME_NS: str(mtime_ns), KEY: key, MADE_UNDER: json.dumps(made_under)}
    out.addfile(info, io.BytesIO(data))


def _members(path: Path):
    """(member, its data as a file object) of an earlier run's records, if readable."""
    try:
        tar = tarfile.open(path, "r:")
    except (OSError, tarfile.TarError):
        return
    with tar:
        for member in tar:
            if member.isfile():
                yield member, tar.extractfile(member)


def load(path: Path) -> tuple[Path, bytes, list[str]] | None:
    """(the home, the record that was at ``path`` there, the directories its node was made under),
    for ``path`` a file in a node's directory; ``None`` if no records file above it holds it."""
    path = Path(path).absolute()
    for home in path.parents:
        archive = home / RESULTS
        try:
            st = os.stat(archive)
        except OSError:
            continue
        if not _ours(archive):  # a pickle is code: never one another user could have put there
            return None
        index = _index(str(archive), st.st_mtime_ns, st.st_size)
        member = str(path.relative_to(home))
        if member not in index:
            return None
        with tarfile.open(archive, "r:") as tar:
            info = tar.getmember(member)
            return home, tar.extractfile(info).read(), json.loads(info.pax_headers.get(MADE_UNDER, "[]"))
    return None


def _ours(archive: Path) -> bool:
    """The records file and its directory are this user's, and no one else can write to them."""
    for path in (archive.parent, archive):
        st = os.lstat(path)
        if st.st_uid != os.getuid() or st.st_mode & 0o022:
            return False
    return True


@functools.lru_cache(maxsize=4)
def _index(archive: str, mtime_ns: int, size: int) -> frozenset[str]:
    """The members' names of a records file (cached while it is unchanged)."""
    try:
        with tarfile.open(archive, "r:") as tar:
            return frozenset(tar.getnames())
    except (OSError, tarfile.TarError):
        return frozenset()
