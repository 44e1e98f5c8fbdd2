"""The ``sea`` command, and the configuration reference it generates."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sea import SeaConfig
from sea.cli import config_reference

DOCS = Path(__file__).parents[1] / "docs"


def sea(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sea.cli", *args], capture_output=True, text=True)


def test_configuration_doc_is_generated_from_the_dataclass():
    assert (DOCS / "configuration.md").read_text() == config_reference(), "run: sea config-docs > docs/configuration.md"
    for key in SeaConfig.keys():
        assert f"## `{key}`" in config_reference()


def test_check_with_home_lists_tiers(disk_dir, shm_dir):
    config = disk_dir / "sea.yml"
    config.write_text(f"tiers:\n  - path: {shm_dir}\n    capacity: 1GiB\n")
    result = sea("check", str(config), "--home", str(disk_dir / "work"))
    assert result.returncode == 0, result.stderr
    assert str(shm_dir) in result.stdout and "capacity 1.0 GiB" in result.stdout
    assert list(shm_dir.iterdir()) == [], "check must leave nothing behind"


def test_report_command(disk_dir):
    result = sea("report", str(disk_dir))
    assert result.returncode == 2 and "no report at" in result.stderr


def test_report_plot_draws_the_timeline(disk_dir, shm_dir):
    from example_workflows.incrementation import build_workflow, make_chunks

    make_chunks(disk_dir / "data", 2, 1)
    wf = build_workflow(disk_dir / "data", 2, 2, disk_dir / "work", disk_dir / "out")
    wf.run(plugin="SeaMultiProc", plugin_args={"n_procs": 2, "sea": {"tiers": [{"path": str(shm_dir)}]}})
    png = disk_dir / "timeline.png"
    result = sea("report", str(disk_dir / "work"), "--plot", str(png))
    assert result.returncode == 0, result.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
