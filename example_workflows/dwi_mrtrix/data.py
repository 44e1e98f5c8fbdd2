"""Simulated multi-shell diffusion MRI in BIDS layout, made locally, sized by flags.

Each subject: ``sub-XX/dwi/sub-XX_dwi.nii.gz`` with its FSL-style ``.bval``/``.bvec`` and a
``.json``: b=0 volumes and two shells (b=1000 and b=2000 s/mm^2) on directions spread over the
sphere (a golden-angle spiral). The phantom is a head-shaped ellipsoid of isotropic tissue
(mean diffusivity 0.8e-3 mm^2/s) crossed by a band of fibres along x (FA about 0.7), signal
``S0 exp(-b g'Dg)`` with Rician noise. The content is a fixed function of the flags and the subject.
"""

from __future__ import annotations

import json
from pathlib import Path

import nibabel as nib
import numpy as np


def directions(n: int) -> np.ndarray:
    """``n`` unit vectors spread over the sphere (golden-angle spiral, one hemisphere's worth mirrored)."""
    i = np.arange(n) + 0.5
    z = 1 - i / n  # upper hemisphere: antipodal directions carry the same diffusion information
    phi = np.pi * (1 + 5**0.5) * i
    r = np.sqrt(1 - z**2)
    return np.stack([r * np.cos(phi), r * np.sin(phi), z], axis=1)


def make_dataset(root: Path, n_subjects: int = 2, matrix: int = 24, n_directions: int = 12) -> list[str]:
    """Write the dataset under ``root`` (existing subjects are kept); the subject labels."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    (root / "dataset_description.json").write_text(json.dumps({"Name": "Sea simulated DWI", "BIDSVersion": "1.8.0"}, indent=2))
    dirs = directions(n_directions)
    bvals = np.r_[np.zeros(2), np.full(n_directions, 1000.0), np.full(n_directions, 2000.0)]
    bvecs = np.vstack([np.zeros((2, 3)), dirs, dirs])
    shape = (matrix, matrix, matrix)
    grid = np.meshgrid(*[np.linspace(-1, 1, n) for n in shape], indexing="ij")
    head = sum((g / r) ** 2 for g, r in zip(grid, (0.85, 0.9, 0.8), strict=True)) <= 1
    fibres = head & (np.abs(grid[1]) < 0.25) & (np.abs(grid[2]) < 0.3)
    isotropic = np.diag([0.8e-3] * 3)
    along_x = np.diag([1.7e-3, 0.3e-3, 0.3e-3])
    affine = np.diag([2.0, 2.0, 2.0, 1.0])
    affine[:3, 3] = -matrix
    subjects = []
    for s in range(n_subjects):
        sub = f"{s + 1:02d}"
        subjects.append(sub)
        dwi = root / f"sub-{sub}" / "dwi" / f"sub-{sub}_dwi.nii.gz"
        if dwi.exists():
            continue
        rng = np.random.default_rng(2000 + s)
        s0 = np.where(head, 1000.0, 0.0) * (1 + 0.05 * rng.standard_normal(shape))
        data = np.empty((*shape, len(bvals)), dtype=np.float32)
        for k, (b, g) in enumerate(zip(bvals, bvecs, strict=True)):
            attenuation = np.where(fibres, np.exp(-b * g @ along_x @ g), np.exp(-b * g @ isotropic @ g))
            clean = s0 * attenuation
            noise = 20.0
            data[..., k] = np.hypot(clean + noise * rng.standard_normal(shape), noise * rng.standard_normal(shape))
        dwi.parent.mkdir(parents=True, exist_ok=True)
        image = nib.Nifti1Image(data, affine)
        image.header.set_xyzt_units("mm", "sec")
        nib.save(image, dwi)
        stem = str(dwi)[: -len(".nii.gz")]
        Path(stem + ".bval").write_text(" ".join(f"{b:g}" for b in bvals) + "\n")
        Path(stem + ".bvec").write_text("\n".join(" ".join(f"{v:.6f}" for v in bvecs[:, axis]) for axis in range(3)) + "\n")
        Path(stem + ".json").write_text(json.dumps({"PhaseEncodingDirection": "j-", "TotalReadoutTime": 0.05}, indent=2))
    return subjects
