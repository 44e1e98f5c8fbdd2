"""A small DICOM series written with pydicom: the raw data of the published-package tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_series(directory: Path, slices: int = 6, size: int = 16, seed: int = 0) -> Path:
    """``slices`` axial MR slices of ``size`` x ``size`` 16-bit pixels, one file each, in ``directory``."""
    import pydicom
    from pydicom.dataset import FileDataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, MRImageStorage, generate_uid

    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    study, series, frame = (generate_uid(entropy_srcs=[f"sea-{seed}-{part}"]) for part in ("study", "series", "frame"))
    for index in range(slices):
        meta = FileMetaDataset()
        meta.MediaStorageSOPClassUID = MRImageStorage
        meta.MediaStorageSOPInstanceUID = generate_uid(entropy_srcs=[f"sea-{seed}-{index}"])
        meta.TransferSyntaxUID = ExplicitVRLittleEndian
        ds = FileDataset(str(directory / f"slice{index:03d}.dcm"), {}, file_meta=meta, preamble=b"\0" * 128)
        ds.SOPClassUID, ds.SOPInstanceUID = MRImageStorage, meta.MediaStorageSOPInstanceUID
        ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.FrameOfReferenceUID = study, series, frame
        ds.PatientName, ds.PatientID, ds.Modality, ds.Manufacturer = "Sea^Test", "sea01", "MR", "SeaScanner"
        ds.StudyDate, ds.SeriesDate, ds.AcquisitionTime, ds.SeriesDescription = "20260101", "20260101", "120000.00", "t1_test"
        ds.SeriesNumber, ds.InstanceNumber, ds.AcquisitionNumber = 1, index + 1, 1
        ds.ImagePositionPatient = [0.0, 0.0, float(index) * 2.0]
        ds.ImageOrientationPatient = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
        ds.PixelSpacing, ds.SliceThickness, ds.SpacingBetweenSlices = [1.0, 1.0], 2.0, 2.0
        ds.MagneticFieldStrength, ds.RepetitionTime, ds.EchoTime, ds.FlipAngle = 3.0, 2000.0, 30.0, 90.0
        ds.Rows = ds.Columns = size
        ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 12, 11, 0
        ds.PixelData = rng.integers(0, 4000, (size, size), dtype=np.uint16).tobytes()
        pydicom.dcmwrite(ds.filename, ds, enforce_file_format=True)
    return directory
