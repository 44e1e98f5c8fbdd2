"""Many small files: a node writes one small text file per region of an atlas, and a DataSink takes
the directory home, as region-wise extraction tools do (one time series per parcel, per vertex
patch or per streamline bundle).

It is the case where a copy's cost is its metadata, not its bytes: what matters is how many
operations per file reach the shared filesystem, and how its durability is paid for
(:mod:`sea.durable`). Under MultiProc, the node writes its files on the shared filesystem and the
DataSink hard-links them into the output directory (Nipype's ``try_hard_link_datasink``); under
Sea, the node writes them on the tier and the stager copies them home.
"""

from __future__ import annotations

from pathlib import Path

from nipype import Function, Node, Workflow
from nipype.interfaces.io import DataSink


def make_atlas(directory: str | Path, regions: int, timepoints: int = 200) -> Path:
    """A file naming the atlas's regions and the series' length (the node's only input)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "atlas.txt"
    if not path.exists():
        path.write_text(f"{regions} {timepoints}\n")
    return path


def extract(atlas):
    """One deterministic time series per region, each in its own small text file (about 1.4 KiB)."""
    import os

    regions, timepoints = (int(x) for x in open(atlas).read().split())
    out_dir = os.path.abspath("regions")
    os.makedirs(out_dir, exist_ok=True)
    for region in range(regions):
        values = ((region * 7919 + t * 104729) % 100003 / 1000.0 for t in range(timepoints))
        with open(os.path.join(out_dir, f"region-{region:05d}_timeseries.txt"), "w") as fh:
            fh.write("\n".join(f"{v:.3f}" for v in values) + "\n")
    return out_dir


def build_workflow(data: str | Path, work: str | Path, out: str | Path, regions: int) -> Workflow:
    atlas = make_atlas(data, regions)
    wf = Workflow(name="many_files", base_dir=str(work))
    node = Node(Function(input_names=["atlas"], output_names=["out_dir"], function=extract), name="extract")
    node.inputs.atlas = str(atlas)
    sink = Node(DataSink(base_directory=str(out)), name="sink")
    wf.connect(node, "out_dir", sink, "regions")
    return wf
