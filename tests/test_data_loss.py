"""What an unlucky user meets (issue 16's data-loss cases): names as long as a file name may be,
empty directories in a sink's outputs, copies kept after a failed flush. Each one against MultiProc
on the same workflow: Sea delivers the same tree, and never removes what it kept on purpose."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from nipype import Node, Workflow
from nipype.interfaces.io import DataSink

from conftest import sea_private_dirs
from nipype_workflows import fn, run


def write_named(length: int) -> str:
    """An output file whose name is ``length`` bytes long, in a directory with an empty subdirectory."""
    import os

    os.makedirs("result/empty/deeper")
    os.makedirs("result/full")
    name = ("x" * length)[: length - 4] + ".txt"
    with open(os.path.join("result", "full", name), "w") as f:
        f.write(name)
    return os.path.abspath("result")


def tree(root: Path) -> dict[str, bytes | None]:
    """Files with their bytes and directories (None): an empty directory counts."""
    found: dict[str, bytes | None] = {}
    for dirpath, dirs, files in os.walk(root):
        for d in dirs:
            found[str(Path(dirpath, d).relative_to(root)) + "/"] = None
        for f in files:
            found[str(Path(dirpath, f).relative_to(root))] = Path(dirpath, f).read_bytes()
    return found


def sink_workflow(base: Path, out: Path, length: int) -> Workflow:
    wf = Workflow(name="names", base_dir=str(base))
    make = fn("make", write_named, ["length"], ["out_dir"])
    make.inputs.length = length
    sink = Node(DataSink(base_directory=str(out)), name="sink")
    wf.connect(make, "out_dir", sink, "derivatives.@result")
    return wf


@pytest.mark.parametrize("length", [240, 255])
def test_long_names_and_empty_directories_reach_home_as_under_multiproc(disk_dir, shm_dir, length):
    run(sink_workflow(disk_dir / "mp-work", disk_dir / "mp-out", length), "MultiProc")
    expected = tree(disk_dir / "mp-out")
    assert any(k.endswith("empty/deeper/") for k in expected), "MultiProc's DataSink keeps empty directories"
    sea = {"tiers": [{"path": str(shm_dir)}]}
    for attempt in ("first run", "rerun"):
        run(sink_workflow(disk_dir / "work", disk_dir / "out", length), "SeaMultiProc", sea)
        assert tree(disk_dir / "out") == expected, attempt
    assert sea_private_dirs(shm_dir) == []
