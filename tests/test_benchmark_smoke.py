"""The benchmark runs end to end at smoke size and writes its table (its numbers are not checked here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_benchmark_smoke_writes_the_table(tmp_path):
    command = [sys.executable, "-m", "benchmarks.run", "--size", "smoke", "--reps", "1", "--out", str(tmp_path)]
    process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        process.terminate()  # SIGTERM: the benchmark kills its worker and removes its scratch directories
        stdout, stderr = process.communicate(timeout=60)
        raise AssertionError(f"the smoke benchmark took over 120 s:\n{stdout[-3000:]}\n{stderr[-3000:]}") from None
    assert process.returncode == 0, f"benchmark failed:\n{stdout[-3000:]}\n{stderr[-3000:]}"

    markdown = tmp_path / "incrementation-smoke.md"
    assert markdown.is_file()
    text = markdown.read_text()
    for name in ("| MultiProc ", "| SeaMultiProc ", "| MultiProc (all tmpfs, the bound) "):
        assert name in text, f"no row {name.strip('| ')!r} in the table:\n{text}"
    assert "ratio vs MultiProc" in text
    assert "SeaMultiProc/MultiProc = " in text
    assert (tmp_path / "incrementation-smoke.json").is_file()


def test_busy_benchmark_smoke_runs_every_configuration(tmp_path):
    """The busy-shared-filesystem benchmark at smoke size, one repetition: it runs every
    configuration on a real throttled FUSE mount and checks outputs; it asserts nothing about speed."""
    command = [sys.executable, "-m", "benchmarks.busy", "--size", "smoke", "--reps", "1", "--out", str(tmp_path)]
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    text = (tmp_path / "busy-incrementation-smoke.md").read_text()
    for key in ("A2 ", "A ", "B ", "C ", "C' ", "T ", "L limit"):
        assert f"| {key}" in text
    assert (tmp_path / "busy-incrementation-smoke.png").read_bytes()[:4] == b"\x89PNG"
    assert "/var/tmp/busy-bench-" not in Path("/proc/mounts").read_text()
