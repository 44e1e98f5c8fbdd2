"""Filtering: per subject, Gaussian smoothing, temporal band-pass filtering, then z-scoring.

The counterpart of the incrementation pipeline with real compute per node (scipy), like the
FSL/SPM steps of the seeds' fMRI pipelines: each step reads and writes a full 4D image.
"""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
from nipype import Function, IdentityInterface, Node, Workflow
from nipype.interfaces.io import DataSink


def make_images(directory: str | Path, n_subjects: int, image_mib: float, frames: int = 40, seed: int = 0) -> list[Path]:
    """One 4D float32 image of about ``image_mib`` MiB (``frames`` volumes) per subject; deterministic."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    side = max(8, round((image_mib * 2**20 / 4 / frames) ** (1 / 3)))
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(n_subjects):
        path = directory / f"sub-{i + 1:02d}_bold.nii"
        if not path.exists():
            data = rng.standard_normal((side, side, side, frames), dtype=np.float32) + np.float32(100)
            nib.save(nib.Nifti1Image(data, np.eye(4)), str(path))
        paths.append(path)
    return paths


def select(data_dir, subject):
    import os

    return os.path.join(data_dir, f"sub-{subject}_bold.nii")


def smooth(in_file, fwhm_vox):
    """Spatial Gaussian smoothing of every volume."""
    import os

    import nibabel as nib
    import numpy as np
    from scipy.ndimage import gaussian_filter

    img = nib.load(in_file)
    data = np.asanyarray(img.dataobj, dtype=np.float32)
    sigma = fwhm_vox / 2.3548
    out = np.empty_like(data)
    for t in range(data.shape[3]):
        out[..., t] = gaussian_filter(data[..., t], sigma)
    out_file = os.path.abspath("smoothed.nii")
    nib.save(nib.Nifti1Image(out, img.affine), out_file)
    return out_file


def bandpass(in_file, tr, low, high):
    """Temporal band-pass (Butterworth, zero-phase) of every voxel's time series."""
    import os

    import nibabel as nib
    import numpy as np
    from scipy.signal import butter, sosfiltfilt

    img = nib.load(in_file)
    data = np.asanyarray(img.dataobj, dtype=np.float32)
    sos = butter(2, [low, high], btype="band", fs=1.0 / tr, output="sos")
    out = sosfiltfilt(sos, data, axis=3).astype(np.float32)
    out_file = os.path.abspath("filtered.nii")
    nib.save(nib.Nifti1Image(out, img.affine), out_file)
    return out_file


def zscore(in_file):
    import os

    import nibabel as nib
    import numpy as np

    img = nib.load(in_file)
    data = np.asanyarray(img.dataobj, dtype=np.float32)
    std = data.std(axis=3, keepdims=True)
    out = (data - data.mean(axis=3, keepdims=True)) / np.where(std > 0, std, 1)
    out_file = os.path.abspath("zscored.nii")
    nib.save(nib.Nifti1Image(out.astype(np.float32), img.affine), out_file)
    return out_file


def fn(name, function, inputs, outputs):
    return Node(Function(input_names=inputs, output_names=outputs, function=function), name=name)


def build_workflow(data_dir: str | Path, n_subjects: int, base_dir: str | Path, out_dir: str | Path) -> Workflow:
    wf = Workflow(name="filtering", base_dir=str(base_dir))
    subjects = Node(IdentityInterface(fields=["subject"]), name="subjects")
    subjects.iterables = ("subject", [f"{i + 1:02d}" for i in range(n_subjects)])
    sel = fn("select", select, ["data_dir", "subject"], ["in_file"])
    sel.inputs.data_dir = str(Path(data_dir).resolve())
    sm = fn("smooth", smooth, ["in_file", "fwhm_vox"], ["out_file"])
    sm.inputs.fwhm_vox = 2.0
    bp = fn("bandpass", bandpass, ["in_file", "tr", "low", "high"], ["out_file"])
    bp.inputs.tr, bp.inputs.low, bp.inputs.high = 2.0, 0.01, 0.1
    zs = fn("zscore", zscore, ["in_file"], ["out_file"])
    sink = Node(DataSink(base_directory=str(Path(out_dir).resolve())), name="sink")
    sink.inputs.regexp_substitutions = [(r"_subject_(\d+)", r"sub-\1")]
    wf.connect([
        (subjects, sel, [("subject", "subject")]),
        (sel, sm, [("in_file", "in_file")]),
        (sm, bp, [("out_file", "in_file")]),
        (bp, zs, [("out_file", "in_file")]),
        (zs, sink, [("out_file", "func.@zscored")]),
    ])
    return wf
