"""Tier discovery inside a container: say in one line what was found and what to bind.

A containerised pipeline (fMRIPrep's image, run by Apptainer, Podman or Docker) sees the node's
storage only where the runtime binds it. Docker and Podman give a container its own 64 MB
``/dev/shm``; ``apptainer --containall`` gives it its own ``/tmp`` and ``/dev/shm``; ``--cleanenv``
and Docker drop ``$SLURM_TMPDIR``. Discovery then finds a tier of a few MiB, or none, and the run is
all but home-only. :func:`advice` is that one line (or ``None`` when nothing is amiss);
:func:`runtime` and :func:`ram_mount` read what it decides on. See docs/containers.md.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from .durable import device, mount_table
from .memory import RAM_FILESYSTEMS
from .sizes import format_size

# a RAM tier smaller than this, inside a container, is the runtime's own (Docker's and Podman's
# /dev/shm is 64 MB, Apptainer's --containall /tmp 64 MiB): too small to hold a node's directory
SMALL_RAM = 1 << 30

BINDS = (
    "bind node-local storage: the host's /dev/shm (podman/docker: -v /dev/shm:/dev/shm; Apptainer binds it unless "
    "--contain/--containall) or $SLURM_TMPDIR (apptainer: -B $SLURM_TMPDIR --env SLURM_TMPDIR=$SLURM_TMPDIR; "
    "podman/docker: -v $SLURM_TMPDIR:$SLURM_TMPDIR -e SLURM_TMPDIR); see Sea's docs/containers.md"
)


class RamMount(NamedTuple):
    """A tier's filesystem when it is a tmpfs: its size and what its mount names it."""

    size: int
    source: str  # "shm": Docker's and Podman's own /dev/shm


def runtime(env: Mapping[str, str] | None = None, root: Path = Path("/")) -> str | None:
    """The container runtime this process runs under, from the marks each leaves (``None`` outside
    one): Apptainer's (or Singularity's) environment and ``/.singularity.d``, Podman's
    ``/run/.containerenv``, Docker's ``/.dockerenv``, and ``$container`` (Podman, systemd-nspawn, LXC)."""
    env = os.environ if env is None else env
    if env.get("APPTAINER_CONTAINER") or env.get("SINGULARITY_CONTAINER") or (root / ".singularity.d").is_dir():
        return "apptainer"
    if (root / "run" / ".containerenv").exists():
        return "podman"
    if (root / ".dockerenv").exists():
        return "docker"
    return env.get("container") or None


def ram_mount(path: str | Path) -> RamMount | None:
    """The tmpfs (or ramfs) ``path`` is on, or ``None`` if it is on another kind of filesystem."""
    try:
        dev = device(Path(path))
        real = os.path.realpath(path)
        mounts = [m for m in mount_table() if m.device == dev and m.fstype in RAM_FILESYSTEMS]
        vfs = os.statvfs(path)
    except OSError:
        return None
    if not mounts:
        return None
    under = [m for m in mounts if real == m.mountpoint or real.startswith(m.mountpoint.rstrip("/") + "/")]
    mount = max(under or mounts, key=lambda m: len(m.mountpoint))
    return RamMount(vfs.f_blocks * vfs.f_frsize, mount.source)


def advice(where: str | None, env: Mapping[str, str], found: Mapping[str, RamMount | None], skipped: list[str]) -> str | None:
    """The one line discovery logs inside a container (``where``: :func:`runtime`'s answer) instead
    of its own, or ``None`` (outside one, or nothing amiss). ``found``: the tiers discovery kept,
    each with its tmpfs (:func:`ram_mount`) if it is one; ``skipped``: why the others were left out.

    Said when no tier is left but RAM tiers under :data:`SMALL_RAM` (the container's own), or none
    at all, or when ``$SLURM_JOB_ID`` is set but ``$SLURM_TMPDIR`` is not (passed without it)."""
    if where is None:
        return None
    small = {path: ram for path, ram in found.items() if ram is not None and ram.size < SMALL_RAM}
    forgotten = bool(env.get("SLURM_JOB_ID")) and not env.get("SLURM_TMPDIR")
    if not forgotten and len(small) < len(found):
        return None  # a tier of a useful size
    said = []
    for path, ram in found.items():
        if path in small:
            own = ", the container's own" if ram.source == "shm" or path.startswith("/tmp") or where == "apptainer" else ""
            said.append(f"{path} is a {format_size(ram.size)} tmpfs{own}")
        else:
            said.append(f"{path} is a tier")
    if not found:
        said.append("no node-local tier usable" + (f" ({'; '.join(skipped)})" if skipped else ""))
    if forgotten:
        said.append("$SLURM_JOB_ID is set but $SLURM_TMPDIR was not passed in")
    if not found:
        outcome = "this run is home-only, every node runs in the work directory on the shared filesystem"
    elif len(small) == len(found):
        outcome = "the nodes that do not fit there run in the work directory on the shared filesystem"
    else:
        outcome = "the job's node-local $SLURM_TMPDIR goes unused"
    return f"[Sea] inside a container ({where}): {'; '.join(said)}: {outcome}; {BINDS}"
