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


def test_a_job_placed_to_wait_for_a_process_counts_its_run_time_from_when_it_began(disk_dir, shm_dir):
    """Pydra's worker places jobs ahead of its free processes (they wait in the pool's queue): a
    job's run time, which nodes of its kind are expected to take (the ETA, the checkpoints' worth,
    back-pressure), counts from when it began in its process, not from its placement."""
    import time

    from sea import NodeSpec, SeaEngine, WorkflowGraph

    engine = SeaEngine(SeaConfig.load({"tiers": [{"path": str(shm_dir)}], "progress": "off"}), disk_dir / "home")
    engine.update_graph(WorkflowGraph.from_specs([NodeSpec("wf/a", kind="job")]))
    engine.place("wf/a")
    time.sleep(0.3)  # in the pool's queue
    began = time.monotonic()
    time.sleep(0.1)
    engine.node_finished("wf/a", started=began)
    assert 0.1 <= engine.estimator.seconds["job"] < 0.25, engine.estimator.seconds
    engine.close()


def test_a_job_whose_result_waited_for_the_engines_loop_counts_its_run_time_until_it_ended(disk_dir, shm_dir):
    """Past a few thousand jobs Pydra's loop hears of a job's end a while after it: a trivial task
    of 20 ms measured 0.4 s at 2,000 tasks, above the half second a checkpoint must spare, and 1,374
    packs went home to be dropped (67 MiB for a 48 KiB result). Its run time ends when it ended in
    its process: not worth a pack."""
    import time

    from sea import NodeSpec, SeaEngine, WorkflowGraph

    engine = SeaEngine(SeaConfig.load({"tiers": [{"path": str(shm_dir)}], "progress": "off"}), disk_dir / "home")
    engine.update_graph(WorkflowGraph.from_specs([NodeSpec("wf/a", kind="job"), NodeSpec("wf/b", kind="job"), NodeSpec("wf/c", kind="sum", upstream=(("wf/a", "out"), ("wf/b", "out")))]))
    engine.place("wf/a")
    began = time.monotonic()
    time.sleep(0.05)
    ended = time.monotonic()
    time.sleep(0.6)  # its result waits for the loop
    engine.node_finished("wf/a", started=began, ended=ended)
    assert 0.05 <= engine.estimator.seconds["job"] < 0.2, engine.estimator.seconds
    assert not engine.run.nodes["wf/a"].checkpoint
    engine.place("wf/b")  # the same without its end: the wait counts, and makes it worth a pack
    began = time.monotonic()
    time.sleep(0.65)
    engine.node_finished("wf/b", started=began)
    assert engine.run.nodes["wf/b"].checkpoint
    engine.close()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fan", "chain"])
def test_the_pydra_eta_is_within_a_quarter_of_the_truth_once_shown_after_a_third_of_the_run(tmp_path, shm_dir, kind):
    """A real run under SeaWorker (48 tasks of 0.25 s on 2 processes; one node split 48 ways, or
    three nodes of 16 in a chain, whose jobs Pydra makes one node at a time: the total grows, and
    no ETA is shown until it is known), its progress sampled every 0.1 s: from a third of the run to
    its last quarter, every ETA shown is within 25% of the time the run then still took."""
    import threading
    import time

    from pydra.engine.submitter import Submitter

    from pydra_workflows import SleepChain, SleepFan

    task = SleepFan(values=list(range(48)), seconds=0.25) if kind == "fan" else SleepChain(values=list(range(0, 160, 10)), seconds=0.25)
    samples, stop = [], threading.Event()
    with Submitter(worker="sea", cache_root=tmp_path / "home", n_procs=2, sea={"tiers": [{"path": str(shm_dir)}], "progress": "off"}) as sub:

        def sample() -> None:
            while not stop.is_set():
                if (engine := getattr(sub.worker, "engine", None)) is not None and not engine._closed:
                    snap = engine.progress_snapshot()
                    samples.append((time.monotonic(), snap.eta if not snap.growing and snap.done < snap.total else None))
                time.sleep(0.1)

        sampler = threading.Thread(target=sample)
        sampler.start()
        start = time.monotonic()
        try:
            result = sub(task)
        finally:
            stop.set()
            sampler.join()
    assert not result.errored
    end = max(t for t, _ in samples)  # the engine's last snapshot: its end, within 0.1 s
    run = end - start
    judged = [(t - start, eta, end - t) for t, eta in samples if start + run / 3 <= t <= end - run / 4 and eta is not None]
    assert judged, f"no ETA shown from a third of the run ({run:.1f} s) to its last quarter"
    wrong = [(round(at, 1), round(eta, 1), round(truth, 1)) for at, eta, truth in judged if abs(eta - truth) > 0.25 * truth]
    assert not wrong, f"{len(wrong)} of {len(judged)} ETAs off by more than 25% (at, ETA, truth): {wrong}"
