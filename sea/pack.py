"""Packed node directories: a directory (with its separate parts) as one uncompressed tar file.

A checkpoint goes home as one file (:mod:`sea.checkpoint`), not as the dozens a node directory
holds: on a shared filesystem every file is a metadata operation others wait behind, and a quota
counts files as well as bytes. Under Dask, a directory a consumer needs from another machine
travels the same way (:mod:`sea.dask.node_storage`).

A pack is a POSIX (pax) tar. Each member carries its exact modification time in nanoseconds
(``SEA.mtime_ns``: tar's own field rounds it, and Nipype's timestamp hashing compares
``str(st_mtime)``), and the pack's global header says where the directory was made
(``SEA.made_under``: the tier directories its result files name), so the engine can rewrite
those paths for where it is unpacked. It is written as a stream (its data with ``sendfile``),
interruptible between chunks like any optional copy (:func:`sea.stager.stage_copy`).

    >>> import os, pathlib, tempfile
    >>> src = pathlib.Path(tempfile.mkdtemp()); _ = (src / "a.txt").write_text("hello")
    >>> (src / "sub").mkdir(); os.symlink("/elsewhere/x", src / "sub" / "link"); (src / "empty").mkdir()
    >>> os.utime(src / "a.txt", ns=(1, 1_700_000_000_123_456_789))
    >>> source = PackSource([(p, str(p.relative_to(src))) for p in sorted(src.rglob("*"))], made_under=["/old/tier"])
    >>> pack = src.parent / (src.name + ".tar")
    >>> with open(pack, "wb") as fh:
    ...     size = source.write(fh.fileno())
    >>> out = pathlib.Path(tempfile.mkdtemp())
    >>> unpack(pack, out)
    ['/old/tier']
    >>> (out / "a.txt").read_text(), os.stat(out / "a.txt").st_mtime_ns, os.readlink(out / "sub" / "link"), (out / "empty").is_dir()
    ('hello', 1700000000123456789, '/elsewhere/x', True)
    >>> size == pack.stat().st_size
    True
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tarfile
from collections.abc import Callable, Iterable
from pathlib import Path

PACKS = Path(".sea") / "checkpoints"  # in the home: auto's checkpoints, one pack each
MTIME_NS = "SEA.mtime_ns"
MADE_UNDER = "SEA.made_under"
BLOCK = tarfile.BLOCKSIZE
SUFFIX = ".tar"


class PackSource:
    """What one pack holds: ``members``, (file on a tier, its path in the pack) pairs, in order;
    ``made_under``: the directories the files were made under (for :func:`unpack`'s caller)."""

    def __init__(self, members: Iterable[tuple[Path, str]], made_under: Iterable[str] = ()):
        self.members = [(Path(src), str(name)) for src, name in members]
        self.made_under = [str(p) for p in made_under]

    def exists(self) -> bool:
        """The files are still there (a copy that failed may be tried again)."""
        return not self.members or os.path.lexists(self.members[0][0])

    def __str__(self) -> str:
        return f"the pack of {self.members[0][0].parent if self.members else 'nothing'}"

    @property
    def nbytes(self) -> int:
        """The bytes of its members' data (a pack adds a header or two per member)."""
        total = 0
        for src, _ in self.members:
            try:
                st = os.lstat(src)
            except OSError:
                continue
            total += st.st_size if stat.S_ISREG(st.st_mode) else 0
        return total

    def write(self, fd: int, interrupt: Callable[[], bool] | None = None, copy: Callable | None = None) -> int:
        """Write the pack to ``fd`` (at its start); returns its size. ``copy(fin, fout, interrupt)``
        copies one member's data (the stager's, which yields between chunks); ``interrupt`` is also
        asked between members."""
        copy = copy or _copy_all
        written = _write_all(fd, _global_header(self.made_under))
        first: dict[tuple[int, int], str] = {}  # a file's (device, inode) -> its first name: the others are hard links to it
        for src, name in self.members:
            if interrupt is not None and interrupt():
                from .stager import Yielded

                raise Yielded("a copy the run needs came first")
            st = os.lstat(src)
            info = tarfile.TarInfo(name)
            info.mode, info.uid, info.gid = stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid
            info.mtime = st.st_mtime_ns // 10**9
            info.pax_headers = {MTIME_NS: str(st.st_mtime_ns)}
            if stat.S_ISDIR(st.st_mode):
                info.type = tarfile.DIRTYPE
                written += _write_all(fd, info.tobuf(tarfile.PAX_FORMAT))
            elif stat.S_ISLNK(st.st_mode):
                info.type, info.linkname = tarfile.SYMTYPE, os.readlink(src)
                written += _write_all(fd, info.tobuf(tarfile.PAX_FORMAT))
            elif stat.S_ISREG(st.st_mode) and st.st_nlink > 1 and (st.st_dev, st.st_ino) in first:
                info.type, info.linkname = tarfile.LNKTYPE, first[(st.st_dev, st.st_ino)]
                written += _write_all(fd, info.tobuf(tarfile.PAX_FORMAT))
            elif stat.S_ISREG(st.st_mode):
                from .stager import open_to_read

                first.setdefault((st.st_dev, st.st_ino), name)

                fin = open_to_read(src)
                try:
                    info.size = os.fstat(fin).st_size
                    written += _write_all(fd, info.tobuf(tarfile.PAX_FORMAT))
                    size = copy(fin, fd, interrupt)
                finally:
                    os.close(fin)
                if size != info.size:  # it changed while packed: a pack is never partial
                    raise OSError(f"{src} changed size while it was packed ({info.size} -> {size} bytes)")
                written += size + _write_all(fd, b"\0" * (-size % BLOCK))
            # anything else (a socket, a fifo a tool left) is no file a rerun reads: left out
        end = b"\0" * (2 * BLOCK)
        written += _write_all(fd, end + b"\0" * (-(written + len(end)) % tarfile.RECORDSIZE))
        return written


def pack_path(home: Path, key: str) -> Path:
    """Where node ``key``'s pack is in ``home``: one directory of Sea's, a name per node."""
    return Path(home) / PACKS / (hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:32] + SUFFIX)


def unpack(pack: Path | bytes, target: Path) -> list[str]:
    """Unpack ``pack`` (a file, or a pack in memory) into the directory ``target`` (made if
    missing), with each file's exact times; returns the directories its files were made under
    (``SEA.made_under``). Members that would land outside ``target`` are refused
    (:func:`tarfile.tar_filter`); their permissions are those they were packed with (:func:`_kept_modes`)."""
    import io

    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(pack), mode="r:") if isinstance(pack, bytes) else tarfile.open(pack, "r:") as tar:
        tar.copybufsize = 4 * 2**20
        members = tar.getmembers()
        tar.extractall(target, members=members, filter=_kept_modes)
        made_under = json.loads(tar.pax_headers.get(MADE_UNDER, "[]"))
    for member in sorted(members, key=lambda m: m.isdir()):  # directories last: writing into one changes its time
        ns = member.pax_headers.get(MTIME_NS)
        if ns is not None:
            os.utime(target / member.name, ns=(int(ns), int(ns)), follow_symlinks=False)
    return [str(p) for p in made_under]


def _kept_modes(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    """:func:`tarfile.tar_filter` (nothing lands outside ``dest``), but the permissions the file had,
    group and other write and the sticky bit included, as the engine's own plugin leaves them (the
    filter clears those); setuid and setgid are still dropped."""
    checked = tarfile.tar_filter(member, dest)
    if member.mode is None or checked.mode is None:
        return checked
    return checked.replace(mode=member.mode & 0o1777, deep=False)


def pack_bytes(members: Iterable[tuple[Path, str]], made_under: Iterable[str] = ()) -> bytes:
    """A pack in memory (a directory sent to another machine)."""
    import tempfile

    with tempfile.TemporaryFile() as fh:
        PackSource(members, made_under).write(fh.fileno())
        fh.seek(0)
        return fh.read()


def directory_members(directory: Path) -> list[tuple[Path, str]]:
    """Every file, link and empty directory under ``directory``, named relative to it."""
    from .stager import walk_files

    return [(p, str(p.relative_to(directory))) for p in walk_files(Path(directory), empty_dirs=True)]


def _global_header(made_under: list[str]) -> bytes:
    info = tarfile.TarInfo("pax_global_header")
    return info._create_pax_generic_header({MADE_UNDER: json.dumps(made_under)}, tarfile.XGLTYPE, "utf-8")


def _write_all(fd: int, data: bytes) -> int:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    return len(data)


def _copy_all(fin: int, fout: int, interrupt: Callable[[], bool] | None) -> int:
    from .stager import _copy_data

    return _copy_data(fin, fout, interrupt)
