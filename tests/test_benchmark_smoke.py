"""The side-by-side benchmark runs end to end at smoke size and writes its tables (their numbers
are not checked here: speed is measured by the full benchmark, never asserted by a test)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


# A2 (MultiProc with Nipype's default 2 s poll) is left out of the smoke: its 2 s rounds were ~46 s of
# this test's ~150 s in CI; it runs in the full benchmark (`benchmarks.run --size full`). By default the
# smoke runs MultiProc and Sea on the busy filesystem with T, which gives the limit L, and each engine's
# own plugin and Sea's on the bare disk. The baseline made by hand (B) and C's and PS's variants with
# one setting changed (C', CN, CP, S, PSP: each setting tested on its own in test_reruns,
# test_prefetch, test_pydra_prefetch, test_home_footprint) run in the slow cross product below, run
# before resolving what the benchmark covers
SMOKE_CONFIGS = "A,C,T"
ALL_CONFIGS = "A,B,C,CN,C',CP,T,S,P,PS,PSP"


def benchmark_scratch() -> set[str]:
    """The scratch of benchmarks.run on this machine: its mounts and directories. Compared before and
    after a benchmark, since another benchmark or test process may run beside this one."""
    mounts = re.findall(r"\S*sea-bench-run-\S*", Path("/proc/mounts").read_text())
    return {*mounts, *map(str, Path("/dev/shm").glob("sea-bench-run-*")), *map(str, Path("/var/tmp").glob("sea-bench-run-*"))}


def smoke_matrix(out: Path, throttles: str, workloads: str, configs: str = SMOKE_CONFIGS) -> str:
    """``benchmarks.run`` at smoke size, every smoke configuration (or ``configs``); its table (smoke.md)."""
    command = [sys.executable, "-m", "benchmarks.run", "--size", "smoke", "--reps", "1", "--configs", configs,
               "--throttles", throttles, "--workloads", workloads, "--out", str(out)]  # fmt: skip
    before = benchmark_scratch()
    process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = process.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        process.terminate()  # SIGTERM: the benchmark kills its worker, unmounts and removes its scratch
        stdout, stderr = process.communicate(timeout=60)
        raise AssertionError(f"the smoke benchmark took over 400 s:\n{stdout[-3000:]}\n{stderr[-3000:]}") from None
    assert process.returncode == 0, f"benchmark failed:\n{stdout[-3000:]}\n{stderr[-3000:]}"
    text = (out / "smoke.md").read_text()
    assert "all identical" in text
    assert (out / "smoke.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "smoke.json").is_file()
    left = benchmark_scratch() - before
    assert not left, f"the benchmark left its scratch behind: {left}"
    return text


def assert_every_configuration(text: str, sections: list[str], configs: str = SMOKE_CONFIGS) -> None:
    for section in sections:
        assert f"## {section}" in text, f"no section {section!r}:\n{text}"
    for key in [f"{c} " for c in configs.split(",")] + ["L limit"]:
        assert f"| {key}" in text, f"no row {key!r}:\n{text}"
    assert "| C within 1.15x of the limit L |" in text


@pytest.mark.slow  # with --run-slow, as the full cross product below (README command 2's 12 minutes)
def test_benchmark_smoke_runs_each_engines_plugin_and_sea(tmp_path):
    """MultiProc and Sea, and T for the limit, on the busy filesystem (incrementation: the workload
    every configuration, Pydra's too, runs), and Pydra's cf and Sea's worker on the bare disk (the
    same benchmark without the FUSE mount), with its target row. The full cross product
    (every configuration on both filesystems, both workloads) is the slow test below."""
    assert_every_configuration(smoke_matrix(tmp_path / "busy", "busy", "incrementation"), ["busy shared filesystem, incrementation"])
    text = smoke_matrix(tmp_path / "unloaded", "unloaded", "incrementation", configs="P,PS")
    section = text.split("## unloaded shared filesystem, incrementation")[1].split("\n## ")[0]
    assert all(f"| {c} " in section for c in ("P", "PS")), text
    assert "| Pydra: PS costs at most 3% over P |" in text


@pytest.mark.slow
def test_benchmark_smoke_runs_every_configuration_on_every_filesystem_and_workload(tmp_path):
    text = smoke_matrix(tmp_path, "busy,unloaded", "incrementation,filtering", configs=ALL_CONFIGS)
    assert_every_configuration(text, ["busy shared filesystem, incrementation", "busy shared filesystem, filtering",
                                      "unloaded shared filesystem, incrementation", "unloaded shared filesystem, filtering"], ALL_CONFIGS)  # fmt: skip


def test_only_dwi_mrtrix_runs_on_the_page_cache_mode_of_the_busy_filesystem():
    """MRtrix3 memory-maps its images, which slowfs's default direct_io refuses; every other workload
    keeps direct_io, so that no page cache stands between it and the throttle."""
    from benchmarks.matrix import EXTRA_WORKLOADS, THROTTLES, WORKLOADS
    from benchmarks.slowfs import Throttle

    busy = THROTTLES["busy"]
    for workload in WORKLOADS + EXTRA_WORKLOADS:
        settings = Throttle(**busy.slowfs_settings(workload))
        assert settings.page_cache == (workload == "dwi_mrtrix"), workload
        assert (settings.write_mbps, settings.read_mbps, settings.meta_latency_ms) == (30, 200, 5)
    assert "page cache mode" in busy.describe("dwi_mrtrix") and "page cache" not in busy.describe("filtering")


@pytest.mark.slow  # its parts run by default: the workload (test_dwi_mrtrix), memory maps through slowfs (test_slowfs)
@pytest.mark.skipif(shutil.which("mrconvert") is None, reason="MRtrix3 is not installed (apt-get install mrtrix3: the suite installs it itself when run as root on Debian)")
def test_dwi_mrtrix_runs_on_the_busy_filesystem(tmp_path):
    """MRtrix3 memory-maps its images through the slowfs mount (its page cache mode): the workload
    runs end to end on the busy shared filesystem, with Sea's outputs identical to MultiProc's."""
    command = [sys.executable, "-m", "benchmarks.run", "--size", "smoke", "--reps", "1", "--throttles", "busy",
               "--workloads", "dwi_mrtrix", "--configs", "A,C", "--out", str(tmp_path)]  # fmt: skip
    before = benchmark_scratch()
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, f"benchmark failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    text = (tmp_path / "smoke.md").read_text()
    assert "## busy shared filesystem, dwi_mrtrix" in text and "page cache mode" in text
    assert "| A " in text and "| C " in text and "all identical" in text
    left = benchmark_scratch() - before
    assert not left, f"the benchmark left its scratch behind: {left}"


@pytest.mark.slow  # a benchmark (33 s on a slow day); the steps it times are tested in test_reruns and test_resume_after_kill
def test_rerun_benchmark_smoke_runs_its_three_steps(tmp_path):
    """benchmarks.reruns end to end at smoke size (A and C, the bare disk, the incrementation chain;
    fmri_preproc takes the same steps): first run and what it leaves in the work directory, rerun
    after a late step changed, resume after a kill, each compared with A's outputs; the table and
    issue 32's targets."""
    command = [sys.executable, "-m", "benchmarks.reruns", "--size", "smoke", "--reps", "1", "--throttles", "unloaded",
               "--workloads", "incrementation", "--configs", "A,C", "--out", str(tmp_path)]  # fmt: skip
    before = benchmark_scratch()
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, f"benchmark failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    text = (tmp_path / "reruns-smoke.md").read_text()
    assert "| A MultiProc" in text and "| C SeaMultiProc" in text, text
    assert "| rerun after a late change: C / A <= 1.2 |" in text and "| work directory: A's files / C's >= 20 |" in text, text
    assert "Outputs identical to A's at every step: yes." in text, text
    steps = {(s["workload"], s["config"], s["step"]) for s in json.loads((tmp_path / "reruns-smoke.json").read_text())["steps"]}
    assert steps == {("incrementation", c, s) for c in ("A", "C") for s in ("first", "rerun", "resumed")}
    assert not benchmark_scratch() - before, "the benchmark left its scratch behind"


@pytest.mark.slow  # a benchmark; a batch of many small files going home is tested in test_durable
def test_many_files_benchmark_smoke_runs_with_its_target(tmp_path):
    """The many-small-files workload (one DataSink of a directory of small files) end to end on the
    bare disk, Sea's outputs identical to MultiProc's, with issue 16's target row."""
    command = [sys.executable, "-m", "benchmarks.run", "--size", "smoke", "--reps", "1", "--throttles", "unloaded",
               "--workloads", "many_files", "--configs", "A,C", "--out", str(tmp_path)]  # fmt: skip
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, f"benchmark failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    text = (tmp_path / "smoke.md").read_text()
    assert "## unloaded shared filesystem, many_files" in text and "500 text files" in text, text
    assert "| C within 1.05x of A (a DataSink of many small files; issue 16) |" in text and "all identical" in text, text
    assert "10x fewer files" not in text, "the files are the outputs: that target does not apply"


@pytest.mark.slow  # 48 s by default on a slow day; its table's making is tested on made-up records below
def test_scaling_benchmark_smoke_times_every_plugin(tmp_path):
    """benchmarks.scaling (issue 19's fan-out/fan-in of N trivial nodes) at its smoke size: every
    plugin runs at both N and the table gives seconds, ms per node and the ratio between sizes."""
    from benchmarks.scaling import PLUGINS

    command = [sys.executable, "-m", "benchmarks.scaling", "--size", "smoke", "--out", str(tmp_path)]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = (tmp_path / "scaling-smoke.md").read_text()
    times, own = text.split("The plugin's own work per node")
    for table in (times, own):  # seconds and ms per node; then the Nipype plugins' own work per node
        rows = [line for line in table.splitlines() if line.startswith("| 20 |") or line.startswith("| 60 |")]
        assert len(rows) == 2 and all("–" not in row for row in rows), text
    assert all(f"{plugin} own ms/node" in own for plugin in ("MultiProc", "SeaMultiProc", "SeaDask")), text
    assert all(f"{plugin} (s)" in text and f"- {plugin}: 60/20: " in text for plugin in PLUGINS), text
    records = json.loads((tmp_path / "scaling-smoke.json").read_text())["records"]
    assert {(r["plugin"], r["n"]) for r in records} == {(p, n) for p in PLUGINS for n in (20, 60)}


def test_a_scaling_table_of_repeated_runs_shows_each_cells_median_spread_and_sea_over_its_engine():
    """``--repeat``: each cell is the median of its runs with their spread, a cell with most of
    its runs past the cap is not shown, and ``sea / cf`` is the ratio of the medians."""
    from types import SimpleNamespace

    from benchmarks.scaling import render_markdown

    def run(plugin, n, seconds):
        return {"plugin": plugin, "n": n, "seconds": seconds, "nodes": n + 1}

    records = [run("cf", 100, s) for s in (2.0, 9.0, 3.0)] + [run("sea", 100, s) for s in (3.3, 2.2, 2.9)]
    records += [run("cf", 400, s) for s in (8.0, 8.4, 8.2)] + [run("sea", 400, s) for s in (None, None, 9.0)]
    machine = SimpleNamespace(nproc=2, kernel="k", python="3", nipype="n", repo_commit="c", date="d")
    text = render_markdown("t", records, machine, cap=60)
    assert "3 runs per cell" in text, text
    row = next(line for line in text.splitlines() if line.startswith("| 100 |"))
    assert row.startswith("| 100 | 3.00 (2.00–9.00) | 2.90 (2.20–3.30) | 29.7 | 28.7 | 0.97 |"), row
    row = next(line for line in text.splitlines() if line.startswith("| 400 |"))
    assert row == "| 400 | 8.20 (8.00–8.40) | – | 20.4 | – | – |", row
    assert "- cf: 400/100: 2.73 (linear 4.0)" in text, text
