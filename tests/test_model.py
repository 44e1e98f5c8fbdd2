"""The performance model and ``sea plan``: replay, predictions, and the command on the example."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from example_workflows.incrementation.workflow import make_chunks
from sea.graph import NodeSpec, WorkflowGraph
from sea.model import Bandwidth, TierModel, Workload, predict_sea, predict_shared, simulate

INF = float("inf")
TMPFS = Bandwidth(read=6e9, write=2.5e9)
BUSY = Bandwidth(read=200e6, write=30e6)


def incrementation_graph(chunks: int, iterations: int) -> WorkflowGraph:
    specs = []
    for c in range(chunks):
        previous = None
        for i in range(iterations):
            key = f"wf/_chunk_{c}/inc{i}"
            specs.append(NodeSpec(key, kind=f"Function:inc{i}", upstream=((previous, "x"),) if previous else ()))
            previous = key
        specs.append(NodeSpec(f"wf/_chunk_{c}/sink", kind="DataSink:sink", upstream=((previous, "x"),), sink_destination=None))
    return WorkflowGraph.from_specs(specs)


def test_depth_first_replay_keeps_the_live_set_small():
    graph = incrementation_graph(8, 5)
    sizes = {k: 32e6 for k in graph.nodes}
    seconds = {k: 0.1 for k in graph.nodes}
    sim = simulate(graph, sizes, seconds, [TierModel("tmpfs", INF, TMPFS)], processes=2)
    assert sim.live_peak <= 4 * 32e6, "depth-first with eviction holds a few chunks, not all 48 outputs"
    assert sim.bytes_written["tmpfs"] == 48 * 32e6
    assert abs(sim.makespan_compute - 48 * 0.1 / 2) < 1e-6


def test_small_tier_spills_to_the_next():
    graph = incrementation_graph(8, 5)
    sizes = {k: 32e6 for k in graph.nodes}
    sim = simulate(graph, sizes, {k: 0.1 for k in graph.nodes}, [TierModel("small", 64e6, TMPFS), TierModel("home", INF, BUSY)], 2)
    assert sim.spills > 0 and sim.peak_bytes["small"] <= 64e6 and sim.bytes_written["home"] > 0


def test_predictions_order_shared_sea_and_bounds():
    w = Workload(
        input_bytes=8 * 32e6, intermediate_bytes=40 * 32e6, output_bytes=8 * 32e6, last_output_bytes=32e6, compute_seconds=4.8, processes=2
    )
    a = predict_shared(w, BUSY)
    c = predict_sea(w, [TierModel("tmpfs", INF, TMPFS)], BUSY, live_peak=4 * 32e6)
    assert a.lower <= a.upper and c.lower <= c.upper
    assert c.upper < a.lower, "on a busy shared filesystem Sea must be predicted faster"
    # the seeds' pure-bandwidth model is the I/O part of the shared prediction
    assert abs(a.io_seconds - ((8 * 32e6 + 40 * 32e6) / BUSY.read + (48 * 32e6) / BUSY.write)) < 1e-9
    # outputs alone at 30 MB/s are a floor for Sea (the limit L of the benchmark)
    assert c.lower >= w.output_bytes / BUSY.write


@pytest.mark.skipif(os.geteuid() != 0, reason="a read-only bind mount: made as root")
def test_sea_plan_where_it_may_not_write_is_one_line_and_takes_the_bandwidth_given(disk_dir, tmp_path):
    """The twentieth adversarial pass: ``sea plan`` of a work directory the caller may not write (a
    colleague's) measured its filesystem by writing a file there: a traceback of Sea's. Now one line
    saying so and what to give instead; given both figures, it measures nothing there."""
    env = {**os.environ, "SEA_DEMO_ROOT": str(disk_dir / "demo"), "SEA_CACHE": str(tmp_path / "cache")}
    (tmp_path / "cache").mkdir()  # the tier's figures known (its probe is not what this tests), the home's not
    known = {"read": 5e9, "write": 3e9, "at": 0}
    (tmp_path / "cache" / "bandwidth.json").write_text(json.dumps({socket.gethostname(): {"/dev/shm": known}}))
    target = "example_workflows.incrementation.plan:workflow"
    given = [sys.executable, "-m", "sea.cli", "plan", target, "--shared-read-mbps", "200", "--shared-write-mbps", "30"]
    make_chunks(disk_dir / "demo" / "data", 4, 8)  # the demo's input data, as the target makes it
    subprocess.run(["mount", "--bind", str(disk_dir), str(disk_dir)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(disk_dir)], check=True)
        refused = subprocess.run([sys.executable, "-m", "sea.cli", "plan", target], capture_output=True, text=True, env=env)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
        assert refused.stderr.count("\n") == 1 and "cannot measure the bandwidth of" in refused.stderr and "--shared-write-mbps" in refused.stderr, refused.stderr
        planned = subprocess.run(given, capture_output=True, text=True, env=env)
        assert planned.returncode == 0 and "makespan" in planned.stdout, planned.stderr[-2000:]
    finally:
        subprocess.run(["umount", str(disk_dir)], check=True)


def test_sea_plan_on_the_example(disk_dir):
    env = {**os.environ, "SEA_DEMO_ROOT": str(disk_dir / "demo")}
    target = "example_workflows.incrementation.plan:workflow"
    before = subprocess.run([sys.executable, "-m", "sea.cli", "plan", target, "--n-procs", "2"], capture_output=True, text=True, env=env)
    assert before.returncode == 0, before.stderr[-2000:]
    assert "not known yet" in before.stdout and not (disk_dir / "demo" / "work").exists(), "plan must not run anything"
    run = subprocess.run(
        [sys.executable, "-m", "example_workflows.incrementation", "--root", str(disk_dir / "demo")], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-2000:]
    after = subprocess.run(
        [sys.executable, "-m", "sea.cli", "plan", target, "--n-procs", "2", "--shared-write-mbps", "30"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert after.returncode == 0, after.stderr[-2000:]
    assert "20 nodes; sizes learned from the last run" in after.stdout
    assert "increment_1" in after.stdout and "makespan, Sea (wakes when a node ends):" in after.stdout
    # MultiProc's 2 s poll: 20 nodes on 2 processes take 10 rounds (its chains are 5 long)
    assert "(of which 20.0 s its 2 s poll: execution.poll_sleep_duration)" in after.stdout, after.stdout


def test_a_polling_plugin_waits_a_poll_per_round():
    from sea.estimate import SizeEstimator
    from sea.plan import make_plan

    chain = WorkflowGraph.from_specs([NodeSpec("a"), NodeSpec("b", upstream=(("a", "x"),)), NodeSpec("c", upstream=(("b", "x"),))])
    fast = TierModel("/dev/shm", 2**30, Bandwidth(2e9, 2e9))
    plan = make_plan(chain, SizeEstimator(2**20), [fast], BUSY, 4, 0, learned=False, poll_seconds=2.0)
    assert plan.shared.wait_seconds == 6.0 and plan.sea.wait_seconds == 0.0  # a chain of 3: three rounds
    wide = WorkflowGraph.from_specs([NodeSpec(f"n{i}") for i in range(9)])
    assert make_plan(wide, SizeEstimator(2**20), [fast], BUSY, 4, 0, learned=False, poll_seconds=2.0).shared.wait_seconds == 6.0  # 9 nodes, 4 a round


def test_prefetch_hides_the_reads_after_the_first_readers_and_auto_counts_where_it_would_go_on():
    """read_compute's shape: 8 readers of 32 MiB on 2 processes, each computing twice its read at
    30 MB/s. Without prefetch the worst case adds every read to the compute; with it, only the
    first two readers' reads (the benchmark's bound: C0 less three rounds of reads)."""
    from sea.estimate import SizeEstimator
    from sea.plan import make_plan

    mib = 2**20
    readers = WorkflowGraph.from_specs([NodeSpec(f"read_{i}", kind="Function:read") for i in range(8)])
    history = SizeEstimator(mib)
    history.seconds["Function:read"] = 2 * 32 * mib / 30e6
    slow = Bandwidth(read=30e6, write=30e6)
    fast = TierModel("/dev/shm", 2**30, TMPFS)
    plans = {p: make_plan(readers, history, [fast], slow, 2, 8 * 32 * mib, learned=True, prefetch=p) for p in (False, True, "auto")}
    reads, first = 8 * 32 * mib / 30e6, 2 * 32 * mib / 30e6
    assert abs(plans[False].sea.upper - plans[True].sea.upper - (reads - first)) < 0.2, (plans[False].sea, plans[True].sea)
    # perfect overlap was the lower bound already; the copies add their tier's writes and reads
    assert 0 < plans[True].sea.lower - plans[False].sea.lower < 0.2, (plans[False].sea, plans[True].sea)
    assert plans["auto"].sea == plans[True].sea, "auto: the tier reads 200x as fast as the shared filesystem"
    as_fast = make_plan(readers, history, [fast], TMPFS, 2, 8 * 32 * mib, learned=True, prefetch="auto")
    assert as_fast.sea.hidden_seconds == 0, "auto stops where the shared filesystem reads as fast as the tier"
    assert "prefetch hides 6.7 s of input reads" in plans[True].to_text(), plans[True].to_text()
