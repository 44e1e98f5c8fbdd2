"""What pydra_sea reads of Pydra's internals (pydra_sea/_pydra_internals.py), checked against the
installed Pydra: when one of these fails, Pydra changed and the adapter must follow."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

pytest.importorskip("pydra.compose", reason="Pydra 1.0 needs Python >= 3.11")

import attrs  # noqa: E402
from fileformats.generic import File  # noqa: E402
from pydra.compose import python, workflow  # noqa: E402
from pydra.engine.submitter import Submitter  # noqa: E402
from pydra.workers import cf  # noqa: E402

from pydra_sea import _pydra_internals as px_  # noqa: E402


@python.define
def Inc(x: int) -> int:
    return x + 1


@workflow.define
def Pair(xs: list[int]) -> list[int]:
    first = workflow.add(Inc().split(x=xs), name="first")
    second = workflow.add(Inc(x=first.out), name="second")
    return second.out


@attrs.define
class Probe(cf.ConcurrentFuturesWorker):
    """Records, for each node job, what the adapter reads from Pydra while it runs."""

    _plugin_name = "probe"
    seen: list = attrs.field(factory=list)
    workflows: list = attrs.field(factory=list)

    def __getstate__(self):
        return {**super().__getstate__(), "seen": [], "workflows": []}

    def __setstate__(self, state):
        super().__setstate__(state)

    async def submit(self, job, rerun=False):
        self.workflows.append(job)
        return await super().submit(job, rerun=rerun)

    async def run(self, job, rerun=False):
        graph = px_.exec_graph(self.workflows[-1])
        node = next((n for j, n in px_.jobs_named(graph, job.name) if j is job), None)
        self.seen.append(
            {
                "name": job.name,
                "node": node.name if node else None,
                "jobs": len(px_.jobs_of(node)) if node else 0,
                "preds": [p.name for p in px_.predecessors(graph, node)] if node else None,
                "succs": [s.name for s in px_.successors(graph, node)] if node else None,
                "outputs": px_.output_node_names(self.workflows[-1]),
                "consumed": px_.consumed_outputs(graph, node) if node else None,
                "side_files": [job.lockfile.name, f"{job.uid}_info.json", job.cache_dir.name + "_save.lock"],
            }
        )
        job.cache_root = job.cache_root  # public and settable
        return await super().run(job, rerun=rerun)


def test_the_version_is_the_tested_one():
    assert px_.pydra_version_supported(), f"pydra {px_.pydra_version()} is not tested: run this module and update TESTED_RANGE"


def test_a_task_function_hashes_the_same_after_the_trip_to_a_worker_process():
    """cf sends a job to its process with cloudpickle, which pickles a python.define task's function
    by value (the module's name for it is the task class), and Pydra checks in that process that the
    job's input hashes did not change while it ran. cloudpickle 3.1.3 renames such a function's code
    '<dynamic-code>', Pydra can no longer read its source, hashes its bytecode instead, and every such
    job fails under cf as under Sea: setup.cfg keeps cloudpickle below it."""
    import cloudpickle
    from pydra.utils.hash import hash_object

    from example_workflows.incrementation.pydra_workflow import Increment

    function = Increment().function
    travelled = cloudpickle.loads(cloudpickle.dumps(function))
    assert travelled is not function, "pickled by reference now: this test no longer checks the trip"
    assert hash_object(travelled) == hash_object(function), f"cloudpickle {cloudpickle.__version__} changes how Pydra hashes a task's function: see setup.cfg's pin"


def test_a_worker_sees_the_graph_through_the_workflow_job(tmp_path):
    worker = Probe(n_procs=1)
    with Submitter(worker=worker, cache_root=tmp_path) as sub:
        result = sub(Pair(xs=[1, 2]))
    assert result.outputs.out == [3, 4]
    by_node = {}
    for record in worker.seen:
        by_node.setdefault(record["node"], []).append(record)
    assert set(by_node) == {"first", "second"}, "a node job was not found in its workflow's execution graph"
    assert all(r["jobs"] == 2 for r in worker.seen), "a node's jobs are not all created together"
    assert by_node["first"][0]["preds"] == [] and by_node["first"][0]["succs"] == ["second"]
    assert by_node["second"][0]["preds"] == ["first"] and by_node["second"][0]["succs"] == []
    assert all(r["outputs"] == {"second"} for r in worker.seen)
    assert by_node["first"][0]["consumed"] == {"out": (int,)}, "the successors' inputs no longer name their producer's fields"
    assert by_node["second"][0]["consumed"] == {}


def test_pydras_side_files_are_known_by_name_and_a_tasks_own_are_left(tmp_path):
    """Sea removes the side files Pydra leaves beside job directories (a stopped run's, an empty lock
    of a killed one's) by their names: Pydra's own names must match, and files a task wrote beside
    its directory that merely end alike (``../run.lock``, ``../subject_info.json``) never do."""
    import logging
    import time

    from pydra.utils.hash import PersistentCache

    worker = Probe(n_procs=1)
    with Submitter(worker=worker, cache_root=tmp_path / "cache") as sub:
        sub(Pair(xs=[1]))
    names = [name for record in worker.seen for name in record["side_files"]]
    assert names and all(px_.JOB_SIDE_FILE.fullmatch(name) for name in names), names
    hashes, seen = PersistentCache(location=tmp_path / "hashes"), []
    hashes.get_or_calculate_hash(("key",), lambda: seen.extend(os.listdir(tmp_path / "hashes")) or b"hash")
    assert len(seen) == 1 and px_.HASH_LOCK.fullmatch(seen[0]), seen

    root, since = tmp_path / "tier", time.time() - 1
    root.mkdir()
    theirs = ["run.lock", "stage1.lock", "subject_info.json", "notes.lock"]
    for name in [*names, *theirs]:
        (root / name).touch()
    px_.remove_stray_side_files(root)
    assert sorted(os.listdir(root)) == sorted(theirs)
    for name in names[:1]:
        (root / name).touch()
    px_.remove_killed_runs_locks(root, {"started": since, "host": "elsewhere", "pid": 1}, logging.getLogger("test"))
    assert sorted(os.listdir(root)) == sorted(theirs)


def test_a_lock_naming_another_host_is_taken_for_a_killed_runs_only_if_it_names_that_run(tmp_path, monkeypatch):
    """A run killed in a container of its own host name leaves locks that name that host (and its
    PID namespace), which filelock cannot judge: those made while it lived go, in the cache_root
    whatever process made them, in the hash cache (shared by the user's other runs) only its
    process's. A lock naming another host, another namespace, or made before the run started stays."""
    import logging
    import socket
    import time

    from pydra.utils.hash import PersistentCache

    cache, hashes = tmp_path / "cache", tmp_path / "hashes"
    cache.mkdir()
    hashes.mkdir()
    monkeypatch.setenv(PersistentCache.LOCATION_ENV_VAR, str(hashes))
    killed = {"host": "ctr-a1b2c3", "pid": 3, "pidns": "pid:[4026532179]", "started": time.time() - 60}
    lock = iter(range(100))

    def made(root: Path, text: str, hash_cache: bool = False) -> Path:
        n = next(lock)
        path = root / (f"{n:0128x}.lock" if hash_cache else f"python-{n:032x}.lock")
        path.write_text(text)
        return path

    gone = [
        made(cache, "7\nctr-a1b2c3?pidns-f0000153\n12345\n"),  # a worker of it (filelock 4: its namespace named)
        made(cache, "8\nctr-a1b2c3\n"),  # filelock 3.22's: no namespace
        made(cache, "filelock/2\npid=9\nhost=ctr-a1b2c3?pidns-f0000153\nmode=exclusive\n"),
        made(hashes, "3\nctr-a1b2c3?pidns-f0000153\n12345\n", hash_cache=True),  # its own process's
    ]
    kept = [
        made(cache, "7\nctr-other\n"),  # another container's
        made(cache, "7\nctr-a1b2c3?pidns-f0000154\n"),  # another namespace under that name
        made(cache, f"7\n{socket.gethostname()}\n"),  # this host's: filelock judges it by its PID
        made(cache, "7\nctr-a1b2c3"),  # partial: names nobody yet
        made(hashes, "4\nctr-a1b2c3?pidns-f0000153\n", hash_cache=True),  # another process on that host: maybe another run
    ]
    old = made(cache, "7\nctr-a1b2c3\n")
    os.utime(old, (killed["started"] - 10, killed["started"] - 10))  # before the killed run started
    kept.append(old)
    removed = px_.remove_killed_runs_locks(cache, killed, logging.getLogger("test-locks"))
    assert sorted(removed) == sorted(gone)
    assert all(path.exists() for path in kept) and not any(path.exists() for path in gone)


def test_an_empty_lock_is_taken_for_a_killed_runs_only_where_filelock_names_a_live_holder(tmp_path, monkeypatch, caplog):
    """A live process's lock (a real filelock SoftFileLock, held) names its holder and stays; an
    empty one made while the killed run lived goes. With a filelock before 3.22, whose held locks
    are empty too, none goes, and one line says what to remove by hand."""
    import logging
    import time

    from filelock import SoftFileLock

    root, since = tmp_path / "cache", time.time() - 1
    root.mkdir()
    held = SoftFileLock(root / f"python-{'a' * 32}.lock")
    held.acquire()
    try:
        assert (root / held.lock_file).stat().st_size > 0, "this filelock writes nothing in a lock it holds"
        empty = root / f"python-{'b' * 32}.lock"
        empty.touch()
        log = logging.getLogger("test-locks")
        monkeypatch.setattr(px_, "filelock_version", lambda: (3, 21))
        with caplog.at_level("WARNING", logger="test-locks"):
            assert px_.remove_killed_runs_locks(root, {"started": since}, log) == [] and empty.exists()
        (line,) = [r.getMessage() for r in caplog.records]
        assert "filelock 3.21" in line and str(root) in line and ">= 3.22" in line, line
        monkeypatch.undo()
        assert px_.remove_killed_runs_locks(root, {"started": since}, log) == [empty]
        assert Path(held.lock_file).exists(), "a live process's lock was removed"
    finally:
        held.release()


def test_the_mount_table_cache_is_where_we_drop_it():
    from fileformats.core.fs_mount_identifier import FsMountIdentifier

    FsMountIdentifier.get_mount_table()
    assert FsMountIdentifier._mount_table is not None
    px_.forget_mount_table()
    assert FsMountIdentifier._mount_table is None


@python.define(outputs=["out", "beside"])
def Touch(name: str) -> tuple[File, list[str]]:
    import os

    with open(name, "w") as f:
        f.write(name)
    return File(os.path.abspath(name)), sorted(os.listdir(".."))  # what the job keeps in its cache_root


@workflow.define(outputs=["out", "beside"])
def One(name: str) -> tuple[File, list[str]]:
    touch = workflow.add(Touch(name=name), name="touch")
    return touch.out, touch.beside


@attrs.define
class Recorder(cf.ConcurrentFuturesWorker):
    """Runs each node job in ``jobs_root``, as SeaWorker runs it on a tier."""

    _plugin_name = "recorder"
    jobs_root: Path = attrs.field(default=None)
    jobs: list = attrs.field(factory=list)

    def __getstate__(self):
        return {**super().__getstate__(), "jobs": []}

    def __setstate__(self, state):
        super().__setstate__(state)

    async def run(self, job, rerun=False):
        self.jobs.append(job)
        px_.run_under(job, self.jobs_root)
        return await super().run(job, rerun=rerun)


def test_job_files_results_and_cache_roots_are_what_the_adapter_expects(tmp_path):
    """The names of a running job's side files, a result's paths rewritten for a moved directory,
    the cache lookup order: what SeaWorker relies on to move a job's directory home."""
    root = tmp_path / "tier"
    root.mkdir()
    worker = Recorder(n_procs=1, jobs_root=root)
    with Submitter(worker=worker, cache_root=tmp_path / "wf") as sub:
        result = sub(One(name="a.txt"))
    (job,) = worker.jobs
    names = {f"{job.checksum}.lock", f"{job.uid}_info.json", f"{job.checksum}_save.lock"}
    assert set(result.outputs.beside) - {job.checksum} <= names, "a running job keeps other files beside its directory"
    assert names & set(result.outputs.beside), "the side files are named differently"
    px_.remove_side_files(job, root)

    home = tmp_path / "home"
    home.mkdir()
    copy = home / ".moving"
    shutil.copytree(root / job.checksum, copy)
    px_.relocate_result(copy, {root: home})
    assert px_.cached_result(job, home) is None, "a directory not yet in place was found"
    copy.rename(home / job.checksum)
    moved = px_.cached_result(job, home)
    assert Path(moved.outputs.out) == home / job.checksum / "a.txt" and Path(moved.outputs.out).read_text() == "a.txt"
    assert Path(moved.cache_dir) == home / job.checksum

    px_.run_under(job, root)
    px_.look_in_home(job, home, root)
    assert job.all_caches == [home]
    assert Path(job.result().outputs.out).is_relative_to(home)
    shutil.rmtree(home / job.checksum)
    assert job.result() is None, "the tier a job ran on is still searched once its directory moves home"


def test_a_pickled_workflow_job_expands_through_the_submitter_it_is_given(tmp_path):
    """pydra_sea.dask sends a nested workflow job to a Dask worker pickled, and has the worker's own
    submitter expand it (``submit_through``): the job's nodes must reach that submitter's worker."""
    import cloudpickle as cp
    from pydra.engine.job import Job

    with Submitter(worker="cf", cache_root=tmp_path / "client", n_procs=1) as client:
        job = Job(Pair(xs=[1, 2]), submitter=client, name="main")
        sent = cp.dumps(job)
    probe = Probe(n_procs=1)
    with Submitter(worker=probe, cache_root=tmp_path / "client") as there:
        received = cp.loads(sent)
        px_.submit_through(received, there)
        assert there.run_start_time is not None
        result = there.loop.run_until_complete(probe.submit(received))
    assert not result.errored and result.outputs.out == [3, 4]
    assert {seen["node"] for seen in probe.seen} == {"first", "second"}, "the nodes did not reach the given submitter's worker"


@python.define
def Read(in_file: File) -> int:
    return len(open(in_file, "rb").read())


def _job_of(task, root: Path):
    """The job Pydra's submitter makes of ``task`` (as the worker receives it)."""
    from pydra.engine.job import Job

    with Submitter(worker="cf", cache_root=root) as submitter:
        return Job(task=task, submitter=submitter, name="read")


def test_a_copy_with_the_same_name_and_bytes_keeps_the_job_checksum(tmp_path):
    """Prefetch (read_copies) relies on Pydra hashing a file by its bytes and its extension (its
    name relative to its stem), not its directory; the job keeps its checksum and resolves its
    inputs again."""
    original = tmp_path / "shared" / "sub-01_bold.nii"
    original.parent.mkdir()
    original.write_bytes(b"0123456789" * 1000)
    copy = tmp_path / "tier" / "abc" / original.name
    copy.parent.mkdir(parents=True)
    shutil.copy2(original, copy)
    changed = tmp_path / "tier" / "changed" / original.name
    changed.parent.mkdir()
    changed.write_bytes(b"9876543210" * 1000)

    job = _job_of(Read(in_file=File(original)), tmp_path / "cache")
    checksum = job.checksum
    assert px_.input_files(job) == [original]
    assert _job_of(Read(in_file=File(copy)), tmp_path / "cache").checksum == checksum, "Pydra hashes a file's directory now"
    assert _job_of(Read(in_file=File(changed)), tmp_path / "cache").checksum != checksum, "Pydra no longer hashes a file's bytes"

    originals, dirs = px_.read_copies(job, {str(original): str(copy)})
    assert str(job.task.in_file) == str(copy) and job.checksum == checksum and dirs == {copy.parent: original.parent}
    assert job.task._checksum == checksum, "the task's own hash changed with the copy"
    assert str(job.inputs["in_file"]) == str(copy), "the job resolved its inputs before the swap"
    px_.put_back_inputs(job, originals)
    assert str(job.task.in_file) == str(original) and str(job.inputs["in_file"]) == str(original)


@python.define(outputs=["out"])
def Produce(text: str, name: str) -> File:
    out = os.path.abspath(name)
    with open(out, "w") as f:
        f.write(text)
    return File(out)


def test_an_output_hashed_in_its_jobs_process_is_what_the_consumers_checksum_finds(tmp_path, monkeypatch):
    """SeaWorker hashes a job's consumed output files in its process (hash_outputs), so that Pydra,
    making the consumers' jobs, finds each hash in its persistent cache (keyed by the file set's
    class, paths and mtimes) instead of reading the file again. Shown by changing a file's bytes
    behind the cache's back (same size, same mtime): the consumer's checksum is then the one of the
    bytes hashed before, which only a lookup in that cache can give."""
    import typing as ty

    from fileformats.medimage import Nifti1

    monkeypatch.setenv("PYDRA_HASH_CACHE", str(tmp_path / "hashes"))
    with Submitter(worker="debug", cache_root=tmp_path / "cache") as submitter:
        hashed = submitter(Produce(text="a" * 1000, name="hashed.txt"))
        control = submitter(Produce(text="b" * 1000, name="control.txt"))
    assert px_.hash_outputs(hashed, {"out": (File,)}) == 1
    assert px_.hash_outputs(control, {"out": (Nifti1,)}) == 0, "a file set its consumer converts to another class was hashed"

    expected = {}
    for result in (hashed, control):
        path = Path(result.outputs.out)
        reference = tmp_path / "reference" / path.stem / path.name  # the same name and bytes elsewhere
        reference.parent.mkdir(parents=True)
        shutil.copy2(path, reference)
        expected[path.name] = _job_of(Read(in_file=File(reference)), tmp_path / "jobs").checksum
        mtime = path.stat().st_mtime_ns
        path.write_text(path.read_text().upper())  # same size
        os.utime(path, ns=(mtime, mtime))
    hashed_path, control_path = Path(hashed.outputs.out), Path(control.outputs.out)
    assert _job_of(Read(in_file=File(hashed_path)), tmp_path / "jobs").checksum == expected["hashed.txt"], "Pydra's checksum did not find the hash made in the job's process"
    assert _job_of(Read(in_file=File(control_path)), tmp_path / "jobs").checksum != expected["control.txt"], "the cache held the control's hash already: the check above proves nothing"

    nifti = Nifti1.sample(tmp_path / "sample")
    assert px_._taken_as_is(nifti, File) and px_._taken_as_is(nifti, File | None) and px_._taken_as_is(nifti, list[File]) and px_._taken_as_is(nifti, ty.Any)
    assert not px_._taken_as_is(File(hashed_path), Nifti1) and not px_._taken_as_is(File(hashed_path), str)


SPLITS = [  # (splitter, inputs, container_ndim): a plain split, scalar and outer splitters, nested values
    ("a", {"NA.a": [3, 5, 7]}, None),
    (("a", "b"), {"NA.a": [1, 2], "NA.b": ["x", "y"]}, None),
    (["a", "b"], {"NA.a": [1, 2], "NA.b": [[3, 4], [5]]}, None),
    ("a", {"NA.a": [[1, 2], [3, 4]]}, {"NA.a": 2}),
    (["a", ("b", "c")], {"NA.a": [0, 1, 2], "NA.b": [(1, 2), (3, 4)], "NA.c": ["p", "q"]}, None),
]


@pytest.mark.parametrize("splitter, inputs, container_ndim", SPLITS)
def test_a_split_made_in_linear_time_has_pydras_own_states(splitter, inputs, container_ndim, monkeypatch):
    """``split_in_linear_time`` replaces ``pydra.engine.state.map_splits``, which
    ``State.prepare_states`` calls by its module name, with one that flattens each input once:
    the same states, and one flatten per input where Pydra's makes one per state."""
    from pydra.engine import state

    def states(linear: bool) -> tuple[list, int]:
        calls = []
        real = state.flatten
        monkeypatch.setattr(state, "flatten", lambda vals, cur_depth=0, max_depth=None: calls.append(cur_depth) or real(vals, cur_depth, max_depth))
        px_.split_in_linear_time(linear)
        try:
            st = state.State(name="NA", splitter=splitter)
            st.prepare_states(inputs=inputs, container_ndim=container_ndim)
            before = len(calls)
            values = st.prepare_states_val()
            return values, sum(1 for depth in calls[before:] if depth == 0)
        finally:
            px_.split_in_linear_time(False)
            monkeypatch.setattr(state, "flatten", real)

    pydras, pydras_flattens = states(False)
    ours, our_flattens = states(True)
    assert ours == pydras and [list(map(id, s.values())) for s in ours] == [list(map(id, s.values())) for s in pydras]
    assert pydras_flattens == sum(len(s) for s in pydras), "Pydra's map_splits no longer flattens an input per state: is the workaround still needed?"
    assert our_flattens == len(pydras[0])
    assert state.map_splits.__module__ == "pydra.engine.state", "Pydra's own is not back"


def test_a_turn_waiting_by_event_takes_what_pydras_wait_takes():
    """``fetch_finished_by_event`` replaces ``Submitter.fetch_finished`` (each turn's
    ``asyncio.wait`` on every pending future): for nothing pending, for futures some of which
    ended, and for futures none of which ended yet, it returns what Pydra's returns, and Pydra's
    own is back after. Ours returns, from the second turn on, the pending set it was given less
    what ended, not a copy of every pending future (Pydra's loop adds to it): a turn costs what
    ended and what was added."""
    import asyncio

    pydras, kept = Submitter.fetch_finished, []

    async def turns(fetch) -> list:
        loop = asyncio.get_running_loop()
        seen = [await fetch(None, set())]
        futures = [loop.create_future() for _ in range(4)]
        futures[1].set_result(1)
        futures[3].set_exception(ValueError("a job's error is the caller's to take"))
        await asyncio.sleep(0)
        pending, done = await fetch(None, set(futures))
        seen.append((sorted(map(futures.index, pending)), sorted(map(futures.index, done))))
        loop.call_later(0.05, futures[2].set_result, 2)
        given = pending
        pending, done = await fetch(None, pending)
        kept.append(pending is given)
        seen.append((sorted(map(futures.index, pending)), sorted(map(futures.index, done))))
        futures[0].cancel()
        pending, done = await fetch(None, pending)
        seen.append((sorted(map(futures.index, pending)), sorted(map(futures.index, done))))
        futures[3].exception()
        return seen

    theirs = asyncio.run(turns(pydras))
    px_.fetch_finished_by_event(True)
    try:
        assert Submitter.fetch_finished is not pydras
        ours = asyncio.run(turns(Submitter.fetch_finished))
    finally:
        px_.fetch_finished_by_event(False)
    assert ours == theirs == [(set(), set()), ([0, 2], [1, 3]), ([0], [2]), ([], [0])]
    assert kept == [False, True], "each turn copies every pending future"
    assert Submitter.fetch_finished is pydras and not px_._ended
