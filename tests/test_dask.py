"""SeaDask: Nipype on a real Dask cluster of 3 worker processes, each with its own tier directory
(one of them a small tmpfs), as three compute nodes would have.

Outputs are byte-identical to MultiProc's; nodes run where their inputs are; no worker ever opens
another worker's tier (an audit hook in each worker process records every file it opens, lists,
renames or removes under any tier)."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

pytest.importorskip("distributed")

from dask_cluster import *  # noqa: E402, F403 - the cluster fixture, which pytest finds by name
from dask_cluster import SEA, assert_no_foreign_access  # noqa: E402

from example_workflows.incrementation.workflow import build_workflow, make_chunks  # noqa: E402
from sea.report import RunReport  # noqa: E402

from conftest import sea_private_dirs, tree_files  # noqa: E402
from example_runs import ROOT  # noqa: E402
from nipype_workflows import build_full, make_subjects, run  # noqa: E402


def seadask(address: str, **dask) -> dict:
    return {"dask": {"address": address, **dask}, "sea": SEA}


CHUNKS, CHUNK_MIB, ITERATIONS = 6, 2.0, 4  # the incrementation every test here runs
NODES = CHUNKS * (ITERATIONS + 2)  # 36: each chunk's chain, its selection and its sink


@pytest.fixture(scope="module")
def multiproc_outputs(tmp_path_factory) -> dict[str, bytes]:
    """MultiProc's outputs of the incrementation (its data is made the same in every directory),
    run once for the tests of this module that compare with them."""
    reference = tmp_path_factory.mktemp("multiproc")
    run(build_workflow(*incrementation_data(reference), ITERATIONS, reference / "work", reference / "out"), "MultiProc")
    return tree_files(reference / "out")


def incrementation_data(root: Path) -> tuple[Path, int]:
    return root / "data", len(make_chunks(root / "data", CHUNKS, CHUNK_MIB))


def test_incrementation_matches_multiproc_and_stays_local(shared_cluster, multiproc_outputs, disk_dir, caplog, monkeypatch):
    """The driver shows the run's progress: nodes done of the total, and the running ones by worker."""
    import sea.progress

    monkeypatch.setattr(sea.progress, "EVERY", 0.1)
    address, tiers, client = shared_cluster
    wf = build_workflow(*incrementation_data(disk_dir), ITERATIONS, disk_dir / "work", disk_dir / "out")
    wf.config["execution"]["poll_sleep_duration"] = 0.05
    with caplog.at_level("INFO", logger="sea"):
        wf.run(plugin="SeaDask", plugin_args={**seadask(address), "sea": {**SEA, "progress": "lines"}})
    progress = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[Sea] progress: ")]
    assert progress and all(re.search(rf" \d+/{NODES} nodes · ", line) for line in progress), progress
    assert any(re.search(r"running: \S+@\w+", line) for line in progress), progress
    assert tree_files(disk_dir / "out") == multiproc_outputs
    report = RunReport.from_json(disk_dir / "work" / "sea-report.json")
    assert report.success and len(report.workers) == 3, report.to_text()
    assert all(w.nodes_run > 0 for w in report.workers), report.to_text()
    assert report.local_hit_rate >= 0.95, report.to_text()
    # each worker's tier is RAM (a tmpfs, /dev/shm): its machine's memory is in the report, by worker
    assert all(w.memory is not None and w.memory.limit_bytes > 0 for w in report.workers), report.to_text()
    assert all(f"  {w.worker}'s memory: peak " in report.to_text() for w in report.workers), report.to_text()
    assert_no_foreign_access(client, tiers)
    assert sea_private_dirs(*tiers.values()) == [], "a tier is not empty at the end"


STUDY_SUBJECTS, STUDY_MIB = 6, 0.5  # the study both tests below run


@pytest.fixture(scope="module")
def multiproc_study_outputs(tmp_path_factory) -> dict[str, bytes]:
    """MultiProc's outputs of the study (its data is made the same in every directory), run once."""
    reference = tmp_path_factory.mktemp("multiproc-study")
    subjects = make_subjects(reference / "data", n_subjects=STUDY_SUBJECTS, mib=STUDY_MIB)
    run(build_full(reference / "data", subjects, reference / "work", reference / "out"), "MultiProc")
    return tree_files(reference / "out")


def _study_matches_multiproc(disk_dir: Path, expected: dict[str, bytes], plugin_args: dict) -> RunReport:
    """The study workflow (grabbers, chains, a MapNode, a join, sinks) under SeaDask: MultiProc's
    outputs. SeaDask's report."""
    data = disk_dir / "data"
    subjects = make_subjects(data, n_subjects=STUDY_SUBJECTS, mib=STUDY_MIB)
    wf = build_full(data, subjects, disk_dir / "work", disk_dir / "out")
    wf.config["execution"]["poll_sleep_duration"] = 0.05
    wf.run(plugin="SeaDask", plugin_args=plugin_args)
    assert tree_files(disk_dir / "out") == expected
    report = RunReport.from_json(disk_dir / "work" / "sea-report.json")
    print(report.to_text())
    return report


def test_prefetch_copies_to_each_workers_tier_what_the_nodes_sent_there_read(shared_cluster, multiproc_study_outputs, disk_dir):
    """The grabbers hand each subject's image to its first step, which waits in a worker's queue:
    that worker copies it to its own tier ahead, and the step reads the copy."""
    from nipype.pipeline.engine.utils import loadpkl

    address, tiers, client = shared_cluster
    report = _study_matches_multiproc(disk_dir, multiproc_study_outputs, {**seadask(address), "sea": {**SEA, "prefetch": True, "keep_intermediates": True}})
    assert report.success and report.prefetch_files == STUDY_SUBJECTS, report.to_text()  # each subject's image, found through its grabber
    assert report.prefetch_hits + report.prefetch_misses == STUDY_SUBJECTS and report.prefetch_hits >= 3, report.to_text()
    read = sorted(str(loadpkl(p).inputs["in_file"]) for p in (disk_dir / "work").rglob("result_smooth.pklz"))
    copies = [path for path in read if "/.prefetch/" in path]
    assert len(read) == STUDY_SUBJECTS and len(copies) == report.prefetch_hits, read
    assert all(any(path.startswith(str(tier)) for tier in tiers.values()) for path in copies), read
    assert_no_foreign_access(client, tiers)
    assert sea_private_dirs(*tiers.values()) == [], "a copy was left on a tier"


def test_fan_in_matches_multiproc_and_moves_only_what_the_join_needs(shared_cluster, multiproc_study_outputs, disk_dir):
    address, tiers, client = shared_cluster
    # no work stealing (tests/test_locality.py has it): here the join is the one node away from its inputs
    report = _study_matches_multiproc(disk_dir, multiproc_study_outputs, seadask(address, busy_threshold=100))
    assert report.success and report.nodes_run == STUDY_SUBJECTS * 5 + 2
    assert report.local_hit_rate >= 0.95, report.to_text()
    moved = sum(w.bytes_received for w in report.workers)
    assert 0 < moved < STUDY_SUBJECTS * 2**20, "only the scaled images of the subjects run elsewhere reach the join"
    assert_no_foreign_access(client, tiers)
    assert sea_private_dirs(*tiers.values()) == []


def nodes_run_here(dask_worker=None) -> int:
    from sea.dask.node_storage import NAME

    engines = [plugin.engine for name, plugin in dask_worker.plugins.items() if name.startswith(NAME) and plugin.engine is not None]
    return sum(engine.report.nodes_run for engine in engines)  # (none before the run registered its own)


def test_a_worker_killed_mid_run_loses_nothing(cluster, multiproc_outputs, disk_dir):
    """SIGKILL one worker process once it ran a few nodes (its nanny starts a new one, with empty
    tiers): the nodes it was running start again elsewhere, the finished nodes whose data only it
    held and that someone still needs run again (counted), the outputs are MultiProc's."""
    import signal
    import threading
    import time

    address, tiers, client = cluster
    victim = next(a for a, w in client.scheduler_info()["workers"].items() if w["name"] == "w1")
    pid = client.run(os.getpid, workers=[victim])[victim]
    killed = threading.Event()

    def kill_when_busy() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if client.run(nodes_run_here, workers=[victim]).get(victim, 0) >= 4:
                    os.kill(pid, signal.SIGKILL)
                    killed.set()
                    return
            except Exception:  # noqa: BLE001 - the plugin is not set up yet
                pass
            time.sleep(0.02)

    killer = threading.Thread(target=kill_when_busy)
    killer.start()
    wf = build_workflow(*incrementation_data(disk_dir), ITERATIONS, disk_dir / "work", disk_dir / "out")
    wf.config["execution"]["poll_sleep_duration"] = 0.05
    wf.run(plugin="SeaDask", plugin_args=seadask(address))
    killer.join()
    assert killed.is_set(), "the run ended before the worker could be killed"
    assert tree_files(disk_dir / "out") == multiproc_outputs
    report = RunReport.from_json(disk_dir / "work" / "sea-report.json")
    print(report.to_text())
    assert report.success and report.nodes_recomputed >= 1, report.to_text()
    client.wait_for_workers(3)
    assert_no_foreign_access(client, tiers, all_used=False)  # w1 restarted may have come up once the run ended


def test_two_runs_at_once_on_one_cluster_each_give_multiprocs_outputs(shared_cluster, multiproc_outputs, disk_dir):
    """Two runs (two users' on one scheduler, or a user's two subjects) at once on one cluster:
    each registered its workers' storage under one name, and its tasks under the same keys, so
    one run's nodes ran in the other's storage, read its paths, and both failed (the seventeenth
    adversarial pass; Pydra's hung). Each run has its own now: both give MultiProc's outputs."""
    import subprocess
    import sys

    address, tiers, client = shared_cluster
    procs = {}
    for run_name in ("first", "second"):
        root = disk_dir / run_name
        root.mkdir()
        (root / "sea.yml").write_text("tiers:\n  - path: ${SEA_TEST_TIER}\n")
        command = [sys.executable, "-m", "example_workflows.incrementation", "--root", str(root), "--chunks", str(CHUNKS), "--chunk-mib", str(CHUNK_MIB),
                   "--iterations", str(ITERATIONS), "--plugin", "SeaDask", "--dask-address", address, "--sea", str(root / "sea.yml")]  # fmt: skip
        procs[run_name] = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT)
    for run_name, proc in procs.items():
        output, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, output.decode()[-3000:]
        assert tree_files(disk_dir / run_name / "out") == multiproc_outputs, run_name
    assert not [name for name in client.run(lambda dask_worker: list(dask_worker.plugins)).values() for name in name if name.startswith("sea-node-storage")], "a run's storage outlived it"
    assert sea_private_dirs(*tiers.values()) == []


# SIGTERM (what SLURM sends) by default; SIGINT takes the same path here (tests/test_interrupt.py has both
# signals through MultiProc-like runs) and runs with --run-slow
@pytest.mark.parametrize("signum", [pytest.param(signal.SIGINT, marks=pytest.mark.slow), signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stopped_driver_commits_what_is_under_way_and_a_rerun_completes(shared_cluster, multiproc_outputs, disk_dir, signum):
    """Ctrl-C or SLURM's SIGTERM to the driver (the workers are other jobs, and live on): it exits
    within seconds, nothing is left half-copied in the home, every worker's journal records the
    stop, the live workers' tiers are empty, and the same command run again gives MultiProc's outputs.
    The workers live on as they were: the module's cluster."""
    import subprocess
    import sys
    import time

    from sea.stager import TMP_MARK

    address, tiers, client = shared_cluster
    root = disk_dir / "stopped"
    root.mkdir()
    (root / "sea.yml").write_text("tiers:\n  - path: ${SEA_TEST_TIER}\ndefault_node_size: 1MiB\n")
    command = [sys.executable, "-m", "example_workflows.incrementation", "--root", str(root), "--chunks", str(CHUNKS), "--chunk-mib", str(CHUNK_MIB),
               "--iterations", str(ITERATIONS), "--plugin", "SeaDask", "--dask-address", address, "--sea", str(root / "sea.yml")]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)

    def done() -> int:
        return sum(p.read_text().count('"done"') for p in (root / "work" / ".sea").glob("journal-*.jsonl"))

    deadline = time.monotonic() + 120
    while done() < 8 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before it could be stopped"
    stopped_at = time.monotonic()
    os.killpg(proc.pid, signum)
    output, _ = proc.communicate(timeout=60)
    took = time.monotonic() - stopped_at
    assert proc.returncode != 0, "a stopped run reported success"
    assert [p for p in root.rglob(f"*{TMP_MARK}*")] == [], "a copy was left half-done"
    assert (root / "work" / "sea-report.json").exists(), f"no report after the stop (exit {proc.returncode}):\n{output.decode()[-3000:]}"
    report = RunReport.from_json(root / "work" / "sea-report.json")
    assert report.interrupted and not report.success, output.decode()[-2000:]
    assert report.kept_dirs == [], "a node still running on its worker had its files reported as kept on purpose"
    journals = list((root / "work" / ".sea").glob("journal-*.jsonl"))
    assert journals and all('"interrupted"' in j.read_text() for j in journals), "a worker's journal does not record the stop"
    # a node running when the driver stopped runs on to its end on its worker (Dask cannot stop a
    # running task), then removes what it wrote and Sea's directory: the tiers end empty
    deadline = time.monotonic() + 60
    while sea_private_dirs(*tiers.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [str(f) for d in sea_private_dirs(*tiers.values()) for f in d.rglob("*")]
    assert sea_private_dirs(*tiers.values()) == [], f"a tier is not empty after the stop: {left[:8]}"

    rerun = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-2000:]
    assert tree_files(root / "out") == multiproc_outputs
    print(f"\nSeaDask {signal.Signals(signum).name}: stopped in {took:.2f} s, {report.files_flushed} files committed before stopping")
