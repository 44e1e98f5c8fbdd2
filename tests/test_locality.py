"""The client-side placement across workers (sea.dask.locality), on graphs of NodeSpecs."""

from __future__ import annotations

from sea.dask.locality import LocalityPlanner
from sea.graph import NodeSpec, WorkflowGraph


def chains(n: int, length: int) -> WorkflowGraph:
    specs = []
    for c in range(n):
        specs.append(NodeSpec(f"c{c}/n0"))
        specs += [NodeSpec(f"c{c}/n{i}", upstream=((f"c{c}/n{i - 1}", "x"),)) for i in range(1, length)]
    return WorkflowGraph.from_specs(specs)


def test_chains_stay_on_the_worker_that_started_them():
    planner = LocalityPlanner(chains(6, 5), {"a": 1, "b": 1, "c": 1})
    first = {key: planner.assign(key).worker for key in planner.order([f"c{c}/n0" for c in range(6)])}
    assert sorted(first.values()) == ["a", "a", "b", "b", "c", "c"], "sources are spread evenly"
    for key, worker in first.items():
        planner.finished(key, worker, size=10)
    for i in range(1, 5):
        for c in range(6):
            a = planner.assign(f"c{c}/n{i}")
            assert a.worker == first[f"c{c}/n0"] and a.local and not a.fetch
            planner.finished(a.key, a.worker, size=10)
    assert sum(r.local_hits for r in planner.rows.values()) == sum(r.with_inputs_held for r in planner.rows.values()) == 24


def test_a_busy_worker_gives_work_to_an_idle_one_with_its_inputs():
    planner = LocalityPlanner(chains(6, 2), {"a": 1, "b": 1}, busy_threshold=2)
    for c in range(6):
        planner.finished(f"c{c}/n0", "a", size=100)  # every input on a
    placed = [planner.assign(f"c{c}/n1") for c in range(6)]
    assert [p.worker for p in placed[:3]] == ["a", "a", "a"], "a runs one and queues two"
    assert placed[3].worker == "b" and placed[3].fetch == {"c3/n0": "a"} and not placed[3].local
    planner.finished("c3/n1", "b", size=1)
    assert planner.rows["b"].bytes_received == 100 and planner.holders["c3/n0"] == {"a", "b"}


def test_the_workers_told_about_a_finished_node_are_those_holding_its_inputs():
    g = WorkflowGraph.from_specs([NodeSpec("x"), NodeSpec("y"), NodeSpec("z", upstream=(("x", "o"), ("y", "o")))])
    planner = LocalityPlanner(g, {"a": 1, "b": 1, "c": 1})
    planner.finished("x", "a", 5)
    planner.finished("y", "b", 50)
    assert planner.assign("z").worker == "b"
    planner.finished("z", "b", 1)
    assert planner.workers_to_tell("z") == ["a", "b"]


def test_a_lost_worker_runs_again_only_what_is_still_needed_with_its_lineage():
    """Chains c0 (on a) and c1 (on b) of 4 nodes; b dies after c1/n2 finished and while c1/n3
    runs: c1/n3 starts again; c1/n2's data (only on b) is needed, and so is c1/n1's (every
    consumer of c1/n1 had finished, so b had evicted it) back to c1/n0; chain c0 is untouched."""
    planner = LocalityPlanner(chains(2, 4), {"a": 1, "b": 1})
    for i in range(3):
        placed = [planner.assign(f"{c}/n{i}") for c in ("c0", "c1")]
        assert [p.worker for p in placed] == ["a", "b"]
        for p in placed:
            planner.finished(p.key, p.worker, size=10)
    planner.assign("c1/n3")
    running, again = planner.worker_lost("b", committed=lambda key: False)
    assert running == {"c1/n3"} and again == {"c1/n0", "c1/n1", "c1/n2"}
    assert planner.recomputed == 3 and "b" not in planner.slots
    assert planner.assign("c1/n0").worker == "a"


def test_a_lost_worker_whose_outputs_were_committed_runs_nothing_again():
    g = WorkflowGraph.from_specs([NodeSpec("x"), NodeSpec("sink", upstream=(("x", "o"),))])
    planner = LocalityPlanner(g, {"a": 1, "b": 1})
    planner.assign("x"), planner.finished("x", "b", 1)
    planner.assign("sink"), planner.finished("sink", "b", 1)
    assert planner.worker_lost("b", committed=lambda key: key == "sink") == (set(), set())
    assert planner.worker_lost("a", committed=lambda key: False)[1] == set()  # a held nothing
