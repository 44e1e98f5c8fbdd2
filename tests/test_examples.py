"""The example pipelines give byte-identical outputs under MultiProc and SeaMultiProc."""

from __future__ import annotations

import pytest

from example_workflows import filtering, incrementation

from conftest import tree_files


def build(name, root):
    if name == "incrementation":
        incrementation.make_chunks(root / "data", 3, 1)
        return lambda tag: incrementation.build_workflow(root / "data", 3, 2, root / f"work-{tag}", root / f"out-{tag}")
    filtering.make_images(root / "data", 2, 1.0, frames=24)
    return lambda tag: filtering.build_workflow(root / "data", 2, root / f"work-{tag}", root / f"out-{tag}")


@pytest.mark.parametrize("name", ["incrementation", "filtering"])
def test_example_identical_under_sea(name, disk_dir, shm_dir):
    make = build(name, disk_dir)
    for tag, plugin, args in [("mp", "MultiProc", {}), ("sea", "SeaMultiProc", {"sea": {"tiers": [{"path": str(shm_dir)}]}})]:
        wf = make(tag)
        wf.config["execution"]["poll_sleep_duration"] = 0.05
        wf.run(plugin=plugin, plugin_args={"n_procs": 2, **args})
    reference = tree_files(disk_dir / "out-mp")
    assert reference and tree_files(disk_dir / "out-sea") == reference
