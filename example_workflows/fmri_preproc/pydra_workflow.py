"""The same pipeline in Pydra 1.0: the steps of :mod:`.steps` as python tasks, one nested workflow
per subject (so on Dask each subject runs whole on one worker's tiers, see docs/pydra.md), split
over the subjects. Its outputs stay in Pydra's cache (the workflow's directory), as Pydra's do."""

from __future__ import annotations

from pathlib import Path

from fileformats.generic import File
from pydra.compose import python, workflow

from . import steps


@python.define(outputs=["out_file"])
def Reorient(in_file: File) -> File:
    return File(steps.reorient(str(in_file)))


@python.define(outputs=["out_file"])
def SliceTiming(in_file: File, sidecar: File) -> File:
    return File(steps.slice_timing(str(in_file), str(sidecar)))


@python.define(outputs=["out_file", "par_file"])
def MotionCorrect(in_file: File) -> tuple[File, File]:
    out_file, par_file = steps.motion_correct(str(in_file))
    return File(out_file), File(par_file)


@python.define(outputs=["mean_file", "mask_file"])
def BrainMask(in_file: File) -> tuple[File, File]:
    mean_file, mask_file = steps.brain_mask(str(in_file))
    return File(mean_file), File(mask_file)


@python.define(outputs=["out_file"])
def Smooth(in_file: File, fwhm: float = 6.0) -> File:
    return File(steps.smooth(str(in_file), fwhm))


@python.define(outputs=["out_file", "confounds"])
def Clean(in_file: File, mask_file: File, par_file: File, low_hz: float = 0.01, high_hz: float = 0.1) -> tuple[File, File]:
    out_file, confounds = steps.clean(str(in_file), str(mask_file), str(par_file), low_hz, high_hz)
    return File(out_file), File(confounds)


@python.define(outputs=["out_file"])
def ParcelTimeseries(in_file: File, atlas: File) -> File:
    return File(steps.parcel_timeseries(str(in_file), str(atlas)))


@python.define(outputs=["out_file"])
def Connectivity(in_file: File) -> File:
    return File(steps.connectivity(str(in_file)))


@workflow.define(outputs=["bold", "mask", "timeseries", "connectivity"])
def Subject(bids_dir: str, subject: str, fwhm: float = 6.0) -> tuple[File, File, File, File]:
    """One subject, from the raw run to its connectivity matrix."""
    func = Path(bids_dir) / f"sub-{subject}" / "func"
    bold, sidecar = File(func / f"sub-{subject}_task-rest_bold.nii.gz"), File(func / f"sub-{subject}_task-rest_bold.json")
    atlas = File(Path(bids_dir) / "derivatives" / "atlas" / "atlas-blocks_dseg.nii.gz")
    reorient = workflow.add(Reorient(in_file=bold), name="reorient")
    stc = workflow.add(SliceTiming(in_file=reorient.out_file, sidecar=sidecar), name="slice_timing")
    mcf = workflow.add(MotionCorrect(in_file=stc.out_file), name="motion_correct")
    mask = workflow.add(BrainMask(in_file=mcf.out_file), name="brain_mask")
    smooth = workflow.add(Smooth(in_file=mcf.out_file, fwhm=fwhm), name="smooth")
    clean = workflow.add(Clean(in_file=smooth.out_file, mask_file=mask.mask_file, par_file=mcf.par_file), name="clean")
    parcels = workflow.add(ParcelTimeseries(in_file=clean.out_file, atlas=atlas), name="parcels")
    conn = workflow.add(Connectivity(in_file=parcels.out_file), name="connectivity")
    return clean.out_file, mask.mask_file, parcels.out_file, conn.out_file


@workflow.define(outputs=["bold", "mask", "timeseries", "connectivity"])
def Study(bids_dir: str, subjects: list[str], fwhm: float = 6.0) -> tuple[list[File], list[File], list[File], list[File]]:
    """Every subject of the dataset, each its own nested workflow."""
    subject = workflow.add(Subject(bids_dir=bids_dir, fwhm=fwhm).split(subject=subjects).combine("subject"), name="subject")
    return subject.bold, subject.mask, subject.timeseries, subject.connectivity
