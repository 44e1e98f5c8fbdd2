"""Measure a directory's read and write bandwidth, once per host, for the performance model.

A few seconds: write a file with fsync (what a node's output costs), ask the kernel to drop its
pages, read it back. Results are cached per host (:func:`cache_file`); a busy shared
filesystem changes by the minute, so ``sea plan`` also takes its bandwidth from the command line.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
import time
from pathlib import Path

from .model import Bandwidth

CHUNK = 2**20


def cache_file() -> Path:
    """Where measured figures are kept: ``bandwidth.json`` in ``$SEA_CACHE``, else in
    ``$XDG_CACHE_HOME/sea`` (``~/.cache/sea`` by default)."""
    directory = os.environ.get("SEA_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sea"
    return Path(directory) / "bandwidth.json"


def probe(directory: Path, nbytes: int = 64 * 2**20) -> Bandwidth:
    block = os.urandom(CHUNK)
    fd, name = tempfile.mkstemp(prefix=".sea-probe-", dir=directory)
    try:
        start = time.perf_counter()
        for _ in range(max(1, nbytes // CHUNK)):
            os.write(fd, block)
        os.fsync(fd)
        write = time.perf_counter() - start
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.lseek(fd, 0, os.SEEK_SET)
        start = time.perf_counter()
        while os.read(fd, 8 * CHUNK):
            pass
        read = time.perf_counter() - start
    finally:
        os.close(fd)
        os.unlink(name)
    size = max(1, nbytes // CHUNK) * CHUNK
    return Bandwidth(read=size / max(read, 1e-9), write=size / max(write, 1e-9))


def remembered(directory: Path) -> Bandwidth | None:
    """What ``sea probe`` measured of ``directory`` on this host, if it did; measures nothing."""
    entry = _read_cache().get(socket.gethostname(), {}).get(str(Path(directory).resolve()))
    try:
        return Bandwidth(read=float(entry["read"]), write=float(entry["write"]))
    except (TypeError, KeyError, ValueError, AttributeError):
        return None


def _read_cache() -> dict:
    try:
        cache = json.loads(cache_file().read_text())
    except (OSError, ValueError):
        return {}
    return cache if isinstance(cache, dict) else {}


def cached_probe(directory: Path, fresh: bool = False, nbytes: int = 64 * 2**20) -> Bandwidth:
    """:func:`probe`, remembered per host and directory."""
    return probe_or_recall(directory, fresh, nbytes)[0]


def probe_or_recall(directory: Path, fresh: bool = False, nbytes: int = 64 * 2**20) -> tuple[Bandwidth, bool]:
    """:func:`cached_probe`, and whether the figures are remembered ones (not measured now)."""
    host, key = socket.gethostname(), str(Path(directory).resolve())
    known = None if fresh else remembered(directory)
    if known is not None:
        return known, True
    cache = _read_cache()
    measured = probe(Path(directory), nbytes)
    cache.setdefault(host, {})[key] = {"read": measured.read, "write": measured.write, "at": time.time()}
    path = cache_file()
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(cache, indent=1))
        os.replace(tmp, path)
    except OSError:  # a home one may not write (a container's): measured again next time
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
    return measured, False
