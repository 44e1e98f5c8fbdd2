"""Incrementation: N chunks of a synthetic image, each read, +1, written, n times, then sunk.

The data-intensive synthetic case of the Sea paper: almost no compute, every iteration writes a
full chunk, so where the intermediates live decides the makespan. Chunks are NIfTI images made
with nibabel; iterations are separate Nipype nodes so each one has its own working directory.
"""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
from nipype import Function, IdentityInterface, Node, Workflow
from nipype.interfaces.io import DataSink


def make_chunks(directory: str | Path, n_chunks: int, chunk_mib: float, seed: int = 0) -> list[Path]:
    """Write ``n_chunks`` float32 NIfTI chunks of about ``chunk_mib`` MiB each; deterministic."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    voxels = max(1, int(chunk_mib * 2**20 / 4))
    side = max(1, round(voxels ** (1 / 3)))
    shape = (side, side, max(1, voxels // (side * side)))
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(n_chunks):
        path = directory / f"chunk{i:03d}.nii"
        if not path.exists():
            data = rng.standard_normal(shape, dtype=np.float32)
            nib.save(nib.Nifti1Image(data, np.eye(4)), str(path))
        paths.append(path)
    return paths


def select_chunk(data_dir, chunk):
    """Path of chunk number ``chunk`` in ``data_dir`` (reads nothing: the first increment does)."""
    import os

    return os.path.join(data_dir, f"chunk{chunk:03d}.nii")


def increment(in_file, delta=1.0):
    """Read a chunk, add ``delta`` (1), write it under the same name in the node's directory."""
    import os

    import nibabel as nib
    import numpy as np

    image = nib.load(in_file)
    data = np.asanyarray(image.dataobj) + np.float32(delta)
    out_file = os.path.abspath(os.path.basename(in_file))
    nib.save(nib.Nifti1Image(data, image.affine, image.header), out_file)
    return out_file


def build_workflow(
    data_dir: str | Path, n_chunks: int, iterations: int, base_dir: str | Path, out_dir: str | Path, changed: int | None = None, delta: float = 1.0
) -> Workflow:
    """``changed``: the iteration (from 1) that adds ``delta`` instead of 1 (a step changed, for a rerun)."""
    wf = Workflow(name="incrementation", base_dir=str(base_dir))
    chunks = Node(IdentityInterface(fields=["chunk"]), name="chunks")
    chunks.iterables = ("chunk", list(range(n_chunks)))
    select = Node(Function(input_names=["data_dir", "chunk"], output_names=["in_file"], function=select_chunk), name="select")
    select.inputs.data_dir = str(Path(data_dir).resolve())
    wf.connect(chunks, "chunk", select, "chunk")
    previous, field = select, "in_file"
    for i in range(1, iterations + 1):
        inc = Node(Function(input_names=["in_file", "delta"], output_names=["out_file"], function=increment), name=f"increment_{i}")
        inc.inputs.delta = delta if i == changed else 1.0
        wf.connect(previous, field, inc, "in_file")
        previous, field = inc, "out_file"
    sink = Node(DataSink(base_directory=str(Path(out_dir).resolve()), parameterization=False), name="sink")
    wf.connect(previous, field, sink, "incremented")
    return wf
