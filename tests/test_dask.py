"""SeaDask: Nipype on a real Dask cluster of 3 worker processes, each with its own tier directory
(one of them a small tmpfs), as three compute nodes would have.

Outputs are byte-identical to MultiProc's; nodes run where their inputs are; no worker ever opens
another worker's tier (an audit hook in each worker process records every file it opens, lists,
renames or removes under any tier)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("distributed")
from distributed import Client, Nanny, Scheduler, SpecCluster, WorkerPlugin  # noqa: E402

from example_workflows.incrementation.workflow import build_workflow, make_chunks  # noqa: E402
from sea.report import RunReport  # noqa: E402

from conftest import sea_private_dirs, tree_files  # noqa: E402
from nipype_workflows import build_full, make_subjects, run  # noqa: E402

WATCHED = ("open", "os.listdir", "os.scandir", "os.rename", "os.remove", "os.rmdir", "os.mkdir", "shutil.rmtree", "shutil.copyfile")


class AccessLog(WorkerPlugin):
    """Records, in the worker process, every path under ``roots`` that Python code touches."""

    def __init__(self, roots: list[str]):
        self.roots = roots

    def setup(self, worker) -> None:
        seen: set[str] = set()
        roots = tuple(self.roots)

        def hook(event, args):
            if event in WATCHED and args and isinstance(args[0], (str, os.PathLike)):
                path = os.fspath(args[0])
                if path.startswith(roots):
                    seen.add(path)

        sys.addaudithook(hook)  # for the life of the worker process, which ends with the test
        worker.sea_access_log = seen


def access_log(dask_worker=None) -> list[str]:
    return sorted(dask_worker.sea_access_log)


@pytest.fixture
def cluster(tmpfs_factory, shm_dir, tmp_path):
    """Three single-threaded worker processes named w0-w2; ``SEA_TEST_TIER`` is each one's tier."""
    tiers = {"w0": tmpfs_factory("48M"), "w1": shm_dir / "w1", "w2": shm_dir / "w2"}
    tiers["w1"].mkdir()
    tiers["w2"].mkdir()
    tiers = {name: Path(path) for name, path in tiers.items()}
    workers = {name: {"cls": Nanny, "options": {"nthreads": 1, "name": name, "env": {"SEA_TEST_TIER": str(path)}, "local_directory": str(tmp_path / "dask")}} for name, path in tiers.items()}
    with SpecCluster(workers=workers, scheduler={"cls": Scheduler, "options": {"dashboard": False}}) as spec:
        with Client(spec) as client:
            client.wait_for_workers(3)
            client.register_plugin(AccessLog([str(p) for p in tiers.values()]), name="access-log")
            yield spec.scheduler_address, tiers, client
    # the tiers may keep only what a failed test left


# w1 and w2 share /dev/shm's filesystem; each worker sees only its own directory
SEA = {"tiers": [{"path": "${SEA_TEST_TIER}"}], "default_node_size": "1MiB"}


def seadask(address: str, **dask) -> dict:
    return {"dask": {"address": address, **dask}, "sea": SEA}


def assert_no_foreign_access(client, tiers: dict[str, Path]) -> None:
    names = {address: str(info["name"]) for address, info in client.scheduler_info()["workers"].items()}
    for address, paths in client.run(access_log).items():
        mine = tiers[names[address]]
        foreign = [p for p in paths if not Path(p).is_relative_to(mine)]
        assert not foreign, f"{names[address]} opened another worker's tier: {foreign[:3]}"
        assert paths, f"{names[address]} used no tier at all"


def test_incrementation_matches_multiproc_and_stays_local(cluster, disk_dir):
    address, tiers, client = cluster
    chunks = make_chunks(disk_dir / "data", 6, 1.0)
    run(build_workflow(disk_dir / "data", len(chunks), 4, disk_dir / "ref", disk_dir / "ref-out"), "MultiProc")
    wf = build_workflow(disk_dir / "data", len(chunks), 4, disk_dir / "work", disk_dir / "out")
    wf.config["execution"]["poll_sleep_duration"] = 0.05
    wf.run(plugin="SeaDask", plugin_args=seadask(address))
    assert tree_files(disk_dir / "out") == tree_files(disk_dir / "ref-out")
    report = RunReport.from_json(disk_dir / "work" / "sea-report.json")
    assert report.success and len(report.workers) == 3, report.to_text()
    assert all(w.nodes_run > 0 for w in report.workers), report.to_text()
    assert report.local_hit_rate >= 0.95, report.to_text()
    assert_no_foreign_access(client, tiers)
    assert sea_private_dirs(*tiers.values()) == [], "a tier is not empty at the end"


def test_fan_in_matches_multiproc_and_moves_only_what_the_join_needs(cluster, disk_dir):
    address, tiers, client = cluster
    data = disk_dir / "data"
    subjects = make_subjects(data, n_subjects=8, mib=0.5)
    run(build_full(data, subjects, disk_dir / "ref", disk_dir / "ref-out"), "MultiProc")
    wf = build_full(data, subjects, disk_dir / "work", disk_dir / "out")
    wf.config["execution"]["poll_sleep_duration"] = 0.05
    # no work stealing (tests/test_locality.py has it): here the join is the one node away from its inputs
    wf.run(plugin="SeaDask", plugin_args=seadask(address, busy_threshold=100))
    assert tree_files(disk_dir / "out") == tree_files(disk_dir / "ref-out")
    report = RunReport.from_json(disk_dir / "work" / "sea-report.json")
    print(report.to_text())
    assert report.success and report.nodes_run == 8 * 5 + 2
    assert report.local_hit_rate >= 0.95, report.to_text()
    moved = sum(w.bytes_received for w in report.workers)
    assert 0 < moved < 8 * 2**20, "only the scaled images of the subjects run elsewhere reach the join"
    assert_no_foreign_access(client, tiers)
    assert sea_private_dirs(*tiers.values()) == []


def nodes_run_here(dask_worker=None) -> int:
    from sea.node_storage import NAME

    engine = dask_worker.plugins[NAME].engine
    return engine.report.nodes_run if engine is not None else 0


def test_a_worker_killed_mid_run_loses_nothing(cluster, disk_dir):
    """SIGKILL one worker process once it ran a few nodes (its nanny starts a new one, with empty
    tiers): the nodes it was running start again elsewhere, the finished nodes whose data only it
    held and that someone still needs run again (counted), the outputs are MultiProc's."""
    import signal
    import threading
    import time

    address, tiers, client = cluster
    chunks = make_chunks(disk_dir / "data", 6, 2.0)
    run(build_workflow(disk_dir / "data", len(chunks), 6, disk_dir / "ref", disk_dir / "ref-out"), "MultiProc")
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
    wf = build_workflow(disk_dir / "data", len(chunks), 6, disk_dir / "work", disk_dir / "out")
    wf.config["execution"]["poll_sleep_duration"] = 0.05
    wf.run(plugin="SeaDask", plugin_args=seadask(address))
    killer.join()
    assert killed.is_set(), "the run ended before the worker could be killed"
    assert tree_files(disk_dir / "out") == tree_files(disk_dir / "ref-out")
    report = RunReport.from_json(disk_dir / "work" / "sea-report.json")
    print(report.to_text())
    assert report.success and report.nodes_recomputed >= 1, report.to_text()
    client.wait_for_workers(3)
    assert_no_foreign_access(client, tiers)
