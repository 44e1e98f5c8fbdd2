"""Two runs on one work directory (a job resubmitted while the first still runs, two array tasks
given the same ``-w``): the second is refused in one line naming the first, before it touches
anything; the first completes as if alone. A lock its holder left behind (killed, or on a host
gone silent) is taken over."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from sea.lock import LOCK, STALE_AFTER, SeaRunLocked

from conftest import refused_while_running, sea_private_dirs, tree_files
from nipype_workflows import build_full, fn, make_subjects, run

FIRST = """
import sys, time
sys.path.insert(0, {tests!r})
from pathlib import Path
from nipype_workflows import build_full, fn, run
from test_concurrent_runs import nap
wf = build_full(Path({data!r}), {subjects!r}, Path({work!r}), Path({out!r}))
slow = fn("nap", nap, ["x"], ["out"])
wf.connect(wf.get_node("group_mean"), "out_file", slow, "x")
run(wf, "SeaMultiProc", {{"tiers": [{{"path": {tier!r}}}]}})
"""


def nap(x):
    """The first run's last node: it is still running when the second run starts."""
    import time

    time.sleep(4)
    return x


def test_a_second_run_on_the_same_work_directory_is_refused_and_the_first_is_untouched(disk_dir, shm_dir):
    data = disk_dir / "data"
    subjects = make_subjects(data, n_subjects=2, mib=1)
    run(build_full(data, subjects, disk_dir / "mp-work", disk_dir / "mp-out"), "MultiProc")
    expected = tree_files(disk_dir / "mp-out")
    work, out = disk_dir / "work", disk_dir / "out"
    script = FIRST.format(tests=str(Path(__file__).parent), data=str(data), subjects=subjects, work=str(work), out=str(out), tier=str(shm_dir))
    # as a resubmitted job would, twice
    second = lambda: run(build_full(data, subjects, work, out), "SeaMultiProc", {"tiers": [{"path": str(shm_dir)}]})  # noqa: E731
    refused_while_running(script, work, second, times=2, cwd=disk_dir, timeout=120)
    assert tree_files(out) == expected, "the first run's outputs differ from a run alone"
    assert not (work / LOCK).exists() and sea_private_dirs(shm_dir) == []
    # once it ended, the same command runs (and finds everything done)
    run(build_full(data, subjects, work, out), "SeaMultiProc", {"tiers": [{"path": str(shm_dir)}]})
    assert tree_files(out) == expected


def ident(x):
    return x


def tiny(work: Path):
    from nipype import Workflow

    wf = Workflow(name="tiny", base_dir=str(work))
    node = fn("ident", ident, ["x"], ["out"])
    node.inputs.x = 1
    wf.add_nodes([node])
    return wf


def test_a_lock_whose_holder_was_killed_and_not_yet_reaped_is_taken_over(disk_dir, shm_dir, caplog):
    """A run killed by SIGKILL is a zombie until its parent reaps it (``timeout -s KILL`` leaves one
    for a second or two): the rerun right after it resumes, as MultiProc's does, not refused as if
    the killed run were still going."""
    work = disk_dir / "work"
    (work / LOCK).parent.mkdir(parents=True)
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        created = psutil.Process(killed.pid).create_time()
        (work / LOCK).write_text(json.dumps({"host": socket.gethostname(), "pid": killed.pid, "started": created, "created": created}))
        killed.kill()
        deadline = time.monotonic() + 10
        while psutil.Process(killed.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.01)
        assert psutil.Process(killed.pid).status() == psutil.STATUS_ZOMBIE  # not reaped: no wait() yet
        run(tiny(work), "SeaMultiProc", {"tiers": [{"path": str(shm_dir)}]})
        assert "left by a run that is gone" in caplog.text and not (work / LOCK).exists()
    finally:
        killed.wait()


def test_a_lock_whose_holder_is_gone_is_taken_over(disk_dir, shm_dir, caplog):
    work = disk_dir / "work"
    (work / LOCK).parent.mkdir(parents=True)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    (work / LOCK).write_text(json.dumps({"host": socket.gethostname(), "pid": int(dead), "started": time.time(), "created": time.time()}))
    run(tiny(work), "SeaMultiProc", {"tiers": [{"path": str(shm_dir)}]})
    assert "left by a run that is gone" in caplog.text and not (work / LOCK).exists()

    # another host's lock: refused while it beats, taken over once silent for STALE_AFTER
    (work / LOCK).write_text(json.dumps({"host": "node042", "pid": 1234, "started": time.time()}))
    with pytest.raises(SeaRunLocked, match="host node042, PID 1234"):
        run(tiny(work), "SeaMultiProc", {"tiers": [{"path": str(shm_dir)}]})
    old = time.time() - STALE_AFTER - 10
    os.utime(work / LOCK, (old, old))
    run(tiny(work), "SeaMultiProc", {"tiers": [{"path": str(shm_dir)}]})
    assert not (work / LOCK).exists() and sea_private_dirs(shm_dir) == []
