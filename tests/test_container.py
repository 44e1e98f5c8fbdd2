"""Sea inside the engine's container (docs/containers.md).

The fast part: tier discovery's one line inside a container (sea/container.py), decided on the
figures a container shows, and read from real mounts (a 64 MiB tmpfs mounted here, as Docker's
and Podman's own /dev/shm). The slow part (--run-slow): a real Podman runs an image built here as
fMRIPrep's is built (its own Python environment), extended with the page's Dockerfile word for
word, a workflow in it under SeaMultiProc and under MultiProc with node-local tiers bound from the
host: the same outputs, byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import ssl
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from sea import container
from sea.container import SMALL_RAM, RamMount, advice
from sea.report import RunReport
from sea.tiers import discover_tiers

from conftest import tree_files

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
        ("docker", {}, {}, ["(docker): no node-local tier usable", "this run is home-only, every node runs in the work directory"]),
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


# ------------------------------------------------- runs in other PID namespaces (containers) sharing a tier
IN_NAMESPACE = """
import os, sys, time
from pathlib import Path
from sea.config import SeaConfig
from sea.lock import RunLock
from sea.tiers import StorageHierarchy
tier, home = sys.argv[1], Path(sys.argv[2])
lock = RunLock.acquire(home)
hierarchy = StorageHierarchy.build(SeaConfig.load({"tiers": [{"path": tier}]}), home)
print(os.getpid(), hierarchy.fast_tiers[0].workdir, flush=True)
time.sleep(600)
"""


def in_other_pid_namespace(script: str, *args: str, hostname: str | None = None) -> subprocess.Popen:
    """``python -c script args`` as a container runs it: in a PID namespace of its own (its PIDs
    none of this one's: the first it hands out is one no process has here), the same host name
    (``--network=host``) or ``hostname`` (a container's own, Docker's and Podman's default)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare (util-linux) for a PID namespace")
    free = next(p for p in range(30000, 1, -1) if not psutil.pid_exists(p) and not psutil.pid_exists(p + 1))
    command = f"echo {free} > /proc/sys/kernel/ns_last_pid; {shlex.quote(sys.executable)} -c {shlex.quote(script)} {shlex.join(args)}"
    if hostname is not None:
        command = f"hostname {shlex.quote(hostname)} && {command}"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    uts = ["--uts"] if hostname is not None else []
    return subprocess.Popen(["unshare", "--pid", *uts, "--fork", "--kill-child", "--mount-proc", "sh", "-c", command], stdout=subprocess.PIPE, text=True, env=env)


@pytest.mark.parametrize("hostname", [None, "ctr-a1b2c3"])
def test_a_run_in_another_pid_namespace_keeps_its_tier_directory_and_its_work_directory(tmpfs_factory, disk_dir, hostname):
    """Two containers binding the host's /dev/shm (or the host and one container) on one node: each
    sees none of the other's PIDs, under the same host name or each under its own. A run starting
    beside a live one in another namespace removed its tier directory as a killed run's (its PID
    not found), and took over its work directory's lock; under a host name of its own, a killed
    run's tier directory stayed for good (RAM of the node) and its work directory was refused for
    five minutes (the fourteenth adversarial pass). Now both are judged by the lock the live run
    holds, on this machine's own filesystems: kept while it lives, removed and taken over once it
    is killed."""
    from sea.config import SeaConfig
    from sea.lock import RunLock, SeaRunLocked
    from sea.tiers import StorageHierarchy

    tier, home = tmpfs_factory("64m"), disk_dir / "work"
    other = in_other_pid_namespace(IN_NAMESPACE, str(tier), str(home), hostname=hostname)
    try:
        pid, workdir = other.stdout.readline().split()
        assert not psutil.pid_exists(int(pid)), "the namespace's PID names a process here: the test shows nothing"
        mine = StorageHierarchy.build(SeaConfig.load({"tiers": [{"path": str(tier)}]}), disk_dir / "mine")
        assert Path(workdir).is_dir(), "the live run's tier directory was removed as a killed run's"
        with pytest.raises(SeaRunLocked, match="another Sea run is using"):
            RunLock.acquire(home)
    finally:
        inside = psutil.Process(other.pid).children(recursive=True)
        other.kill()  # (--kill-child: the namespace's processes with it)
        other.wait(timeout=30)
        psutil.wait_procs(inside, timeout=30)
    again = StorageHierarchy.build(SeaConfig.load({"tiers": [{"path": str(tier)}]}), disk_dir / "again")
    assert not Path(workdir).exists(), "a killed run's tier directory is still there"
    taken = RunLock.acquire(home)  # taken over at once: its flock went with it
    assert taken.killed_run is not None, "taken over without a word (PID 1 in each container, say)"
    taken.release()
    for hierarchy in (mine, again):
        for t in hierarchy.fast_tiers:
            t.private.remove_all()


PYDRA_IN_NAMESPACE = """
import sys, time
from pathlib import Path
from pydra.compose import python, workflow
from pydra.engine.submitter import Submitter

@python.define
def Wait(x: int, marker: str) -> int:
    while Path(marker).exists():  # the container's run: held until it is killed
        time.sleep(0.1)
    return x + 1

@workflow.define
def Waits(xs: list[int], marker: str) -> list[int]:
    return workflow.add(Wait(marker=marker).split(x=xs)).out

tier, home, marker = sys.argv[1:4]
with Submitter(worker="sea", cache_root=home, n_procs=1, sea={"tiers": [{"path": tier}]}) as sub:
    result = sub(Waits(xs=[1, 2], marker=marker))
print("outputs", result.outputs.out, flush=True)
"""


def test_a_pydra_run_killed_in_a_container_of_its_own_host_name_is_resumed_past_its_lock_files(tmpfs_factory, disk_dir, tmp_path):
    """fMRIPrep's way under Pydra: a container (a PID namespace and a host name of its own, Docker's
    and Podman's default) runs the workflow and is killed; the same cache_root is resumed from
    another. The killed job's Pydra lock file names the container's host: filelock cannot tell its
    holder is gone, and the resume waited for it forever (under ``cf`` too: the sixteenth
    adversarial pass). Sea knows that run was killed (it took its run lock over), and removes the
    lock files it made, saying so."""
    pytest.importorskip("pydra.compose", reason="Pydra 1.0 needs Python >= 3.11")
    from pydra_sea import _pydra_internals as px_

    tier, home, marker = tmpfs_factory("64m"), disk_dir / "cache", tmp_path / "hold"
    marker.touch()
    other = in_other_pid_namespace(PYDRA_IN_NAMESPACE, str(tier), str(home), str(marker), hostname="ctr-a1b2c3")
    try:
        deadline = time.monotonic() + 120
        while not [p for p in home.glob("*.lock") if px_.JOB_SIDE_FILE.fullmatch(p.name) and p.stat().st_size]:
            assert other.poll() is None and time.monotonic() < deadline, "the container's run never took a job's lock"
            time.sleep(0.1)
    finally:
        inside = psutil.Process(other.pid).children(recursive=True)
        other.kill()  # (--kill-child: the namespace's processes with it)
        other.wait(timeout=30)
        psutil.wait_procs(inside, timeout=30)
    left = [p for p in home.glob("*.lock") if px_.JOB_SIDE_FILE.fullmatch(p.name)]
    assert any("ctr-a1b2c3" in p.read_text() for p in left), "no lock names the container: the test shows nothing"
    marker.unlink()
    resumed = subprocess.run(
        [sys.executable, "-c", PYDRA_IN_NAMESPACE, str(tier), str(home), str(marker)],
        capture_output=True, text=True, timeout=150, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
    )  # fmt: skip
    assert resumed.returncode == 0 and "outputs [2, 3]" in resumed.stdout, resumed.stderr[-3000:]
    assert "lock files left by the run that was killed" in resumed.stderr, resumed.stderr[-3000:]


def test_a_lock_someone_else_holds_on_a_dead_container_runs_lock_file_does_not_keep_it(disk_dir):
    """The work directory's lock file may be read, and so locked, by others: a lock held on it does
    not keep a run from another PID namespace alive past its heartbeat."""
    import fcntl
    import json
    import socket

    from sea.lock import LOCK, STALE_AFTER, RunLock, SeaRunLocked

    home = disk_dir / "work"
    (home / LOCK).parent.mkdir(parents=True)
    (home / LOCK).write_text(json.dumps({"host": socket.gethostname(), "pid": 4242, "pidns": "pid:[1]", "started": 0}))
    reader = os.open(home / LOCK, os.O_RDONLY)
    try:
        fcntl.flock(reader, fcntl.LOCK_EX)  # (flock asks for no write access)
        with pytest.raises(SeaRunLocked):  # its heartbeat is recent: it may live
            RunLock.acquire(home)
        old = time.time() - STALE_AFTER - 60
        os.utime(home / LOCK, (old, old))
        RunLock.acquire(home).release()  # no heartbeat for longer than a run's: taken over
    finally:
        os.close(reader)


def test_a_run_whose_lock_another_user_held_first_is_not_taken_for_dead(disk_dir):
    """The fourteenth adversarial pass: another user who may read the lock file holds its flock a
    moment as a run creates it, so that the run goes on without one; a run in another PID
    namespace then took that live run's silence for death. A run records whether it holds its
    lock: one that does not is judged by its heartbeat."""
    import fcntl

    from sea.lock import LOCK, RunLock, SeaRunLocked

    home = disk_dir / "work"
    (home / LOCK).parent.mkdir(parents=True)
    real_flock = fcntl.flock

    def taken_first(fd, operation):  # the other user's moment, as the run asks
        if operation == fcntl.LOCK_EX | fcntl.LOCK_NB:
            raise BlockingIOError(11, "held by another user")
        return real_flock(fd, operation)

    fcntl.flock = taken_first
    try:
        live = RunLock.acquire(home)
    finally:
        fcntl.flock = real_flock
    try:
        record = json.loads((home / LOCK).read_text())
        (home / LOCK).write_text(json.dumps({**record, "pidns": "pid:[1]"}))  # as a container sees it: its PID says nothing
        with pytest.raises(SeaRunLocked, match="another Sea run is using"):
            RunLock.acquire(home)
        assert record.get("flock") is False
    finally:
        live.release()


def test_a_killed_container_runs_lock_with_this_processs_pid_is_taken_over_as_a_killed_runs(disk_dir):
    """A container's first process is PID 1 in every container: the lock of a killed run there,
    taken over by the next container's PID 1, was taken for this process's own, without a word
    and without what follows a killed run (Pydra's empty lock files it left, removed)."""
    import socket

    from sea.lock import LOCK, RunLock

    home = disk_dir / "work"
    (home / LOCK).parent.mkdir(parents=True)
    killed = {"host": socket.gethostname(), "pid": os.getpid(), "pidns": "pid:[1]", "started": 1234.5, "created": 0.0, "flock": True}
    (home / LOCK).write_text(json.dumps(killed))
    taken = RunLock.acquire(home)
    try:
        assert taken.killed_run["started"] == 1234.5
    finally:
        taken.release()


# --------------------------------------------------------------------------------- docs/containers.md with a real Podman
ROOT = Path(__file__).parents[1]
CACHE = Path("/var/tmp/sea-test-containers")  # Podman's storage (overlay) and the engine image, kept between runs
RECIPE = Path(__file__).parent / "container"
DEBIAN = ["mmdebstrap", "--variant=apt", "--include=python3,python3-venv", "--dpkgopt=path-exclude=/usr/share/doc/*",
          "--dpkgopt=path-exclude=/usr/share/man/*", "--dpkgopt=path-exclude=/usr/share/locale/*", "bookworm"]  # fmt: skip
# Podman as root on this machine: its own storage under CACHE; runc, since crun refuses the
# hybrid cgroup hierarchy found here; the limits the machine lets a container have (Podman's
# defaults are above this machine's hard limits, which root may not raise here); the host's network
# (pip reaches PyPI while building; nothing is pulled from a registry).
PODMAN = ["podman", f"--root={CACHE}/storage", f"--runroot={CACHE}/run", "--storage-driver=overlay",
          "--cgroup-manager=cgroupfs", "--events-backend=file", "--runtime=runc"]  # fmt: skip
RUN_OPTIONS = ["--network=host", "--ulimit=nofile=4096:4096", "--ulimit=nproc=4096:4096"]
DERIVED = "localhost/sea-test-fmriprep-sea:latest"
FIGURES: dict[str, str] = {}


def docs_block(test: str, lang: str, start: str = "") -> str:
    from test_docs import handled_by

    (block,) = [b for b in handled_by(f"test_container.py::{test}") if b.lang == lang and b.text.startswith(start)]
    return block.text


def podman(*args: str, timeout: float = 900, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run([*PODMAN, *args], capture_output=True, text=True, timeout=timeout, **kwargs)
    assert not check or done.returncode == 0, f"podman {' '.join(args[:3])}: {done.stderr[-3000:]}"
    return done


def to_podman(line: str, options: list[str]) -> str:
    """A page's ``docker run`` or ``docker build`` line as this machine's Podman runs it."""
    words = line.split(maxsplit=2)
    assert words[0] == "docker" and words[1] in ("run", "build"), line
    return " ".join([*map(shlex.quote, PODMAN), words[1], *options, words[2]])


def replaced(text: str, pairs: list[tuple[str, str]]) -> str:
    for old, new in pairs:
        assert text.count(old) >= 1, f"{old!r} is not in the page's block: update the test"
        text = text.replace(old, new)
    return text


@pytest.fixture(scope="module")
def engine_image():
    """The engine image (tests/container/): built once, cached under CACHE by a hash of its recipe.
    Podman and mmdebstrap installed with apt-get when missing (as root)."""
    missing = [package for package, tool in (("podman", "podman"), ("runc", "runc"), ("mmdebstrap", "mmdebstrap")) if shutil.which(tool) is None]
    if missing:
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            pytest.skip(f"needs {' '.join(missing)}: apt-get install {' '.join(missing)} (as root)")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=600)
        done = subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], env=env, capture_output=True, text=True, timeout=1200)
        assert done.returncode == 0, done.stderr[-2000:]
    recipe = "\n".join([*DEBIAN, *((RECIPE / name).read_text() for name in ("engine.Containerfile", "fmriprep"))])
    key = hashlib.sha256(recipe.encode()).hexdigest()[:12]
    tag = f"localhost/sea-test-engine:{key}"
    CACHE.mkdir(exist_ok=True)
    if podman("image", "exists", tag, check=False).returncode != 0:
        start = time.monotonic()
        podman("rmi", "--all", "--force", check=False)  # an older recipe's images
        rootfs = CACHE / "rootfs.tar"
        made = subprocess.run([*DEBIAN, str(rootfs), "http://deb.debian.org/debian"], capture_output=True, text=True, timeout=1200)
        assert made.returncode == 0, made.stderr[-3000:]
        podman("import", str(rootfs), f"localhost/sea-test-debian:{key}")
        rootfs.unlink()
        context = CACHE / "engine"
        shutil.rmtree(context, ignore_errors=True)
        context.mkdir()
        (context / "Containerfile").write_text((RECIPE / "engine.Containerfile").read_text().replace(":KEY", f":{key}"))
        shutil.copy(RECIPE / "fmriprep", context / "fmriprep")
        bundle = os.environ.get("PIP_CERT") or ssl.get_default_verify_paths().cafile or certifi_bundle()
        podman("build", *RUN_OPTIONS, f"--volume={bundle}:/etc/ssl/host-ca.crt:ro", "--build-arg=PIP_CERT=/etc/ssl/host-ca.crt", "-t", tag, str(context), timeout=1800)
        FIGURES["engine image built in"] = f"{time.monotonic() - start:.0f} s"
    size = podman("image", "inspect", "--format", "{{.Size}}", tag).stdout.strip()
    FIGURES["engine image"] = f"{tag}, {int(size) / 2**20:.0f} MiB"
    yield tag
    print("\n".join(f"{what}: {figure}" for what, figure in FIGURES.items()))


def certifi_bundle() -> str:
    import certifi  # pip's own bundle, when Python has no default one

    return certifi.where()


def make_study(root: Path) -> tuple[Path, Path]:
    """The host's /data (three inputs of 2 MiB in /data/bids) and /scratch/$USER."""
    bids = root / "data" / "bids"
    bids.mkdir(parents=True)
    for i, name in enumerate(("sub-01_bold.bin", "sub-02_bold.bin", "sub-03_bold.bin")):
        (bids / name).write_bytes(bytes((j * (i + 3)) % 251 for j in range(256)) * (8 << 10))
    (root / "scratch").mkdir()
    return root / "data", root / "scratch"


def run_line(line: str, root: Path, image: str, env: dict, extra: list[tuple[str, str]] = ()) -> tuple[subprocess.CompletedProcess, float]:
    """A page's ``docker run`` line, with this study's /data and /scratch/$USER bound in their place."""
    data, scratch = root / "data", root / "scratch"
    line = replaced(line, [('-v /data:/data', f"-v {data}:/data"), ('-v "/scratch/$USER:/scratch/$USER"', f'-v "{scratch}:/scratch/$USER"'), *extra])
    line = line.replace("fmriprep-sea:24.1.1", image).replace("nipreps/fmriprep:24.1.1", image)
    start = time.monotonic()
    done = subprocess.run(["bash", "-c", to_podman(line, RUN_OPTIONS)], capture_output=True, text=True, env={**os.environ, "USER": "sea-user", **env}, timeout=900)
    return done, time.monotonic() - start


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_derived_image_runs_the_pipeline_as_multiproc_does(engine_image, tmp_path, tmpfs_factory):
    """containers.md's derived image, built with its commands and Dockerfile (FROM the engine
    image); its docker run line (on Podman) with the page's plugin file (n_procs and memory_gb this
    machine's), $SLURM_TMPDIR a tmpfs bound from the host: every node runs there; the same line with
    no --use-plugin (fMRIPrep's MultiProc) in the same image: the same derivatives, byte for byte;
    and without the binds, the container line the page shows."""
    build = docs_block("test_derived_image_runs_the_pipeline_as_multiproc_does", "bash", "# on the host")
    dockerfile = docs_block("test_derived_image_runs_the_pipeline_as_multiproc_does", "dockerfile")
    context = tmp_path / "fmriprep-sea"
    wheel_line, build_line = [line for line in build.splitlines() if not line.startswith("#")]
    wheel = subprocess.run(["bash", "-c", replaced(wheel_line, [("python ", f"{sys.executable} "), ("-w fmriprep-sea", f"-w {context}")])],
                           capture_output=True, text=True, cwd=ROOT, timeout=600)  # fmt: skip
    assert wheel.returncode == 0, wheel.stderr[-3000:]
    (context / "Dockerfile").write_text(replaced(dockerfile, [("FROM nipreps/fmriprep:24.1.1", f"FROM {engine_image}")]))
    start = time.monotonic()
    build_line = replaced(build_line.split("#")[0].strip(), [("fmriprep-sea:24.1.1", DERIVED), (" fmriprep-sea", f" {context}")])
    built = subprocess.run(["bash", "-c", to_podman(build_line, RUN_OPTIONS)], capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    FIGURES["derived image built in"] = f"{time.monotonic() - start:.1f} s"
    podman("image", "prune", "--force")  # the previous run's derived image
    size = int(podman("image", "inspect", "--format", "{{.Size}}", DERIVED).stdout.strip())
    FIGURES["derived image"] = f"{size / 2**20:.0f} MiB"

    plugin_yaml = plugin_file()
    line = docs_block("test_derived_image_runs_the_pipeline_as_multiproc_does", "bash", "docker run")
    slurm_tmpdir = tmpfs_factory("256M")
    runs = run_both(line, tmp_path, DERIVED, {"SLURM_TMPDIR": str(slurm_tmpdir)}, "{} run in the container")
    sea_out, mp_out = (tree_files(tmp_path / plugin / "data" / "derivatives") for plugin in ("SeaMultiProc", "MultiProc"))
    assert len(sea_out) == 3 and sea_out == mp_out, (sorted(sea_out), sorted(mp_out))
    FIGURES["derivatives"] = f"{len(sea_out)} files, {sum(map(len, sea_out.values())) / 2**20:.0f} MiB, byte-identical"
    report = RunReport.from_json(tmp_path / "SeaMultiProc" / "scratch" / "work" / "sea-report.json")
    assert report.success and report.nodes_run == report.nodes_total > 0, report.to_text()
    first = report.tiers[0]
    assert Path(first.path) == slurm_tmpdir and first.nodes_placed == report.nodes_run, report.to_text()
    assert "inside a container" not in runs["SeaMultiProc"].stderr, runs["SeaMultiProc"].stderr[-3000:]
    assert list(slurm_tmpdir.iterdir()) == []

    # without the binds: the container's own /dev/shm, no $SLURM_TMPDIR
    root = tmp_path / "unbound"
    _data, scratch = make_study(root)
    (scratch / "sea-plugin.yml").write_text(plugin_yaml)
    unbound = replaced(line, [("-v /dev/shm:/dev/shm ", ""), ('-v "$SLURM_TMPDIR:$SLURM_TMPDIR" -e SLURM_TMPDIR ', "")])
    done, _seconds = run_line(unbound, root, DERIVED, {})
    assert done.returncode == 0, done.stderr[-4000:]
    said = [line for line in done.stderr.splitlines() if "inside a container" in line]
    expected = docs_block("test_derived_image_runs_the_pipeline_as_multiproc_does", "text").strip()
    assert len(said) == 1 and said[0][said[0].index("[Sea] "):] == expected, said
    FIGURES["without binds, Sea said"] = said[0][said[0].index("[Sea] "):]
    assert tree_files(root / "data" / "derivatives") == mp_out


def plugin_file() -> str:
    """containers.md's --use-plugin file, at this machine's size."""
    return replaced(docs_block("test_derived_image_runs_the_pipeline_as_multiproc_does", "yaml"), [("n_procs: 8", "n_procs: 2"), ("memory_gb: 32", "memory_gb: 4")])


def run_both(line: str, tmp_path: Path, image: str, env: dict[str, str], figure: str, multiproc_drops: list[tuple[str, str]] = ()) -> dict:
    """The page's run ``line`` in ``image`` with Sea's plugin file, then without it (MultiProc, and
    ``multiproc_drops`` taken out of the line), each on a study of its own under ``tmp_path``."""
    runs = {}
    for plugin in ("SeaMultiProc", "MultiProc"):
        root = tmp_path / plugin
        _data, scratch = make_study(root)
        (scratch / "sea-plugin.yml").write_text(plugin_file())
        drop = [] if plugin == "SeaMultiProc" else [*multiproc_drops, (' --use-plugin "/scratch/$USER/sea-plugin.yml"', "")]
        done, seconds = run_line(line, root, image, env, drop)
        assert done.returncode == 0 and f"fmriprep: {plugin} done" in done.stdout, done.stdout[-2000:] + done.stderr[-4000:]
        runs[plugin] = done
        FIGURES[figure.format(plugin)] = f"{seconds:.1f} s"
    return runs


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_without_rebuilding_sea_is_bound_into_the_engine_image(engine_image, tmp_path, tmpfs_factory):
    """containers.md's route without rebuilding: Sea installed on the host (the page's commands,
    ~ being tmp_path) and bound into the unchanged engine image with PYTHONPATH: `plugin:
    SeaMultiProc` resolves by name (sitecustomize.py reads Sea's .pth file), every node runs in the
    bound $SLURM_TMPDIR, the derivatives are those of MultiProc in the same image."""
    commands = docs_block("test_without_rebuilding_sea_is_bound_into_the_engine_image", "bash", "# on the host")
    env = {**os.environ, "HOME": str(tmp_path), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    for command in [line for line in commands.splitlines() if not line.startswith("#")]:
        done = subprocess.run(["bash", "-c", command.replace("dist", str(tmp_path / "dist"))], capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
        assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
    assert (tmp_path / "sea-in-container" / "sea_workflows.pth").is_file()
    line = docs_block("test_without_rebuilding_sea_is_bound_into_the_engine_image", "bash", "docker run")
    slurm_tmpdir = tmpfs_factory("256M")
    env = {"SLURM_TMPDIR": str(slurm_tmpdir), "HOME": str(tmp_path)}
    run_both(line, tmp_path, engine_image, env, "no rebuild: {} run", [("-v ~/sea-in-container:/opt/sea:ro -e PYTHONPATH=/opt/sea ", "")])
    outputs = {plugin: tree_files(tmp_path / plugin / "data" / "derivatives") for plugin in ("SeaMultiProc", "MultiProc")}
    assert len(outputs["SeaMultiProc"]) == 3 and outputs["SeaMultiProc"] == outputs["MultiProc"]
    report = RunReport.from_json(tmp_path / "SeaMultiProc" / "scratch" / "work" / "sea-report.json")
    assert report.success and Path(report.tiers[0].path) == slurm_tmpdir and report.tiers[0].nodes_placed == report.nodes_run > 0, report.to_text()


def test_apptainer_recipe_installs_what_the_dockerfile_installs():
    """Apptainer is not packaged for Debian 12: the page's definition file is checked, not built.
    It starts from the Dockerfile's image, copies the wheel `pip wheel` builds of this version, and
    runs the Dockerfile's RUN command with the image's Python named in full; its run line passes
    $SLURM_TMPDIR through --cleanenv and binds what the docker run line binds."""
    import configparser

    version = configparser.ConfigParser()
    version.read(ROOT / "setup.cfg")
    wheel = f"sea_workflows-{version['metadata']['version']}-py3-none-any.whl"
    dockerfile = docs_block("test_derived_image_runs_the_pipeline_as_multiproc_does", "dockerfile")
    definition = docs_block("test_apptainer_recipe_installs_what_the_dockerfile_installs", "singularity")
    sections = dict(re.findall(r"^%(\w+)\n(.*?)(?=^%|\Z)", definition, re.M | re.S))
    assert re.search(r"^Bootstrap: docker\nFrom: (\S+)$", definition, re.M)[1] == re.search(r"^FROM (\S+)$", dockerfile, re.M)[1]
    assert sections["files"].split() == [wheel, "/tmp/"]
    run = re.search(r"^RUN (.*?)(?=^\S|\Z)", dockerfile, re.M | re.S)[1]
    assert sections["post"].split() == run.replace("python ", "/opt/conda/envs/fmriprep/bin/python ").split()
    docker = shlex.split(docs_block("test_derived_image_runs_the_pipeline_as_multiproc_does", "bash", "docker run"))
    apptainer = shlex.split(docs_block("test_apptainer_recipe_installs_what_the_dockerfile_installs", "bash", "apptainer run"))
    assert apptainer[:3] == ["apptainer", "run", "--cleanenv"] and ["--env", "SLURM_TMPDIR=$SLURM_TMPDIR"] == apptainer[3:5]
    binds = [apptainer[i + 1] for i, word in enumerate(apptainer) if word == "-B"]
    assert binds == ["$SLURM_TMPDIR", "/data", "/scratch/$USER"]
    assert apptainer[apptainer.index("fmriprep-sea.sif") + 1 :] == docker[docker.index("fmriprep-sea:24.1.1") + 1 :]


def test_a_killed_containers_run_recorded_with_this_namespace_number_is_judged_by_its_lock(tmpfs_factory, disk_dir):
    """The sixteenth adversarial pass: Podman gives a new container the PID namespace number of one
    killed before. A run killed in container ``hostA`` and resumed in container ``hostB`` found its
    own namespace recorded under another host name: neither the killed run's PID nor its lock was
    asked, only its heartbeat. The resume was refused for five minutes (MultiProc's resumes at once),
    and the killed run's tier directory stayed (RAM of the node). Both are judged by the lock now,
    free once its run is dead, on this machine's own filesystems."""
    from sea.lock import LOCK, RunLock
    from sea.private import OWNER_FILE, pid_namespace
    from sea.tiers import dead_private_dirs

    home = disk_dir / "work"
    (home / LOCK).parent.mkdir(parents=True)
    now = time.time()
    killed = {"host": "ctr-killed", "pid": 1, "pidns": pid_namespace(), "flock": True, "started": now, "created": now}
    (home / LOCK).write_text(json.dumps(killed))  # its heartbeat fresh, its lock free: killed a moment ago
    taken = RunLock.acquire(home)
    assert taken.killed_run is not None, "taken over without a word"
    taken.release()
    tier = tmpfs_factory("8m")
    left = tier / "sea-killedctr"
    left.mkdir(mode=0o700)
    (left / OWNER_FILE).write_text(f"1 ctr-killed /work\n{pid_namespace()}\n")
    assert dead_private_dirs(tier) == [left], "a killed container's tier directory is kept"
