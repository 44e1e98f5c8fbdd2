"""The example pipeline run as a user runs it (``python -m example_workflows.incrementation``), through
either adapter, in a subprocess: for the tests that kill or stop it."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from sea.stager import TMP_MARK

ROOT = Path(__file__).parents[1]


@dataclass
class Pipeline:
    adapter: str  # "nipype" or "pydra"

    def command(self, root: Path, tier: Path) -> list[str]:
        root.mkdir(parents=True, exist_ok=True)
        (root / "sea.yml").write_text(f"tiers:\n  - path: {tier}\n")
        cmd = [sys.executable, "-m", "example_workflows.incrementation", "--root", str(root), "--chunks", "6", "--chunk-mib", "4", "--iterations", "4", "--sea", str(root / "sea.yml")]
        return cmd + (["--pydra"] if self.adapter == "pydra" else [])

    def home(self, root: Path) -> Path:
        return root / ("pydra-cache" if self.adapter == "pydra" else "work")

    def final_files(self, root: Path) -> dict[str, bytes]:
        """Declared outputs at their final paths: Nipype's DataSink tree; in Pydra's cache, the
        workflow's outputs (its directory's links, and the output jobs' files they link to; job
        directory names are content hashes), not the intermediate jobs kept as checkpoints."""
        base = root / "out" if self.adapter == "nipype" else self.home(root)
        files = {}
        for path in base.rglob("*.nii") if base.exists() else []:
            if TMP_MARK in str(path) or not path.is_file():
                continue
            if self.adapter == "pydra" and not path.parent.name.startswith("workflow-") and path.stat().st_nlink < 2:
                continue
            files[str(path.relative_to(base))] = path.read_bytes()
        return files

    def journal_events(self, root: Path) -> dict[str, int]:
        journal = self.home(root) / ".sea" / "journal.jsonl"
        counts: dict[str, int] = {}
        if journal.exists():
            for line in journal.read_text().splitlines():
                try:
                    event = json.loads(line)["event"]
                except (ValueError, KeyError):
                    continue  # a line cut by the kill
                counts[event] = counts.get(event, 0) + 1
        return counts


def wait_for_run_start(pipeline: Pipeline, root: Path, proc: subprocess.Popen) -> float:
    """Wait until Sea's engine started (its journal exists): the kills are spread over the run
    itself, not over the interpreter's start-up and the data generation."""
    journal = pipeline.home(root) / ".sea" / "journal.jsonl"
    start = time.monotonic()
    while not journal.exists() and proc.poll() is None and time.monotonic() - start < 120:
        time.sleep(0.005)
    return time.monotonic() - start


def adapters() -> list:
    """Both adapters as pytest parameters; Pydra's skipped where it cannot be installed."""
    pydra = importlib.util.find_spec("pydra") is not None and sys.version_info >= (3, 11)
    return ["nipype", pytest.param("pydra", marks=pytest.mark.skipif(not pydra, reason="Pydra 1.0 needs Python >= 3.11"))]
