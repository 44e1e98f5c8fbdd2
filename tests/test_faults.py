"""A failing shared filesystem, through both adapters: the home (Nipype's base_dir, Pydra's cache
root) and the outputs live on slowfs, which injects the faults a loaded Lustre or NFS returns.

Transient errors are retried and the run ends as without them; a persistent one ends the run with
one SeaFlushError naming the file, the fast-tier copy is kept where the message says, nothing is
counted as flushed that did not commit, no partial file sits at a final path, and a rerun, once the
filesystem is healthy, gives the same outputs."""

from __future__ import annotations

import itertools
import shutil
import threading
import time
from pathlib import Path

import pytest

from sea import SeaFlushError
from sea.report import RunReport
from sea.stager import TMP_MARK, FlushBatch, Stager

from conftest import sea_private_dirs, tree_files
from slowfs_fixtures import *  # noqa: F403 - the fixtures, which pytest finds by name
from slowfs_fixtures import slowfs_scratch

ADAPTERS = ["nipype", "pydra"]
SEEDS = itertools.count(300)  # each Pydra dataset its own contents (see make_images)
# an output file of each adapter's workflow, by the glob slowfs matches it with (its temporary copy included)
ONE_OUTPUT = {"nipype": "out/group/*group_mean.nii*", "pydra": "cache/*sea-tmp-dir/group_mean.nii"}
OUTPUT_TEMPORARY = {"nipype": f"out/*{TMP_MARK}*", "pydra": "cache/*sea-tmp-dir/*"}  # what the run delivers, on its way home


class Study:
    """The test workflow of one adapter, run with Sea on ``root`` (the shared filesystem) or with
    the engine's own plugin (MultiProc, cf) on ``root`` as the reference."""

    def __init__(self, adapter: str, data: Path):
        if adapter == "pydra":
            pytest.importorskip("pydra.compose", reason="Pydra 1.0 needs Python >= 3.11")
        self.adapter, self.data = adapter, data
        if adapter == "nipype":
            from nipype_workflows import make_subjects

            self.subjects = make_subjects(data, n_subjects=2, mib=1)
        else:
            from pydra_workflows import make_images

            self.images = make_images(data, 2, side=32, seed=next(SEEDS))

    def home(self, root: Path) -> Path:
        return root / ("work" if self.adapter == "nipype" else "cache")

    def run(self, root: Path, sea: dict | None) -> dict[str, bytes]:
        """The declared outputs, by name; raises what the run raises."""
        if self.adapter == "nipype":
            from nipype_workflows import build_full, run

            run(build_full(self.data, self.subjects, self.home(root), root / "out"), "MultiProc" if sea is None else "SeaMultiProc", sea)
            return tree_files(root / "out")
        from pydra.engine.submitter import Submitter

        from pydra_workflows import Study as PydraStudy

        options = {"worker": "cf"} if sea is None else {"worker": "sea", "sea": sea}
        with Submitter(cache_root=self.home(root), n_procs=2, **options) as sub:
            result = sub(PydraStudy(in_files=self.images))
        assert not result.errored, result.errors["error message"] if isinstance(result.errors, dict) else result.errors
        files = [Path(result.outputs.mean), *map(Path, result.outputs.copies)]
        return {f"{i}-{f.name}": f.read_bytes() for i, f in enumerate(files)}


@pytest.fixture(params=ADAPTERS)
def study(request, disk_dir):
    study = Study(request.param, disk_dir / "data")
    study.reference = study.run(disk_dir / "reference", None)
    return study


def no_temporaries(root: Path) -> list[Path]:
    return [p for p in root.rglob(f"*{TMP_MARK}*")]


def test_transient_errors_writing_home_are_retried(study, slowfs_factory, shm_dir):
    """The first two writes of a temporary copy of an output home fail with EIO (a Lustre OST timing
    out): the stager tries again with backoff and the run ends as without the faults. (A checkpoint
    is optional: an error on its copy drops it instead, see test_a_home_with_no_room_for_checkpoints.)"""
    fs = slowfs_factory(fail_pattern=OUTPUT_TEMPORARY[study.adapter], fail_errno="EIO", fail_count=2)
    sea = {"tiers": [{"path": str(shm_dir)}]}
    assert study.run(fs.path, sea) == study.reference
    report = RunReport.from_json(study.home(fs.path) / "sea-report.json")
    assert report.success and report.flush_retries == 2 and not report.flush_errors, report.to_text()
    assert no_temporaries(fs.path) == [] and sea_private_dirs(shm_dir) == []


# by default each adapter meets one of the two errors (the stager's path is the same for both);
# each meets both with --run-slow
PERSISTENT = [(adapter, fault, (adapter, fault) in (("nipype", "ENOSPC"), ("pydra", "EIO"))) for adapter in ADAPTERS for fault in ("EIO", "ENOSPC")]


@pytest.mark.parametrize(
    ("study", "fault"),
    [pytest.param(adapter, fault, marks=[pytest.mark.slow] if slow else [], id=f"{adapter}-{fault}") for adapter, fault, slow in PERSISTENT],
    indirect=["study"],
)
def test_a_persistent_error_ends_the_run_with_one_line_and_keeps_the_tier_copy(study, slowfs_factory, shm_dir, fault):
    """Every write of one output fails (EIO: after the retries; ENOSPC: at once, a quota is not
    transient): the run ends in one SeaFlushError naming that file and where its fast-tier copy is
    kept; that copy is complete; nothing partial is at the final path; the report does not count it
    as flushed; once the filesystem is healthy, the same command gives the reference outputs."""
    fs = slowfs_factory(fail_pattern=ONE_OUTPUT[study.adapter], fail_errno=fault)
    sea = {"tiers": [{"path": str(shm_dir)}]}
    with pytest.raises(SeaFlushError) as info:
        study.run(fs.path, sea)
    message = str(info.value)
    assert "\n" not in message and "group_mean.nii" in message and "kept in" in message, message
    kept_in = [Path(p) for p in message.split("kept in ", 1)[1].split("; ")[0].split(", ")]
    assert all(str(p).startswith(str(shm_dir)) for p in kept_in), kept_in
    kept = [p for d in kept_in for p in d.rglob("group_mean.nii")]
    reference_mean = next(data for name, data in study.reference.items() if name.endswith("group_mean.nii"))
    assert len(kept) == 1 and kept[0].read_bytes() == reference_mean, "the fast-tier copy was not kept whole"
    assert not (fs.path / "out" / "group" / "group_mean.nii").exists(), "a copy that did not commit is at its final path"
    for other in fs.path.rglob("group_mean.nii"):  # Pydra's own copy into the (unfinished) workflow's directory
        assert other.read_bytes() == reference_mean, f"{other} is partial"
    report = RunReport.from_json(study.home(fs.path) / "sea-report.json")
    assert not report.success and len(report.flush_errors) == 1 and "group_mean.nii" in report.flush_errors[0]
    assert report.flush_retries == (3 if fault == "EIO" else 0)
    assert no_temporaries(fs.path) == []

    fs.clear_faults()
    for leftover in sea_private_dirs(shm_dir):  # a new process would remove it as a dead run's; this one is alive
        shutil.rmtree(leftover)
    assert study.run(fs.path, sea) == study.reference
    assert RunReport.from_json(study.home(fs.path) / "sea-report.json").success
    assert sea_private_dirs(shm_dir) == []


def test_slow_renames_commit_every_output(study, slowfs_factory, shm_dir):
    """Each rename (the commit of every copy home) takes 0.2 s more, as on a loaded metadata
    server: the run waits for every commit before it returns, and leaves no temporary copy."""
    fs = slowfs_factory(rename_latency_ms=200)
    sea = {"tiers": [{"path": str(shm_dir)}]}
    assert study.run(fs.path, sea) == study.reference
    report = RunReport.from_json(study.home(fs.path) / "sea-report.json")
    assert report.success and report.files_flushed > 0 and not report.flush_errors
    assert no_temporaries(fs.path) == [] and sea_private_dirs(shm_dir) == []


def test_a_target_directory_removed_during_a_copy_is_made_again(slowfs_factory, shm_dir):
    """Another client removes the directory a copy is being written into (a user cleaning up, a
    second node): the stager makes it again and commits, instead of failing or losing the file."""
    fs = slowfs_factory(write_mbps=2, entry_timeout_s=0)  # 4 MB take 2 s; the removal is seen at once
    src = shm_dir / "big.bin"
    src.write_bytes(bytes(range(256)) * 2**14)  # 4 MiB
    target = fs.path / "out" / "sub-01"

    def remove_when_the_copy_starts() -> None:
        backing = fs.backing / "out" / "sub-01"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (backing.is_dir() and any(TMP_MARK in p.name for p in backing.iterdir())):
            time.sleep(0.01)
        shutil.rmtree(backing)  # behind the mount, as another client would

    remover = threading.Thread(target=remove_when_the_copy_starts)
    remover.start()
    done: list[FlushBatch] = []
    stager = Stager(threads=1, backoff=0.01)
    stager.submit(FlushBatch("k", [(src, target / "big.bin")], done.append))
    stager.close()
    remover.join()
    assert not done[0].errors and done[0].retries == 1, (done[0].errors, done[0].retries)
    assert (target / "big.bin").read_bytes() == src.read_bytes()
    assert no_temporaries(fs.path) == []


def test_an_optional_copy_gives_way_to_a_declared_output_and_is_stopped_at_the_end(slowfs_factory, shm_dir):
    """On a slow link (2 MB/s), an optional checkpoint copy under way stops as soon as a declared
    output is submitted (the output is committed first; the checkpoint is copied again, whole,
    once the link is idle), and one under way when the run ends is stopped, not waited for: its
    batch settles as abandoned, nothing partial left."""
    from sea.stager import CHECKPOINT, DECLARED

    fs = slowfs_factory(write_mbps=2)
    big, small = shm_dir / "big.bin", shm_dir / "small.bin"
    big.write_bytes(bytes(range(256)) * 2**14)  # 4 MiB: 2 s over the link
    small.write_bytes(b"x" * 2**18)  # 256 KiB
    order: list[str] = []
    stager = Stager(threads=1, backoff=0.01)  # one thread: the output waits unless the checkpoint gives way
    stager.submit(FlushBatch("checkpoint", [(big, fs.path / "ckpt" / "big.bin")], lambda b: order.append(b.key)), CHECKPOINT)
    time.sleep(0.5)  # under way
    stager.submit(FlushBatch("declared", [(small, fs.path / "out" / "small.bin")], lambda b: order.append(b.key)), DECLARED)
    stager.drain()
    assert order == ["declared", "checkpoint"], order
    assert (fs.path / "ckpt" / "big.bin").read_bytes() == big.read_bytes()

    done: list[FlushBatch] = []
    stager.submit(FlushBatch("late", [(big, fs.path / "late" / "big.bin")], done.append), CHECKPOINT)
    time.sleep(0.5)
    start = time.monotonic()
    stager.abandon(CHECKPOINT)
    stager.drain()
    assert time.monotonic() - start < 1.5, "the run waited for an optional copy"
    assert done[0].abandoned and not done[0].committed and not done[0].errors
    assert not (fs.path / "late" / "big.bin").exists() and no_temporaries(fs.path) == []

    stager.close()

    # a directory cut short: its first file is home, the rest not (the engine removes the part copied)
    done.clear()
    stager = Stager(threads=1, backoff=0.01)
    stager.submit(FlushBatch("cut", [(small, fs.path / "cut" / "small.bin"), (big, fs.path / "cut" / "big.bin")], done.append), CHECKPOINT)
    deadline = time.monotonic() + 10
    while not (fs.path / "cut" / "small.bin").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # the big file under way
    stager.abandon(CHECKPOINT)
    stager.drain()
    assert [dst.name for dst, _, _ in done[0].committed] == ["small.bin"], done[0].committed
    assert [dst.name for _, dst in done[0].abandoned] == ["big.bin"], done[0].abandoned
    stager.close()


@pytest.mark.parametrize("fault", ["ENOSPC", "EDQUOT", "EIO"])
def test_a_checkpoint_that_cannot_go_home_is_dropped_and_the_run_goes_on(shm_dir, fault, caplog):
    """The core alone; the home refuses every write of a checkpoint's pack (full, over quota, an I/O
    error). The first checkpoint's copy fails: it is dropped in one warning line, checkpointing stops
    for the run (the second chain's expensive step is not even tried), its directory leaves its tier
    once its consumer finished, and the run ends successfully with everything it delivers home."""
    from sea import NodeSpec, SeaConfig, SeaEngine, WorkflowGraph
    from sea.pack import pack_path

    with slowfs_scratch(fail_pattern="home/.sea/checkpoints/*", fail_errno=fault) as fs:
        home = fs.path / "home"
        engine = SeaEngine(SeaConfig.load({"tiers": [{"path": str(shm_dir)}], "progress": "off"}), home)
        specs = []
        for chain in ("a", "b"):  # an expensive step, a cheap one reading it, then the chain's result
            specs += [NodeSpec(f"wf/{chain}1", kind="slow"), NodeSpec(f"wf/{chain}2", kind="cheap", upstream=((f"wf/{chain}1", "x"),)),
                      NodeSpec(f"wf/{chain}3", kind="result", upstream=((f"wf/{chain}2", "x"),))]  # fmt: skip
        engine.update_graph(WorkflowGraph.from_specs(specs))

        def finish(key: str, seconds: float = 0.0) -> None:
            (engine.place(key).physical / "data.bin").write_bytes(b"x" * 4096)
            time.sleep(seconds)
            engine.node_finished(key)

        with caplog.at_level("WARNING", logger="sea"):
            finish("wf/a1", seconds=0.5)
            assert engine.run.nodes["wf/a1"].checkpoint, "a1's recomputation is worth a checkpoint: the test proves nothing"
            engine.run.stager.drain()  # its copy, on the idle link, fails
            assert not engine.run.nodes["wf/a1"].checkpoint and engine.checkpoints.stopped
            finish("wf/a2")
            assert engine.run.nodes["wf/a1"].evicted, "a1's directory stays on its tier although its checkpoint was dropped"
            finish("wf/a3")
            finish("wf/b1", seconds=0.5)
            assert not engine.run.nodes["wf/b1"].checkpoint, "checkpoints go on after a copy home failed"
            finish("wf/b2")
            finish("wf/b3")
            report = engine.close()
        warnings = [r.getMessage() for r in caplog.records if "checkpoint" in r.getMessage()]
        assert len(warnings) == 1 and "no more checkpoints in this run, which goes on" in warnings[0], warnings
        assert report.success and report.checkpoints_failed == 1 and report.checkpoint_packs == 0, report.to_text()
        assert "checkpoints stopped: 1 could not be copied home" in report.to_text()
        assert (home / "wf" / "a3" / "data.bin").is_file() and (home / "wf" / "b3" / "data.bin").is_file()
        assert not pack_path(home, "wf/a1").exists() and no_temporaries(home) == [] and sea_private_dirs(shm_dir) == []


def test_a_home_that_refuses_every_write_mid_run_ends_it_in_one_line_and_the_same_command_resumes(slowfs_factory, shm_dir):
    """The home remounted read-only (or full, or failing) while the run goes on: every write there
    fails, Sea's own too (its journal, its result records, its history, its report, its lock).
    Those ended the run in a traceback of Sea's code (the seventeenth adversarial pass; MultiProc
    hangs there); now each is said in one line, the run ends in ``sea: error``, and once the home is
    writable again the same command ends the run."""
    import os
    import subprocess
    import sys

    from example_runs import ROOT

    fs = slowfs_factory(write_mbps=20)
    root = fs.path
    (Path(str(shm_dir)) / "sea.yml").write_text(f"tiers: [{{path: {shm_dir}}}]\n")
    command = [sys.executable, "-m", "example_workflows.incrementation", "--root", str(root), "--chunks", "4", "--chunk-mib", "2",
               "--iterations", "4", "--plugin", "SeaMultiProc", "--sea", str(shm_dir / "sea.yml")]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    journal = fs.backing / "work" / ".sea" / "journal.jsonl"
    deadline = time.monotonic() + 120
    while (not journal.exists() or journal.read_text().count('"done"') < 8) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before the home refused writes"
    fs.set_faults(fail_pattern="*", fail_errno="EROFS")
    output = proc.communicate(timeout=120)[0].decode(errors="replace")
    assert proc.returncode != 0, output[-3000:]
    assert f'File "{ROOT / "sea"}' not in output, output[-5000:]
    assert "sea: error: " in output, output[-3000:]
    fs.clear_faults()
    again = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert len(list((fs.backing / "out").rglob("*.nii"))) == 4
