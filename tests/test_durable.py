"""Batched durability (sea.durable) and the stager's two steps: a batch of many files on a filesystem
that honours syncfs is written whole, synced once, then renamed; elsewhere each file is synced
before its rename. Either way nothing reaches its final name before its data is durable, a copy
keeps its source's mode, times and extended attributes, and a batch cut short leaves nothing."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from sea.durable import SYNCFS_MIN_FILES, BatchSync
from sea.stager import CHECKPOINT, DECLARED, TMP_MARK, FlushBatch, Stager

from slowfs_fixtures import *  # noqa: F403 - the fixtures, which pytest finds by name

pytestmark = pytest.mark.timeout(120)


def temporaries(root: Path) -> list[str]:
    return [name for _, _, files in os.walk(root) for name in files if TMP_MARK in name]


def slow_batch(source, dst_root: Path, n: int) -> list[tuple[Path, Path]]:
    """``n`` small files, then one of 4 MiB on ``source`` (a slowfs mount reading at 2 MB/s): its
    copy, last, holds the batch open for about two seconds, its temporary there."""
    files = []
    for i in range(n):
        src = source.path / f"f{i:03d}.txt"
        src.write_text(f"{i}\n" * 50)
        files.append((src, dst_root / "out" / src.name))
    big = source.path / "zz-big.bin"
    big.write_bytes(os.urandom(4 * 2**20))
    files.append((big, dst_root / "out" / big.name))
    return files


def wait_for(condition, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_batch_of_many_files_on_a_local_disk_is_synced_once_and_renamed_only_then(disk_dir, slowfs_factory):
    files = slow_batch(slowfs_factory(read_mbps=2, write_mbps=1000), disk_dir, SYNCFS_MIN_FILES + 4)
    done: list[FlushBatch] = []
    stager = Stager(threads=1)  # in order: the big file, last, holds the batch open
    stager.submit(FlushBatch("many", files, done.append), DECLARED)
    out = disk_dir / "out"
    wait_for(lambda: len(temporaries(out)) == len(files))
    # every file is written or being written, none is at its final name: they wait for the batch's sync
    assert sorted(p.name for p in out.iterdir() if TMP_MARK not in p.name) == [] and not done
    stager.drain()
    stager.close()
    assert not done[0].errors and len(done[0].committed) == len(files)
    assert temporaries(out) == []
    for src, dst in files:
        assert dst.read_bytes() == src.read_bytes() and dst.stat().st_mtime_ns == src.stat().st_mtime_ns
    recorded = {dst: (size, mtime) for dst, size, mtime in done[0].committed}
    for dst, (size, mtime) in recorded.items():  # what a rerun will compare with
        assert (dst.lstat().st_size, dst.lstat().st_mtime_ns) == (size, mtime)


def test_a_few_files_or_a_fuse_filesystem_are_synced_file_by_file(disk_dir, slowfs_factory):
    fs = slowfs_factory()
    assert BatchSync(files=SYNCFS_MIN_FILES).defer(disk_dir), "ext4 or XFS: one syncfs per batch"
    assert not BatchSync(files=SYNCFS_MIN_FILES - 1).defer(disk_dir), "a few files: fsync each"
    assert not BatchSync(files=10_000).defer(fs.path), "FUSE: syncfs does not reach the daemon"
    assert not BatchSync(files=10_000).defer(fs.path / "not" / "made" / "yet")


def test_an_optional_batch_cut_short_leaves_nothing_written_in_place(disk_dir, slowfs_factory):
    files = slow_batch(slowfs_factory(read_mbps=2, write_mbps=1000), disk_dir, SYNCFS_MIN_FILES + 4)
    done: list[FlushBatch] = []
    stager = Stager(threads=1)
    stager.submit(FlushBatch("checkpoint", files, done.append), CHECKPOINT)
    out = disk_dir / "out"
    wait_for(lambda: len(temporaries(out)) == len(files))  # the big file's copy under way
    stager.abandon(CHECKPOINT)  # the run ends: it stops at its next chunk
    stager.drain()
    stager.close()
    assert done[0].abandoned and not done[0].committed and not done[0].errors
    assert temporaries(out) == [] and [p.name for p in out.iterdir()] == []


@pytest.mark.parametrize("many", [False, True], ids=["file by file", "batched"])
def test_a_copy_keeps_its_sources_mode_under_any_umask_and_its_extended_attributes(shm_dir, disk_dir, many):
    n = SYNCFS_MIN_FILES if many else 2
    files = []
    for i in range(n):
        src = shm_dir / f"tool-{i}.sh"
        src.write_text("#!/bin/sh\necho hi\n")
        src.chmod(0o750 if i % 2 else 0o644)
        files.append((src, disk_dir / "out" / src.name))
    try:
        os.setxattr(files[0][0], "user.sea-test", b"kept")
        xattrs = True
    except OSError:  # a tmpfs without user xattrs (kernels before 6.6)
        xattrs = False
    done: list[FlushBatch] = []
    old = os.umask(0o077)  # would take the group's and others' bits off at creation
    try:
        stager = Stager(threads=2)
        stager.submit(FlushBatch("modes", files, done.append))
        stager.close()
    finally:
        os.umask(old)
    assert not done[0].errors
    for src, dst in files:
        assert stat.S_IMODE(dst.stat().st_mode) == stat.S_IMODE(src.stat().st_mode), dst
    if xattrs:
        assert os.getxattr(files[0][1], "user.sea-test") == b"kept"


def test_a_filesystem_is_synced_through_any_of_its_directories_that_still_exists(disk_dir, monkeypatch):
    """The batch's last directory was never made (its copy failed first) or was removed: the files
    written in its other directories on that filesystem are still synced before their renames."""
    import sea.durable

    synced: list[Path] = []
    real = sea.durable.syncfs
    monkeypatch.setattr(sea.durable, "syncfs", lambda path: (real(path), synced.append(path)))
    sync = BatchSync(files=100)
    made, gone = disk_dir / "made", disk_dir / "never-made"
    made.mkdir()
    assert sync.defer(made) and sync.defer(gone)  # the order the stager's threads saw them in
    sync.sync_data()
    sync.sync_dirs()
    assert synced == [made, made], synced
