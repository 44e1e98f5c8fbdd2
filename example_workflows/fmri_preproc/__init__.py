"""An fMRIPrep-like functional preprocessing pipeline on a synthetic BIDS dataset: reorientation,
slice timing, motion correction, brain mask, smoothing, confound regression and band-pass, parcel
time series and a connectivity matrix per subject (Nipype; Pydra in :mod:`.pydra_workflow`)."""

from .data import make_dataset
from .nipype_workflow import build_workflow

__all__ = ["build_workflow", "make_dataset"]
