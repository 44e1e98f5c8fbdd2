"""The side-by-side benchmark runs end to end at smoke size and writes its tables (their numbers
are not checked here: speed is measured by the full benchmark, never asserted by a test)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_benchmark_smoke_runs_every_configuration_on_both_filesystems(tmp_path):
    command = [sys.executable, "-m", "benchmarks.run", "--size", "smoke", "--reps", "1", "--out", str(tmp_path)]
    process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = process.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        process.terminate()  # SIGTERM: the benchmark kills its worker, unmounts and removes its scratch
        stdout, stderr = process.communicate(timeout=60)
        raise AssertionError(f"the smoke benchmark took over 400 s:\n{stdout[-3000:]}\n{stderr[-3000:]}") from None
    assert process.returncode == 0, f"benchmark failed:\n{stdout[-3000:]}\n{stderr[-3000:]}"

    text = (tmp_path / "smoke.md").read_text()
    for section in ("busy shared filesystem, incrementation", "busy shared filesystem, filtering",
                    "unloaded shared filesystem, incrementation", "unloaded shared filesystem, filtering"):  # fmt: skip
        assert f"## {section}" in text
    for key in ("A2 ", "A ", "B ", "C ", "C' ", "CP ", "T ", "S ", "P ", "PS ", "PSP ", "L limit"):
        assert f"| {key}" in text, f"no row {key!r}:\n{text}"
    assert "all identical" in text
    assert "| C within 1.15x of the limit L |" in text and "| C costs at most 3% over the tuned A |" in text
    assert (tmp_path / "smoke.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "smoke.json").is_file()
    mounts = Path("/proc/mounts").read_text()
    assert "sea-bench-run-" not in mounts, "the benchmark left a mount behind"
    assert not list(Path("/dev/shm").glob("sea-bench-run-*")) and not list(Path("/var/tmp").glob("sea-bench-run-*"))
