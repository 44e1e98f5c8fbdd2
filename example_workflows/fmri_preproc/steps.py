"""The processing steps of the fMRIPrep-like pipeline, engine-free: each reads its input files and
writes its outputs in the current directory (the node's or job's own), and returns their paths.

Every step writes a full image (4D where the data are 4D), as the AFNI/SPM pipelines Sea was
measured on do; the arithmetic is numpy/scipy with a fixed order of operations, and images are
written uncompressed (gzip stamps the time), so a step gives byte-identical files wherever and
however often it runs.
"""

from __future__ import annotations

import json
import os

import nibabel as nib
import numpy as np


def _save(data: np.ndarray, like: nib.Nifti1Image, name: str) -> str:
    path = os.path.abspath(name)
    image = nib.Nifti1Image(np.asarray(data, dtype=np.float32), like.affine)
    image.header.set_xyzt_units("mm", "sec")
    image.header["pixdim"][4] = like.header["pixdim"][4]
    nib.save(image, path)
    return path


def reorient(in_file: str) -> str:
    """To the closest RAS+ orientation (what fMRIPrep's first step does)."""
    image = nib.as_closest_canonical(nib.load(in_file))
    return _save(np.asanyarray(image.dataobj), image, "bold_ras.nii")


def slice_timing(in_file: str, sidecar: str) -> str:
    """Interpolate every slice (along z) to the middle of the repetition time, linearly in time,
    from the acquisition times in the BIDS sidecar's ``SliceTiming``."""
    image = nib.load(in_file)
    data = np.asanyarray(image.dataobj).astype(np.float32)
    meta = json.loads(open(sidecar).read())
    tr, times = float(meta["RepetitionTime"]), np.asarray(meta["SliceTiming"], dtype=np.float64)
    n = data.shape[3]
    out = np.empty_like(data)
    for z in range(data.shape[2]):
        shift = (tr / 2 - times[z]) / tr  # in volumes: > 0 means the slice was acquired early
        position = np.clip(np.arange(n) + shift, 0, n - 1)
        low = np.floor(position).astype(int)
        high = np.minimum(low + 1, n - 1)
        weight = (position - low).astype(np.float32)
        out[:, :, z, :] = data[:, :, z, low] * (1 - weight) + data[:, :, z, high] * weight
    return _save(out, image, "bold_stc.nii")


def motion_correct(in_file: str) -> tuple[str, str]:
    """Rigid (translation) realignment to the first volume: each volume's shift is estimated from
    the peak of its phase correlation with the reference (subvoxel by a parabola through the
    peak), then the volume is resampled by that shift (cubic spline). Writes the realigned series
    and the six motion parameters per volume (rotations 0: this estimator fits translations)."""
    from scipy import ndimage

    image = nib.load(in_file)
    data = np.asanyarray(image.dataobj).astype(np.float32)
    reference = np.fft.fftn(data[..., 0])
    params = np.zeros((data.shape[3], 6), dtype=np.float64)
    out = np.empty_like(data)
    for t in range(data.shape[3]):
        volume = data[..., t]
        cross = reference * np.conj(np.fft.fftn(volume))
        correlation = np.real(np.fft.ifftn(cross / np.maximum(np.abs(cross), 1e-12)))
        peak = np.unravel_index(np.argmax(correlation), correlation.shape)
        shift = []
        for axis, p in enumerate(peak):
            size = correlation.shape[axis]
            before = [*peak]
            after = [*peak]
            before[axis], after[axis] = (p - 1) % size, (p + 1) % size
            c0, cm, cp = correlation[peak], correlation[tuple(before)], correlation[tuple(after)]
            denominator = cm - 2 * c0 + cp
            sub = 0.5 * (cm - cp) / denominator if denominator != 0 else 0.0
            s = p + sub
            shift.append(s - size if s > size / 2 else s)
        params[t, :3] = shift
        out[..., t] = ndimage.shift(volume, shift, order=3, mode="nearest")
    path = _save(out, image, "bold_mcf.nii")
    params_file = os.path.abspath("motion_params.tsv")
    np.savetxt(params_file, params, fmt="%.6f", delimiter="\t", header="trans_x\ttrans_y\ttrans_z\trot_x\trot_y\trot_z", comments="")
    return path, params_file


def brain_mask(in_file: str) -> tuple[str, str]:
    """The mean image, and a mask of it: voxels above a threshold that splits the intensity
    histogram in two (Otsu), the largest connected component, holes filled, one closing."""
    from scipy import ndimage

    image = nib.load(in_file)
    mean = np.asanyarray(image.dataobj).astype(np.float32).mean(axis=3)
    values = np.sort(mean.ravel())
    best, threshold = -1.0, values[0]
    for candidate in np.quantile(values, np.linspace(0.05, 0.95, 91)):
        low, high = values[values <= candidate], values[values > candidate]
        if low.size and high.size:
            between = low.size * high.size * (low.mean() - high.mean()) ** 2
            if between > best:
                best, threshold = between, candidate
    mask = mean > threshold
    labels, n = ndimage.label(mask)
    if n > 1:
        sizes = ndimage.sum(mask, labels, range(1, n + 1))
        mask = labels == (1 + int(np.argmax(sizes)))
    mask = ndimage.binary_closing(ndimage.binary_fill_holes(mask), iterations=1)
    mean_file = _save(mean, image, "mean_bold.nii")
    mask_image = nib.Nifti1Image(mask.astype(np.uint8), image.affine)
    mask_file = os.path.abspath("brain_mask.nii")
    nib.save(mask_image, mask_file)
    return mean_file, mask_file


def smooth(in_file: str, fwhm_mm: float) -> str:
    """Gaussian smoothing in space, each volume, with the kernel's FWHM in millimetres."""
    from scipy import ndimage

    image = nib.load(in_file)
    data = np.asanyarray(image.dataobj).astype(np.float32)
    voxel = np.asarray(image.header.get_zooms()[:3], dtype=np.float64)
    sigma = [float(fwhm_mm / np.sqrt(8 * np.log(2)) / v) for v in voxel] + [0.0]
    return _save(ndimage.gaussian_filter(data, sigma=sigma), image, "bold_smooth.nii")


def clean(in_file: str, mask_file: str, params_file: str, low_hz: float, high_hz: float) -> tuple[str, str]:
    """Confound regression and temporal band-pass inside the mask: the motion parameters, their
    derivatives and the global signal regressed out of every voxel (least squares), then the
    frequencies outside [low_hz, high_hz] removed (FFT). Writes the cleaned series and the confounds."""
    image = nib.load(in_file)
    data = np.asanyarray(image.dataobj).astype(np.float64)
    mask = np.asanyarray(nib.load(mask_file).dataobj) > 0
    series = data[mask]  # voxels x time
    params = np.loadtxt(params_file, skiprows=1, ndmin=2)
    n = data.shape[3]
    derivatives = np.vstack([np.zeros((1, params.shape[1])), np.diff(params, axis=0)])
    global_signal = series.mean(axis=0)[:, None]
    confounds = np.hstack([np.ones((n, 1)), params, derivatives, global_signal])
    beta, *_ = np.linalg.lstsq(confounds, series.T, rcond=None)
    residual = series.T - confounds @ beta
    tr = float(image.header["pixdim"][4]) or 2.0
    frequencies = np.fft.rfftfreq(n, d=tr)
    spectrum = np.fft.rfft(residual, axis=0)
    spectrum[(frequencies < low_hz) | (frequencies > high_hz)] = 0
    filtered = np.fft.irfft(spectrum, n=n, axis=0)
    out = np.zeros(data.shape, dtype=np.float32)
    out[mask] = filtered.T.astype(np.float32)
    confounds_file = os.path.abspath("confounds.tsv")
    np.savetxt(confounds_file, confounds, fmt="%.6f", delimiter="\t")
    return _save(out, image, "bold_clean.nii"), confounds_file


def parcel_timeseries(in_file: str, atlas_file: str) -> str:
    """The mean time series of each parcel of the atlas (labels 1..K), as a TSV (time x parcels)."""
    data = np.asanyarray(nib.load(in_file).dataobj).astype(np.float64)
    atlas = np.asanyarray(nib.load(atlas_file).dataobj).astype(int)
    labels = [label for label in np.unique(atlas) if label > 0]
    series = np.stack([data[atlas == label].mean(axis=0) for label in labels], axis=1)
    path = os.path.abspath("timeseries.tsv")
    np.savetxt(path, series, fmt="%.8f", delimiter="\t", header="\t".join(f"parcel_{label}" for label in labels), comments="")
    return path


def connectivity(timeseries_file: str) -> str:
    """The Pearson correlation between every two parcels' time series, Fisher z-transformed."""
    series = np.loadtxt(timeseries_file, skiprows=1, ndmin=2)
    r = np.corrcoef(series, rowvar=False)
    z = np.arctanh(np.clip(r, -0.999999, 0.999999))
    path = os.path.abspath("connectivity.tsv")
    np.savetxt(path, z, fmt="%.8f", delimiter="\t")
    return path
