"""SeaMultiProc against MultiProc on real workflows, real NIfTI files, real filesystems."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from sea.report import RunReport
from sea.stager import TMP_MARK

from conftest import sea_private_dirs, tree_files
from nipype_workflows import build_full, make_subjects, run

NIPYPE_WF_FILES = {"d3.js", "graph.json", "graph1.json", "index.html"}


@pytest.fixture
def dataset(disk_dir):
    data = disk_dir / "data"
    return data, make_subjects(data)


@pytest.fixture(scope="module")
def reference():
    """The same workflow under Nipype's own MultiProc, on the same data (made alike in a directory of
    its own, once for the module): the outputs Sea must reproduce byte for byte."""
    root = Path(tempfile.mkdtemp(prefix="sea-test-", dir="/var/tmp"))
    try:
        subjects = make_subjects(root / "data")
        run(build_full(root / "data", subjects, root / "ref_work", root / "ref_out"), "MultiProc")
        yield tree_files(root / "ref_out")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def home_leftovers(home: Path) -> list[str]:
    """Files in the home other than Sea's journal/report and Nipype's workflow-level report."""
    left = []
    for dirpath, _dirs, files in os.walk(home):
        for name in files:
            rel = Path(dirpath, name).relative_to(home)
            if rel.parts[0] == ".sea" or str(rel) == "sea-report.json" or name in NIPYPE_WF_FILES:
                continue
            left.append(str(rel))
    return left


def assert_no_temporaries(*roots: Path) -> None:
    for root in roots:
        for dirpath, dirs, files in os.walk(root):
            assert not [n for n in dirs + files if TMP_MARK in n], f"temporary names left in {dirpath}"


def test_outputs_identical_spill_and_clean_tiers(dataset, disk_dir, small_tmpfs, shm_dir, reference):
    data, subjects = dataset
    home, out = disk_dir / "work", disk_dir / "out"
    # without checkpoints: only declared outputs come home (with them, tests/test_reruns.py)
    sea = {"tiers": [{"path": str(small_tmpfs)}, {"path": str(shm_dir)}], "default_node_size": "1MiB", "checkpoints": "none"}
    run(build_full(data, subjects, home, out), "SeaMultiProc", sea)

    assert tree_files(out) == reference
    report = RunReport.from_json(home / "sea-report.json")
    assert report.success and report.nodes_failed == 0
    assert report.nodes_run == report.nodes_total == 17
    small = report.tiers[0]
    assert small.nodes_placed > 0 and small.spills > 0, "the 24 MiB tier should take some nodes and refuse others"
    assert report.tiers[1].nodes_placed > 0
    assert small.peak_bytes <= 24 * 2**20
    assert report.files_flushed == len(reference)
    assert report.files_created_home < report.without_sea_files_home / 3
    # the tiers hold nothing of the run, the home only what the rules say, no temporary names
    assert sea_private_dirs(small_tmpfs, shm_dir) == []
    assert home_leftovers(home) == []
    assert_no_temporaries(home, out)


def test_rerun_executes_no_node(dataset, disk_dir, shm_dir, reference):
    data, subjects = dataset
    home, out = disk_dir / "work", disk_dir / "out"
    sea = {"tiers": [{"path": str(shm_dir)}]}
    run(build_full(data, subjects, home, out), "SeaMultiProc", sea)
    first = {p: os.stat(out / p).st_mtime_ns for p in reference}
    run(build_full(data, subjects, home, out), "SeaMultiProc", sea)
    report = RunReport.from_json(home / "sea-report.json")
    assert report.nodes_run == 0 and report.nodes_cached == report.nodes_total
    assert {p: os.stat(out / p).st_mtime_ns for p in reference} == first, "outputs were rewritten"
    assert tree_files(out) == reference


def test_changed_parameter_reruns_only_downstream_and_what_it_needs(dataset, disk_dir, shm_dir):
    data, subjects = dataset
    home, out = disk_dir / "work", disk_dir / "out"
    sea = {"tiers": [{"path": str(shm_dir)}]}
    run(build_full(data, subjects, home, out), "SeaMultiProc", sea)
    wf = build_full(data, subjects, home, out)
    wf.get_node("group_sink").inputs.container = "group2"  # only the group sink changes
    run(wf, "SeaMultiProc", sea)
    report = RunReport.from_json(home / "sea-report.json")
    # group_sink reruns, so the evicted group_mean and scale (x3) and smooth (x3) it needs run again
    assert 0 < report.nodes_run < report.nodes_total
    assert (out / "group2" / "group_mean.nii").is_file()


def test_disk_tier_with_home_on_another_filesystem(dataset, tmpfs_factory, disk_dir, reference):
    data, subjects = dataset
    shared = tmpfs_factory("256M")  # the 'shared filesystem' is a tmpfs here, the tier is the disk
    home, out = shared / "work", shared / "out"
    run(build_full(data, subjects, home, out), "SeaMultiProc", {"tiers": [{"path": str(disk_dir)}]})
    assert tree_files(out) == reference
    report = RunReport.from_json(home / "sea-report.json")
    assert report.tiers[0].nodes_placed >= report.nodes_total and report.tiers[-1].nodes_placed == 0
    assert sea_private_dirs(disk_dir) == []


def test_keep_intermediates_and_copy_rule(dataset, disk_dir, shm_dir, reference):
    data, subjects = dataset
    home, out = disk_dir / "work", disk_dir / "out"
    sea = {"tiers": [{"path": str(shm_dir)}], "keep_intermediates": True}
    run(build_full(data, subjects, home, out), "SeaMultiProc", sea)
    assert tree_files(out) == reference
    smooth_dirs = list(home.glob("study/preproc/_subject_*/smooth"))
    assert len(smooth_dirs) == 3 and all((d / "result_smooth.pklz").is_file() and not d.is_symlink() for d in smooth_dirs)
    assert_no_temporaries(home)

    home2 = disk_dir / "work2"
    sea = {"tiers": [{"path": str(shm_dir)}], "rules": [{"pattern": "**/_report/**", "mode": "copy"}], "checkpoints": "none"}
    run(build_full(data, subjects, home2, disk_dir / "out2"), "SeaMultiProc", sea)
    reports = list(home2.glob("study/**/_report/report.rst"))
    assert len(reports) >= 17
    assert not list(home2.glob("study/**/result_*.pklz")), "only what the rule names comes home"


def test_enospc_on_a_tier_reruns_the_node_on_the_next(dataset, disk_dir, tmpfs_factory, shm_dir):
    data, subjects = dataset
    tiny = tmpfs_factory("32M")
    home, out = disk_dir / "work", disk_dir / "out"
    sea = {"tiers": [{"path": str(tiny)}, {"path": str(shm_dir)}], "default_node_size": "1KiB"}
    run(build_full(data, subjects[:1], home, out, big_mib=40), "SeaMultiProc", sea)
    report = RunReport.from_json(home / "sea-report.json")
    assert report.success and report.enospc_retries >= 1
    assert sea_private_dirs(tiny, shm_dir) == []
    assert (out / "group" / "big.bin").stat().st_size == 40 * 2**20


def test_failing_node_behaves_like_multiproc_and_siblings_are_committed(dataset, disk_dir, shm_dir):
    data, subjects = dataset
    home, out = disk_dir / "work", disk_dir / "out"
    with pytest.raises(RuntimeError):
        run(build_full(data, subjects, home, out, fail=True), "SeaMultiProc", {"tiers": [{"path": str(shm_dir)}]})
    report = RunReport.from_json(home / "sea-report.json")
    assert not report.success and report.nodes_failed == 1
    assert (out / "group" / "group_mean.nii").is_file()
    assert len(list(out.glob("func/sub-*/desc-smooth_bold.nii"))) == 3
    # the crashed node's directory is brought home to inspect; nothing stays on the tier
    assert (home / "study" / "explode").is_dir()
    assert sea_private_dirs(shm_dir) == []


def test_stop_on_first_crash(dataset, disk_dir, shm_dir):
    data, subjects = dataset
    wf = build_full(data, subjects, disk_dir / "work", disk_dir / "out", fail=True)
    wf.config["execution"]["stop_on_first_crash"] = True
    with pytest.raises(RuntimeError):
        run(wf, "SeaMultiProc", {"tiers": [{"path": str(shm_dir)}]})
    assert sea_private_dirs(shm_dir) == []


def test_report_json_has_the_issue_fields(dataset, disk_dir, shm_dir):
    data, subjects = dataset
    home = disk_dir / "work"
    run(
        build_full(data, subjects, home, disk_dir / "out"),
        "SeaMultiProc",
        {"tiers": [{"path": str(shm_dir)}], "report": "reports/run.json"},
    )
    fields = json.loads((home / "reports" / "run.json").read_text())
    for key in (
        "tiers",
        "bytes_flushed",
        "files_flushed",
        "bytes_evicted",
        "stager_wait_seconds",
        "files_created_home",
        "without_sea_bytes_home",
    ):
        assert key in fields
    assert {"peak_bytes", "bytes_written", "nodes_placed", "spills"} <= set(fields["tiers"][0])


def test_rules_on_declared_outputs_remove_and_keep(dataset, disk_dir, shm_dir, caplog):
    data, subjects = dataset
    home, out = disk_dir / "work", disk_dir / "out"
    sea = {
        "tiers": [{"path": str(shm_dir)}],
        "rules": [
            {"pattern": "**/image.nii.gz", "mode": "remove"},  # a declared output the user does not want home
            {"pattern": "**/group_mean.nii", "mode": "keep"},  # left on the fast tier after the run
            {"pattern": "study/**/*.mat", "mode": "copy"},  # may match at run time: a warning, not an error
        ],
    }
    run(build_full(data, subjects, home, out), "SeaMultiProc", sea)
    assert not list(out.rglob("image.nii.gz"))
    assert not (out / "group" / "group_mean.nii").exists()
    kept = list(shm_dir.rglob("group_mean.nii"))
    assert kept and all(k.is_relative_to(shm_dir) for k in kept)
    assert len(list(out.glob("func/sub-*/desc-smooth_bold.nii"))) == 3
    assert any("may match files made at run time" in r.getMessage() for r in caplog.records)
