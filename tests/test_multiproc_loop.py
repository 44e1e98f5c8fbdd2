"""SeaMultiProc's own scheduling loop (issue 19) keeps what MultiProc's does: each case runs the
same small workflow under MultiProc and under SeaMultiProc and compares what a user sees."""

from __future__ import annotations

import os
import time

import pytest
from nipype import Function, MapNode, Node, Workflow


def nap(x):
    import time

    time.sleep(0.15)
    return x


def pid_of(x):
    import os

    return os.getpid()


def same(x):
    return x


def add(a, b):
    return a + b


class Concurrency:
    """MultiProc's status_callback (called in the loop's thread), counting the jobs started and
    not yet ended. (Nipype deep-copies what a MapNode's sub-nodes are given: nothing unpicklable.)"""

    def __init__(self):
        self.now = self.peak = 0

    def __call__(self, node, status):
        self.now += {"start": 1, "end": -1, "exception": -1}[status]
        self.peak = max(self.peak, self.now)


def naps(base, n: int = 4, **node_attrs) -> Workflow:
    wf = Workflow("naps", base_dir=str(base))
    wf.config["execution"]["poll_sleep_duration"] = 0.05
    for i in range(n):
        node = Node(Function(input_names=["x"], output_names=["out"], function=nap), name=f"nap{i}", **node_attrs)
        node.inputs.x = i
        wf.add_nodes([node])
    return wf


def run(wf, plugin: str, shm_dir, **args):
    if plugin == "SeaMultiProc":
        args["sea"] = {"tiers": [{"path": str(shm_dir)}], "progress": "off"}
    return wf.run(plugin=plugin, plugin_args=args)


@pytest.mark.parametrize(
    "node_attrs, args, peak",
    [
        ({}, {"n_procs": 2}, 2),  # the control: nothing holds them back
        ({"mem_gb": 1.5}, {"n_procs": 2, "memory_gb": 2}, 1),
        ({"n_procs": 2}, {"n_procs": 2}, 1),
        ({}, {"n_procs": 2, "max_jobs": 1}, 2),  # MultiProc reads it only before each round: not a bound
    ],
    ids=["free", "memory_gb", "threads", "max_jobs"],
)
def test_jobs_run_at_once_only_as_the_resources_allow(disk_dir, shm_dir, node_attrs, args, peak):
    peaks = {}
    for plugin in ("MultiProc", "SeaMultiProc"):
        counter = Concurrency()
        run(naps(disk_dir / plugin, **node_attrs), plugin, shm_dir, status_callback=counter, **args)
        assert counter.now == 0
        peaks[plugin] = counter.peak
    assert peaks == {"MultiProc": peak, "SeaMultiProc": peak}


def test_a_job_needing_more_than_there_is_fails_before_any_node_unless_told_to_run(disk_dir, shm_dir):
    for plugin in ("MultiProc", "SeaMultiProc"):
        counter = Concurrency()
        with pytest.raises(RuntimeError, match="Insufficient resources"):
            run(naps(disk_dir / plugin, n=2, mem_gb=8), plugin, shm_dir, n_procs=2, memory_gb=1, status_callback=counter)
        assert counter.peak == 0, f"{plugin} started a node"
        counter = Concurrency()  # told to run anyway: one at a time, each given all there is
        run(naps(disk_dir / f"{plugin}-anyway", n=2, mem_gb=8), plugin, shm_dir, n_procs=2, memory_gb=1, raise_insufficient=False, status_callback=counter)
        assert counter.peak == 1, plugin


def test_a_node_run_without_submitting_runs_in_this_process_and_feeds_its_consumer(disk_dir, shm_dir):
    for plugin in ("MultiProc", "SeaMultiProc"):
        wf = Workflow("here", base_dir=str(disk_dir / plugin))
        wf.config["execution"]["poll_sleep_duration"] = 0.05
        here = Node(Function(input_names=["x"], output_names=["out"], function=pid_of), name="here", run_without_submitting=True)
        here.inputs.x = 0
        after = Node(Function(input_names=["x"], output_names=["out"], function=same), name="after")
        wf.connect(here, "out", after, "x")
        graph = run(wf, plugin, shm_dir, n_procs=2)
        [last] = [n for n in graph.nodes() if n.name == "after"]
        assert last.result.outputs.out == os.getpid(), plugin


def test_a_mapnode_whose_inputs_cannot_be_split_fails_the_run(disk_dir, shm_dir):
    """Iterfields of different lengths: MultiProc writes a crash file and skips the MapNode's
    consumers, yet returns as if the run succeeded (Nipype 1.11); SeaMultiProc raises the error, as it
    does for any node that failed: a run that returns has made every output."""

    def workflow(base):
        wf = Workflow("split", base_dir=str(base))
        wf.config["execution"]["poll_sleep_duration"] = 0.05
        wf.config["execution"]["crashdump_dir"] = str(base)  # not the current directory (a user's clone)
        m = MapNode(Function(input_names=["a", "b"], output_names=["out"], function=add), iterfield=["a", "b"], name="m")
        m.inputs.a, m.inputs.b = [1, 2, 3], [1, 2]
        wf.connect(m, "out", Node(Function(input_names=["x"], output_names=["out"], function=same), name="after"), "x")
        return wf

    run(workflow(disk_dir / "MultiProc"), "MultiProc", shm_dir, n_procs=2)  # returns
    with pytest.raises(RuntimeError, match="iterfield"):
        run(workflow(disk_dir / "SeaMultiProc"), "SeaMultiProc", shm_dir, n_procs=2)
    for plugin in ("MultiProc", "SeaMultiProc"):
        assert not (disk_dir / plugin / "split" / "after").exists(), plugin


def test_mapnode_sub_nodes_run_as_jobs_of_their_own_then_the_mapnode_collects_them(disk_dir, shm_dir):
    outputs, peaks = {}, {}
    for plugin in ("MultiProc", "SeaMultiProc"):
        wf = Workflow("mapped", base_dir=str(disk_dir / plugin))
        wf.config["execution"]["poll_sleep_duration"] = 0.05
        m = MapNode(Function(input_names=["x"], output_names=["out"], function=nap), iterfield=["x"], name="m")
        m.inputs.x = [1, 2, 3, 4]
        wf.connect(m, "out", Node(Function(input_names=["x"], output_names=["out"], function=same), name="after"), "x")
        counter = Concurrency()
        start = time.monotonic()
        graph = run(wf, plugin, shm_dir, n_procs=2, status_callback=counter)
        assert time.monotonic() - start < 30
        [last] = [n for n in graph.nodes() if n.name == "after"]
        outputs[plugin], peaks[plugin] = last.result.outputs.out, counter.peak
    assert outputs == {"MultiProc": [1, 2, 3, 4], "SeaMultiProc": [1, 2, 3, 4]}
    assert peaks == {"MultiProc": 2, "SeaMultiProc": 2}  # the sub-nodes ran two at a time
