"""Back-pressure: on a small tier in front of a busy home, a node waits for room that is on its way
instead of spilling its directory home.

The home is the busy shared filesystem (benchmarks.slowfs: 30 MB/s writes). The one fast tier holds
two chains' live directories and half a chunk more, so a chain's declared output waiting for its
copy home leaves no room for the next chain's second step. Before sea.backpressure that node's
directory went to the home (a spill: written at 30 MB/s, beside the declared outputs it competes
with, then read back); now it waits until the copy commits and its directory leaves the tier.
"""

from __future__ import annotations

import json
import time

from example_workflows.incrementation import build_workflow, make_chunks
from sea.pack import pack_path

from conftest import tree_files
from slowfs_fixtures import slowfs_scratch

CHUNKS, CHUNK_MIB, ITERATIONS = 6, 8, 3


def run(data, base, out, plugin, plugin_args):
    wf = build_workflow(data, CHUNKS, ITERATIONS, base, out)
    wf.config["execution"]["poll_sleep_duration"] = 0.05
    wf.run(plugin=plugin, plugin_args={"n_procs": 2, **plugin_args})


def test_a_small_tier_waits_for_room_instead_of_spilling_home(tmp_path, shm_dir):
    data = tmp_path / "data"
    make_chunks(data, CHUNKS, CHUNK_MIB)
    run(data, tmp_path / "mp", tmp_path / "mp-out", "MultiProc", {})
    # two chains' live directories (input and output of a step each) and half a chunk; a node of a
    # kind not seen yet is taken to be a chunk's size (the default, 64 MiB, would not fit at all)
    capacity = f"{4 * CHUNK_MIB + CHUNK_MIB // 2}MiB"
    with slowfs_scratch(write_mbps=30, read_mbps=200, meta_latency_ms=5) as fs:
        home, out = fs.path / "work", fs.path / "out"
        run(data, home, out, "SeaMultiProc", {"sea": {"tiers": [{"path": str(shm_dir), "capacity": capacity}], "default_node_size": f"{CHUNK_MIB}MiB"}})
        report = json.loads((home / "sea-report.json").read_text())
        assert tree_files(out) == tree_files(tmp_path / "mp-out")
    placed = {t["name"].split(":")[0]: t["nodes_placed"] for t in report["tiers"]}
    assert placed["home"] == 0, f"directories spilled home: {report['tiers']}"
    assert report["nodes_held_for_link"] >= 1, report
    assert report["tiers"][0]["peak_bytes"] <= tier_bytes(capacity)


def tier_bytes(capacity: str) -> int:
    return int(capacity.removesuffix("MiB")) * 2**20


def _engine(disk_dir, shm_dir, specs):
    """An engine whose one tier (3 MiB) holds two 1.5 MiB nodes, in front of a home where a spill
    costs what 2 MB/s takes (as a last run on it measured): 1.5 MiB in 0.8 s."""
    from sea import SeaConfig, SeaEngine, WorkflowGraph
    from sea.checkpoint import CopyCost

    config = SeaConfig.load({"tiers": [{"path": str(shm_dir), "capacity": "3MiB"}], "default_node_size": "1536KiB"})
    engine = SeaEngine(config, disk_dir / "home")
    engine.run.checkpoints.cost = CopyCost(per_byte=1 / 2e6)
    engine.update_graph(WorkflowGraph.from_specs(specs))
    return engine


def test_a_node_that_would_spill_waits_for_a_reader_ending_soon_not_for_one_running_long(disk_dir, shm_dir):
    """The core alone: node n would spill (the 3 MiB tier holds p's 2 MiB while r reads it) to a
    home where that costs 0.8 s (2 MB/s, as the last run's copies measured); r is expected to end
    sooner (a node of its kind took 0.2 s), so n waits for p's room. Once r has run far longer
    than its kind's time, n no longer waits for it: it spills, as the engine's own plugin would
    have written it to the home at once. Where the home takes it in milliseconds, n spills at once."""
    from sea import NodeSpec
    from sea.checkpoint import CopyCost

    specs = [NodeSpec("wf/q", kind="reader"), NodeSpec("wf/p", kind="producer"),
             NodeSpec("wf/r", kind="reader", upstream=(("wf/p", "x"),)), NodeSpec("wf/n", kind="new")]  # fmt: skip
    engine = _engine(disk_dir, shm_dir, specs)
    for key, mib in (("wf/q", 0), ("wf/p", 2)):  # q: a reader's run time is now known (0.2 s)
        (engine.place(key).physical / "data.bin").write_bytes(b"x" * (mib * 2**20))
        time.sleep(0.2)  # not milliseconds: r, just placed, is then surely within its kind's time on a loaded machine too
        engine.node_finished(key)
    engine.place("wf/r")  # runs, the last reader of p's 2 MiB
    assert not engine.run.hierarchy.has_room(engine.run.estimate("wf/n"))
    assert not engine.may_start("wf/n", running=1), "n spilled although p's room comes as r ends"
    engine.run.checkpoints.cost = CopyCost(per_file=0.0, per_byte=1 / 2e9)  # a home taking 1.5 MiB in a millisecond
    assert engine.may_start("wf/n", running=1), "n waits for room longer than its spill takes"
    engine.run.checkpoints.cost = CopyCost(per_byte=1 / 2e6)
    engine.run.nodes["wf/r"].started -= 60  # r has run a minute: far past its kind's time
    assert engine.may_start("wf/n", running=1), "n waits for a node that runs far longer than expected"
    engine.node_finished("wf/r")
    engine.close()


def test_before_any_copy_home_committed_a_spill_costs_what_the_copy_model_says_not_a_node_time(disk_dir, shm_dir):
    """Seen in CI on a loaded machine: no copy home had committed yet (no rate measured), and a
    spill's cost was taken to be the mean node's run time (29 ms), shorter than the 30 ms the
    running reader had left; the node spilled 8 MiB to a 30 MB/s home. Here the copy cost model
    (the last run's copies home: 2 MB/s) says the spill takes 0.8 s: r, 0.6 s from its end, is
    waited for."""
    from sea import NodeSpec

    specs = [NodeSpec("wf/q", kind="reader"), NodeSpec("wf/p", kind="producer"),
             NodeSpec("wf/r", kind="reader", upstream=(("wf/p", "x"),)), NodeSpec("wf/n", kind="new")]  # fmt: skip
    engine = _engine(disk_dir, shm_dir, specs)
    for key, mib, seconds in (("wf/q", 0, 0.6), ("wf/p", 2, 0.0)):  # readers take 0.6 s; the mean node 0.3 s
        (engine.place(key).physical / "data.bin").write_bytes(b"x" * (mib * 2**20))
        time.sleep(seconds)
        engine.node_finished(key)
    engine.place("wf/r")  # runs, the last reader of p's 2 MiB, for about 0.6 s
    assert engine.run.stager.committed_bytes == 0 and not engine.run.hierarchy.has_room(engine.run.estimate("wf/n"))
    assert not engine.may_start("wf/n", running=1), "n spilled although p's room comes before its spill would be written"
    engine.node_finished("wf/r")
    engine.close()


def test_a_running_node_of_a_kind_not_seen_yet_is_expected_to_take_the_mean_nodes_time(disk_dir, shm_dir):
    """Seen in CI on a loaded machine: the second of two DataSinks spilled home because the first,
    running 8 ms and the last reader of 8 MiB, was of a kind no node had ended yet: nothing was
    expected of it, so its room was not waited for. It is now expected to take the mean node's time."""
    from sea import NodeSpec

    specs = [NodeSpec("wf/p", kind="producer"), NodeSpec("wf/s1", kind="sink", upstream=(("wf/p", "x"),)), NodeSpec("wf/s2", kind="sink")]
    engine = _engine(disk_dir, shm_dir, specs)
    (engine.place("wf/p").physical / "data.bin").write_bytes(b"x" * 2 * 2**20)
    time.sleep(0.1)  # the mean node: 0.1 s
    engine.node_finished("wf/p")
    engine.place("wf/s1")  # runs: no sink ended yet
    assert not engine.run.hierarchy.has_room(engine.run.estimate("wf/s2"))
    assert not engine.may_start("wf/s2", running=1), "s2 spilled: s1, of a kind not seen yet, was not expected to end"
    engine.node_finished("wf/s1")
    engine.close()


def test_a_checkpoint_the_busy_link_has_not_started_is_given_up_once_its_directory_is_done_with(shm_dir):
    """The core alone, the home on a 2 MB/s link. ``a`` (1 s to compute, one small file) is worth
    an ``auto`` checkpoint; its copy waits behind ``big``'s (4 MiB, what the run made: about 2 s).
    Once ``b``, a's only consumer, finished, a's directory waits for nothing but that optional copy:
    it is given up and the directory leaves the tier at once, not after the busy link. On an idle
    link the same kind of checkpoint is taken."""
    from sea import NodeSpec, SeaConfig, SeaEngine, WorkflowGraph

    with slowfs_scratch(write_mbps=2, read_mbps=200, meta_latency_ms=1) as fs:
        engine = SeaEngine(SeaConfig.load({"tiers": [{"path": str(shm_dir)}], "progress": "off"}), fs.path / "home")
        specs = [NodeSpec("wf/big", kind="big"), NodeSpec("wf/a", kind="slow"), NodeSpec("wf/b", kind="reader", upstream=(("wf/a", "x"),)),
                 NodeSpec("wf/c", kind="slow"), NodeSpec("wf/d", kind="reader", upstream=(("wf/c", "x"),))]  # fmt: skip
        engine.update_graph(WorkflowGraph.from_specs(specs))

        def finish(key: str, nbytes: int, seconds: float = 0.0) -> None:
            (engine.place(key).physical / "data.bin").write_bytes(b"x" * nbytes)
            time.sleep(seconds)
            engine.node_finished(key)

        finish("wf/big", 4 * 2**20)  # nothing reads it: it goes home, and holds the link ~2 s
        finish("wf/a", 1000, seconds=1.0)
        assert engine.run.nodes["wf/a"].checkpoint, "a's recomputation is worth a copy"
        finish("wf/b", 1000)
        assert engine.run.stager.needed_backlog > 0, "big's copy ended already: the test proves nothing"
        assert engine.run.nodes["wf/a"].evicted, "a's directory waits on its tier for a copy the busy link has not started"
        assert not (fs.path / "home" / "wf" / "a").exists()
        engine.run.stager.drain()  # the link idle again
        finish("wf/c", 1000, seconds=1.0)
        engine.run.stager.drain()  # c's copy, on the idle link (d, what the run made, would make it busy)
        finish("wf/d", 1000)
        report = engine.close()
        home = fs.path / "home"
        assert pack_path(home, "wf/c").is_file(), "c's checkpoint, on an idle link, was not taken"
        assert not pack_path(home, "wf/a").exists() and not (home / "wf" / "a").exists()
    assert report.checkpoints_abandoned == 1, report.to_text()
    assert "1 left out as their copy could not start in time" in report.to_text()


def test_a_job_goes_ahead_of_a_free_process_only_where_a_tier_has_room_for_it(disk_dir, shm_dir):
    """Pydra's worker places a few jobs to wait in its pool's queue (issue 36): one goes ahead only
    while a fast tier has room for it beside what is placed, so that no job spills home for one
    that only waits (the 3 MiB tier holds two 1.5 MiB jobs)."""
    from sea import NodeSpec

    engine = _engine(disk_dir, shm_dir, [NodeSpec(f"wf/{k}", kind="job") for k in "abc"])
    assert engine.may_go_ahead("wf/a")
    engine.place("wf/a")
    assert engine.may_go_ahead("wf/b")
    engine.place("wf/b")
    assert not engine.may_go_ahead("wf/c"), "a job placed ahead would spill home"
    for key in ("wf/a", "wf/b"):
        engine.node_finished(key)
    engine.close()


def test_a_node_waits_for_the_room_an_optional_checkpoints_copy_frees_as_it_commits(shm_dir):
    """Seen in CI on a loaded machine: the 36 MiB tier held two directories done with but for their
    ``checkpoints: auto`` copies home, under way; nothing else was to go home, so no room seemed on
    its way and the next node spilled home. A directory whose copy is under way leaves as it
    commits, optional or not: here n waits for a's (1.5 MiB at 2 MB/s) instead of spilling."""
    from sea import NodeSpec, SeaConfig, SeaEngine, WorkflowGraph
    from sea.checkpoint import CopyCost

    with slowfs_scratch(write_mbps=2, read_mbps=200, meta_latency_ms=1) as fs:
        config = SeaConfig.load({"tiers": [{"path": str(shm_dir), "capacity": "3MiB"}], "default_node_size": "1536KiB", "progress": "off"})
        engine = SeaEngine(config, fs.path / "home")
        engine.run.checkpoints.cost = CopyCost(per_byte=1 / 2e6)
        specs = [NodeSpec("wf/a", kind="slow"), NodeSpec("wf/b", kind="reader", upstream=(("wf/a", "x"),)),
                 NodeSpec("wf/p", kind="fast"), NodeSpec("wf/q", kind="reader", upstream=(("wf/p", "x"),)), NodeSpec("wf/n", kind="new")]  # fmt: skip
        engine.update_graph(WorkflowGraph.from_specs(specs))
        for key, nbytes, seconds in (("wf/a", 1536 * 2**10, 1.0), ("wf/b", 0, 0.0), ("wf/p", 1536 * 2**10, 0.0)):
            (engine.place(key).physical / "data.bin").write_bytes(b"x" * nbytes)
            time.sleep(seconds)
            engine.node_finished(key)
        a = engine.run.nodes["wf/a"]
        assert a.checkpoint and a.flushes_pending and not a.consumers_left, "a's optional copy is not under way: the test proves nothing"
        assert engine.run.stager.needed_backlog == 0 and not engine.run.hierarchy.has_room(engine.run.estimate("wf/n"))
        assert not engine.may_start("wf/n", running=0), "n spilled home although a's directory leaves as its copy commits"
        engine.run.stager.drain()
        assert a.evicted and engine.may_start("wf/n", running=0)
        engine.close()


def test_a_job_whose_input_files_prefetch_copies_goes_ahead_only_once_they_are_copied(disk_dir, shm_dir):
    """Prefetch copies the input files of the next jobs in the order processes are handed out: a job
    placed ahead of that order would read the shared filesystem instead, so it waits for a process;
    a job that reads nothing there goes ahead, prefetch on or not (issue 36: with the default
    ``prefetch: auto`` every job waited)."""
    from sea import NodeSpec, SeaConfig, SeaEngine, WorkflowGraph

    shared = disk_dir / "shared"
    shared.mkdir()
    for name in ("x.nii", "a.nii"):
        (shared / name).write_bytes(b"x" * 1024)
    config = SeaConfig.load({"tiers": [{"path": str(shm_dir)}], "prefetch": {"enabled": True, "lookahead": 1}, "progress": "off"})
    engine = SeaEngine(config, disk_dir / "home")
    engine.update_graph(WorkflowGraph.from_specs([NodeSpec(f"wf/{k}", kind="job") for k in "xab"]))
    engine.expect_reads("wf/x", [str(shared / "x.nii")], position=0)
    engine.expect_reads("wf/a", [str(shared / "a.nii")], position=1)  # beyond the lookahead: not copied yet
    assert not engine.may_go_ahead("wf/a"), "a job ahead of prefetch's order would read the shared filesystem"
    assert engine.may_go_ahead("wf/b"), "a job that reads no shared file waits for prefetch"
    assert str(shared / "x.nii") in engine.prefetched("wf/x")  # x starts: a is next, its copy starts
    deadline = time.monotonic() + 30
    while not engine.prefetcher.copied("wf/a") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.may_go_ahead("wf/a"), "a, its input copied, does not go ahead"
    engine.close()
