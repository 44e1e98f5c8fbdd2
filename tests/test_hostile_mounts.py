"""Tiers that change under a run or were mounted with odd options: never worse than MultiProc,
which runs every node in the home. Real mounts: a tmpfs mounted ``noexec``, a tier removed or
lazily unmounted while nodes run."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest
from nipype import Workflow

from sea import SeaHomeMoved, SeaTierSwapped
from sea.report import RunReport

from conftest import mounted_tmpfs, sea_private_dirs
from nipype_workflows import fn, run


def run_own_script(x: int) -> str:
    """What many pipelines do: write a helper script into the working directory and run it."""
    import os
    import subprocess

    with open("helper.sh", "w") as f:
        f.write(f"#!/bin/sh\necho {x * 2} > out.txt\n")
    os.chmod("helper.sh", 0o755)
    subprocess.run(["./helper.sh"], check=True)
    return os.path.abspath("out.txt")


def report_value(in_file: str, dest: str) -> str:
    with open(in_file) as f, open(dest, "w") as g:
        g.write(f.read())
    return dest


def script_workflow(base: Path, dest: Path) -> Workflow:
    wf = Workflow(name="scripts", base_dir=str(base))
    make = fn("make", run_own_script, ["x"], ["out_file"])
    make.inputs.x = 21
    report = fn("report", report_value, ["in_file", "dest"], ["out_file"])
    report.inputs.dest = str(dest)
    wf.connect(make, "out_file", report, "in_file")
    return wf


def test_a_node_that_runs_a_script_on_a_noexec_tier_is_rerun_on_the_next_tier(disk_dir):
    run(script_workflow(disk_dir / "mp", disk_dir / "mp.txt"), "MultiProc")
    assert (disk_dir / "mp.txt").read_text() == "42\n"
    with mounted_tmpfs("1G", options="noexec") as noexec:  # room for Sea's first estimate of a node
        run(script_workflow(disk_dir / "sea", disk_dir / "sea.txt"), "SeaMultiProc", {"tiers": [{"path": str(noexec)}]})
        report = RunReport.from_json(disk_dir / "sea" / "sea-report.json")
        assert report.success and report.noexec_retries == 1 and report.nodes_failed == 0, report.to_text()
        assert sea_private_dirs(noexec) == []
    assert (disk_dir / "sea.txt").read_text() == "42\n"


def nap(x: int) -> int:
    import time

    time.sleep(0.4)
    return x + 1


def chain_workflow(base: Path, dest: Path, length: int = 8) -> Workflow:
    wf = Workflow(name="chain", base_dir=str(base))
    previous = fn("step0", nap, ["x"], ["x"])
    previous.inputs.x = 0
    for i in range(1, length):
        step = fn(f"step{i}", nap, ["x"], ["x"])
        wf.connect(previous, "x", step, "x")
        previous = step
    last = fn("report", write_number, ["x", "dest"], ["out_file"])
    last.inputs.dest = str(dest)
    wf.connect(previous, "x", last, "x")
    return wf


def write_number(x: int, dest: str) -> str:
    with open(dest, "w") as f:
        f.write(str(x))
    return dest


@pytest.mark.parametrize("how", ["emptied", pytest.param("lazily unmounted", marks=pytest.mark.slow)])  # lazily unmounted: --run-slow
def test_a_tier_lost_mid_run_ends_it_in_one_line_and_the_same_command_resumes(disk_dir, how):
    """Another job's cleanup empties the tier, or an admin unmounts it (``umount -l``) while nodes
    run: the run ends in one line saying so, nothing committed home is lost, and the same command
    on a healthy tier completes with MultiProc's result."""
    run(chain_workflow(disk_dir / "mp", disk_dir / "mp.txt"), "MultiProc")
    with mounted_tmpfs("64M") as tier:
        def lose_it() -> None:
            time.sleep(1.5)
            if how == "emptied":  # again while a node writes into a directory being removed ("Directory not empty")
                for _ in range(20):
                    if subprocess.run(f"rm -rf {tier}/sea-*", shell=True).returncode == 0:
                        break
                else:
                    raise AssertionError(f"could not empty {tier}")
            else:
                subprocess.run(["umount", "-l", str(tier)], check=True)

        loser = threading.Thread(target=lose_it)
        loser.start()
        try:
            with pytest.raises(SeaTierSwapped) as info:
                run(chain_workflow(disk_dir / "sea", disk_dir / "sea.txt"), "SeaMultiProc", {"tiers": [{"path": str(tier)}]})
        finally:
            loser.join()
        assert "\n" not in str(info.value) and "the same command resumes the run" in str(info.value), str(info.value)
        assert "emptied or unmounted" in str(info.value)
        report = RunReport.from_json(disk_dir / "sea" / "sea-report.json")
        assert not report.success
    with mounted_tmpfs("64M") as fresh:
        run(chain_workflow(disk_dir / "sea", disk_dir / "sea.txt"), "SeaMultiProc", {"tiers": [{"path": str(fresh)}]})
        assert sea_private_dirs(fresh) == []
    assert (disk_dir / "sea.txt").read_text() == (disk_dir / "mp.txt").read_text() == "8"


def test_the_records_of_nodes_that_ended_as_the_home_moved_make_no_new_home(tmp_path):
    """The nodes' result records (sea.records) are written as directories leave their tiers: a node
    that ends just after the user moved the work directory must not make a new one in its place
    (it did: the records' writer made ``.sea`` with its parents, under load in the test above)."""
    from sea.records import Records

    home, node = tmp_path / "work", tmp_path / "tier" / "wf" / "a"
    node.mkdir(parents=True)
    (node / "result_a.pklz").write_bytes(b"pickled")
    (home / ".sea").mkdir(parents=True)
    records = Records(home, lambda d: [d / "result_a.pklz"])
    (home / ".sea").rmdir()
    home.rename(tmp_path / "work.old")
    records.keep("wf/a", node)
    records.close(keys={"wf/a"})
    assert not home.exists(), "the records made a new home in place of the one moved away"
    assert records.failed


@pytest.mark.parametrize("checkpoints", [pytest.param("auto", marks=pytest.mark.slow), "all"])  # all: the most to resume; auto with --run-slow
def test_the_home_moved_mid_run_ends_it_in_one_line_and_moved_back_the_same_command_resumes(disk_dir, shm_dir, checkpoints):
    """A user renames the work directory (``mv work work.old``) while the run goes on (MultiProc, in
    the same situation, spun at full CPU until it was killed ten minutes later). Sea ends the run in
    one line saying where the home is now, makes no new one in its place (``all``: every node's
    directory is on its way home, so the move is seen at the next node; ``auto``: at the end), leaves
    nothing on the tier, and once it is moved back the same command completes with MultiProc's result."""
    run(chain_workflow(disk_dir / "mp", disk_dir / "mp.txt"), "MultiProc")
    home, moved = disk_dir / "sea", disk_dir / "sea-moved"

    def move_it() -> None:
        time.sleep(1.5)
        home.rename(moved)

    mover = threading.Thread(target=move_it)
    mover.start()
    sea = {"tiers": [{"path": str(shm_dir)}], "checkpoints": checkpoints}
    try:
        with pytest.raises(SeaHomeMoved) as info:
            run(chain_workflow(home, disk_dir / "sea.txt"), "SeaMultiProc", sea)
    finally:
        mover.join()
    message = str(info.value)
    assert "\n" not in message and f"(it is now {str(moved)!r})" in message and "the same command resumes the run" in message, message
    assert not home.exists(), "Sea made a new home in place of the one moved away"
    assert sea_private_dirs(shm_dir) == []
    assert not RunReport.from_json(moved / "sea-report.json").success
    moved.rename(home)
    run(chain_workflow(home, disk_dir / "sea.txt"), "SeaMultiProc", sea)
    assert (disk_dir / "sea.txt").read_text() == (disk_dir / "mp.txt").read_text() == "8"
    assert sea_private_dirs(shm_dir) == []
