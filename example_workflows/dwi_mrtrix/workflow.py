"""A diffusion pipeline driving the MRtrix3 command-line tools through Nipype's
``nipype.interfaces.mrtrix3`` interfaces, unchanged: mrconvert (NIfTI + FSL gradients to .mif),
dwidenoise, mrdegibbs, dwi2mask, dwi2tensor and tensor2metric, then DataSink.

Sea places each node's directory (where the tools write) on a fast tier without intercepting the
tools: any command-line program works, whether it reads its inputs statically or discovers them.
The derivatives are NIfTI (MRtrix's .mif headers record each command line, paths included).
"""

from __future__ import annotations

from pathlib import Path

from nipype import IdentityInterface, Node, SelectFiles, Workflow
from nipype.interfaces.io import DataSink
from nipype.interfaces.mrtrix3 import BrainMask, DWIDenoise, FitTensor, MRConvert, MRDeGibbs, TensorMetrics
from nipype.interfaces.utility import Function

TOOLS = ("mrconvert", "dwidenoise", "mrdegibbs", "dwi2mask", "dwi2tensor", "tensor2metric")


def _pair(bvec, bval):
    return (bvec, bval)


def build_workflow(bids_dir: Path, subjects: list[str], base_dir: Path, out_dir: Path, nthreads: int = 1) -> Workflow:
    """``nthreads``: each MRtrix command's threads (one per node keeps the outputs identical to a
    single-threaded run, and leaves the parallelism to the plugin's processes)."""
    wf = Workflow(name="dwi_mrtrix", base_dir=str(base_dir))
    subject = Node(IdentityInterface(fields=["subject"]), name="subjects")
    subject.iterables = ("subject", subjects)
    templates = {
        "dwi": "sub-{subject}/dwi/sub-{subject}_dwi.nii.gz",
        "bval": "sub-{subject}/dwi/sub-{subject}_dwi.bval",
        "bvec": "sub-{subject}/dwi/sub-{subject}_dwi.bvec",
    }
    select = Node(SelectFiles(templates, base_directory=str(bids_dir)), name="select")
    gradients = Node(Function(input_names=["bvec", "bval"], output_names=["grad_fsl"], function=_pair), name="gradients")
    convert = Node(MRConvert(out_file="dwi.mif", nthreads=nthreads), name="mrconvert")
    denoise = Node(DWIDenoise(out_file="dwi_denoised.mif", noise="noise.mif", nthreads=nthreads), name="dwidenoise")
    degibbs = Node(MRDeGibbs(out_file="dwi_degibbs.mif", nthreads=nthreads), name="mrdegibbs")
    mask = Node(BrainMask(out_file="brain_mask.mif", nthreads=nthreads), name="dwi2mask")
    tensor = Node(FitTensor(out_file="dti.mif", nthreads=nthreads), name="dwi2tensor")
    metrics = Node(TensorMetrics(out_fa="fa.nii", out_adc="md.nii", out_ad="ad.nii", out_rd="rd.nii", nthreads=nthreads), name="tensor2metric")
    preproc = Node(MRConvert(out_file="dwi_preproc.nii", out_bval="dwi_preproc.bval", out_bvec="dwi_preproc.bvec", nthreads=nthreads), name="export")
    mask_nii = Node(MRConvert(out_file="brain_mask.nii", nthreads=nthreads), name="export_mask")
    sink = Node(DataSink(base_directory=str(out_dir)), name="sink")
    sink.inputs.regexp_substitutions = [(r"_subject_(\d+)", r"sub-\1")]
    wf.connect([
        (subject, select, [("subject", "subject")]),
        (select, gradients, [("bvec", "bvec"), ("bval", "bval")]),
        (select, convert, [("dwi", "in_file")]),
        (gradients, convert, [("grad_fsl", "grad_fsl")]),
        (convert, denoise, [("out_file", "in_file")]),
        (denoise, degibbs, [("out_file", "in_file")]),
        (degibbs, mask, [("out_file", "in_file")]),
        (degibbs, tensor, [("out_file", "in_file")]),
        (mask, tensor, [("out_file", "in_mask")]),
        (tensor, metrics, [("out_file", "in_file")]),
        (mask, metrics, [("out_file", "in_mask")]),
        (degibbs, preproc, [("out_file", "in_file")]),
        (mask, mask_nii, [("out_file", "in_file")]),
        (metrics, sink, [("out_fa", "dwi.@fa"), ("out_adc", "dwi.@md"), ("out_ad", "dwi.@ad"), ("out_rd", "dwi.@rd")]),
        (preproc, sink, [("out_file", "dwi.@dwi"), ("out_bval", "dwi.@bval"), ("out_bvec", "dwi.@bvec")]),
        (mask_nii, sink, [("out_file", "dwi.@mask")]),
    ])  # fmt: skip
    return wf
