"""A single-host SLURM for tests (tests/slurm/start_slurm.sh), started in a directory of its own on
ports of its own, so that test modules can each have one: ``with single_host_slurm(dir, ports) as env``."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "tests" / "slurm"
LOCK = Path("/var/tmp/sea-test-slurm.lock")


@contextlib.contextmanager
def single_host_slurm(directory: Path, ports: dict[str, str], stopped: Callable[[], None] = lambda: None) -> Iterator[dict[str, str]]:
    """Start the cluster (skip the test where it cannot run), yield what sbatch and the jobs need in
    their environment (the cluster's SLURM_CONF, and PYTHONPATH so the jobs import Sea from this
    checkout), stop it and check it is gone (and ``stopped()``, before another cluster may start)."""
    if os.geteuid() != 0:
        pytest.skip("a real SLURM needs root (munged, slurmd and the job Prolog's tmpfs mounts)")
    if shutil.which("slurmctld") is None and shutil.which("apt-get") is None:
        pytest.skip("SLURM is not installed and there is no apt-get to install slurmctld slurmd slurm-client munge")
    with _one_cluster_at_a_time():
        yield from _started(directory, ports)
        stopped()


@contextlib.contextmanager
def _one_cluster_at_a_time() -> Iterator[None]:
    """The suite's clusters take turns (pytest-xdist runs test modules side by side): each test of
    one checks, once it stopped, that no ``slurmstepd`` nor job worker is left, of any cluster."""
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _started(directory: Path, ports: dict[str, str]) -> Iterator[dict[str, str]]:
    env = {**os.environ, **ports, "START_TIMEOUT": "30"}
    start = subprocess.run([SCRIPTS / "start_slurm.sh", directory], capture_output=True, text=True, env=env, timeout=600)
    if start.returncode != 0:
        subprocess.run([SCRIPTS / "stop_slurm.sh", directory], capture_output=True, env=env)
        why = next((line for line in start.stderr.splitlines() if "ERROR" in line), start.stderr.strip()[-500:])
        pytest.skip(f"single-host SLURM did not start (tests/slurm/start_slurm.sh): {why}")
    try:
        yield {
            "SLURM_CONF": str(directory / "etc" / "slurm.conf"),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
    finally:
        stop = subprocess.run([SCRIPTS / "stop_slurm.sh", directory], capture_output=True, text=True, env=env)
        assert stop.returncode == 0, stop.stderr
