"""Concurrency stress: a 500-node fan-out/fan-in workflow on 2 processes and 4 stager threads, run
again and again in one process: identical outputs every time, tiers empty at the end, and no
thread or file descriptor left behind by a run."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest
from nipype.interfaces.io import DataSink
from nipype.interfaces.utility import IdentityInterface
from nipype.pipeline.engine import JoinNode, Node, Workflow

from conftest import tree_files
from nipype_workflows import fn, run

RUNS = 10
BRANCHES = 100  # x 5 nodes per branch (the source expands too), + the join and the sink: 502 nodes


def make(value: int) -> str:
    import os

    with open("made.txt", "w") as f:
        f.write(f"{value}\n" * 200)
    return os.path.abspath("made.txt")


def twice(in_file: str) -> str:
    import os

    with open(in_file) as f:
        text = f.read()
    with open("twice.txt", "w") as f:
        f.write(text + text)
    return os.path.abspath("twice.txt")


def count(in_file: str) -> str:
    import os

    with open(in_file) as f, open("count.txt", "w") as g:
        g.write(str(len(f.read().splitlines())))
    return os.path.abspath("count.txt")


def total(in_files: list) -> str:
    import os

    with open("total.txt", "w") as out:
        out.write(str(sum(int(open(f).read()) for f in in_files)))
    return os.path.abspath("total.txt")


def fan(base: Path, out: Path) -> Workflow:
    wf = Workflow(name="fan", base_dir=str(base))
    source = Node(IdentityInterface(fields=["value"]), name="source")
    source.iterables = ("value", list(range(BRANCHES)))
    first = fn("make", make, ["value"], ["out_file"])
    second = fn("twice", twice, ["in_file"], ["out_file"])
    third = fn("again", twice, ["in_file"], ["out_file"])
    fourth = fn("count", count, ["in_file"], ["out_file"])
    join = JoinNode(fn("total", total, ["in_files"], ["out_file"]).interface, joinsource="source", joinfield=["in_files"], name="total")
    sink = Node(DataSink(base_directory=str(out)), name="sink")
    wf.connect([(source, first, [("value", "value")]), (first, second, [("out_file", "in_file")]), (second, third, [("out_file", "in_file")])])
    wf.connect([(third, fourth, [("out_file", "in_file")]), (fourth, join, [("out_file", "in_files")]), (join, sink, [("out_file", "@total")])])
    wf.connect(fourth, "out_file", sink, "counts.@count")
    return wf


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.timeout(600)
def test_a_500_node_fan_out_fan_in_ten_times(disk_dir, shm_dir):
    sea = {"tiers": [{"path": str(shm_dir)}], "stager_threads": 4}
    reference, resources = None, []
    for i in range(RUNS):
        base, out = disk_dir / f"work-{i}", disk_dir / f"out-{i}"
        graph = run(fan(base, out), "SeaMultiProc", sea, n_procs=2)
        assert graph.number_of_nodes() >= 500
        outputs = tree_files(out)
        assert len(outputs) == BRANCHES + 1
        if reference is None:
            reference = outputs
        assert outputs == reference, f"run {i} gave different outputs"
        assert list(shm_dir.iterdir()) == [], f"run {i} left files on the tier"
        shutil.rmtree(base)
        resources.append((threading.active_count(), open_fds()))
    # the first run may start long-lived things (logging, Nipype's caches): compare from the second
    assert resources[-1] <= resources[1], f"threads and fds grew over the runs: {resources}"
    print(f"\n{RUNS}/{RUNS} runs identical; (threads, fds) after each run: {resources}")
