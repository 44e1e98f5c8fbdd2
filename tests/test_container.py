"""Sea inside the engine's container (docs/containers.md).

The fast part: tier discovery's one line inside a container (sea/container.py), decided on the
figures a container shows, and read from real mounts (a 64 MiB tmpfs mounted here, as Docker's
and Podman's own /dev/shm). The slow part (--run-slow): a real Podman runs an image built here as
fMRIPrep's is built (its own Python environment), extended with the page's Dockerfile word for
word, a workflow in it under SeaMultiProc and under MultiProc with node-local tiers bound from the
host: the same outputs, byte for byte.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from sea import container
from sea.container import SMALL_RAM, RamMount, advice
from sea.tiers import discover_tiers

MiB = 1 << 20
PODMAN_SHM = RamMount(64000 * 1024, "shm")  # podman's and docker's default: size=64000k, named "shm"
HOST_SHM = RamMount(12 << 30, "tmpfs")


@pytest.mark.parametrize(
    ("where", "env", "found", "says"),
    [
        (None, {}, {}, None),  # not in a container: discovery's own lines
        (None, {}, {"/dev/shm": PODMAN_SHM}, None),
        ("podman", {}, {"/dev/shm": HOST_SHM}, None),  # the host's /dev/shm bound: nothing amiss
        ("podman", {"SLURM_TMPDIR": "/l/job1"}, {"/l/job1": None, "/dev/shm": PODMAN_SHM}, None),  # a disk tier passed in
        ("podman", {}, {"/dev/shm": PODMAN_SHM}, ["/dev/shm is a 62.5 MiB tmpfs, the container's own", "nodes that do not fit there"]),
        ("docker", {}, {}, ["(docker): no node-local tier usable", "nodes run in the work directory"]),
        (
            "apptainer",
            {"SLURM_JOB_ID": "7"},
            {"/dev/shm": HOST_SHM},
            ["/dev/shm is a tier", "$SLURM_TMPDIR was not passed in", "goes unused"],
        ),
        ("apptainer", {"TMPDIR": "/tmp"}, {"/tmp": RamMount(64 * MiB, "tmpfs")}, ["/tmp is a 64.0 MiB tmpfs, the container's own"]),
        ("podman", {}, {"/dev/shm": RamMount(SMALL_RAM, "shm")}, None),  # --shm-size=1g: the user's choice
    ],
)
def test_the_container_line_says_what_it_found_and_what_to_bind(where, env, found, says):
    line = advice(where, env, found, [])
    if says is None:
        assert line is None
        return
    assert line is not None and "\n" not in line and line.startswith(f"[Sea] inside a container ({where}): ")
    assert "-v /dev/shm:/dev/shm" in line and "-B $SLURM_TMPDIR --env SLURM_TMPDIR=$SLURM_TMPDIR" in line and "-e SLURM_TMPDIR" in line
    for part in says:
        assert part in line, line


def test_runtime_reads_each_runtimes_mark(tmp_path):
    assert container.runtime({}, tmp_path) is None
    assert container.runtime({"container": "systemd-nspawn"}, tmp_path) == "systemd-nspawn"
    assert container.runtime({"APPTAINER_CONTAINER": "/images/fmriprep.sif"}, tmp_path) == "apptainer"
    (tmp_path / ".dockerenv").touch()
    assert container.runtime({}, tmp_path) == "docker"
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".containerenv").touch()
    assert container.runtime({}, tmp_path) == "podman"
    (tmp_path / ".singularity.d").mkdir()
    assert container.runtime({}, tmp_path) == "apptainer"


def test_ram_mount_reads_a_real_tmpfs(tmpfs_factory, disk_dir):
    small = tmpfs_factory("64M")
    assert container.ram_mount(small) == RamMount(64 * MiB, "tmpfs")
    (small / "sub").mkdir()
    assert container.ram_mount(small / "sub") == RamMount(64 * MiB, "tmpfs")
    assert container.ram_mount(disk_dir) is None


def test_discovery_in_a_container_says_it_once(tmpfs_factory, disk_dir, monkeypatch, caplog):
    """discover_tiers on this machine's real mounts, with Apptainer's mark in the environment: a
    64 MiB $TMPDIR and the home on /dev/shm (so /dev/shm is left out) is one line naming the tmpfs
    and the binds; a job that lost its $SLURM_TMPDIR is said even beside a large /dev/shm."""
    small = tmpfs_factory("64M")
    for name in ("SLURM_TMPDIR", "SLURM_JOB_ID", "SINGULARITY_CONTAINER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("APPTAINER_CONTAINER", "/images/engine.sif")
    monkeypatch.setenv("TMPDIR", str(small))
    with caplog.at_level(logging.INFO, logger="sea"):
        found = discover_tiers(Path("/dev/shm"))
    assert [spec.path for spec in found] == [str(small)]
    (line,) = [r.getMessage() for r in caplog.records if r.name == "sea"]
    assert line.startswith("[Sea] inside a container (apptainer): ") and f"{small} is a 64.0 MiB tmpfs" in line, line
    assert "/dev/shm: on the home's filesystem" not in line and "-v /dev/shm:/dev/shm" in line

    caplog.clear()
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    with caplog.at_level(logging.INFO, logger="sea"):
        found = discover_tiers(disk_dir)
    (line,) = [r.getMessage() for r in caplog.records if r.name == "sea"]
    if os.statvfs("/dev/shm").f_blocks * os.statvfs("/dev/shm").f_frsize >= SMALL_RAM:
        assert [spec.path for spec in found] == [str(small), "/dev/shm"]
    assert "$SLURM_JOB_ID is set but $SLURM_TMPDIR was not passed in" in line, line
