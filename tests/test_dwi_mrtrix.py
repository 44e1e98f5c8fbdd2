"""The MRtrix3 example (example_workflows/dwi_mrtrix): real command-line tools (Debian's mrtrix3)
driven by Nipype's mrtrix3 interfaces give byte-identical outputs under MultiProc and SeaMultiProc."""

from __future__ import annotations

import shutil

import pytest

from example_workflows.dwi_mrtrix import TOOLS, build_workflow, make_dataset
from sea.report import RunReport

from conftest import sea_private_dirs, tree_files

pytestmark = pytest.mark.skipif(
    any(shutil.which(tool) is None for tool in TOOLS), reason="MRtrix3 is not installed (apt-get install mrtrix3: the suite installs it itself when run as root on Debian)"
)


def test_mrtrix_outputs_identical_under_sea(disk_dir, shm_dir):
    subjects = make_dataset(disk_dir / "bids", n_subjects=2, matrix=16, n_directions=8)
    for tag, plugin, args in [("mp", "MultiProc", {}), ("sea", "SeaMultiProc", {"sea": {"tiers": [{"path": str(shm_dir)}]}})]:
        wf = build_workflow(disk_dir / "bids", subjects, disk_dir / f"work-{tag}", disk_dir / f"out-{tag}")
        wf.config["execution"]["poll_sleep_duration"] = 0.05
        wf.run(plugin=plugin, plugin_args={"n_procs": 2, **args})
    reference = tree_files(disk_dir / "out-mp")
    assert len(reference) == 8 * len(subjects), sorted(reference)  # FA, MD, AD, RD, mask, DWI + bval/bvec
    assert tree_files(disk_dir / "out-sea") == reference
    report = RunReport.from_json(disk_dir / "work-sea" / "sea-report.json")
    assert report.success and report.nodes_run == 11 * len(subjects), report.to_text()
    assert report.tiers[0].nodes_placed == 11 * len(subjects), "a node ran outside the tier"
    assert sea_private_dirs(shm_dir) == []
