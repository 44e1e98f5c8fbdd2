"""The incrementation pipeline in Pydra 1.0: the same chunks, the same +1 per iteration, one task
per iteration so each has its own directory, split over chunks; run with ``Submitter(worker="sea")``."""

from __future__ import annotations

import os

import nibabel as nib
import numpy as np
from fileformats.generic import File
from pydra.compose import python, workflow


@python.define(outputs=["out_file"])
def Increment(in_file: File) -> File:
    """Read a chunk, add 1, write it under the same name in the task's directory."""
    image = nib.load(in_file)
    data = np.asanyarray(image.dataobj) + np.float32(1)
    out_file = os.path.abspath(os.path.basename(in_file))
    nib.save(nib.Nifti1Image(data, image.affine, image.header), out_file)
    return File(out_file)


@workflow.define(outputs=["out_files"])
def Incrementation(in_files: list[File], iterations: int = 3) -> list[File]:
    previous = workflow.add(Increment().split(in_file=in_files), name="increment_1")
    for i in range(2, iterations + 1):
        previous = workflow.add(Increment(in_file=previous.out_file), name=f"increment_{i}")
    return previous.out_file
