"""slowfs, the throttled FUSE stand-in for a busy shared filesystem: it throttles, it passes
everything else through unchanged, it injects errors, and it never leaves a mount behind.

Only lower bounds on time are asserted: a throttle that does not slow things down is broken, but
how fast things go is the benchmarks' business, never a unit test's.
"""

from __future__ import annotations

import errno
import mmap
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from benchmarks.slowfs import MB, mounts

from slowfs_fixtures import *  # noqa: F403 - the fixtures, which pytest finds by name
from slowfs_fixtures import slowfs_scratch

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
T1, T2 = 1_600_000_000_111_222_333, 1_600_000_000_444_555_666  # nanosecond times no clock rounds to


def write(path: Path, nbytes: int, chunk: int = MB) -> None:
    with open(path, "wb", buffering=0) as fh:
        for start in range(0, nbytes, chunk):
            fh.write(b"\0" * min(chunk, nbytes - start))
        os.fsync(fh.fileno())


def timed(action: Callable[[], object]) -> float:
    start = time.monotonic()
    action()
    return time.monotonic() - start


def _gone(pid: int) -> bool:
    """The process ended: no longer there, or a zombie its new parent (PID 1 here) has not reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.02)
    return predicate()


# --- throttling -----------------------------------------------------------------------------


def test_the_write_throttle_holds(slowfs_factory):
    fs = slowfs_factory(write_mbps=30)
    assert timed(lambda: write(fs.path / "a.bin", 30 * MB)) >= 0.9, "30 MB at 30 MB/s take a second"
    assert (fs.backing / "a.bin").stat().st_size == 30 * MB


def test_the_read_throttle_holds(slowfs_factory):
    fs = slowfs_factory(read_mbps=40)
    (fs.backing / "a.bin").write_bytes(os.urandom(20 * MB))
    data: list[bytes] = []
    assert timed(lambda: data.append((fs.path / "a.bin").read_bytes())) >= 0.45, "20 MB at 40 MB/s take half a second"
    assert data[0] == (fs.backing / "a.bin").read_bytes()


def test_busy_writers_take_their_share(slowfs_factory):
    fs = slowfs_factory(write_mbps=40, busy_share=0.5)
    assert timed(lambda: write(fs.path / "a.bin", 10 * MB)) >= 0.45, "half of 40 MB/s left: 10 MB take half a second"


WRITER = """
import sys, time
start = time.monotonic()
with open(sys.argv[1], "wb", buffering=0) as fh:
    for _ in range(20):
        fh.write(b"\\0" * 1_000_000)
print(start, time.monotonic())
"""


def test_the_bandwidth_is_shared_by_processes(slowfs_factory):
    """Alone, 20 MB at 40 MB/s take 0.5 s; two writers at once share the link and take 1 s together."""
    fs = slowfs_factory(write_mbps=40)
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(fs.path / f"{i}.bin")], stdout=subprocess.PIPE, text=True) for i in range(2)
    ]
    spans = [tuple(map(float, w.communicate()[0].split())) for w in writers]
    assert all(w.returncode == 0 for w in writers)
    starts, ends = zip(*spans, strict=True)
    assert max(starts) < min(ends), "the writers ran at the same time"
    assert max(ends) - min(starts) >= 0.9, "40 MB through one 40 MB/s bucket take a second, however many writers"


def test_the_page_cache_mode_memory_maps_files_and_still_throttles_writes(slowfs_factory):
    """MRtrix3 memory-maps its images: in the page cache mode a map can be read and written through
    the mount, its bytes reach the backing directory, and writes, by write() or through a map, still
    pass the write bucket; a new open reads anew (no stale page)."""
    fs = slowfs_factory(write_mbps=30, page_cache=True)
    data = os.urandom(15 * MB)

    def store_through_a_map() -> None:
        with open(fs.path / "mapped.bin", "w+b") as fh:
            fh.truncate(len(data))
            with mmap.mmap(fh.fileno(), len(data)) as mapped:  # MAP_SHARED, read and write
                mapped[:] = data
                mapped.flush()  # msync: the dirty pages go to the server, through the write bucket

    assert timed(store_through_a_map) >= 0.45, "15 MB at 30 MB/s take half a second, through a map too"
    assert (fs.backing / "mapped.bin").read_bytes() == data
    assert timed(lambda: write(fs.path / "written.bin", 15 * MB)) >= 0.45, "write() is write-through: 15 MB take half a second"
    assert (fs.backing / "written.bin").stat().st_size == 15 * MB

    with open(fs.path / "mapped.bin", "rb") as fh, mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ) as mapped:
        assert mapped[:] == data
    changed = os.urandom(len(data))  # another client's write, of the same size (a new size alone drops the pages)
    (fs.backing / "mapped.bin").write_bytes(changed)
    with open(fs.path / "mapped.bin", "rb") as fh, mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ) as mapped:
        assert mapped[:] == changed, "an open was served stale pages from the page cache"
    assert (fs.path / "mapped.bin").read_bytes() == changed


def test_the_direct_io_default_refuses_shared_memory_maps(slowfs_factory):
    fs = slowfs_factory()
    (fs.path / "a.bin").write_bytes(b"x" * 4096)
    with open(fs.path / "a.bin", "r+b") as fh, pytest.raises(OSError) as info:
        mmap.mmap(fh.fileno(), 0)
    assert info.value.errno == errno.ENODEV


def test_metadata_operations_pay_the_latency(slowfs_factory):
    fs = slowfs_factory(meta_latency_ms=5)
    (fs.path / "f").write_text("x")
    assert timed(lambda: [os.stat(fs.path / "f") for _ in range(50)]) >= 50 * 0.005 * 0.8


# --- pass-through ---------------------------------------------------------------------------


def test_times_pass_through_to_the_nanosecond(slowfs_factory):
    fs = slowfs_factory(meta_latency_ms=1)
    mounted, backing = fs.path / "x.nii", fs.backing / "x.nii"
    mounted.write_bytes(b"data")
    assert os.stat(mounted).st_mtime_ns == os.stat(backing).st_mtime_ns
    os.utime(mounted, ns=(T1, T2))
    assert (os.stat(mounted).st_atime_ns, os.stat(mounted).st_mtime_ns) == (T1, T2)
    assert (os.stat(backing).st_atime_ns, os.stat(backing).st_mtime_ns) == (T1, T2)
    shutil.copy2(mounted, fs.path / "copy.nii")  # copyfile, then copystat: mode, times, xattrs (none here)
    assert os.stat(fs.path / "copy.nii").st_mtime_ns == os.stat(fs.backing / "copy.nii").st_mtime_ns == T2
    assert (fs.path / "copy.nii").read_bytes() == b"data"
    atime = os.stat(backing).st_atime_ns  # the copy read the file
    subprocess.run(["touch", "-m", "-d", "@1500000000.5", str(mounted)], check=True)  # atime left alone (UTIME_OMIT)
    assert (os.stat(backing).st_atime_ns, os.stat(backing).st_mtime_ns) == (atime, 1_500_000_000_500_000_000)
    before = time.time_ns()
    os.utime(mounted)  # "now" (UTIME_NOW)
    assert abs(os.stat(backing).st_mtime_ns - before) < 10**9
    assert os.stat(mounted).st_mtime_ns == os.stat(backing).st_mtime_ns


def test_links_renames_and_attributes_pass_through(slowfs_factory):
    fs = slowfs_factory(meta_latency_ms=1)
    mnt, backing = fs.path, fs.backing
    (mnt / "x.nii").write_bytes(b"data")
    os.symlink("x.nii", mnt / "link")
    assert os.readlink(mnt / "link") == os.readlink(backing / "link") == "x.nii"
    assert (mnt / "link").read_bytes() == b"data"
    os.link(mnt / "x.nii", mnt / "hard")
    assert os.stat(mnt / "x.nii").st_nlink == 2 and os.path.samefile(mnt / "x.nii", mnt / "hard")
    os.chmod(mnt / "x.nii", 0o640)
    assert stat.S_IMODE(os.stat(backing / "x.nii").st_mode) == stat.S_IMODE(os.stat(mnt / "x.nii").st_mode) == 0o640
    os.truncate(mnt / "x.nii", 3)
    with open(mnt / "x.nii", "r+b") as fh:
        fh.truncate(2)
        fh.flush()
        os.fsync(fh.fileno())
        os.fdatasync(fh.fileno())
    assert (backing / "x.nii").read_bytes() == b"da"
    assert os.statvfs(mnt).f_blocks == os.statvfs(backing).f_blocks
    (mnt / "new").write_bytes(b"new")
    os.replace(mnt / "new", mnt / "hard")  # onto an existing file
    assert (backing / "hard").read_bytes() == b"new" and os.stat(mnt / "x.nii").st_nlink == 1
    with pytest.raises(FileExistsError):
        open(mnt / "hard", "xb")
    (mnt / "d").mkdir()
    os.rename(mnt / "x.nii", mnt / "d" / "y.nii")
    assert (backing / "d" / "y.nii").read_bytes() == b"da"
    os.unlink(mnt / "d" / "y.nii")
    os.rmdir(mnt / "d")
    os.unlink(mnt / "link")
    assert sorted(os.listdir(mnt)) == sorted(os.listdir(backing)) == ["hard"]


# --- error injection ------------------------------------------------------------------------


def test_writes_fail_with_enospc_after_n_bytes(slowfs_factory):
    fs = slowfs_factory(fail_after_bytes=1_000_000, fail_errno="ENOSPC")
    write(fs.path / "small", 600_000)
    with pytest.raises(OSError) as info:
        write(fs.path / "big", 600_000)
    assert info.value.errno == errno.ENOSPC


def test_writes_and_creates_matching_a_pattern_fail_with_eio(slowfs_factory):
    fs = slowfs_factory(fail_pattern="out/*.nii", fail_errno="EIO")
    (fs.path / "out").mkdir()
    (fs.path / "out" / "fine.txt").write_text("ok")
    with pytest.raises(OSError) as info:
        open(fs.path / "out" / "x.nii", "wb")
    assert info.value.errno == errno.EIO
    (fs.backing / "out" / "old.nii").write_bytes(b"")
    with open(fs.path / "out" / "old.nii", "r+b", buffering=0) as fh, pytest.raises(OSError) as info:
        fh.write(b"x")
    assert info.value.errno == errno.EIO


def test_a_counted_fault_fails_n_times_then_passes_and_covers_renames(slowfs_factory):
    fs = slowfs_factory(fail_pattern="*.nii", fail_errno="EIO", fail_count=2)
    (fs.path / "tmp").write_bytes(b"x")
    with pytest.raises(OSError) as info:
        os.rename(fs.path / "tmp", fs.path / "a.nii")  # a rename onto a matching name fails too
    assert info.value.errno == errno.EIO and (fs.path / "tmp").exists()
    with pytest.raises(OSError):
        (fs.path / "b.nii").write_bytes(b"x")
    (fs.path / "b.nii").write_bytes(b"x")  # the third operation passes: the fault was transient
    os.rename(fs.path / "tmp", fs.path / "a.nii")


def test_renames_pay_their_latency(slowfs_factory):
    fs = slowfs_factory(rename_latency_ms=300)
    (fs.path / "a").write_bytes(b"x")
    start = time.monotonic()
    os.rename(fs.path / "a", fs.path / "b")
    assert time.monotonic() - start >= 0.3
    start = time.monotonic()
    (fs.path / "c").write_bytes(b"x")  # other operations do not
    assert time.monotonic() - start < 0.3


def test_faults_change_at_run_time(slowfs_factory):
    fs = slowfs_factory()
    fs.set_faults(fail_pattern="*.nii", fail_errno="ENOSPC")
    with pytest.raises(OSError) as info:
        (fs.path / "a.nii").write_bytes(b"x")
    assert info.value.errno == errno.ENOSPC
    (fs.path / "a.txt").write_bytes(b"x")
    fs.set_faults(fail_after_bytes=10)  # EIO by default; counting restarts at each change
    write(fs.path / "b.txt", 10)
    with pytest.raises(OSError) as info:
        write(fs.path / "c.txt", 1)
    assert info.value.errno == errno.EIO
    fs.clear_faults()
    (fs.path / "a.nii").write_bytes(b"x")


# --- a real workflow ------------------------------------------------------------------------


def add_one(in_file):
    import os

    with open(in_file) as fh:
        value = int(fh.read())
    out_file = os.path.abspath(os.path.basename(in_file) + ".plus1")
    with open(out_file, "w") as fh:
        fh.write(str(value + 1))
    return out_file


def test_a_nipype_workflow_runs_on_it(busy_shared_fs, tmp_path):
    from nipype import Node, Workflow
    from nipype.interfaces.io import DataSink
    from nipype.interfaces.utility import Function

    root = busy_shared_fs.path
    (root / "data").mkdir()
    inputs = []
    for i in (1, 41):
        (root / "data" / f"in{i}.txt").write_text(str(i))
        inputs.append(str(root / "data" / f"in{i}.txt"))
    node = Node(Function(input_names=["in_file"], output_names=["out_file"], function=add_one), name="add_one")
    node.iterables = ("in_file", inputs)
    sink = Node(DataSink(base_directory=str(root / "out")), name="sink")
    wf = Workflow(name="wf", base_dir=str(root / "work"))
    wf.connect(node, "out_file", sink, "results")
    wf.config["execution"]["poll_sleep_duration"] = 0.05
    wf.config["execution"]["crashdump_dir"] = str(tmp_path)

    wf.run(plugin="MultiProc", plugin_args={"n_procs": 2})
    results = {p.name: p.read_text() for p in (root / "out" / "results").rglob("*.plus1")}
    assert results == {"in1.txt.plus1": "2", "in41.txt.plus1": "42"}
    computed = {p: p.stat().st_mtime_ns for p in (root / "work").rglob("*.plus1")}
    assert len(computed) == 2

    wf.run(plugin="MultiProc", plugin_args={"n_procs": 2})  # mtimes pass through: Nipype's hashes hold, nothing reruns
    assert {p: p.stat().st_mtime_ns for p in (root / "work").rglob("*.plus1")} == computed


# --- no stale mounts ------------------------------------------------------------------------


def test_no_stale_mount_when_the_body_raises():
    with pytest.raises(RuntimeError, match="boom"):
        with slowfs_scratch(write_mbps=10) as fs:
            assert str(fs.path) in mounts()
            server = fs.pid
            raise RuntimeError("boom")
    assert str(fs.path) not in mounts() and not fs.path.exists()
    assert not Path(f"/proc/{server}").exists()


def test_the_fixture_unmounts_when_its_test_fails(tmp_path):
    record = tmp_path / "mountpoint"
    (tmp_path / "test_inner.py").write_text(
        textwrap.dedent(f"""
            from pathlib import Path
            from slowfs_fixtures import busy_shared_fs, slowfs_factory  # noqa: F401

            def test_fails(busy_shared_fs):
                Path({str(record)!r}).write_text(str(busy_shared_fs.path))
                raise RuntimeError("boom")
            """)
    )
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_inner.py")]
    result = subprocess.run(command, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "boom" in result.stdout, result.stdout + result.stderr
    mountpoint = record.read_text()
    assert mountpoint not in mounts() and not Path(mountpoint).exists()


def test_a_killed_server_leaves_no_dead_mount(slowfs_factory):
    fs = slowfs_factory()
    os.kill(fs.pid, signal.SIGKILL)
    assert wait_for(lambda: not os.path.ismount(fs.path)) and str(fs.path) in mounts(), "a dead FUSE mount"
    fs.close()
    assert str(fs.path) not in mounts()


OWNER = """
import sys, time
from benchmarks.slowfs import SlowFS
fs = SlowFS(sys.argv[1], sys.argv[2]).__enter__()
print(fs.pid, flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_the_mount_dies_with_its_owner(tmp_path, sig):
    """The owner never leaves a ``with`` block. Ctrl-C: atexit unmounts; SIGTERM: the signal handler
    unmounts; kill -9: the server sees it is orphaned and unmounts itself."""
    mountpoint = Path("/var/tmp") / f"sea-test-slowfs-owner-{os.getpid()}"
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(tmp_path / "b"), str(mountpoint)], stdout=subprocess.PIPE, text=True, env=ENV
    )
    try:
        server = int(owner.stdout.readline())
        assert str(mountpoint) in mounts()
        owner.send_signal(sig)
        assert owner.wait(10) == -sig
        assert wait_for(lambda: str(mountpoint) not in mounts())
        assert wait_for(lambda: _gone(server), timeout=15)
    finally:
        owner.kill()
        owner.wait()
        if str(mountpoint) in mounts():
            subprocess.run(["umount", "-l", str(mountpoint)])
        mountpoint.rmdir()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_the_command_line_unmounts_on_ctrl_c_and_sigterm(tmp_path, sig):
    mountpoint = tmp_path / "mnt"
    flags = "--write-mbps 50 --read-mbps 200 --meta-latency-ms 5".split()
    command = [sys.executable, "-m", "benchmarks.slowfs", str(tmp_path / "b"), str(mountpoint), *flags]
    (tmp_path / "b").mkdir()
    server = subprocess.Popen(command, env=ENV, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: os.path.ismount(mountpoint)), "the command line did not mount"
        (mountpoint / "f").write_text("through")
        server.send_signal(sig)
        assert server.wait(10) == 0
        assert str(mountpoint) not in mounts() and (tmp_path / "b" / "f").read_text() == "through"
    finally:
        server.kill()
        server.wait()
        if str(mountpoint) in mounts():
            subprocess.run(["umount", "-l", str(mountpoint)])
