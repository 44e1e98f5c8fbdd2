"""What Nipype's own test suite expects of a plugin, on workflows of our own (each a cause found by
running that suite through SeaMultiProc: tests/peer/nipype_suite.py), and the suite itself in a
smoke form (the whole of it: ``--run-slow``, or ``tox -e peer``)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
from nipype import IdentityInterface, Node, Workflow, config

from nipype_workflows import fn, run

HERE = Path(__file__).resolve().parent


def double(x):
    return 2 * x


def add_one(x):
    return x + 1


def write_text(x):
    import os

    path = os.path.abspath("value.txt")
    with open(path, "w") as fh:
        fh.write(str(x))
    return path


def chain(base_dir) -> tuple[Workflow, Node, Node]:
    """a (doubles) -> b (adds one, writes a file): no DataSink."""
    wf = Workflow(name="chain", base_dir=None if base_dir is None else str(base_dir))
    a = fn("a", double, ["x"], ["out"])
    a.inputs.x = 20
    b = fn("b", write_text, ["x"], ["out"])
    wf.connect(a, "out", b, "x")
    return wf, a, b


def graph_node(graph, name: str):
    return next(node for node in graph.nodes() if node.name == name)


def test_returned_graph_names_home_and_keeps_what_nothing_consumes(disk_dir, shm_dir):
    """The graph Workflow.run returns is read after the run (node.result, get_output): its nodes
    name their directories in the home, not on a tier; the node nothing consumes (the workflow's
    result: no DataSink here) is there, the intermediate one is evicted."""
    wf, _, _ = chain(disk_dir / "work")
    graph = run(wf, "SeaMultiProc", {"tiers": [{"path": str(shm_dir)}], "checkpoints": "none"})
    a, b = graph_node(graph, "a"), graph_node(graph, "b")
    home = (disk_dir / "work").resolve()
    assert Path(a.output_dir()) == home / "chain" / "a" and Path(b.output_dir()) == home / "chain" / "b"
    assert all(Path(result).is_relative_to(home) for result, _ in b.input_source.values())
    value_file = b.get_output("out")
    assert Path(value_file).parent == home / "chain" / "b" and Path(value_file).read_text() == "40"
    assert (home / "chain" / "b").is_dir() and not (home / "chain" / "b").is_symlink()
    assert not (home / "chain" / "a").exists()  # an intermediate: evicted (checkpoints: all keeps it)
    assert list(shm_dir.iterdir()) == []


def test_keep_everything_then_every_result_reads(disk_dir, shm_dir):
    wf, _, _ = chain(disk_dir / "work")
    graph = run(wf, "SeaMultiProc", {"tiers": [{"path": str(shm_dir)}], "checkpoints": "all"})
    assert graph_node(graph, "a").get_output("out") == 40
    assert graph_node(graph, "a").result.outputs.out == 40


def test_provenance_written(disk_dir, shm_dir, caplog):
    """execution.write_provenance: Workflow.run reads every node's result after the plugin returns."""
    wf, _, _ = chain(disk_dir / "work")
    wf.config["execution"]["write_provenance"] = True
    with caplog.at_level(logging.WARNING, logger="sea"):
        run(wf, "SeaMultiProc", {"tiers": [{"path": str(shm_dir)}]})
    assert list((disk_dir / "work").glob("workflow_provenance_*.provn"))
    assert sum("write_provenance" in r.getMessage() for r in caplog.records) == 1


def test_without_base_dir_a_temporary_home(shm_dir, caplog):
    """Nipype gives each node of a workflow without base_dir a temporary directory: Sea gives the
    workflow one temporary home, said once, kept after the run."""
    wf, _, _ = chain(None)
    with caplog.at_level(logging.WARNING, logger="sea"):
        graph = run(wf, "SeaMultiProc", {"tiers": [{"path": str(shm_dir)}]})
    said = [r.getMessage() for r in caplog.records if "no base_dir" in r.getMessage()]
    assert len(said) == 1
    b = graph_node(graph, "b")
    home = Path(b.output_dir()).parent.parent
    assert home.name.startswith("sea-home-") and str(home) in said[0]
    assert Path(b.get_output("out")).read_text() == "40"
    assert (home / "sea-report.json").is_file()
    assert list(shm_dir.iterdir()) == []


def test_two_nodes_one_directory(disk_dir, shm_dir):
    """Iterables repeating a value with parameterize_dirs = False: two execution nodes share a
    directory. Linear runs the second after the first, which Nipype's hash check finds done; so does Sea."""
    results = {}
    for plugin in ("Linear", "SeaMultiProc"):
        wf = Workflow(name="twins", base_dir=str(disk_dir / plugin))
        wf.config["execution"]["parameterize_dirs"] = False
        src = Node(IdentityInterface(fields=["x"]), name="src")
        src.iterables = ("x", [3, 3, 4])
        a = fn("a", double, ["x"], ["out"])
        b = fn("b", add_one, ["x"], ["out"])
        wf.connect(src, "x", a, "x")
        wf.connect(a, "out", b, "x")
        graph = run(wf, plugin, {"tiers": [{"path": str(shm_dir)}]} if plugin == "SeaMultiProc" else None)
        results[plugin] = sorted(node.get_output("out") for node in graph.nodes() if node.name == "b")
    assert results["SeaMultiProc"] == results["Linear"] == [7, 7, 9]
    assert list(shm_dir.iterdir()) == []


@pytest.fixture
def restore_nipype_config():
    yield
    config.set_default_config()


@pytest.mark.parametrize("size", ["smoke", pytest.param("full", marks=pytest.mark.slow)])
def test_nipype_suite_through_sea(size, restore_nipype_config):
    """Nipype's engine and plugin tests from the installed package, Linear and MultiProc swapped
    for SeaMultiProc: no test fails only under Sea but those listed by design (each passing under
    the configuration that gives back what it reads)."""
    sys.path.insert(0, str(HERE / "peer"))
    try:
        import nipype_suite
    finally:
        sys.path.remove(str(HERE / "peer"))
    assert nipype_suite.main(["--smoke"] if size == "smoke" else []) == 0



def _write(tag):
    import os

    with open(f"{tag}.txt", "w") as fh:
        fh.write(tag)
    return os.path.abspath(f"{tag}.txt")


def _concatenate(files):
    return "".join(open(f).read() for f in files)


def test_a_node_that_hands_its_inputs_on_keeps_their_directories_for_its_consumers(disk_dir, shm_dir):
    """Nipype's Merge passes its inputs' paths on: its consumer reads files in the directories of
    Merge's producers, which are not its own producers. Sea kept them only until Merge finished
    (the consumer then failed with FileNotFoundError, where MultiProc succeeds); they stay until
    the consumer finished."""
    from nipype.interfaces.utility import Merge

    results = {}
    for plugin in ("MultiProc", "SeaMultiProc"):
        wf = Workflow(name="handed_on", base_dir=str(disk_dir / plugin))
        merged = Node(Merge(3), name="merged")
        for i in range(3):
            wf.connect(fn(f"write{i}", _write, ["tag"], ["out"]), "out", merged, f"in{i + 1}")
            wf.get_node(f"write{i}").inputs.tag = f"part{i}"
        wf.connect(merged, "out", fn("read", _concatenate, ["files"], ["out"]), "files")
        graph = run(wf, plugin, {"tiers": [{"path": str(shm_dir)}]} if plugin == "SeaMultiProc" else None)
        results[plugin] = next(node.get_output("out") for node in graph.nodes() if node.name == "read")
    assert results == {"MultiProc": "part0part1part2", "SeaMultiProc": "part0part1part2"}
    assert list(shm_dir.iterdir()) == []
