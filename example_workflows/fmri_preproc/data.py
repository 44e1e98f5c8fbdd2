"""A synthetic resting-state fMRI dataset in BIDS layout, made locally (no download), sized by flags.

Each subject has one run: ``sub-XX/func/sub-XX_task-rest_bold.nii.gz`` and its sidecar
(``RepetitionTime``, interleaved ``SliceTiming``), stored LAS (so reorientation has work to do), a
head-shaped ellipsoid whose parcels follow their own slow signals plus noise, moved by a small
drift of the head; and one atlas for all, ``derivatives/atlas/atlas-blocks_dseg.nii.gz``, in the
RAS grid the pipeline resamples to. The content is a fixed function of the flags and the subject.
"""

from __future__ import annotations

import json
from pathlib import Path

import nibabel as nib
import numpy as np

TR = 2.0


def _ellipsoid(shape: tuple[int, int, int]) -> np.ndarray:
    grid = np.meshgrid(*[np.linspace(-1, 1, n) for n in shape], indexing="ij")
    return sum((g / r) ** 2 for g, r in zip(grid, (0.8, 0.9, 0.75), strict=True)) <= 1


def atlas(matrix: int, parcels_per_axis: int = 3) -> np.ndarray:
    """Blocks of the ellipsoid (labels 1..parcels_per_axis**3 where the head is), in RAS voxels."""
    shape = (matrix, matrix, matrix)
    index = [np.minimum(np.arange(n) * parcels_per_axis // n, parcels_per_axis - 1) for n in shape]
    labels = (index[0][:, None, None] * parcels_per_axis**2 + index[1][None, :, None] * parcels_per_axis + index[2][None, None, :] + 1).astype(np.int16)
    labels[~_ellipsoid(shape)] = 0
    return labels


def make_dataset(root: Path, n_subjects: int = 2, volumes: int = 40, matrix: int = 32) -> list[str]:
    """Write the dataset under ``root`` (files already there are kept); the subject labels."""
    from scipy import ndimage

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    (root / "dataset_description.json").write_text(json.dumps({"Name": "Sea synthetic rest", "BIDSVersion": "1.8.0"}, indent=2))
    ras = np.diag([3.0, 3.0, 3.0, 1.0])
    ras[:3, 3] = -1.5 * matrix
    labels = atlas(matrix)
    atlas_file = root / "derivatives" / "atlas" / "atlas-blocks_dseg.nii.gz"
    if not atlas_file.exists():
        atlas_file.parent.mkdir(parents=True, exist_ok=True)
        nib.save(nib.Nifti1Image(labels, ras), atlas_file)
    las = ras.copy()
    las[0, 0], las[0, 3] = -3.0, 1.5 * matrix - 3.0  # the x axis stored right to left
    order = np.r_[np.arange(0, matrix, 2), np.arange(1, matrix, 2)]  # interleaved acquisition
    slice_timing = np.empty(matrix)
    slice_timing[order] = np.arange(matrix) * TR / matrix
    subjects = []
    for s in range(n_subjects):
        sub = f"{s + 1:02d}"
        subjects.append(sub)
        bold = root / f"sub-{sub}" / "func" / f"sub-{sub}_task-rest_bold.nii.gz"
        if bold.exists():
            continue
        rng = np.random.default_rng(1000 + s)
        signals = np.cumsum(rng.standard_normal((labels.max() + 1, volumes)), axis=1) * 2.0
        data = np.where(labels[..., None] > 0, 1000.0 + signals[labels], 50.0).astype(np.float32)
        data += rng.standard_normal(data.shape).astype(np.float32) * 5
        drift = np.cumsum(rng.normal(0, 0.08, (volumes, 3)), axis=0)
        for t in range(volumes):
            data[..., t] = ndimage.shift(data[..., t], drift[t], order=1, mode="nearest")
        bold.parent.mkdir(parents=True, exist_ok=True)
        image = nib.Nifti1Image(data[::-1], las)  # stored LAS
        image.header.set_xyzt_units("mm", "sec")
        image.header["pixdim"][4] = TR
        nib.save(image, bold)
        sidecar = {"RepetitionTime": TR, "SliceTiming": [round(float(t), 6) for t in slice_timing], "TaskName": "rest"}
        bold.with_name(bold.name.replace(".nii.gz", ".json")).write_text(json.dumps(sidecar, indent=2))
    return subjects
