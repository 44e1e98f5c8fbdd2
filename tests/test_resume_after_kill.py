"""A run killed with SIGKILL mid-way: the rerun completes with byte-identical outputs and
re-executes less than everything (the full kill matrix is a later issue)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sea.report import RunReport

from conftest import tree_files

ROOT = Path(__file__).parents[1]


def demo(root: Path, tier: Path) -> list[str]:
    root.mkdir(parents=True, exist_ok=True)
    (root / "sea.yml").write_text(f"tiers:\n  - path: {tier}\n")
    return [
        sys.executable,
        "-m",
        "example_workflows.incrementation",
        "--root",
        str(root),
        "--chunks",
        "6",
        "--chunk-mib",
        "4",
        "--iterations",
        "4",
        "--sea",
        str(root / "sea.yml"),
    ]


def count(journal: Path, event: str) -> int:
    if not journal.exists():
        return 0
    return sum(1 for line in journal.read_text().splitlines() if f'"event": "{event}"' in line)


def test_rerun_after_sigkill_completes_identically(disk_dir, shm_dir):
    reference = disk_dir / "reference"
    subprocess.run(demo(reference, shm_dir), check=True, capture_output=True, cwd=ROOT)
    expected = tree_files(reference / "out")

    root = disk_dir / "killed"
    journal = root / "work" / ".sea" / "journal.jsonl"
    proc = subprocess.Popen(demo(root, shm_dir), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT, start_new_session=True)
    deadline = time.monotonic() + 120
    # kill once a first chain's output is committed home, while the other chains still run
    while count(journal, "committed") < 1 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = count(journal, "done")
    assert 0 < killed_at < 34, f"kill landed outside the run ({killed_at} nodes done)"

    rerun = subprocess.run(demo(root, shm_dir), capture_output=True, text=True, cwd=ROOT)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert tree_files(root / "out") == expected
    report = RunReport.from_json(root / "work" / "sea-report.json")
    assert report.success and report.nodes_cached > 0 and report.nodes_run < report.nodes_total
    print(json.dumps({"done_before_kill": killed_at, "rerun_executed": report.nodes_run, "total": report.nodes_total}))
