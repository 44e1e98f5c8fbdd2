"""Issue #7's Dask benchmark runs end to end at smoke size and writes its tables (their numbers are
not checked here: speed is measured by the full benchmark, never asserted by a test), and leaves no
mount, worker process or scratch directory behind."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("distributed")

REPO_ROOT = Path(__file__).resolve().parent.parent
PREFIX = "sea-bench-dask-"


def processes_mentioning(text: str) -> list[int]:
    """Processes whose command line or environment names ``text`` (the benchmark's workers carry
    their tier directory in SEA_TIER, the slowfs server its mount point on its command line)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if text.encode() in (proc / "cmdline").read_bytes() or text.encode() in (proc / "environ").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


@pytest.mark.slow  # a benchmark (25 s); SeaDask's runs and cleaning up are tested in test_dask and test_registration
def test_dask_benchmark_smoke_runs_both_configurations_and_cleans_up(tmp_path):
    command = [sys.executable, "-m", "benchmarks.dask_bench", "--size", "smoke", "--reps", "1", "--out", str(tmp_path)]
    process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = process.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        process.terminate()  # SIGTERM: the benchmark stops its cluster, unmounts and removes its scratch
        output, _ = process.communicate(timeout=60)
        raise AssertionError(f"the smoke Dask benchmark took over 90 s:\n{output[-4000:]}") from None
    assert process.returncode == 0, f"benchmark failed:\n{output[-4000:]}"
    scratch = re.search(rf"scratch: (/var/tmp/{PREFIX}\S+) (/dev/shm/{PREFIX}\S+)", output)
    assert scratch, f"the benchmark did not name its scratch directories:\n{output[:2000]}"

    text = (tmp_path / "dask-smoke.md").read_text()
    for heading in ("## Setup", "## Makespan", "## Placement overhead per node (no cluster)", "## Targets"):
        assert heading in text, f"no section {heading!r}:\n{text}"
    assert "| 1 | D |" in text and "| 1 | SD |" in text, text
    assert "identical to D's" in text and "all identical to D" in text and "DIFFER" not in text, text
    assert "| median makespan (s) |" in text and "| SeaDask locality hit rate (median) |" in text
    assert "| 3 | 2000 |" in text and "| 30 | 2000 |" in text, "no placement row for 3 and for 30 workers"
    assert "| SD |" in text and "SeaDask's own client-side cost over D's" in text
    assert "| placement decisions <= 5 ms per node (3 and 30 workers) |" in text

    raw = json.loads((tmp_path / "dask-smoke.json").read_text())
    sd = [run for run in raw["runs"] if run["config"] == "SD"]
    assert sd and all(run["identical_to_d"] for run in sd)
    assert {w["worker"] for w in sd[0]["sea"]["workers"]} == {"w0", "w1", "w2"}
    assert all(run["tier_leftovers"] == [] for run in sd), "SeaDask left something on a worker's tier"

    # only this run's own directories: other people may run the benchmark on this machine meanwhile
    shared, tiers = scratch.groups()
    assert shared not in Path("/proc/mounts").read_text(), "the benchmark left its slowfs mount behind"
    assert not Path(shared).exists() and not Path(tiers).exists(), "the benchmark left its scratch directories behind"
    assert not processes_mentioning(tiers), "a worker process of the benchmark is still running"
    assert not processes_mentioning(shared), "the slowfs server of the benchmark is still running"
