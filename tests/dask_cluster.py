"""A real Dask cluster of 3 worker processes named w0-w2, each with its own tier directory (w0's a
48M tmpfs), as three compute nodes would have, and an audit hook in each worker process that
records every file it opens, lists, renames or removes under any tier. Import the fixture with
``from dask_cluster import *`` (pytest finds fixtures by name)."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from distributed import Client, Nanny, Scheduler, SpecCluster, WorkerPlugin

from conftest import mounted_tmpfs

WATCHED = ("open", "os.listdir", "os.scandir", "os.rename", "os.remove", "os.rmdir", "os.mkdir", "shutil.rmtree", "shutil.copyfile")


class AccessLog(WorkerPlugin):
    """Records, in the worker process, every path under ``roots`` that Python code touches."""

    def __init__(self, roots: list[str]):
        self.roots = roots

    def setup(self, worker) -> None:
        seen: set[str] = set()
        roots = tuple(self.roots)

        def hook(event, args):
            if event in WATCHED and args and isinstance(args[0], (str, os.PathLike)):
                path = os.fspath(args[0])
                if path.startswith(roots):
                    seen.add(path)

        sys.addaudithook(hook)  # for the life of the worker process, which ends with the test
        worker.sea_access_log = seen


def access_log(dask_worker=None) -> list[str]:
    return sorted(dask_worker.sea_access_log)


@contextlib.contextmanager
def three_workers(tiers: dict[str, Path], local_directory: Path):
    """Three single-threaded worker processes named w0-w2; ``SEA_TEST_TIER`` is each one's tier."""
    workers = {name: {"cls": Nanny, "options": {"nthreads": 1, "name": name, "env": {"SEA_TEST_TIER": str(path)}, "local_directory": str(local_directory)}} for name, path in tiers.items()}
    with SpecCluster(workers=workers, scheduler={"cls": Scheduler, "options": {"dashboard": False}}) as spec:
        with Client(spec) as client:
            client.wait_for_workers(3)
            client.register_plugin(AccessLog([str(p) for p in tiers.values()]), name="access-log")
            yield spec.scheduler_address, tiers, client
    # the tiers may keep only what a failed test left


def worker_tiers(small: Path, shm: Path) -> dict[str, Path]:
    """w0's tier a 48M tmpfs, w1's and w2's directories of /dev/shm."""
    (shm / "w1").mkdir()
    (shm / "w2").mkdir()
    return {"w0": Path(small), "w1": shm / "w1", "w2": shm / "w2"}


@pytest.fixture
def cluster(tmpfs_factory, shm_dir, tmp_path):
    """A cluster of the test's own: for a test that kills or stops a worker."""
    with three_workers(worker_tiers(tmpfs_factory("48M"), shm_dir), tmp_path / "dask") as running:
        yield running


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory):
    """One cluster for the tests of a module that leave it as they found it (each checks that the
    tiers end empty); starting one costs about 20 s of CPU: each worker process imports Dask and
    the engines. A worker's access log holds every test's paths: still only its own tier's."""
    with contextlib.ExitStack() as stack:
        shm = Path(tempfile.mkdtemp(prefix="sea-test-", dir="/dev/shm"))
        stack.callback(shutil.rmtree, shm, ignore_errors=True)
        small = stack.enter_context(mounted_tmpfs("48M"))
        yield stack.enter_context(three_workers(worker_tiers(small, shm), tmp_path_factory.mktemp("dask")))


# w1 and w2 share /dev/shm's filesystem; each worker sees only its own directory
SEA = {"tiers": [{"path": "${SEA_TEST_TIER}"}], "default_node_size": "1MiB"}


def assert_no_foreign_access(client, tiers: dict[str, Path], all_used: bool = True) -> None:
    """``all_used=False``: a worker restarted by its nanny after a kill may have run nothing since."""
    names = {address: str(info["name"]) for address, info in client.scheduler_info()["workers"].items()}
    for address, paths in client.run(access_log).items():
        mine = tiers[names[address]]
        foreign = [p for p in paths if not Path(p).is_relative_to(mine)]
        assert not foreign, f"{names[address]} opened another worker's tier: {foreign[:3]}"
        assert paths or not all_used, f"{names[address]} used no tier at all"
