"""Seeing what happens: Sea's own logger, its progress (a line that updates on a terminal, plain
lines in a log), task names, and a situation Sea can name ending a script in one line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sea import RunReport, SeaConfig
from sea.report import TierReport, merge_reports

ROOT = Path(__file__).parents[1]


def run_script(text: str, cwd: Path, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    script = cwd / "script.py"  # Nipype's Function reads its function's source from a file
    script.write_text(textwrap.dedent(text))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)


NIPYPE_RUN = """
    import sys
    from pathlib import Path
    from nipype import config
    from example_workflows.incrementation import build_workflow, make_chunks

    root = Path(sys.argv[0]).parent
    {before}
    make_chunks(root / "data", 3, {mib})
    wf = build_workflow(root / "data", 3, 3, root / "work", root / "out")
    wf.config["execution"]["poll_sleep_duration"] = 0.05
    wf.run(plugin="SeaMultiProc", plugin_args={{"n_procs": 2, "sea": {sea!r}}})
"""


def test_quieting_nipype_leaves_seas_progress_and_report(disk_dir, shm_dir):
    """``workflow_level: WARNING`` hides Nipype's lines; Sea's (own logger) are still there, with
    progress lines naming nodes done of the total, each tier's fill, and the report once."""
    sea = {"tiers": [{"path": str(shm_dir)}], "progress": "lines"}
    before = "config.set('logging', 'workflow_level', 'WARNING'); from nipype import logging; logging.update_logging(config)\n    import sea.progress; sea.progress.EVERY = 0.2"
    done = run_script(NIPYPE_RUN.format(before=before, sea=sea, mib=64), disk_dir, env={**os.environ, "PYTHONPATH": str(ROOT)})
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "[Node] Finished" not in output, "Nipype was asked to be quiet"
    progress = [line for line in output.splitlines() if "[Sea] progress:" in line]
    assert len(progress) >= 2, output[-3000:]
    assert re.search(r"\d+/15 nodes · .*elapsed \w+ · " + re.escape(str(shm_dir)) + r" [\d.]+ \w?i?B of [\d.]+ \wiB", "\n".join(progress)), progress
    assert output.count("Sea run succeeded") == 1, output[-3000:]
    assert "--plot" in output


def test_a_pydra_run_is_not_silent_and_names_tasks_not_checksums(disk_dir, shm_dir):
    """No logging configured (a plain script): Sea says what it does on standard error, its
    progress names running tasks by task and node, and the total is marked as still growing."""
    script = f"""
        import sys
        from pathlib import Path
        import sea.progress
        sea.progress.EVERY = 0.1
        from pydra.engine.submitter import Submitter
        from example_workflows.incrementation import make_chunks
        from example_workflows.incrementation.pydra_workflow import Incrementation

        root = Path(sys.argv[0]).parent
        chunks = make_chunks(root / "data", 3, 4)
        with Submitter(worker="sea", cache_root=root / "cache", n_procs=2, sea={{"tiers": [{{"path": {str(shm_dir)!r}}}], "progress": "lines"}}) as sub:
            result = sub(Incrementation(in_files=chunks, iterations=3))
        assert not result.errored
    """
    done = run_script(script, disk_dir, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "[Sea] tiers:" in done.stderr and done.stderr.count("Sea run succeeded") == 1, done.stderr[-3000:]
    progress = [line for line in done.stderr.splitlines() if "[Sea] progress:" in line]
    running = [line for line in progress if "running:" in line]
    assert running, progress
    assert not any(re.search(r"running: .*\b[0-9a-f]{32}\b", line) for line in running), running
    assert any(re.search(r"running: .*\w+:\w+", line) for line in running), running  # Task:node
    assert any(re.search(r"\d+/\d+\+ nodes", line) for line in progress), progress


def test_a_terminal_gets_one_updating_line(disk_dir, shm_dir):
    """On a terminal (a pseudo-terminal made by ``script``), progress is one line redrawn in place
    (carriage returns, no newline between updates) that ends before the report."""
    sea = {"tiers": [{"path": str(shm_dir)}]}  # progress: auto
    (disk_dir / "run.py").write_text(textwrap.dedent(NIPYPE_RUN.format(before="", sea=sea, mib=64)))
    log = disk_dir / "typescript"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", "TERM": "xterm"}
    done = subprocess.run(["script", "-qec", f"{sys.executable} {disk_dir / 'run.py'}", str(log)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]
    raw = log.read_bytes().decode(errors="replace")  # carriage returns as they are
    redraws = re.findall(r"\[Sea\] [^\r\n]* \d+/15 nodes · [^\r\n]*", raw)
    assert len(redraws) >= 2 and "\r[Sea] " in raw, raw[-3000:]  # drawn again from the start of its line
    assert "/15 nodes" in raw and "Sea run succeeded" in raw
    assert "[Sea] progress:" not in raw, "a terminal gets the updating line, not log lines"


def test_a_situation_sea_names_ends_the_script_in_one_line(disk_dir):
    """A tier on the home's own filesystem is refused; from ``wf.run`` in a user's script that is
    one line on standard error, not a traceback through Nipype (SEA_TRACEBACK=1 gives it back)."""
    tier = disk_dir / "tier"
    tier.mkdir()
    sea = {"tiers": [{"path": str(tier)}]}
    text = NIPYPE_RUN.format(before="", sea=sea, mib=1)
    done = run_script(text, disk_dir, env={**os.environ, "PYTHONPATH": str(ROOT)})
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert errors[-1].startswith("sea: error: ") and "/dev/shm" in errors[-1], errors
    assert not [line for line in errors[:-1] if "error" in line.lower() and "[Sea]" not in line], errors
    again = run_script(text, disk_dir, env={**os.environ, "PYTHONPATH": str(ROOT), "SEA_TRACEBACK": "1"})
    assert again.returncode == 1 and "Traceback" in again.stderr


def test_the_report_counts_sub_nodes_says_interrupted_and_names_workers():
    interrupted = RunReport(success=False, interrupted=True, nodes_total=21, nodes_run=5, subnodes=12)
    first = interrupted.to_text().splitlines()[0]
    assert first.startswith("Sea run interrupted") and "FAILED" not in first and "run again next time" in first, first
    assert "12 of them MapNode sub-nodes" in interrupted.to_text()
    long = RunReport(tiers=[TierReport("home:x", "/scratch/a-very-long-user-name/projects/study/work", 0, 0, 0, 0, 0)])
    assert "…" in long.to_text()
    same = [TierReport("tier0:/dev/shm", "/dev/shm", 1, 1, 1, 0, 0)]
    merged = merge_reports([("w1", RunReport(tiers=list(same))), ("w2", RunReport(tiers=list(same)))], [])
    assert [t.path for t in merged.tiers] == ["/dev/shm", "/dev/shm"]
    assert "  w1:/dev/shm " in merged.to_text() and "  w2:/dev/shm " in merged.to_text(), merged.to_text()


def test_progress_is_a_setting_refused_in_one_line_when_wrong():
    assert SeaConfig.load({"progress": "off"}).progress == "off"
    from sea import SeaConfigError

    try:
        SeaConfig.load({"progress": "loud"})
    except SeaConfigError as error:
        assert "progress 'loud' is not one of auto, bar, lines, off" in str(error)
    else:
        raise AssertionError("progress: loud accepted")


@pytest.mark.parametrize("width", [60, 100, 180])
def test_the_progress_line_fits_the_terminal_most_useful_fields_first(width):
    """At 180 columns the ETA and the time elapsed were cut off, at 100 all but the node count and
    the running names: the line keeps to the width, the nodes done, the ETA and what waits to go
    home first, the running nodes' names last."""
    from sea.progress import Snapshot

    names = [f"incrementation/_chunk_{i}/increment_{i + 20}" for i in range(4)]
    snap = Snapshot(elapsed=58, done=146, total=256, growing=False, running=names, tiers=[("/dev/shm", 2**30, 23 * 2**30)],
                    backlog_bytes=512 * 2**20, backlog_files=6, rate=591e6, eta=29)  # fmt: skip
    line = snap.line(width=width)
    assert len(line) <= width and line.startswith("146/256 nodes · ETA 29s"), line
    if width >= 100:
        assert "to home: 512.0 MiB (6 files)" in line and "elapsed 58s" in line, line
    if width >= 180:
        assert "/dev/shm" in line and "running: incrementation/_chunk_0/increment_20" in line, line
