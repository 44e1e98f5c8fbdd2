"""Kill anywhere: the example pipeline is SIGKILLed at seeded random points spread over its run,
through both adapters. After each kill no file at a final path is partial, and a rerun of the same
command completes with byte-identical outputs, re-executing only what it must: next to each rerun's
count is what MultiProc (cf) would run again after a kill at the same point, the nodes not finished
then (every finished node's directory is in its cache; tests/test_reruns.py measures that for real).

With --run-slow, one point per adapter; ``pytest --run-slow -k kill_matrix`` runs the full 20.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from sea.report import RunReport

from example_runs import ROOT, Pipeline, adapters, wait_for_run_start

SEED = 20261123
CI_POINTS = 1  # (kills at chosen points: test_reruns, test_resume_after_kill, test_interrupt); the full matrix (test_kill_matrix_full, --run-slow) spreads its kills over every phase


def phase(events: dict[str, int], total: int) -> str:
    if not events.get("started"):
        return "before the first node"
    if events.get("done", 0) < total:
        return "during nodes" + (" and flushes" if events.get("committed") else "")
    return "during the final drain"


def kill_and_resume(pipeline: Pipeline, work: Path, tier: Path, points: int) -> list[dict]:
    reference = work / "reference"
    proc = subprocess.Popen(pipeline.command(reference, tier), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    wait_for_run_start(pipeline, reference, proc)
    start = time.monotonic()
    assert proc.wait(timeout=300) == 0, "the reference run failed"
    duration = time.monotonic() - start  # from Sea's start (the journal opened) to the end
    expected = pipeline.final_files(reference)
    assert expected, "the reference run produced no outputs"
    total = RunReport.from_json(pipeline.home(reference) / "sea-report.json").nodes_total

    rng = random.Random(f"{SEED}-{pipeline.adapter}")
    at = sorted(rng.uniform(0.0, 1.05) * duration for _ in range(points))
    outcomes = []
    for i, delay in enumerate(at):
        root = work / f"kill-{i:02d}"
        proc = subprocess.Popen(pipeline.command(root, tier), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT, start_new_session=True)
        wait_for_run_start(pipeline, root, proc)
        time.sleep(delay)
        finished_first = proc.poll() is not None
        if not finished_first:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        events = pipeline.journal_events(root)
        # nothing partial at a final path: every output there is the reference's, whole
        for name, data in pipeline.final_files(root).items():
            assert name in expected and data == expected[name], f"kill {i} at {delay:.2f} s left {name} partial or wrong"
        rerun = subprocess.run(pipeline.command(root, tier), capture_output=True, text=True, cwd=ROOT, timeout=300)
        assert rerun.returncode == 0, f"rerun after kill {i} failed:\n{rerun.stdout[-2000:]}\n{rerun.stderr[-2000:]}"
        assert pipeline.final_files(root) == expected, f"rerun after kill {i} at {delay:.2f} s differs from the reference"
        report = RunReport.from_json(pipeline.home(root) / "sea-report.json")
        if finished_first:
            assert report.nodes_run == 0, f"a rerun of a finished run executed {report.nodes_run} nodes"
        outcomes.append(
            {
                "at_s": round(delay, 2),
                "phase": "after the end" if finished_first else phase(events, total),
                "done_before": events.get("done", 0),
                "rerun_executed": report.nodes_run,
                "multiproc_would": total - min(events.get("done", 0), total),
                "total": total,
            }
        )
    leftovers = [p for p in tier.iterdir()]
    assert leftovers == [], f"private directories left on the tier after the reruns: {leftovers}"
    return outcomes


def _report(adapter: str, outcomes: list[dict]) -> None:
    executed = sum(o["rerun_executed"] for o in outcomes)
    would = sum(o["multiproc_would"] for o in outcomes)
    print(
        f"\n{adapter}: {len(outcomes)}/{len(outcomes)} kills survived, files lost 0; re-executed {executed} of {sum(o['total'] for o in outcomes)} "
        f"nodes in the reruns; the engine's own plugin, killed at the same points, would run {would} again"
    )
    for o in outcomes:
        print(
            f"  kill at {o['at_s']:5.2f} s ({o['phase']}, {o['done_before']} nodes done): rerun executed {o['rerun_executed']}/{o['total']}"
            f" (MultiProc/cf: {o['multiproc_would']})"
        )


# --run-slow: by default a kill and its rerun are tested at chosen points, through both adapters
# (test_resume_after_kill, test_reruns' killed runs, test_interrupt, test_memory_budget's OOM kills)
@pytest.mark.slow
@pytest.mark.parametrize("adapter", adapters())
def test_kill_matrix(adapter, disk_dir, shm_dir):
    outcomes = kill_and_resume(Pipeline(adapter), disk_dir, shm_dir, CI_POINTS)
    _report(adapter, outcomes)


@pytest.mark.slow
@pytest.mark.parametrize("adapter", adapters())
def test_kill_matrix_full(adapter, disk_dir, shm_dir):
    outcomes = kill_and_resume(Pipeline(adapter), disk_dir, shm_dir, 20)
    _report(adapter, outcomes)
    assert len({o["phase"] for o in outcomes}) >= 2, "the kills did not spread over the run"
