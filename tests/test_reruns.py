"""Reruns cost what they cost under MultiProc (issue 15): the work directory is the user's cache.

Every scenario starts each plugin from an identical state (its own first run of the same study,
snapshotted with timestamps), applies the same change, reruns, and compares the nodes executed and
the outputs byte for byte with MultiProc's rerun:

- ``checkpoints: all`` executes exactly MultiProc's nodes (sub-nodes included); sinks aside: a sink
  whose inputs did not change is skipped by Sea's journal where MultiProc always runs it;
- ``auto`` executes MultiProc's nodes plus, at most, cheap producers a changed node needs, and never
  the expensive step unless MultiProc does;
- ``none`` executes what a changed node needs, the expensive step included.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from sea.pack import pack_path
from sea.report import RunReport

import rerun_workflows as study
from conftest import tree_files

SUBJECTS = ["01", "02"]
MODES = ["none", "auto", "all"]
SCENARIOS = {
    "nothing changed": {},
    "last step changed": {"threshold": 0.25},
    "middle step changed": {"width": 5},
    "a subject added": {"subjects": [*SUBJECTS, "03"]},
    "an input file changed": {},  # sub-01's image is rewritten (see rerun)
}


def expensive(keys: set[str]) -> set[str]:
    return {k for k in keys if k.endswith("/prep")}


def rerun(root: Path, saved: Path, scenario: str, plugin: str, checkpoints: str | None, tier: Path) -> tuple[set[str], dict[str, bytes]]:
    study.restore(saved, root)
    changes = dict(SCENARIOS[scenario])
    if scenario == "an input file changed":
        study.make_data(root / "data", ["01"], seed=99)
    executed = study.run(root, plugin, checkpoints, tier, **changes)
    return executed, tree_files(root / "out")


@pytest.fixture(scope="module")
def states(tmp_path_factory):
    """Each plugin's first run (MultiProc, then Sea with each checkpoint mode), snapshotted."""
    base = Path(tempfile.mkdtemp(prefix="sea-test-reruns-", dir="/var/tmp"))
    tier = Path(tempfile.mkdtemp(prefix="sea-test-", dir="/dev/shm"))
    saved = {}
    try:
        for mode in ["MultiProc", *MODES]:
            root = base / "runs" / mode
            study.make_data(root / "data", [*SUBJECTS, "03"])
            plugin = "MultiProc" if mode == "MultiProc" else "SeaMultiProc"
            study.run(root, plugin, None if mode == "MultiProc" else mode, tier)
            saved[mode] = base / "saved" / mode
            study.snapshot(root, saved[mode])
        yield base, tier, saved
        assert not list(tier.iterdir()), "Sea left something on the tier"
    finally:
        shutil.rmtree(tier, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)


# by default the changes a user makes most (none, a step's parameter, an input); with --run-slow every one
SLOW_SCENARIOS = ("last step changed", "a subject added")


@pytest.mark.parametrize("scenario", [pytest.param(s, marks=pytest.mark.slow) if s in SLOW_SCENARIOS else s for s in SCENARIOS])
def test_rerun_executes_what_multiproc_executes(states, scenario):
    base, tier, saved = states
    theirs, expected = rerun(base / "runs" / "MultiProc", saved["MultiProc"], scenario, "MultiProc", None, tier)
    assert expected, "MultiProc's rerun produced no outputs"
    figures = {"MultiProc": len(study.nodes(theirs))}
    for mode in MODES:
        ours, outputs = rerun(base / "runs" / mode, saved[mode], scenario, "SeaMultiProc", mode, tier)
        assert outputs == expected, f"{mode}: outputs differ from MultiProc's after '{scenario}'"
        report = RunReport.from_json(base / "runs" / mode / "work" / "sea-report.json")
        assert report.success
        figures[mode] = len(study.nodes(ours))
        sinks_ours = {k for k in ours if study.is_sink(k)}
        assert sinks_ours <= theirs, f"{mode}: ran sinks MultiProc did not"
        ours_nodes, theirs_nodes = ({k for k in s if not study.is_sink(k)} for s in (ours, theirs))
        if mode == "all":
            assert ours_nodes == theirs_nodes, f"all: {sorted(ours_nodes ^ theirs_nodes)} differ from MultiProc's rerun"
        elif mode == "auto":
            extra = study.nodes(ours_nodes) - study.nodes(theirs_nodes)
            assert not expensive(extra), f"auto recomputed the expensive step: {sorted(extra)}"
            assert expensive(ours_nodes) == expensive(theirs_nodes)
    print(f"\n{scenario}: nodes executed {figures}")


def test_none_recomputes_the_evicted_chain_and_auto_keeps_the_expensive_step(states):
    """The trade-off the modes make, on the last-step change: without checkpoints the expensive step
    runs again (its output was evicted), with them it does not."""
    base, tier, saved = states
    none, _ = rerun(base / "runs" / "none", saved["none"], "last step changed", "SeaMultiProc", "none", tier)
    auto, _ = rerun(base / "runs" / "auto", saved["auto"], "last step changed", "SeaMultiProc", "auto", tier)
    assert expensive(none) == {f"{study.NAME}/_subject_{s}/prep" for s in SUBJECTS}
    assert not expensive(auto)
    first = RunReport.from_json(saved["auto"] / "work" / "sea-report.json")
    assert first.checkpoints >= len(SUBJECTS) and first.checkpoint_bytes > 0, first.to_text()
    assert first.checkpoint_seconds >= len(SUBJECTS) * 0.8


def test_a_work_directory_multiproc_finished_is_reused_whole(states):
    """A user switching to Sea (fMRIPrep's -w reused with --use-plugin): Nipype's own hash check
    finds every node done, sinks aside, and not one file of MultiProc's cache is removed."""
    base, tier, saved = states
    root = base / "runs" / "MultiProc"  # at the path MultiProc ran: node directories name it
    for mode in MODES:
        study.restore(saved["MultiProc"], root)
        before = study.files_under(root / "work")
        executed = study.run(root, "SeaMultiProc", mode, tier)
        assert {k for k in executed if not study.is_sink(k)} == set(), f"{mode}: executed {sorted(executed)}"
        missing = before - study.files_under(root / "work")
        assert not missing, f"{mode}: Sea removed {len(missing)} files of MultiProc's cache, e.g. {sorted(missing)[:5]}"
        assert tree_files(root / "out") == tree_files(saved["MultiProc"] / "out")
        report = RunReport.from_json(root / "work" / "sea-report.json")
        assert report.rerun_plan["cache check"] == report.nodes_total, report.to_text()


# ---------------------------------------------------------------------------------- killed runs
TESTS = Path(__file__).parent
HELD = ["select", "prep", "smooth", "gzip", "scale", "group_mean", "group_sink"]  # done when stats is held


def killed(root: Path, plugin: str, checkpoints: str | None, tier: Path, ready) -> None:
    """Run the study in its own process with the last step held, SIGKILL it once ``ready()``."""
    hold = root / "hold"
    hold.parent.mkdir(parents=True, exist_ok=True)
    hold.touch()
    command = [sys.executable, str(TESTS / "rerun_workflows.py"), str(root), plugin, checkpoints or "-", str(tier), ",".join(SUBJECTS), "3"]
    proc = subprocess.Popen(command, env={**os.environ, study.HOLD: str(hold)}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not ready():
            assert proc.poll() is None, f"the run ended before the kill: {proc.stderr.read().decode()[-3000:]}"
            assert time.monotonic() < deadline, "the run never reached the kill point"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        hold.unlink()


def done_in_home(root: Path, names: list[str]) -> bool:
    """MultiProc: each named node finished (its result file is in the home) for every subject."""
    work = root / "work" / study.NAME
    keys = [f"_subject_{s}/{n}" for s in SUBJECTS for n in names if n not in ("group_mean", "group_sink")]
    keys += [n for n in names if n in ("group_mean", "group_sink")]
    return all(list((work / k).glob("result_*.pklz")) for k in keys)


def journal(root: Path) -> dict[str, set[str]]:
    """Sea: event -> the keys the journal holds it for."""
    events: dict[str, set[str]] = {}
    path = root / "work" / ".sea" / "journal.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        events.setdefault(entry["event"], set()).add(entry["key"])
    return events


def kept_or_done(events: dict[str, set[str]], mode: str) -> set[str]:
    """The nodes whose directories are in the home (a checkpoint: whole, or packed), or, without
    checkpoints, done."""
    if mode == "none":
        return events.get("done", set())
    return events.get("checkpointed", set()) | events.get("packed", set())


def in_home(root: Path, key: str) -> bool:
    """The node's directory is in the home: whole (MultiProc's, or checkpoints: all), or packed (auto)."""
    return (root / "work" / key).is_dir() or pack_path(root / "work", key).is_file()


def sea_ready(root: Path, mode: str, names: list[str]) -> bool:
    """Sea: each named node done, and (with checkpoints) its checkpoint committed where the mode takes one."""
    events = journal(root)
    done = {k for k in events.get("done", set()) if k.rsplit("/", 1)[-1] in names}
    if len(done) != sum(len(SUBJECTS) if n not in ("group_mean", "group_sink") else 1 for n in names):
        return False
    kept = events.get("checkpointed", set()) | events.get("packed", set())
    if mode == "all":
        return all(k in kept or study.is_sink(k) for k in done)
    if mode == "auto":
        return all(k in kept for k in done if k.endswith("/prep"))
    return True


@pytest.mark.parametrize("point", ["late", pytest.param("early", marks=pytest.mark.slow)])  # early: --run-slow
def test_a_killed_run_resumes_from_its_checkpoints(states, point):
    """SIGKILL (a SLURM wall time) at the same point of MultiProc's run and of Sea's, then the same
    command again: 'late' holds the last step until everything else finished, 'early' kills once the
    first subject's expensive step finished. Each resumes to MultiProc's outputs; with checkpoints
    the expensive steps that finished are not run again, without them they are."""
    base, tier, saved = states
    names = HELD if point == "late" else ["prep"]
    figures = {}
    for mode in ["MultiProc", *MODES]:
        root = base / "runs" / f"killed-{point}-{mode}"
        shutil.rmtree(root, ignore_errors=True)
        study.make_data(root / "data", SUBJECTS)
        plugin = "MultiProc" if mode == "MultiProc" else "SeaMultiProc"
        checkpoints = None if mode == "MultiProc" else mode
        if point == "late":
            ready = (lambda r=root: done_in_home(r, names)) if mode == "MultiProc" else (lambda r=root, m=mode: sea_ready(r, m, names))
        else:
            ready = (lambda r=root: any(list((r / "work" / study.NAME).glob("_subject_*/prep/result_prep.pklz")))) if mode == "MultiProc" else (
                lambda r=root, m=mode: bool({k for k in kept_or_done(journal(r), m) if k.endswith("/prep")})
            )
        killed(root, plugin, checkpoints, tier, ready)
        # what the killed run kept of the expensive step: with Sea, what its journal vouches for (a
        # pack renamed into place just before the kill and not yet recorded is an orphan: swept, run again)
        finished_prep = {key for s in SUBJECTS if in_home(root, key := f"{study.NAME}/_subject_{s}/prep")}
        if mode not in ("MultiProc", "none"):
            finished_prep &= kept_or_done(journal(root), mode)
            assert finished_prep, f"{mode}: the kill came before any expensive step was kept"
        executed = study.run(root, plugin, checkpoints, tier)
        assert tree_files(root / "out") == tree_files(saved["MultiProc"] / "out"), f"{mode}: the resumed run's outputs differ"
        figures[mode] = len(study.nodes(executed))
        if mode == "MultiProc":
            reference = executed
            continue
        if mode != "none":
            assert not expensive(executed) & finished_prep, f"{mode}: ran again the expensive steps it had kept: {sorted(expensive(executed))}"
        if point == "late":
            ours, theirs = ({k for k in s if not study.is_sink(k)} for s in (executed, reference))
            if mode == "all":
                assert ours == theirs, f"all: {sorted(ours ^ theirs)} differ from MultiProc's resumed run"
            if mode == "none":
                assert expensive(executed) == expensive({f"{study.NAME}/_subject_{s}/prep" for s in SUBJECTS})
    print(f"\nkilled {point}: nodes executed by the resumed run {figures}")


def test_a_work_directory_multiproc_left_half_done_is_resumed_as_multiproc_resumes_it(states):
    """MultiProc killed half-way (its last step held), then resumed by MultiProc and by Sea from
    the same state: the same nodes run again, the same outputs, and Sea removes nothing of the
    killed run's directory that MultiProc's resume keeps."""
    base, tier, saved = states
    root = base / "runs" / "half-done"
    shutil.rmtree(root, ignore_errors=True)
    study.make_data(root / "data", SUBJECTS)
    killed(root, "MultiProc", None, tier, lambda: done_in_home(root, HELD))
    half_done = base / "saved" / "half-done"
    study.snapshot(root, half_done)
    before = study.files_under(root / "work")
    theirs = study.run(root, "MultiProc", n_procs=3)
    kept_by_multiproc = study.files_under(root / "work") & before
    expected = tree_files(root / "out")
    for mode in MODES:
        study.restore(half_done, root)
        ours = study.run(root, "SeaMultiProc", mode, tier, n_procs=3)
        assert {k for k in ours if not study.is_sink(k)} == {k for k in theirs if not study.is_sink(k)}, f"{mode}: ran {sorted(ours)}, MultiProc {sorted(theirs)}"
        assert tree_files(root / "out") == expected
        removed = kept_by_multiproc - study.files_under(root / "work")
        assert not removed, f"{mode}: removed {sorted(removed)[:5]} of the killed run's directory"


def test_sea_plan_rerun_says_what_the_rerun_executes(states, tmp_path):
    """`sea plan --rerun` before the rerun of the last-step change: the nodes it says will run are
    the nodes the rerun executes (checkpoints none: no directory left to Nipype's check)."""
    base, tier, saved = states
    root = base / "runs" / "none"
    study.restore(saved["none"], root)
    target = tmp_path / "target.py"
    target.write_text(
        f"import sys\nfrom pathlib import Path\nsys.path.insert(0, {str(TESTS)!r})\nimport rerun_workflows as study\n\n"
        f"def workflow():\n    return study.build(Path({str(root)!r}), {SUBJECTS!r}, threshold=0.25)\n"
    )
    result = subprocess.run([sys.executable, "-m", "sea.cli", "plan", "--rerun", f"{target}:workflow"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    predicted = {line.split()[0] for line in result.stdout.splitlines() if line.startswith(f"    {study.NAME}/")}
    assert "runs: new, or its inputs" in result.stdout and "evicted, and a node that runs needs it" in result.stdout, result.stdout
    executed = study.run(root, "SeaMultiProc", "none", tier, threshold=0.25)
    assert study.nodes(executed) == predicted, f"plan: {sorted(predicted)}\nran: {sorted(study.nodes(executed))}"
    print(result.stdout)


def test_checkpoints_all_leave_a_work_directory_multiproc_reuses_whole(states):
    """Back to MultiProc after Sea with checkpoints: all: every node directory is in the home, with
    result files naming the home and Nipype's own hash files, so MultiProc re-executes nothing but
    its sinks (Nipype hashes files by size and timestamp, which the stager keeps)."""
    base, tier, saved = states
    root = base / "runs" / "all"
    study.restore(saved["all"], root)
    executed = study.run(root, "MultiProc")
    assert {k for k in executed if not study.is_sink(k)} == set(), sorted(executed)
    assert tree_files(root / "out") == tree_files(saved["MultiProc"] / "out")
