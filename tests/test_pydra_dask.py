"""SeaWorker on Dask: Pydra on the real 3-worker cluster of tests/dask_cluster.py, each worker with
its own tier. Each subject's nested workflow runs whole on one worker, on that worker's tier; the
outputs are byte-identical to cf's; no worker opens another's tier; a worker killed mid-run loses
nothing."""

from __future__ import annotations

import filecmp
import os
import re
import signal
import threading
import time

import pytest

pytest.importorskip("distributed")
pytest.importorskip("pydra.compose")

from dask_cluster import *  # noqa: E402, F403 - the cluster fixture, which pytest finds by name
from dask_cluster import SEA, assert_no_foreign_access  # noqa: E402
from pydra.engine.submitter import Submitter  # noqa: E402

from sea import SeaConfigError  # noqa: E402
from sea.report import RunReport  # noqa: E402

from conftest import sea_private_dirs  # noqa: E402
from pydra_workflows import Study, make_images  # noqa: E402


def _files(outputs) -> list:
    return [outputs.mean.fspath, *(f.fspath for f in outputs.copies)]


def _reference(tmp_path, images):
    with Submitter(worker="cf", cache_root=tmp_path / "cf", n_procs=2) as sub:
        theirs = sub(Study(in_files=images))
    assert not theirs.errored
    return theirs


def _assert_same(ours, theirs, home) -> None:
    assert not ours.errored
    for mine, ref in zip(_files(ours.outputs), _files(theirs.outputs), strict=True):
        assert mine.is_relative_to(home) and mine.is_file(), f"{mine} is not in the home"
        assert filecmp.cmp(mine, ref, shallow=False), f"{mine} differs from cf's {ref}"


def test_each_subject_runs_whole_on_one_worker_and_matches_cf(shared_cluster, tmp_path, caplog, monkeypatch):
    """... and the client shows the run's progress: jobs done, those on a worker (a total that grows)."""
    import sea.progress

    monkeypatch.setattr(sea.progress, "EVERY", 0.1)
    address, tiers, client = shared_cluster
    images = make_images(tmp_path / "data", 6, seed=71)
    theirs = _reference(tmp_path, images)
    home = tmp_path / "home"
    with caplog.at_level("INFO", logger="sea"), Submitter(worker="sea", cache_root=home, sea={**SEA, "progress": "lines"}, dask={"address": address}) as sub:
        ours = sub(Study(in_files=images))
    _assert_same(ours, theirs, home)
    progress = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[Sea] progress: ")]
    assert progress and all(re.search(r" \d+/\d+\+ nodes · ", line) for line in progress), progress
    report = RunReport.from_json(home / "sea-report.json")
    print(report.to_text())
    assert report.success and report.nodes_run == 6 * 3 + 1, report.to_text()  # 6 x (scale, smooth, copy) + mean
    assert sum(w.nodes_run for w in report.workers) == report.nodes_run
    assert len([w for w in report.workers if w.nodes_run]) >= 2, "the subjects were not spread over the workers"
    assert report.local_hit_rate == 1.0 and sum(w.bytes_received for w in report.workers) == 0
    assert sum(t.nodes_placed for t in report.tiers) == 6 * 3, "each subject's jobs ran on its worker's tier"
    assert_no_foreign_access(client, tiers)
    assert sea_private_dirs(*tiers.values()) == [], "a tier is not empty at the end"

    with Submitter(worker="sea", cache_root=home, sea=SEA, dask={"address": address}) as sub:
        again = sub(Study(in_files=images))
    _assert_same(again, theirs, home)
    assert RunReport.from_json(home / "sea-report.json").nodes_run == 0, "the second run executed tasks"


def test_a_worker_killed_mid_run_loses_nothing(cluster, tmp_path):
    """SIGKILL the worker process w1 once it finished a job (its nanny starts an empty one): Dask
    runs its subject again elsewhere, which recomputes what was lost with w1's tier (counted) and
    reuses what w1 had committed home; the outputs are cf's."""
    address, tiers, client = cluster
    images = make_images(tmp_path / "data", 6, side=48, seed=72)
    theirs = _reference(tmp_path, images)
    home = tmp_path / "home"
    victim = next(a for a, w in client.scheduler_info()["workers"].items() if w["name"] == "w1")
    pid = client.run(os.getpid, workers=[victim])[victim]
    journal = home / ".sea" / "journal-w1.jsonl"
    killed, ended = threading.Event(), threading.Event()

    def kill_when_busy() -> None:
        while not ended.is_set():
            if journal.exists() and '"done"' in journal.read_text():
                os.kill(pid, signal.SIGKILL)
                killed.set()
                return
            time.sleep(0.005)

    killer = threading.Thread(target=kill_when_busy)
    killer.start()
    try:
        with Submitter(worker="sea", cache_root=home, sea=SEA, dask={"address": address}) as sub:
            ours = sub(Study(in_files=images))
    finally:
        ended.set()
        killer.join()
    assert killed.is_set(), "the run ended before w1 could be killed"
    _assert_same(ours, theirs, home)
    report = RunReport.from_json(home / "sea-report.json")
    print(report.to_text())
    assert report.success and report.nodes_recomputed >= 1, report.to_text()
    client.wait_for_workers(3)
    assert_no_foreign_access(client, tiers, all_used=False)  # w1 is a new process, which may have run nothing
    # the killed process's private directory stays on w1's tier (SLURM empties a job's $SLURM_TMPDIR)
    assert sea_private_dirs(tiers["w0"], tiers["w2"]) == [], "a tier is not empty at the end"



@pytest.mark.parametrize(
    ("dask", "says"),
    [
        ({"cluster": "local", "adress": "x"}, "SeaWorker dask: unknown key 'adress'"),
        ("tcp://x:8786", "SeaWorker dask must be a dict"),
        ({"cluster": "cloud"}, "'cluster'"),
    ],
)
def test_bad_dask_options_fail_in_the_submitter(tmp_path, dask, says):
    with pytest.raises(SeaConfigError, match=says.replace("(", r"\(")) as error:
        Submitter(worker="sea", cache_root=tmp_path, sea=SEA, dask=dask)
    assert "\n" not in str(error.value)


def test_a_tier_missing_on_the_workers_fails_before_any_job(shared_cluster, tmp_path):
    address, tiers, client = shared_cluster
    images = make_images(tmp_path / "data", 2, seed=73)
    home = tmp_path / "home"
    sea = {"tiers": [{"path": "${SEA_TEST_TIER}/missing"}]}
    with pytest.raises(SeaConfigError, match="missing") as error:
        with Submitter(worker="sea", cache_root=home, sea=sea, dask={"address": address}) as sub:
            sub(Study(in_files=images))
    assert "\n" not in str(error.value)
    assert not [p for p in home.iterdir() if p.name.startswith("python-")], "a job ran"
