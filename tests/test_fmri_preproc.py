"""The fMRIPrep-like example (example_workflows/fmri_preproc): its BIDS dataset, and its derivatives
byte-identical under MultiProc, SeaMultiProc and Pydra's Sea worker (each with and without prefetch) and Pydra's cf worker."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import nibabel as nib
import pytest

from example_workflows.fmri_preproc import build_workflow, make_dataset
from sea.report import RunReport

from conftest import sea_private_dirs, tree_files

SIZE = {"n_subjects": 2, "volumes": 16, "matrix": 20}


def test_the_dataset_is_bids_and_the_same_every_time(tmp_path):
    subjects = make_dataset(tmp_path / "a", **SIZE)
    make_dataset(tmp_path / "b", **SIZE)
    assert subjects == ["01", "02"]
    bold = tmp_path / "a" / "sub-01" / "func" / "sub-01_task-rest_bold.nii.gz"
    sidecar = json.loads(bold.with_name("sub-01_task-rest_bold.json").read_text())
    assert len(sidecar["SliceTiming"]) == SIZE["matrix"] and sidecar["RepetitionTime"] > 0
    image = nib.load(bold)
    assert image.shape == (20, 20, 20, 16) and nib.aff2axcodes(image.affine) == ("L", "A", "S")
    assert (tmp_path / "a" / "dataset_description.json").is_file()
    for a, b in zip(sorted((tmp_path / "a").rglob("*.nii.gz")), sorted((tmp_path / "b").rglob("*.nii.gz")), strict=True):
        assert nib.load(a).get_fdata().tobytes() == nib.load(b).get_fdata().tobytes()


def test_nipype_derivatives_identical_under_sea_with_and_without_prefetch(disk_dir, shm_dir):
    subjects = make_dataset(disk_dir / "bids", **SIZE)
    runs = [("mp", "MultiProc", None), ("sea", "SeaMultiProc", False), ("prefetch", "SeaMultiProc", True)]
    for tag, plugin, prefetch in runs:
        wf = build_workflow(disk_dir / "bids", subjects, disk_dir / f"work-{tag}", disk_dir / f"derivatives-{tag}")
        wf.config["execution"]["poll_sleep_duration"] = 0.05
        sea = {"tiers": [{"path": str(shm_dir)}], "sinks": ["DerivativesDataSink"], "prefetch": prefetch}
        wf.run(plugin=plugin, plugin_args={"n_procs": 2, **({"sea": sea} if prefetch is not None else {})})
    reference = tree_files(disk_dir / "derivatives-mp")
    assert len(reference) == 5 * len(subjects), sorted(reference)
    assert "sub-01/func/sub-01_task-rest_desc-preproc_bold.nii" in reference
    for tag in ("sea", "prefetch"):
        assert tree_files(disk_dir / f"derivatives-{tag}") == reference, f"{tag} differs from MultiProc"
        report = RunReport.from_json(disk_dir / f"work-{tag}" / "sea-report.json")
        assert report.success and report.nodes_run == 14 * len(subjects), report.to_text()  # 8 steps, SelectFiles, 5 sinks
        # the derivatives, Sea's journal, history, report and the run's own copy of it, and the checkpoints: no other node directory
        # (and the files of a checkpoint the run's end cut short, copied home and removed)
        home_files = 5 * len(subjects) + 4 + report.checkpoint_files + report.checkpoint_files_dropped
        assert report.files_created_home <= home_files, report.to_text()
    prefetched = RunReport.from_json(disk_dir / "work-prefetch" / "sea-report.json")
    # each run and its sidecar, and the atlas every subject's parcels node reads; the sinks only name the run
    assert prefetched.prefetch_files == 2 * len(subjects) + 1, prefetched.to_text()
    assert prefetched.prefetch_hits == 3 * len(subjects) and prefetched.prefetch_misses == 0, prefetched.to_text()
    assert sea_private_dirs(shm_dir) == []


@pytest.mark.skipif(sys.version_info < (3, 11), reason="Pydra 1.0 needs Python >= 3.11")
def test_pydra_outputs_identical_under_sea(tmp_path, shm_dir):
    from pydra.engine.submitter import Submitter

    from example_workflows.fmri_preproc.pydra_workflow import Study

    subjects = make_dataset(tmp_path / "bids", **SIZE)
    digests = {}
    tiers = [{"path": str(shm_dir)}]
    runs = [("cf", "cf", {}), ("sea", "sea", {"sea": {"tiers": tiers}}), ("prefetch", "sea", {"sea": {"tiers": tiers, "prefetch": True}})]
    for tag, worker, options in runs:
        with Submitter(worker=worker, cache_root=tmp_path / tag, n_procs=2, **options) as submitter:
            result = submitter(Study(bids_dir=str(tmp_path / "bids"), subjects=subjects))
        assert not result.errored
        files = [Path(f) for name in ("bold", "mask", "timeseries", "connectivity") for f in getattr(result.outputs, name)]
        digests[tag] = [(f.name, hashlib.md5(f.read_bytes()).hexdigest()) for f in files]
    assert len(digests["cf"]) == 4 * len(subjects) and digests["sea"] == digests["cf"] and digests["prefetch"] == digests["cf"]
    prefetched = RunReport.from_json(tmp_path / "prefetch" / "sea-report.json")
    # each subject's bold image and sidecar, and the atlas every subject's parcellation reads: Pydra
    # makes a job when it can run, so the atlas's copy may be gone (its readers so far finished)
    # before the next subject's reader appears, and is made again
    assert 2 * len(subjects) + 1 <= prefetched.prefetch_files <= 3 * len(subjects), prefetched.to_text()
    assert prefetched.prefetch_hits == 3 * len(subjects) and prefetched.prefetch_misses == 0, prefetched.to_text()
    assert sea_private_dirs(shm_dir) == []
