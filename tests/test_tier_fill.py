"""A tier that another process fills while the workflow runs, through both adapters.

Tier 0 is a small tmpfs, tier 1 a directory in /dev/shm. A separate process (another job on the
machine, writing greedily) fills tier 0 to ENOSPC and takes back every byte that frees up there,
every 20 ms, until the test stops it. It starts either when the first node directory appears on
tier 0 (nearly every node then runs after the fill) or once several nodes ran there and a node that
writes slowly, in chunks, has started writing its output there: that node must run out of space
and run again on tier 1. Either way the nodes placed after the fill go to tier 1, the run succeeds,
the outputs are byte-identical to a run without Sea, and both tiers are empty at the end. Real
processes, real filesystems, no mocks.
"""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sea.report import RunReport

from conftest import sea_private_dirs, tree_files

# The other job: waits for a path matching a glob (the first node directory, or the slow node's
# first output), then writes ``<tier>/filler.bin`` until ENOSPC, records when the tier was first
# full, and every 20 ms takes again whatever space freed up, until the stop file appears (or
# SIGTERM; it also ends if the test's process is gone, or after two minutes).
FILLER = r"""
import errno, glob, os, sys, time
tier, pattern, state, stop, parent = sys.argv[1:5] + [int(sys.argv[5])]
deadline = time.monotonic() + 120

def stopped():
    return os.path.exists(stop) or os.getppid() != parent or time.monotonic() > deadline

while not glob.glob(os.path.join(tier, pattern)):
    if stopped():
        open(state, "w").write("never\n")
        sys.exit(0)
    time.sleep(0.001)
fd = os.open(os.path.join(tier, "filler.bin"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
chunks = [b"\xa5" * (1 << k) for k in (20, 16, 12)]  # 1 MiB, then smaller pieces down to a page

def fill():
    taken = 0
    for chunk in chunks:
        while True:
            try:
                n = os.write(fd, chunk)
            except OSError as error:
                if error.errno != errno.ENOSPC:
                    raise
                break
            taken += n
            if n < len(chunk):
                break
    return taken

first = fill()
full_at = time.monotonic()
refills = retaken = 0
with open(state + ".tmp", "w") as f:
    f.write(f"{full_at!r} {first}\n")
os.rename(state + ".tmp", state)
while not stopped():
    time.sleep(0.02)
    got = fill()
    if got:
        refills, retaken = refills + 1, retaken + got
open(state, "a").write(f"refills {refills} {retaken}\n")
"""


class Filler:
    """The filler process, and what it wrote to its state file."""

    def __init__(self, tier: Path, pattern: str, workdir: Path):
        self.tier, self.state, self.stop_file = tier, workdir / "filler.state", workdir / "filler.stop"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", FILLER, str(tier), pattern, str(self.state), str(self.stop_file), str(os.getpid())]
        )

    def stop(self) -> dict:
        self.stop_file.touch()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=10)
        (self.tier / "filler.bin").unlink(missing_ok=True)
        lines = self.state.read_text().split("\n") if self.state.exists() else ["never"]
        if lines[0] == "never":
            return {"full_at": None}
        full_at, first = lines[0].split()
        refills = [line.split() for line in lines if line.startswith("refills")]
        return {
            "full_at": float(full_at),
            "first_bytes": int(first),
            "refills": int(refills[0][1]) if refills else 0,
            "retaken": int(refills[0][2]) if refills else 0,
            "returncode": self.proc.returncode,
        }


class TierWatcher(threading.Thread):
    """Notes when each node directory first appears in Sea's private directory of each tier."""

    def __init__(self, tiers: dict[str, Path], is_node_dir):
        super().__init__(daemon=True, name="tier-watcher")
        self.tiers, self.is_node_dir = tiers, is_node_dir
        self.seen: dict[tuple[str, str], float] = {}
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            for name, root in self.tiers.items():
                for private in list(root.glob("sea-*")):
                    for dirpath, dirs, _files in os.walk(private):
                        now = time.monotonic()
                        for d in dirs:
                            rel = os.path.relpath(os.path.join(dirpath, d), private)
                            if self.is_node_dir(rel):
                                self.seen.setdefault((name, rel), now)
            time.sleep(0.002)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)

    def counts(self, full_at: float) -> dict[str, tuple[int, int]]:
        """Per tier: (node directories first seen before the fill, after it)."""
        out = {name: [0, 0] for name in self.tiers}
        for (name, _rel), when in self.seen.items():
            out[name][when >= full_at] += 1
        return {name: tuple(v) for name, v in out.items()}


# ============================================================================= Nipype
def write_slowly(in_file, mib, pause):
    """Writes ``mib`` MiB in 256 KiB chunks with a pause after each: still writing when the tier fills."""
    import os
    import time

    out_file = os.path.abspath("slow.bin")
    block = bytes(range(256)) * 1024
    with open(out_file, "wb", buffering=0) as fh:
        for _ in range(int(mib) * 4):
            fh.write(block)
            time.sleep(pause)
    return out_file


NIPYPE_NODES = {"select", "smooth", "gzip", "scale", "group_mean", "sink", "group_sink", "slowly"}


def nipype_crowded(data, subjects, base, out):
    from nipype_workflows import build_full, fn

    wf = build_full(data, subjects, base, out)
    slow = fn("slowly", write_slowly, ["in_file", "mib", "pause"], ["out_file"])
    slow.inputs.mib, slow.inputs.pause = 16, 0.02
    wf.connect(wf.get_node("group_mean"), "out_file", slow, "in_file")
    wf.connect(slow, "out_file", wf.get_node("group_sink"), "@slow")
    return wf


@pytest.fixture(scope="module")
def nipype_reference(tmp_path_factory):
    """The subjects' images, and the outputs of the workflow under Nipype's own MultiProc."""
    from nipype_workflows import make_subjects, run

    root = tmp_path_factory.mktemp("nipype-reference")
    data = root / "data"
    subjects = make_subjects(data, 3, mib=4.0)
    run(nipype_crowded(data, subjects, root / "work", root / "out"), "MultiProc")
    return data, subjects, tree_files(root / "out")


# When the other job starts filling tier 0: as soon as the first node directory appears there
# (nearly every node then runs after the fill), or once the slow node is writing its output there.
NIPYPE_TRIGGERS = {"first-node": "sea-*/study/*/select", "slow-node": "sea-*/study/slowly/slow.bin"}


@pytest.mark.timeout(120)
# by default the tier fills as the first node starts; while a slow node writes, with --run-slow
@pytest.mark.parametrize("when", [pytest.param(w, marks=pytest.mark.slow) if w == "slow-node" else w for w in NIPYPE_TRIGGERS])
def test_nipype_a_tier_another_process_fills_during_the_run(when, nipype_reference, disk_dir, tmpfs_factory, shm_dir):
    from nipype_workflows import run

    data, subjects, reference = nipype_reference
    tier0 = tmpfs_factory("64M")
    home, out = disk_dir / "work", disk_dir / "out"
    sea = {"tiers": [{"path": str(tier0)}, {"path": str(shm_dir)}], "default_node_size": "1MiB"}
    filler = Filler(tier0, NIPYPE_TRIGGERS[when], disk_dir)
    watcher = TierWatcher({"tier0": tier0, "tier1": shm_dir}, lambda rel: Path(rel).name in NIPYPE_NODES)
    watcher.start()
    try:
        run(nipype_crowded(data, subjects, home, out), "SeaMultiProc", sea)
    finally:
        fill = filler.stop()
        watcher.stop()
    report = RunReport.from_json(home / "sea-report.json")
    print(f"\nfiller: {fill}\nnode dirs (before, after the fill): {watcher.counts(fill['full_at'] or 0)}\n{report.to_text()}")
    assert fill["full_at"] is not None and fill["returncode"] == 0, f"the tier was not filled: {fill}"
    assert report.success, report.to_text()
    counts = watcher.counts(fill["full_at"])
    if when == "slow-node":
        assert report.enospc_retries >= 1, report.to_text()  # it was writing when the tier filled
        assert counts["tier0"][0] >= 5, f"too few nodes ran on tier 0 before the fill: {counts}"
        # the slow node's rerun, and group_sink (it starts after it, with tier 0 still full)
        assert counts["tier1"][1] >= 2 and report.tiers[0].spills >= 1, f"nodes were not placed on tier 1 after the fill: {counts}"
    else:
        # 18 nodes: the first ones may have started on tier 0 (and run out of space there)
        assert counts["tier1"][1] >= 12 and report.tiers[0].spills >= 12, f"nodes were not placed on tier 1 after the fill: {counts}"
    assert tree_files(out) == reference
    assert sea_private_dirs(tier0, shm_dir) == []


def test_a_failure_reported_while_the_main_loop_clears_tasks_is_not_lost():
    """A node that runs out of space before Nipype could even write its result file makes Nipype's
    ``run_node`` raise in the worker process, so SeaMultiProc's callback (in the pool's thread)
    looks the failed future up in ``_task_obj`` while the main loop adds and clears tasks in that
    dict. Seen in the first-node run above: "RuntimeError: dictionary changed size during iteration"
    in the callback; had it come before the failed task was found, its failure would have been lost
    and the loop would have waited for it forever. Here the main loop's clearing is done while the
    callback runs, with the thread switch interval made tiny: before the fix, 200 callbacks gave
    ~160 RuntimeErrors and ~16 lost failures."""
    from concurrent.futures import Future

    from nipype_sea._nipype_internals import EventedMultiProc

    plugin = EventedMultiProc(plugin_args={"n_procs": 1})
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    errors, lost = [], 0
    try:
        for _ in range(200):
            plugin._task_obj = {taskid: Future() for taskid in range(200)}
            failed = Future()
            failed.set_exception(FileNotFoundError("result_node.pklz"))
            plugin._task_obj[999] = failed
            plugin._taskresult = {}

            def callback(failed=failed):
                try:
                    plugin._async_callback(failed)
                except Exception as error:
                    errors.append(error)

            thread = threading.Thread(target=callback)
            thread.start()
            for taskid in range(200):  # the main loop clears the tasks that finished (_clear_task)
                del plugin._task_obj[taskid]
            thread.join()
            lost += 999 not in plugin._taskresult
    finally:
        sys.setswitchinterval(interval)
        plugin.pool.shutdown()
    assert not errors and not lost, f"{len(errors)} errors ({errors[:1]}), {lost} failures lost"
    assert "FileNotFoundError" in "".join(plugin._taskresult[999]["traceback"])


# ============================================================================= Pydra
def _pydra_tasks():
    """Defined on first use: Pydra 1.0 needs Python >= 3.11, and the Nipype test must not need it
    (so this module has no ``from __future__ import annotations``: Pydra reads the annotations)."""
    from fileformats.generic import File
    from pydra.compose import python, workflow

    from pydra_workflows import Checksum, Study

    @python.define(outputs=["out"])
    def WriteSlowly(in_file: File, mib: int, pause: float) -> File:
        out = os.path.abspath("slow.bin")
        block = bytes(range(256)) * 1024
        with open(out, "wb", buffering=0) as fh:
            for _ in range(mib * 4):
                fh.write(block)
                time.sleep(pause)
        return File(out)

    @workflow.define(outputs=["mean", "copies", "slow", "digest"])
    def Crowded(in_files: list[File]) -> tuple[File, list[File], File, str]:
        """Study (3 subjects x scale, smooth, cp; a group mean), then a job that writes slowly, and
        one that reads what it wrote."""
        study = workflow.add(Study(in_files=in_files), name="study")
        slow = workflow.add(WriteSlowly(in_file=study.mean, mib=16, pause=0.02), name="slow")
        digest = workflow.add(Checksum(in_file=slow.out), name="digest")
        return study.mean, study.copies, slow.out, digest.out

    return Crowded


def _pydra_outputs(outputs) -> list[Path]:
    return [Path(outputs.mean), *(Path(f) for f in outputs.copies), Path(outputs.slow)]


@pytest.fixture(scope="module")
def pydra_reference(tmp_path_factory):
    """The images, and the workflow's outputs under Pydra's own cf worker."""
    pytest.importorskip("pydra.compose", reason="Pydra 1.0 needs Python >= 3.11")
    from pydra.engine.submitter import Submitter

    from pydra_workflows import make_images

    root = tmp_path_factory.mktemp("pydra-reference")
    images = make_images(root / "data", 3, side=64, seed=11)  # 4 MiB each
    with Submitter(worker="cf", cache_root=root / "cf", n_procs=2) as sub:
        theirs = sub(_pydra_tasks()(in_files=images))
    assert not theirs.errored
    return images, [p.read_bytes() for p in _pydra_outputs(theirs.outputs)], theirs.outputs.digest


PYDRA_TRIGGERS = {"first-node": "sea-*/python-*", "slow-node": "sea-*/python-*/slow.bin"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("when", [pytest.param(w, marks=pytest.mark.slow) if w == "slow-node" else w for w in PYDRA_TRIGGERS])
def test_pydra_a_tier_another_process_fills_during_the_run(when, pydra_reference, tmp_path, tmpfs_factory, shm_dir):
    from pydra.engine.submitter import Submitter

    images, reference, digest = pydra_reference
    tier0 = tmpfs_factory("64M")
    home = tmp_path / "home"
    sea = {"tiers": [{"path": str(tier0)}, {"path": str(shm_dir)}], "default_node_size": "1MiB"}
    filler = Filler(tier0, PYDRA_TRIGGERS[when], tmp_path)
    watcher = TierWatcher({"tier0": tier0, "tier1": shm_dir}, lambda rel: "/" not in rel and rel.startswith(("python-", "shell-")))
    watcher.start()
    try:
        with Submitter(worker="sea", cache_root=home, n_procs=2, sea=sea) as sub:
            ours = sub(_pydra_tasks()(in_files=images))
    finally:
        fill = filler.stop()
        watcher.stop()
    report = RunReport.from_json(home / "sea-report.json")
    print(f"\nfiller: {fill}\njob dirs (before, after the fill): {watcher.counts(fill['full_at'] or 0)}\n{report.to_text()}")
    assert fill["full_at"] is not None and fill["returncode"] == 0, f"the tier was not filled: {fill}"
    assert not ours.errored
    assert report.success, report.to_text()
    counts = watcher.counts(fill["full_at"])
    if when == "slow-node":
        assert report.enospc_retries >= 1, report.to_text()  # it was writing when the tier filled
        assert counts["tier0"][0] >= 5, f"too few jobs ran on tier 0 before the fill: {counts}"
        # the slow job's rerun, and the checksum (it starts after it, with tier 0 still full)
        assert counts["tier1"][1] >= 2 and report.tiers[0].spills >= 1, f"jobs were not placed on tier 1 after the fill: {counts}"
    else:
        # 12 jobs: the first ones may have started on tier 0 (and run out of space there)
        assert counts["tier1"][1] >= 8 and report.tiers[0].spills >= 8, f"jobs were not placed on tier 1 after the fill: {counts}"
    mine = _pydra_outputs(ours.outputs)
    assert all(p.is_relative_to(home) for p in mine), mine
    assert [p.read_bytes() for p in mine] == reference
    assert ours.outputs.digest == digest
    assert sea_private_dirs(tier0, shm_dir) == []
