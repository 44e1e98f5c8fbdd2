"""Fixtures that mount benchmarks.slowfs, the throttled FUSE stand-in for a busy shared filesystem.

Register with ``pytest_plugins = ["slowfs_fixtures"]`` in the root conftest, or import the fixtures
into a test module. Mount points and backing directories live under /var/tmp (a real disk, unlike
/tmp, which may be a tmpfs); both are unmounted and removed when the test ends, pass or fail.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.slowfs import SlowFS

__all__ = ["busy_shared_fs", "slowfs_factory", "slowfs_scratch"]

SCRATCH_PARENT = "/var/tmp"
BUSY_SHARED = {"write_mbps": 30, "read_mbps": 200, "meta_latency_ms": 5}  # the benchmark's busy shared filesystem


@contextlib.contextmanager
def slowfs_scratch(**settings: Any) -> Iterator[SlowFS]:
    """A SlowFS over a fresh backing dir, at a fresh mount point, both removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="sea-test-slowfs-", dir=SCRATCH_PARENT))
    try:
        with SlowFS(root / "backing", root / "mnt", **settings) as fs:
            yield fs
    finally:
        shutil.rmtree(root, ignore_errors=True)  # after the unmount: only the backing files go


@pytest.fixture
def slowfs_factory() -> Iterator[Callable[..., SlowFS]]:
    """``slowfs_factory(write_mbps=..., read_mbps=..., meta_latency_ms=..., busy_share=..., fail_...=...)``."""
    with contextlib.ExitStack() as stack:
        yield lambda **settings: stack.enter_context(slowfs_scratch(**settings))


@pytest.fixture
def busy_shared_fs(slowfs_factory: Callable[..., SlowFS]) -> SlowFS:
    """A busy shared filesystem: 30 MB/s write, 200 MB/s read, 5 ms per metadata operation."""
    return slowfs_factory(**BUSY_SHARED)
