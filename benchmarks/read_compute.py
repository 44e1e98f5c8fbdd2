"""read_compute: where prefetch should pay (issue 20, part 3).

Per subject, a first step reads its input whole from the shared filesystem, then computes on it for
twice as long as the read takes at 30 MB/s (a fixed time, so every configuration does the same
work); a second step writes a small summary; a DataSink takes it. With two processes that alternate
reading and computing, the reads and the compute of one subject do not overlap; copying the next
subjects' inputs ahead while the current ones compute can at best make the run the time of its reads
alone (the bound, 2x for compute = 2 x read with two processes). The input is the first step's own
(unconnected) input, as a data grabber's output would be named, so prefetch sees it.
"""

from __future__ import annotations

from pathlib import Path

from nipype import Function, Node, Workflow
from nipype.interfaces.io import DataSink

READ_MBPS = 30  # the slow-reads filesystem's: compute is sized from it


def compute_seconds(unit_mib: float) -> float:
    """Twice the time one input takes to read at READ_MBPS."""
    return 2 * unit_mib * 2**20 / (READ_MBPS * 1e6)


def read_and_compute(in_file, seconds):
    """Read ``in_file`` whole, compute on it for ``seconds``, write a digest of it (1 MiB)."""
    import hashlib
    import os
    import time

    import numpy as np

    with open(in_file, "rb") as fh:
        data = np.frombuffer(fh.read(), dtype=np.uint8)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        np.add.reduce(data[: 1 << 20], dtype=np.uint64)
    digest = hashlib.sha256(data.tobytes()).digest()
    out = os.path.abspath("features.bin")
    with open(out, "wb") as fh:
        fh.write(digest * (2**20 // len(digest)))
    return out


def summarise(in_file):
    import os

    out = os.path.abspath("summary.bin")
    with open(in_file, "rb") as fh, open(out, "wb") as dst:
        dst.write(fh.read()[::-1])
    return out


def make_inputs(data: Path, subjects: int, unit_mib: float) -> None:
    data.mkdir(parents=True, exist_ok=True)
    for i in range(subjects):
        path = data / f"sub-{i + 1:02d}.bin"
        if not path.exists():
            block = bytes((i * 7 + j) % 251 for j in range(4096))
            path.write_bytes(block * int(unit_mib * 2**20 // len(block)))


def build_workflow(data: Path, subjects: int, unit_mib: float, work: Path, out: Path) -> Workflow:
    wf = Workflow(name="read_compute", base_dir=str(work))
    sink = Node(DataSink(base_directory=str(Path(out).resolve()), parameterization=False), name="sink")
    for i in range(subjects):
        subject = f"sub-{i + 1:02d}"
        first = Node(Function(input_names=["in_file", "seconds"], output_names=["out_file"], function=read_and_compute), name=f"read_{subject}")
        first.inputs.in_file = str((Path(data) / f"{subject}.bin").resolve())
        first.inputs.seconds = compute_seconds(unit_mib)
        second = Node(Function(input_names=["in_file"], output_names=["out_file"], function=summarise), name=f"summary_{subject}")
        wf.connect(first, "out_file", second, "in_file")
        wf.connect(second, "out_file", sink, f"{subject}.@summary")
    return wf
