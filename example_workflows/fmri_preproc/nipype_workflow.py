"""The fMRIPrep-like functional pipeline in Nipype, with real interfaces (``SimpleInterface``
subclasses around :mod:`.steps`) and a DerivativesDataSink-style sink writing BIDS derivatives.

Per subject: SelectFiles -> reorient -> slice timing -> motion correction -> brain mask, and
smoothing -> confound regression and band-pass -> parcel time series -> connectivity matrix.
Run it with ``plugin='SeaMultiProc'`` and ``sea={'sinks': ['DerivativesDataSink'], ...}`` so the
derivatives are staged on a fast tier and copied home by Sea's stager.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from nipype import IdentityInterface, Node, SelectFiles, Workflow
from nipype.interfaces.base import BaseInterfaceInputSpec, File, SimpleInterface, TraitedSpec, traits

from . import steps


class _InFile(BaseInterfaceInputSpec):
    in_file = File(exists=True, mandatory=True, desc="a 4D BOLD series")


class _OutFile(TraitedSpec):
    out_file = File(exists=True)


class Reorient(SimpleInterface):
    """To the closest RAS+ orientation."""

    input_spec, output_spec = _InFile, _OutFile

    def _run_interface(self, runtime):
        self._results["out_file"] = steps.reorient(self.inputs.in_file)
        return runtime


class _SliceTimingInput(_InFile):
    sidecar = File(exists=True, mandatory=True, desc="the BIDS sidecar with SliceTiming and RepetitionTime")


class SliceTiming(SimpleInterface):
    """Every slice interpolated in time to the middle of the repetition."""

    input_spec, output_spec = _SliceTimingInput, _OutFile

    def _run_interface(self, runtime):
        self._results["out_file"] = steps.slice_timing(self.inputs.in_file, self.inputs.sidecar)
        return runtime


class _MotionOutput(_OutFile):
    par_file = File(exists=True, desc="six motion parameters per volume (TSV)")


class MotionCorrect(SimpleInterface):
    """Rigid (translation) realignment to the first volume."""

    input_spec, output_spec = _InFile, _MotionOutput

    def _run_interface(self, runtime):
        self._results["out_file"], self._results["par_file"] = steps.motion_correct(self.inputs.in_file)
        return runtime


class _MaskOutput(TraitedSpec):
    mean_file = File(exists=True)
    mask_file = File(exists=True)


class BrainMask(SimpleInterface):
    """The mean image and a brain mask of it."""

    input_spec, output_spec = _InFile, _MaskOutput

    def _run_interface(self, runtime):
        self._results["mean_file"], self._results["mask_file"] = steps.brain_mask(self.inputs.in_file)
        return runtime


class _SmoothInput(_InFile):
    fwhm = traits.Float(6.0, usedefault=True, desc="kernel FWHM in mm")


class Smooth(SimpleInterface):
    """Gaussian spatial smoothing."""

    input_spec, output_spec = _SmoothInput, _OutFile

    def _run_interface(self, runtime):
        self._results["out_file"] = steps.smooth(self.inputs.in_file, self.inputs.fwhm)
        return runtime


class _CleanInput(_InFile):
    mask_file = File(exists=True, mandatory=True)
    par_file = File(exists=True, mandatory=True)
    low_hz = traits.Float(0.01, usedefault=True)
    high_hz = traits.Float(0.1, usedefault=True)


class _CleanOutput(_OutFile):
    confounds = File(exists=True)


class Clean(SimpleInterface):
    """Confound regression (motion, derivatives, global signal) and band-pass filtering."""

    input_spec, output_spec = _CleanInput, _CleanOutput

    def _run_interface(self, runtime):
        i = self.inputs
        self._results["out_file"], self._results["confounds"] = steps.clean(i.in_file, i.mask_file, i.par_file, i.low_hz, i.high_hz)
        return runtime


class _ParcelInput(_InFile):
    atlas = File(exists=True, mandatory=True, desc="a label image in the same grid")


class ParcelTimeseries(SimpleInterface):
    """The mean time series of each parcel."""

    input_spec, output_spec = _ParcelInput, _OutFile

    def _run_interface(self, runtime):
        self._results["out_file"] = steps.parcel_timeseries(self.inputs.in_file, self.inputs.atlas)
        return runtime


class _ConnectivityInput(BaseInterfaceInputSpec):
    in_file = File(exists=True, mandatory=True, desc="parcel time series (TSV)")


class Connectivity(SimpleInterface):
    """Fisher-z correlation matrix between parcels."""

    input_spec, output_spec = _ConnectivityInput, _OutFile

    def _run_interface(self, runtime):
        self._results["out_file"] = steps.connectivity(self.inputs.in_file)
        return runtime


class _DerivativesInput(BaseInterfaceInputSpec):
    base_directory = traits.Str(mandatory=True, desc="the derivatives dataset's root")
    source_file = File(exists=False, mandatory=True, desc="the raw file the derivative comes from (names it)")
    in_file = File(exists=True, mandatory=True)
    desc = traits.Str(desc="the desc- entity")
    suffix = traits.Str(mandatory=True)


class DerivativesDataSink(SimpleInterface):
    """Copies ``in_file`` to ``<base_directory>/sub-XX/func/<source entities>[_desc-<desc>]_<suffix><ext>``,
    as niworkflows' sink of the same name does (fMRIPrep's outputs)."""

    input_spec, output_spec = _DerivativesInput, _OutFile

    def _run_interface(self, runtime):
        source = Path(self.inputs.source_file).name
        entities = re.sub(r"_[^_]+\.nii(\.gz)?$", "", source)  # sub-01_task-rest_bold.nii.gz -> sub-01_task-rest
        subject = entities.split("_")[0]
        extension = "".join(Path(self.inputs.in_file).suffixes)
        desc = f"_desc-{self.inputs.desc}" if self.inputs.desc else ""
        target = Path(self.inputs.base_directory) / subject / "func" / f"{entities}{desc}_{self.inputs.suffix}{extension}"
        os.makedirs(target.parent, exist_ok=True)
        shutil.copyfile(self.inputs.in_file, target)
        self._results["out_file"] = str(target)
        return runtime


def build_workflow(bids_dir: Path, subjects: list[str], base_dir: Path, out_dir: Path, fwhm: float = 6.0, high_hz: float = 0.1) -> Workflow:
    """The pipeline for ``subjects`` of the BIDS dataset ``bids_dir``; derivatives under ``out_dir``;
    ``fwhm``: the smoothing kernel (mm), ``high_hz``: the band-pass's upper cut-off."""
    wf = Workflow(name="fmri_preproc", base_dir=str(base_dir))
    subject = Node(IdentityInterface(fields=["subject"]), name="subjects")
    subject.iterables = ("subject", subjects)
    templates = {"bold": "sub-{subject}/func/sub-{subject}_task-rest_bold.nii.gz", "sidecar": "sub-{subject}/func/sub-{subject}_task-rest_bold.json"}
    select = Node(SelectFiles(templates, base_directory=str(bids_dir)), name="select")
    reorient = Node(Reorient(), name="reorient")
    stc = Node(SliceTiming(), name="slice_timing")
    mcf = Node(MotionCorrect(), name="motion_correct")
    mask = Node(BrainMask(), name="brain_mask")
    smooth = Node(Smooth(fwhm=fwhm), name="smooth")
    clean = Node(Clean(high_hz=high_hz), name="clean")
    parcels = Node(ParcelTimeseries(atlas=str(Path(bids_dir) / "derivatives" / "atlas" / "atlas-blocks_dseg.nii.gz")), name="parcels")
    conn = Node(Connectivity(), name="connectivity")
    wf.connect([
        (subject, select, [("subject", "subject")]),
        (select, reorient, [("bold", "in_file")]),
        (reorient, stc, [("out_file", "in_file")]),
        (select, stc, [("sidecar", "sidecar")]),
        (stc, mcf, [("out_file", "in_file")]),
        (mcf, mask, [("out_file", "in_file")]),
        (mcf, smooth, [("out_file", "in_file")]),
        (smooth, clean, [("out_file", "in_file")]),
        (mask, clean, [("mask_file", "mask_file")]),
        (mcf, clean, [("par_file", "par_file")]),
        (clean, parcels, [("out_file", "in_file")]),
        (parcels, conn, [("out_file", "in_file")]),
    ])  # fmt: skip
    outputs = [
        ("ds_bold", clean, "out_file", "preproc", "bold"),
        ("ds_mask", mask, "mask_file", "brain", "mask"),
        ("ds_confounds", clean, "confounds", "confounds", "timeseries"),
        ("ds_timeseries", parcels, "out_file", "blocks", "timeseries"),
        ("ds_connectivity", conn, "out_file", "blocks", "connectivity"),
    ]
    for name, node, field, desc, suffix in outputs:
        sink = Node(DerivativesDataSink(base_directory=str(out_dir), desc=desc, suffix=suffix), name=name)
        wf.connect(select, "bold", sink, "source_file")
        wf.connect(node, field, sink, "in_file")
    return wf
