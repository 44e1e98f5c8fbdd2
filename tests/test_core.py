"""The core on its own (no engine): stager atomicity, placement, eviction order, resume plan."""

from __future__ import annotations

import os
import stat
import threading
import time
from pathlib import Path

import pytest

from sea import NodeSpec, SeaConfig, SeaEngine, SeaFlushError, WorkflowGraph
from sea.config import glob_to_regex
from sea.sizes import format_size, parse_size
from sea.stager import TMP_MARK, FlushBatch, Stager, atomic_copy


def test_sizes():
    assert parse_size("4GiB") == 4 * 2**30 and parse_size("500 MB") == 500 * 10**6 and parse_size(12) == 12
    assert format_size(3 * 2**20) == "3.0 MiB"
    with pytest.raises(ValueError):
        parse_size("12XB")


def test_glob_semantics():
    import re

    assert re.fullmatch(glob_to_regex("**/_report/**"), "wf/a/_report/report.rst")
    assert re.fullmatch(glob_to_regex("wf/*/x.nii"), "wf/a/x.nii")
    assert not re.fullmatch(glob_to_regex("wf/*/x.nii"), "wf/a/b/x.nii")


def test_atomic_copy_is_never_partial_at_its_final_path(shm_dir, disk_dir):
    src = shm_dir / "big.bin"
    src.write_bytes(os.urandom(64 * 2**20))
    dst = disk_dir / "out" / "big.bin"
    seen, stop = [], threading.Event()

    def watch():
        while not stop.is_set():
            try:
                seen.append(dst.stat().st_size)
            except FileNotFoundError:
                pass

    watcher = threading.Thread(target=watch)
    watcher.start()
    atomic_copy(src, dst)
    stop.set()
    watcher.join()
    assert set(seen) <= {src.stat().st_size}, "a partial file was visible at the final path"
    assert dst.read_bytes() == src.read_bytes()
    assert dst.stat().st_mtime_ns == src.stat().st_mtime_ns, "timestamps must survive for Nipype's hashing"
    assert not [p for p in dst.parent.iterdir() if TMP_MARK in p.name]


def test_stager_reports_a_persistent_error_and_keeps_the_source(shm_dir, disk_dir):
    src = shm_dir / "a.txt"
    src.write_text("data")
    blocker = disk_dir / "not_a_dir"
    blocker.write_text("a file where a directory should be")
    done = []
    stager = Stager(threads=2, backoff=0.01)
    stager.submit(FlushBatch("k", [(src, blocker / "a.txt")], done.append))
    stager.close()
    assert done and done[0].errors and str(blocker / "a.txt") in done[0].errors[0]
    assert src.exists()


def test_the_stager_writes_the_next_file_while_a_written_batch_is_settled(shm_dir, disk_dir):
    """On a busy filesystem each metadata operation waits on its server: making a written batch
    durable, renaming it in place and settling it must not hold a write slot, or the link idles."""
    for name in ("a", "b"):
        (shm_dir / name).write_bytes(name.encode() * 4096)
    settling, release, done = threading.Event(), threading.Event(), []

    def slow_settle(batch: FlushBatch) -> None:  # the first batch's settling, held until the second is done
        settling.set()
        release.wait(10)
        done.append(batch.key)

    stager = Stager(threads=1)  # one file written at a time
    stager.submit(FlushBatch("a", [(shm_dir / "a", disk_dir / "a")], slow_settle))
    assert settling.wait(10)
    stager.submit(FlushBatch("b", [(shm_dir / "b", disk_dir / "b")], lambda batch: done.append(batch.key)))
    deadline = time.monotonic() + 10
    while "b" not in done and time.monotonic() < deadline:
        time.sleep(0.01)
    release.set()
    stager.close()
    assert done == ["b", "a"], "the second batch waited for the first one's settling"
    assert (disk_dir / "b").read_bytes() == b"b" * 4096


def chain_specs(n: int, sink_out: Path) -> list[NodeSpec]:
    specs = [NodeSpec("wf/n0")]
    for i in range(1, n):
        specs.append(NodeSpec(f"wf/n{i}", upstream=((f"wf/n{i - 1}", "x"),)))
    specs.append(NodeSpec("wf/sink", kind="DataSink", upstream=((f"wf/n{n - 1}", "x"),), sink_destination=sink_out))
    return specs


def run_chain(engine: SeaEngine, keys: list[str], mib: int = 1) -> None:
    for key in keys:
        p = engine.place(key)
        target = p.staging if p.staging is not None else p.physical
        target.mkdir(parents=True, exist_ok=True)
        (target / "data.bin").write_bytes(b"x" * (mib * 2**20))
        engine.node_finished(key)


def test_eviction_waits_for_every_consumer(disk_dir, shm_dir):
    home = disk_dir / "home"
    engine = SeaEngine(SeaConfig.load({"tiers": [{"path": str(shm_dir)}]}), home)
    specs = [NodeSpec("wf/a"), NodeSpec("wf/b", upstream=(("wf/a", "x"),)), NodeSpec("wf/c", upstream=(("wf/a", "x"),))]
    engine.update_graph(WorkflowGraph.from_specs(specs))
    run_chain(engine, ["wf/a", "wf/b"])
    assert (home / "wf/a").is_symlink() and (home / "wf/a/data.bin").exists(), "evicted while wf/c may still read it"
    run_chain(engine, ["wf/c"])
    assert not (home / "wf/a").exists()
    engine.close()


def test_spill_when_the_capacity_is_reached(disk_dir, shm_dir):
    home = disk_dir / "home"
    config = SeaConfig.load({"tiers": [{"path": str(shm_dir), "capacity": "3MiB"}], "default_node_size": "1MiB"})
    engine = SeaEngine(config, home)
    specs = [NodeSpec(f"wf/n{i}") for i in range(5)] + [NodeSpec("wf/last", upstream=tuple((f"wf/n{i}", "x") for i in range(5)))]
    engine.update_graph(WorkflowGraph.from_specs(specs))
    run_chain(engine, [f"wf/n{i}" for i in range(5)])
    report = engine.close()
    tier, homet = report.tiers
    assert tier.nodes_placed == 3 and tier.spills == 2 and homet.nodes_placed == 2
    assert tier.peak_bytes <= 3 * 2**20


def test_resume_plan_skips_complete_work_and_reruns_what_a_changed_consumer_needs(disk_dir, shm_dir):
    home, out = disk_dir / "home", disk_dir / "out"
    config = SeaConfig.load({"tiers": [{"path": str(shm_dir)}]})
    specs = chain_specs(3, out)
    engine = SeaEngine(config, home)
    engine.update_graph(WorkflowGraph.from_specs(specs))
    run_chain(engine, [s.key for s in specs])
    engine.close()
    assert (out / "data.bin").is_file()

    again = SeaEngine(config, home)
    again.update_graph(WorkflowGraph.from_specs(specs))
    assert all(again.is_skipped(s.key) for s in specs)
    again.close()

    changed = specs[:-1] + [NodeSpec("wf/sink", kind="DataSink", signature="new", upstream=specs[-1].upstream, sink_destination=out)]
    third = SeaEngine(config, home)
    third.update_graph(WorkflowGraph.from_specs(changed))
    assert not any(third.is_skipped(s.key) for s in changed), "the sink needs n2's evicted data, which needs n1's, ..."
    third.close()

    (out / "data.bin").unlink()  # a committed output removed by hand: its sink must run again
    fourth = SeaEngine(config, home)
    fourth.update_graph(WorkflowGraph.from_specs(specs))
    assert not fourth.is_skipped("wf/sink")
    fourth.close()


def test_flush_failure_keeps_the_fast_copy_and_says_where(disk_dir, shm_dir):
    home = disk_dir / "home"
    out = disk_dir / "blocked"
    out.write_text("a file where the output directory should be")
    engine = SeaEngine(SeaConfig.load({"tiers": [{"path": str(shm_dir)}]}), home)
    engine.update_graph(WorkflowGraph.from_specs([NodeSpec("wf/sink", kind="DataSink", sink_destination=out)]))
    run_chain(engine, ["wf/sink"])
    with pytest.raises(SeaFlushError) as info:
        engine.close()
    message = str(info.value)
    assert "could not be committed" in message and str(out) in message and str(shm_dir) in message
    kept = [p for p in shm_dir.rglob("data.bin")]
    assert kept, "the only copy of an output was evicted"


def test_a_copy_home_the_home_moved_under_ends_the_run_as_moved_not_as_a_failed_flush(disk_dir, shm_dir):
    """The home is moved away while a node's directory is being committed into it (the adapter's
    relocation finds the old path gone): its node runs again once the home is back, as a running
    node's would; the run ends in SeaHomeMoved and leaves nothing on the tier (seen in CI under
    Pydra as a SeaFlushError that kept the copy)."""
    from sea import SeaHomeMoved

    home, moved = disk_dir / "home", disk_dir / "home-moved"

    def relocate(directory: Path, moves: dict) -> list[str]:
        home.rename(moved)  # the user's `mv` lands while the copy is committed
        return [str(p) for p in directory.iterdir()]  # FileNotFoundError: it moved with the home

    engine = SeaEngine(SeaConfig.load({"tiers": [{"path": str(shm_dir)}], "checkpoints": "all"}), home, relocate=relocate)
    engine.update_graph(WorkflowGraph.from_specs([NodeSpec("wf/a"), NodeSpec("wf/b", upstream=(("wf/a", "x"),))]))
    run_chain(engine, ["wf/a"])
    with pytest.raises(SeaHomeMoved) as info:
        engine.close()
    assert str(moved) in str(info.value)
    assert not engine.report.flush_errors
    assert not [p for p in shm_dir.rglob("*") if p.is_file()], "a copy the moved home made fail was kept on the tier"


def test_a_copy_home_started_after_the_home_moved_makes_no_new_home(disk_dir, shm_dir, monkeypatch):
    """The home is moved away once a node's directory was queued to go home (checkpoints: all) and
    before its copy starts: the copy finds its destination's directories missing, and must not
    make them again (a new, empty home where the user's was; seen in CI with the home-moved test).
    The run ends in SeaHomeMoved, and the home is where the user moved it, alone."""
    import sea.stager
    from sea import SeaHomeMoved

    home, moved = disk_dir / "home", disk_dir / "home-moved"
    copy = sea.stager.stage_copy

    def moved_first(*args, **kwargs):
        if home.exists():
            home.rename(moved)  # the user's `mv` lands between the queueing and the copy
        return copy(*args, **kwargs)

    monkeypatch.setattr(sea.stager, "stage_copy", moved_first)
    engine = SeaEngine(SeaConfig.load({"tiers": [{"path": str(shm_dir)}], "checkpoints": "all"}), home)
    engine.update_graph(WorkflowGraph.from_specs([NodeSpec("wf/a"), NodeSpec("wf/b", upstream=(("wf/a", "x"),))]))
    run_chain(engine, ["wf/a"])
    with pytest.raises(SeaHomeMoved) as info:
        engine.close()
    assert str(moved) in str(info.value)
    assert not home.exists(), "a copy home made a new home in place of the one moved away"


def test_a_copy_home_the_tier_was_emptied_under_ends_the_run_as_a_lost_tier_not_as_a_failed_flush(disk_dir, shm_dir):
    """Another job's cleanup empties the tier while a node's directory is being committed home, and
    a node still running makes its directory there again (Nipype's ``os.makedirs``): the run ends
    in the one line a lost tier gets, saying the same command resumes it, not in a failed flush
    whose "kept" copies are gone (seen in CI: SeaFlushError, and "replaced by another")."""
    import shutil

    from sea import SeaTierSwapped

    home = disk_dir / "home"

    def relocate(directory: Path, moves: dict) -> list[str]:
        for private in shm_dir.glob("sea-*"):
            shutil.rmtree(private)  # emptied while the copy is committed
        engine.run.nodes["wf/b"].placement.physical.mkdir(parents=True)  # made again by a node still writing there
        raise FileNotFoundError(2, "No such file or directory", str(directory / "data.bin"))

    engine = SeaEngine(SeaConfig.load({"tiers": [{"path": str(shm_dir)}], "checkpoints": "all"}), home, relocate=relocate)
    engine.update_graph(WorkflowGraph.from_specs([NodeSpec("wf/a"), NodeSpec("wf/b", upstream=(("wf/a", "x"),))]))
    run_chain(engine, ["wf/a"])
    engine.place("wf/b")  # running
    with pytest.raises(SeaTierSwapped) as info:
        engine.close()
    message = str(info.value)
    assert "\n" not in message and "emptied or unmounted" in message and "the same command resumes the run" in message, message
    assert engine.report.flush_errors and not engine.report.success


def test_live_working_set_of_a_chain_is_a_producer_and_its_consumer(disk_dir, shm_dir):
    """Sequential chain of 1 MiB nodes: at most two outputs are needed at once (the one being read
    and the one being written), and eviction keeps the tier's peak at that."""
    home = disk_dir / "home"
    engine = SeaEngine(SeaConfig.load({"tiers": [{"path": str(shm_dir)}]}), home)
    specs = chain_specs(6, disk_dir / "out")
    engine.update_graph(WorkflowGraph.from_specs(specs))
    run_chain(engine, [s.key for s in specs])
    report = engine.close()
    assert 2 * 2**20 <= report.live_peak_bytes < 3 * 2**20
    assert report.tiers[0].peak_bytes <= 1.2 * report.live_peak_bytes


def test_a_graph_built_in_steps_equals_the_graph_built_at_once():
    specs = chain_specs(4, Path("/out"))
    whole = WorkflowGraph.from_specs(specs)
    steps = WorkflowGraph.from_specs(specs[:2]).add(specs[2:3]).add(specs[3:])
    assert [steps.chain(s.key) for s in specs] == [whole.chain(s.key) for s in specs]
    assert [steps.depth(s.key) for s in specs] == [whole.depth(s.key) for s in specs]
    with pytest.raises(ValueError, match="share"):
        steps.add([specs[0]])


def test_nodes_added_during_the_run_are_evicted_only_once_sealed(disk_dir, shm_dir):
    """Pydra creates a job when its inputs are known: the producer must outlive consumers that do
    not exist yet, until the adapter says none will come (seal)."""
    home = disk_dir / "home"
    engine = SeaEngine(SeaConfig.load({"tiers": [{"path": str(shm_dir)}]}), home)
    engine.update_graph(WorkflowGraph())
    engine.add_nodes([NodeSpec("a")], open_ended=True)
    run_chain(engine, ["a"])
    physical = engine.physical_dir("a")
    assert physical is not None and physical.is_dir(), "evicted while consumers may still be added"
    engine.add_nodes([NodeSpec("b", upstream=(("a", "x"),))], open_ended=True)
    engine.seal(["a"])
    assert physical.is_dir(), "evicted before its consumer b finished"
    run_chain(engine, ["b"])
    assert not physical.exists(), "a should be evicted once b finished and a was sealed"
    with pytest.raises(RuntimeError, match="evicted already"):
        engine.add_nodes([NodeSpec("c", upstream=(("a", "x"),))])
    engine.seal(["b"])
    report = engine.close()
    assert report.nodes_total == 2 and report.nodes_run == 2
    assert not any(shm_dir.iterdir()), "tier not empty at the end"


def test_a_directory_handed_on_stays_until_the_readers_of_the_node_that_handed_it_on_finished(disk_dir, shm_dir):
    """m's results name a file in a's directory (m passes its input on): m's consumer c reads it
    there, so a's directory stays past m's end, until c finished."""
    engine = SeaEngine(SeaConfig.load({"tiers": [{"path": str(shm_dir)}]}), disk_dir / "home")
    specs = [NodeSpec("w/a"), NodeSpec("w/m", upstream=(("w/a", "x"),)), NodeSpec("w/c", upstream=(("w/m", "x"),))]
    engine.update_graph(WorkflowGraph.from_specs(specs))
    a = engine.place("w/a")
    (a.physical / "f.txt").write_text("x")
    engine.node_finished("w/a")
    engine.place("w/m")
    engine.node_finished("w/m", gives=[str(a.physical / "f.txt")])
    assert engine.physical_dir("w/a") == a.physical and (a.physical / "f.txt").exists(), "evicted while m's consumer still reads it"
    engine.place("w/c")
    engine.node_finished("w/c")
    assert engine.physical_dir("w/a") is None and not a.physical.exists()
    engine.close()


def test_a_pack_the_rerun_plan_counts_on_is_no_other_packs_room_before_it_is_unpacked(shm_dir, disk_dir):
    """The core alone. A first run packs ``a1`` (0.6 s to compute). The rerun changes ``a2``: its
    plan skips ``a1`` and unpacks it for ``a2``. Before that, ``b1`` (worth three times as much per
    byte) finishes and wants the budget's room (one pack): ``a1``'s pack is not taken from under the
    plan (it was, and ``a2`` then found no ``a1`` to read); ``b1`` waits for the next run."""
    import time

    from sea.pack import pack_path

    config = SeaConfig.load({"tiers": [{"path": str(shm_dir)}], "progress": "off", "checkpoint_budget": "16KiB"})
    home = disk_dir / "home"

    def chain(name: str, signature: str = "") -> list[NodeSpec]:
        return [NodeSpec(f"wf/{name}1", kind=f"slow{name}"), NodeSpec(f"wf/{name}2", kind="cheap", signature=signature, upstream=((f"wf/{name}1", "x"),)),
                NodeSpec(f"wf/{name}3", kind="result", upstream=((f"wf/{name}2", "x"),))]  # fmt: skip

    def finish(engine: SeaEngine, key: str, seconds: float = 0.0, nbytes: int = 1000) -> None:
        (engine.place(key).physical / "data.bin").write_bytes(b"x" * nbytes)
        time.sleep(seconds)
        engine.node_finished(key)

    first = SeaEngine(config, home)
    first.update_graph(WorkflowGraph.from_specs(chain("a")))
    finish(first, "wf/a1", 0.6)
    first.stager.drain()
    finish(first, "wf/a2")
    finish(first, "wf/a3")
    first.close()
    assert pack_path(home, "wf/a1").is_file(), "the first run kept no pack: the test proves nothing"

    rerun = SeaEngine(config, home)
    rerun.update_graph(WorkflowGraph.from_specs([*chain("a", signature="changed"), *chain("b")]))
    assert rerun.is_skipped("wf/a1") and not rerun.is_skipped("wf/a2")
    finish(rerun, "wf/b1", 1.8, nbytes=8000)  # more than the room left, worth four times a1's per byte: it would take a1's
    rerun.stager.drain()
    assert pack_path(home, "wf/a1").is_file(), "a1's pack was dropped before the rerun unpacked it"
    rerun.node_skipped("wf/a1")
    assert (rerun.physical_dir("wf/a1") / "data.bin").read_bytes() == b"x" * 1000
    finish(rerun, "wf/a2")
    for key in ("wf/a3", "wf/b2", "wf/b3"):
        finish(rerun, key)
    assert rerun.close().success


def test_a_pack_unpacks_with_the_permissions_its_files_had(tmp_path):
    """A checkpoint unpacked for a rerun: its files keep the modes they were made with (a umask 002
    lab's 0664, a sticky empty directory), as the directory the engine's own plugin leaves does;
    tarfile's "tar" filter alone clears group and other write (adversarial pass 5, H7)."""
    from sea.pack import PackSource, directory_members, unpack

    made = tmp_path / "made"
    (made / "shared").mkdir(parents=True)
    (made / "empty").mkdir()
    (made / "b.txt").write_text("b")
    (made / "shared" / "c.txt").write_text("c")
    modes = {"b.txt": 0o664, "shared/c.txt": 0o666, "empty": 0o1777}
    for name, mode in modes.items():
        os.chmod(made / name, mode)
    pack = tmp_path / "node.tar"
    with open(pack, "wb") as fh:
        PackSource(directory_members(made)).write(fh.fileno())
    unpack(pack, tmp_path / "back")
    assert {name: stat.S_IMODE(os.lstat(tmp_path / "back" / name).st_mode) for name in modes} == modes


def test_the_common_start_of_two_files_the_view_merges_is_found_exactly():
    """sea.view merges a file two nodes appended to at once from the bytes both copies start with:
    found a chunk at a time (a Python loop over each byte of a large log took minutes)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from sea.view import _common_prefix_length

    @settings(max_examples=300, deadline=None)
    @given(st.binary(max_size=200), st.binary(max_size=60), st.binary(max_size=60), st.sampled_from([1, 3, 16, 1 << 16]))
    def check(shared, a_tail, b_tail, chunk):
        a, b = shared + a_tail, shared + b_tail
        assert _common_prefix_length(a, b, chunk) == len(os.path.commonprefix([a, b]))

    check()
