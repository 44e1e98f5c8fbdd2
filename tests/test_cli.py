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
