"""Ctrl-C (SIGINT) and a batch system's SIGTERM, sent to the whole process group as a terminal and
SLURM do, stop a run cleanly through both adapters: the copies under way are committed (none is
left half-written under a temporary name), the journal records the stop, the tiers are left empty,
and a rerun completes with byte-identical outputs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from sea.report import RunReport
from sea.stager import TMP_MARK

from example_runs import ROOT, Pipeline, adapters, wait_for_run_start


def crash_reports(home) -> str:
    """Pydra's crash records under ``home``, to say why a rerun failed."""
    import pickle

    texts = []
    for path in home.rglob("_error.pklz"):
        with open(path, "rb") as f:
            texts.append("".join(pickle.load(f).get("error message", []))[-1500:])
    return "\n".join(texts)


def wait_for(pipeline: Pipeline, root, proc, event: str, count: int) -> None:
    deadline = time.monotonic() + 120
    while pipeline.journal_events(root).get(event, 0) < count and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)


def _stops() -> list:
    """Each adapter with each signal; by default SLURM's SIGTERM to a Pydra run (Ctrl-C goes to the
    same handler; a Nipype run's SIGTERM is tested by default in test_never_worse and test_dask),
    every pair with --run-slow."""
    pairs = []
    for adapter in adapters():
        name, marks = (adapter, ()) if isinstance(adapter, str) else (adapter.values[0], adapter.marks)
        for signum, default in ((signal.SIGINT, False), (signal.SIGTERM, name != "nipype")):
            pairs.append(pytest.param(name, signum, marks=[*marks, *(() if default else (pytest.mark.slow,))], id=f"{name}-{signum.name}"))
    return pairs


@pytest.mark.parametrize(("adapter", "signum"), _stops())
def test_a_stopped_run_commits_what_is_under_way_and_resumes(adapter, signum, disk_dir, shm_dir):
    pipeline = Pipeline(adapter)
    reference = disk_dir / "reference"
    subprocess.run(pipeline.command(reference, shm_dir), check=True, capture_output=True, cwd=ROOT, timeout=300)
    expected = pipeline.final_files(reference)

    root = disk_dir / "stopped"
    env = dict(os.environ, PYTHONFAULTHANDLER="1")  # a hang is reported with every thread's stack
    proc = subprocess.Popen(pipeline.command(root, shm_dir), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True, env=env)
    wait_for_run_start(pipeline, root, proc)
    wait_for(pipeline, root, proc, "done", 10)  # mid-run: some nodes done, flushes under way
    assert proc.poll() is None, "the run ended before it could be stopped"
    stopped_at = time.monotonic()
    os.killpg(proc.pid, signum)
    try:
        output, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        time.sleep(2)
        os.killpg(proc.pid, signal.SIGKILL)  # with any worker process it left behind
        output, _ = proc.communicate()
        pytest.fail(f"the stopped run did not exit within 60 s; its threads:\n{output.decode()[-6000:]}")
    took = time.monotonic() - stopped_at
    assert proc.returncode != 0, "a stopped run reported success"

    home = pipeline.home(root)
    temporaries = [p for p in root.rglob(f"*{TMP_MARK}*")]
    assert temporaries == [], f"copies left half-done: {temporaries}"
    stops = [json.loads(line) for line in (home / ".sea" / "journal.jsonl").read_text().splitlines() if '"interrupted"' in line]
    assert len(stops) == 1, output.decode()[-3000:]
    report = RunReport.from_json(home / "sea-report.json")
    assert report.interrupted and not report.success
    assert stops[0]["committed"] == report.files_flushed
    left = [str(p.relative_to(shm_dir)) for p in shm_dir.rglob("*")]
    assert left == [], f"the stop left Sea's directory on the tier: {left[:12]}"
    for name, data in pipeline.final_files(root).items():
        assert data == expected[name], f"{name} is partial after the stop"

    rerun = subprocess.run(pipeline.command(root, shm_dir), capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-2000:] + crash_reports(home)
    assert pipeline.final_files(root) == expected
    again = RunReport.from_json(home / "sea-report.json")
    print(f"\n{adapter} {signal.Signals(signum).name}: stopped in {took:.2f} s, {report.files_flushed} files committed before stopping; rerun executed {again.nodes_run}/{again.nodes_total}")
