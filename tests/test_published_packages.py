"""Published task packages used the way their users do, under the engines' own workers and under
Sea, byte-identical: Pydra's ``pydra-tasks-dcm2niix`` and ``pydra-tasks-mrtrix3`` (a DICOM series
to NIfTI, then MRtrix3 tools, with side-car and union output types), and Nipype's ``Dcm2niix`` and
``Gunzip`` interfaces with a DataSink. The tools are Debian's (``dcm2niix``, ``mrtrix3``)."""

import shutil
from pathlib import Path

import pytest

from sea.report import RunReport

from conftest import sea_private_dirs, tree_files
from dicom_series import write_series

pytestmark = pytest.mark.skipif(
    any(shutil.which(tool) is None for tool in ("dcm2niix", "mrconvert")),
    reason="dcm2niix and MRtrix3 are not installed (apt-get install dcm2niix mrtrix3: the suite installs them itself when run as root on Debian)",
)


def test_pydra_task_packages_identical_under_sea(disk_dir, shm_dir):
    pytest.importorskip("pydra.compose", reason="Pydra 1.0 needs Python >= 3.11")
    from fileformats.medimage import DicomDir
    from pydra.compose import workflow
    from pydra.engine.submitter import Submitter
    from pydra.tasks.dcm2niix import Dcm2Niix
    from pydra.tasks.mrtrix3.v3_1 import MrConvert, MrMath

    @workflow.define(outputs=["nifti", "converted", "mean"])
    def Convert(in_dir: DicomDir):
        dcm = workflow.add(Dcm2Niix(in_dir=in_dir, compress="y", out_dir=Path("."), filename="sub01"), name="dcm2niix")
        conv = workflow.add(MrConvert(in_file=dcm.out_file, out_file="converted.nii.gz", datatype="float32"), name="mrconvert")
        mean = workflow.add(MrMath(in_file=conv.out_file, operation="mean", axis=2, out_file="mean.nii.gz"), name="mrmath")
        return dcm.out_file, conv.out_file, mean.out_file

    series = DicomDir(write_series(disk_dir / "dicom"))
    outputs = {}
    for worker, options in (("cf", {}), ("sea", {"sea": {"tiers": [{"path": str(shm_dir)}]}})):
        with Submitter(worker=worker, cache_root=disk_dir / f"work-{worker}", n_procs=2, **options) as submitter:
            result = submitter(Convert(in_dir=series))
        assert not result.errored, result.errors
        outputs[worker] = {name: {Path(p).name: Path(p).read_bytes() for p in getattr(result.outputs, name).fspaths} for name in ("nifti", "converted", "mean")}
        assert all(Path(p).is_relative_to(disk_dir / f"work-{worker}") for name in outputs[worker] for p in getattr(result.outputs, name).fspaths)
    assert outputs["sea"] == outputs["cf"]
    assert set(outputs["cf"]["nifti"]) == {"sub01.nii.gz"}
    report = RunReport.from_json(disk_dir / "work-sea" / "sea-report.json")
    assert report.success and report.nodes_run == 3, report.to_text()
    assert sea_private_dirs(shm_dir) == []


def test_nipype_interfaces_identical_under_sea(disk_dir, shm_dir):
    from nipype import Node, Workflow
    from nipype.algorithms.misc import Gunzip
    from nipype.interfaces.dcm2nii import Dcm2niix
    from nipype.interfaces.io import DataSink

    series = write_series(disk_dir / "dicom", slices=8)
    for tag, plugin, args in (("mp", "MultiProc", {}), ("sea", "SeaMultiProc", {"sea": {"tiers": [{"path": str(shm_dir)}]}})):
        wf = Workflow(name="dicom", base_dir=str(disk_dir / f"work-{tag}"))
        convert = Node(Dcm2niix(source_dir=str(series), out_filename="sub01", compress="y", bids_format=True), name="dcm2niix")
        gunzip = Node(Gunzip(), name="gunzip")
        sink = Node(DataSink(base_directory=str(disk_dir / f"out-{tag}")), name="sink")
        wf.connect(convert, "converted_files", gunzip, "in_file")
        wf.connect(convert, "converted_files", sink, "anat.@nii_gz")
        wf.connect(convert, "bids", sink, "anat.@json")
        wf.connect(gunzip, "out_file", sink, "anat.@nii")
        wf.config["execution"]["poll_sleep_duration"] = 0.05
        wf.run(plugin=plugin, plugin_args={"n_procs": 2, **args})
    reference = tree_files(disk_dir / "out-mp")
    assert sorted(reference) == ["anat/sub01.json", "anat/sub01.nii", "anat/sub01.nii.gz"]
    assert tree_files(disk_dir / "out-sea") == reference
    report = RunReport.from_json(disk_dir / "work-sea" / "sea-report.json")
    assert report.success and report.nodes_run == 3, report.to_text()
    assert sea_private_dirs(shm_dir) == []
