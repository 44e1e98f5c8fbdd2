"""slowfs, the throttled FUSE stand-in for a busy shared filesystem: it throttles, it passes
everything else through unchanged, it injects errors, and it never leaves a mount behind.

Only lower bounds on time are asserted (a throttle that does not slow things is broken); speed
goals live in the benchmark."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.slowfs import SlowFS, Throttle

MB = 10**6


def write(path: Path, nbytes: int) -> None:
    with open(path, "wb") as fh:
        fh.write(b"\0" * nbytes)
        fh.flush()
        os.fsync(fh.fileno())


def test_write_throttle_holds(slowfs_factory):
    fs = slowfs_factory(write_mbps=20)
    start = time.monotonic()
    write(fs.path / "a.bin", 20 * MB)
    assert time.monotonic() - start >= 0.9


def test_bandwidth_is_shared_by_processes(slowfs_factory):
    fs = slowfs_factory(write_mbps=40)
    code = "import sys; open(sys.argv[1], 'wb').write(b'\\0' * 20_000_000)"
    start = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-c", code, str(fs.path / f"{i}.bin")]) for i in range(2)]
    assert all(p.wait() == 0 for p in procs)
    assert time.monotonic() - start >= 0.9, "two writers of 20 MB at 40 MB/s in total need ~1 s"


def test_metadata_latency(slowfs_factory):
    fs = slowfs_factory(meta_latency_ms=5)
    (fs.path / "f").write_text("x")
    start = time.monotonic()
    for _ in range(40):
        os.stat(fs.path / "f")
    assert time.monotonic() - start >= 40 * 0.005 * 0.8


def test_passthrough_keeps_times_links_and_renames(slowfs_factory):
    fs = slowfs_factory(write_mbps=100)
    target = fs.path / "x.nii"
    target.write_bytes(b"data")
    os.utime(target, ns=(1_600_000_000_111_222_333, 1_600_000_000_444_555_666))
    assert os.stat(target).st_mtime_ns == os.stat(fs.backing / "x.nii").st_mtime_ns == 1_600_000_000_444_555_666
    os.symlink("x.nii", fs.path / "link")
    os.link(target, fs.path / "hard")
    assert os.readlink(fs.path / "link") == "x.nii" and os.stat(target).st_nlink == 2
    (fs.path / "new").write_bytes(b"new")
    os.replace(fs.path / "new", target)
    assert target.read_bytes() == b"new"
    (fs.path / "d").mkdir()
    os.rename(target, fs.path / "d" / "y")
    assert sorted(os.listdir(fs.path)) == ["d", "hard", "link"]


def test_injected_errors(slowfs_factory):
    fs = slowfs_factory(fail_after_bytes=1_000_000, fail_errno="ENOSPC")
    with pytest.raises(OSError) as info:
        write(fs.path / "big", 2_000_000)
    assert info.value.errno == errno.ENOSPC
    fs = slowfs_factory(fail_pattern="out/*.nii", fail_errno="EIO")
    (fs.path / "out").mkdir()
    (fs.path / "out" / "fine.txt").write_text("ok")
    with pytest.raises(OSError) as info:
        write(fs.path / "out" / "x.nii", 10)
    assert info.value.errno == errno.EIO


def test_a_nipype_workflow_runs_on_it(busy_shared_fs):
    from example_workflows.incrementation import build_workflow, make_chunks

    root = busy_shared_fs.path
    make_chunks(root / "data", 2, 0.5)
    wf = build_workflow(root / "data", 2, 2, root / "work", root / "out")
    wf.config["execution"]["poll_sleep_duration"] = 0.05
    wf.run(plugin="MultiProc", plugin_args={"n_procs": 2})
    assert len(list((root / "out" / "incremented").glob("*.nii"))) == 2


def mounts() -> str:
    return Path("/proc/mounts").read_text()


def test_no_stale_mount_even_when_the_body_raises(tmp_path):
    mountpoint = Path("/var/tmp") / f"sea-test-slowfs-raise-{os.getpid()}"
    with pytest.raises(RuntimeError, match="boom"):
        with SlowFS(tmp_path / "backing", mountpoint, Throttle(write_mbps=10)):
            assert str(mountpoint) in mounts()
            raise RuntimeError("boom")
    assert str(mountpoint) not in mounts()
    mountpoint.rmdir()
