"""The Debian packages the suite uses, installed by the suite itself when they are missing, as
``tests/slurm/start_slurm.sh`` installs SLURM: the README's test command is all a fresh Debian
machine (Python and apt, as root) needs.

- ``fuse3``, ``libfuse3-3``: the throttled FUSE filesystem (benchmarks/slowfs.py, through mfusepy,
  which looks for libfuse when it is imported) that stands in for a busy shared filesystem;
- ``mrtrix3``: example_workflows/dwi_mrtrix and the published task packages' tests;
- ``dcm2niix``: DICOM to NIfTI through Nipype's and pydra-tasks-dcm2niix's interfaces.
"""

from __future__ import annotations

import ctypes.util
import os
import shutil
import subprocess

PACKAGES = {  # package -> is it installed
    "fuse3": lambda: shutil.which("fusermount3") is not None,
    "libfuse3-3": lambda: ctypes.util.find_library("fuse3") is not None,
    "mrtrix3": lambda: shutil.which("mrconvert") is not None,
    "dcm2niix": lambda: shutil.which("dcm2niix") is not None,
}


def missing() -> list[str]:
    return [package for package, present in PACKAGES.items() if not present()]


def can_install() -> bool:
    """Root on a machine with apt-get."""
    return os.geteuid() == 0 and shutil.which("apt-get") is not None


def install_missing() -> str | None:
    """Install what is missing with apt-get; None when all is there, else the one line saying what
    could not be installed and how to install it."""
    needed = missing()
    if not needed:
        return None
    command = f"apt-get install {' '.join(needed)}"
    if not can_install():
        return f"the test suite needs the Debian packages {' '.join(needed)}: run '{command}' as root (as root on Debian, the suite installs them itself)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for step in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *needed]):
        done = subprocess.run(step, capture_output=True, text=True, env=env, timeout=1200)
        if done.returncode != 0:
            return f"'{' '.join(step)}' failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}"
    still = missing()
    return f"installed {' '.join(needed)} but {' '.join(still)} still not found" if still else None
