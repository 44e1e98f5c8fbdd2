"""Fixtures: real filesystems (tmpfs mounted by the test, disk), real workflows, no mocks."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", help="also run the tests marked slow (full-size kill matrix, benchmarks)")


def pytest_configure(config):
    """The Debian packages the suite uses, installed before any test module is collected (the
    FUSE tests' modules load libfuse when imported); see tests/system_packages.py."""
    import system_packages

    # what `sea probe` measures stays with the test session, not in the user's ~/.cache/sea
    os.environ["SEA_CACHE"] = tempfile.mkdtemp(prefix="sea-test-cache-")
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the controller installed them before starting it
        return
    problem = system_packages.install_missing()
    if problem is not None and system_packages.can_install():  # it tried, and failed
        pytest.exit(problem, returncode=4)
    if problem is not None:  # not root, or not Debian: the tests that need them fail or skip, saying so
        config.issue_config_time_warning(pytest.PytestConfigWarning(problem), stacklevel=2)


# the longest modules first (measured: --durations, summed by module), so that pytest-xdist's workers,
# taking one module at a time, do not end with one of them running alone
LONGEST_FIRST = ["test_docs", "test_never_worse", "test_reruns", "test_dask", "test_memory_budget", "test_faults", "test_prefetch",
                 "test_nipype_e2e", "test_never_worse_beside", "test_registration", "test_slurm", "test_home_footprint",
                 "test_pydra_dask", "test_nipype_as_multiproc", "test_tier_fill", "test_pydra_worker", "test_data_loss",
                 "test_interrupt", "test_reruns_pydra", "test_resume_after_kill", "test_cli", "test_kill_matrix",
                 "test_benchmark_smoke", "test_hostile_mounts", "test_fmri_preproc", "test_security", "test_bad_input"]  # fmt: skip


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: each module's own order kept
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


TMPFS_PREFIX = "sea-test-tmpfs-"


def unmount_stale_tmpfs(parent: str = "/var/tmp") -> list[Path]:
    """Unmount and remove the tmpfs mounts of test runs that died without their cleanup (killed:
    a ``finally`` never ran). Each mount point names the pid of the run that made it."""
    removed = []
    for line in Path("/proc/mounts").read_text().splitlines():
        mountpoint = Path(line.split()[1])
        if mountpoint.parent != Path(parent) or not mountpoint.name.startswith(TMPFS_PREFIX):
            continue
        pid = mountpoint.name[len(TMPFS_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or Path(f"/proc/{pid}").exists():
            continue  # a live run's
        if subprocess.run(["umount", str(mountpoint)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True)
        shutil.rmtree(mountpoint, ignore_errors=True)
        removed.append(mountpoint)
    return removed


@contextlib.contextmanager
def mounted_tmpfs(size: str, parent: str = "/var/tmp", options: str = ""):
    """A fresh tmpfs of ``size`` (e.g. "8M"; ``options``, e.g. "noexec"), unmounted afterwards even if
    the test fails; one a killed run left is unmounted by the next (:func:`unmount_stale_tmpfs`)."""
    unmount_stale_tmpfs(parent)
    mountpoint = Path(tempfile.mkdtemp(prefix=f"{TMPFS_PREFIX}{os.getpid()}-", dir=parent))
    opts = f"size={size}" + (f",{options}" if options else "")
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(mountpoint)], capture_output=True, text=True)
    if result.returncode != 0:
        mountpoint.rmdir()
        pytest.fail(f"cannot mount a tmpfs (the tests need root): {result.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        if subprocess.run(["umount", str(mountpoint)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True)
        mountpoint.rmdir()


@pytest.fixture(scope="session")
def other_user() -> tuple[int, int]:
    """A real second user on this machine (``useradd``): the other user of a shared node. Test
    processes running side by side may both add it: the one that finds it made already takes it."""
    try:
        entry = pwd.getpwnam("sea-attacker")
    except KeyError:
        made = subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "sea-attacker"], capture_output=True, text=True)
        assert made.returncode in (0, 9), made.stderr  # 9: the name exists (another test process made it)
        entry = pwd.getpwnam("sea-attacker")
    return entry.pw_uid, entry.pw_gid


@pytest.fixture
def small_tmpfs():
    """A 24 MiB tmpfs: too small for the test workflows, so nodes spill to the next tier."""
    with mounted_tmpfs("24M") as path:
        yield path


@pytest.fixture
def tmpfs_factory():
    with contextlib.ExitStack() as stack:
        yield lambda size: stack.enter_context(mounted_tmpfs(size))


@pytest.fixture
def disk_dir():
    """A directory on disk (/var/tmp), not on any tmpfs: the 'shared filesystem' of most tests."""
    path = Path(tempfile.mkdtemp(prefix="sea-test-", dir="/var/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def shm_dir():
    path = Path(tempfile.mkdtemp(prefix="sea-test-", dir="/dev/shm"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def tree_files(root: Path) -> dict[str, bytes]:
    """Every regular file under ``root`` (relative path -> content)."""
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = Path(dirpath, name)
            out[str(path.relative_to(root))] = path.read_bytes()
    return out


def sea_private_dirs(*tier_roots: Path) -> list[Path]:
    return [p for root in tier_roots for p in Path(root).glob("sea-*")]


@pytest.fixture(autouse=True)
def _run_in_tmp(tmp_path, monkeypatch):
    """Nipype writes crash files (and, without base_dir, reports) to the working directory."""
    monkeypatch.chdir(tmp_path)


def build_tiers_as(uid: int, gid: int, tiers: list[Path], home: Path) -> list[str]:
    """For each tier, what ``StorageHierarchy.build`` says when an unprivileged user (``uid``,
    ``gid``) gives it with ``home``: its one-line refusal, or ``OK``. Run in a child process that
    imports Sea as root (the interpreter may live under /root) and then drops to the user."""
    code = (
        "import os\nfrom sea import SeaConfig, SeaConfigError\nfrom sea.tiers import StorageHierarchy\n"
        f"os.setgroups([]); os.setgid({gid}); os.setuid({uid})\n"
        f"for tier in {[str(t) for t in tiers]!r}:\n"
        f"    try:\n        StorageHierarchy.build(SeaConfig.load({{'tiers': [{{'path': tier}}]}}), {str(home)!r}).close()\n        print('OK')\n"
        "    except SeaConfigError as e:\n        print(e)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def refused_while_running(script: str, home: Path, second, times: int = 1, cwd: Path | None = None, timeout: float = 240) -> str:
    """Start ``script`` (a Sea run) in a child process; once it holds ``home``'s run lock and is
    under way, call ``second`` (another run on ``home``) ``times`` times: each must be refused in one
    line naming the first (its PID and host) while the first goes on. Returns the first's output,
    once it succeeded."""
    import socket
    import time

    from sea.lock import LOCK, SeaRunLocked

    first = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd)
    try:
        deadline = time.monotonic() + 60
        while not (home / LOCK).exists():
            assert first.poll() is None and time.monotonic() < deadline, "the first run never started"
            time.sleep(0.05)
        time.sleep(1.0)  # the first run is under way: its nodes run, its copies go home
        for _ in range(times):
            with pytest.raises(SeaRunLocked) as info:
                second()
            message = str(info.value)
            assert "\n" not in message and f"PID {first.pid}" in message and socket.gethostname() in message, message
            assert first.poll() is None, "the first run ended before the second was refused: the test proves nothing"
        log = first.communicate(timeout=timeout)[0]
        assert first.returncode == 0, log[-3000:]
        return log
    finally:
        if first.poll() is None:
            first.kill()
