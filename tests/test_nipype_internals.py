"""The Nipype internals nipype_sea relies on, checked one by one: these fail loudly, naming the
assumption, when a Nipype release changes one (see nipype_sea/_nipype_internals.py)."""

from __future__ import annotations

import inspect
import os
import re
import time

import nipype
import pytest
from nipype import Function, MapNode, Node, Workflow
from nipype.pipeline.engine import workflows
from nipype.pipeline.plugins import base, legacymultiproc, multiproc

from nipype_sea import _nipype_internals as nx_


def test_version_in_tested_range():
    assert nx_.nipype_version_supported(), f"nipype {nipype.__version__} is outside the tested range {nx_.TESTED_RANGE}"
    assert not nx_.nipype_version_supported("1.13.0") and not nx_.nipype_version_supported("1.7.1")


HOOKS = {  # MultiProc's methods SeaMultiProc's loop calls or overrides
    "_prerun_check": ["self", "graph"],
    "_check_resources": ["self", "running_tasks"],
    "_local_hash_check": ["self", "jobid", "graph"],
    "_submit_job": ["self", "node", "updatehash"],
    "_async_callback": ["self", "args"],
    "_get_result": ["self", "taskid"],
    "_clear_task": ["self", "taskid"],
    "_task_finished_cb": ["self", "jobid", "cached"],
    "_clean_queue": ["self", "jobid", "graph", "result"],
    "_remove_node_deps": ["self", "jobid", "crashfile", "graph"],
    "_remove_node_dirs": ["self"],
    "_postrun_check": ["self"],
}


@pytest.mark.parametrize("name, params", HOOKS.items())
def test_multiproc_private_hooks_exist_with_their_signatures(name, params):
    method = getattr(multiproc.MultiProcPlugin, name, None)
    assert method is not None, f"MultiProcPlugin.{name} is gone"
    assert list(inspect.signature(method).parameters) == params, f"MultiProcPlugin.{name} changed its signature"


def test_run_node_signature():
    assert list(inspect.signature(multiproc.run_node).parameters) == ["node", "updatehash", "taskid"]


# What Nipype's loop does, which nx_._IncrementalLoop and EventedMultiProc do in their own way: a
# step missing here means Nipype's loop changed, and ours must be read against it again.
LOOP_STEPS = {
    "DistributedPluginBase.run": [
        "self._prerun_check(graph)", "self._get_result(taskid)", "self._clean_queue(jobid, graph", "self._run_errors.append(",
        "self._task_finished_cb(jobid)", "self._clear_task(taskid)", "self.max_jobs", "report_nodes_not_run(notrun)",
        "self._postrun_check()", "raise error from cause", 'config["execution"]["poll_sleep_duration"]',
    ],
    "MultiProcPlugin._send_procs_to_workers": [
        "self._check_resources(", "num_subnodes()", "self._submit_mapnode(jobid)", ".n_procs", ".is_gpu_node()", "self._local_hash_check(jobid, graph)",
        ".is_cached()", "run_without_submitting", 'self._status_callback(self.procs[jobid], "start")', "deepcopy(self.procs[jobid])",
        "self.pending_tasks.insert(0, (tid, jobid))",
    ],
    "DistributedPluginBase._submit_mapnode": ["get_subnodes()", "self.mapnodesubids[", "self.depidx[-numnodes:, jobid] = 1"],
    "DistributedPluginBase._clean_queue": ['"stop_on_first_crash"', "self.mapnodesubids", "self._remove_node_deps(jobid, crashfile, graph)"],
    # ours submits run_measured, a run_node that also measures the node's memory
    "MultiProcPlugin._submit_job": ["self._taskid += 1", '"terminal_output"', "self.pool.submit(run_node, node, updatehash, self._taskid)",
                                    "add_done_callback(self._async_callback)", "self._task_obj[self._taskid]", "return self._taskid"],
}


@pytest.mark.parametrize("where, steps", LOOP_STEPS.items())
def test_nipype_loop_does_what_ours_does(where, steps):
    owner, name = where.split(".")
    source = inspect.getsource(getattr({"DistributedPluginBase": base.DistributedPluginBase, "MultiProcPlugin": multiproc.MultiProcPlugin}[owner], name))
    missing = [step for step in steps if step not in source]
    assert not missing, f"Nipype's {where} no longer has {missing}: read nipype_sea/_nipype_internals.py's loop against it again"
    multiproc_resources = inspect.getsource(multiproc.MultiProcPlugin._send_procs_to_workers)
    assert "mem_gb_runtime" in multiproc_resources or ".mem_gb," in multiproc_resources


def test_plugin_lookup_by_attribute_of_plugins_module():
    source = inspect.getsource(workflows.Workflow.run)
    assert 'getattr(sys.modules[name], "%sPlugin" % plugin)' in source


def test_plugin_instance_attributes():
    plugin = multiproc.MultiProcPlugin(plugin_args={"n_procs": 1})
    try:
        for attr in ("pool", "_taskresult", "_task_obj", "pending_tasks", "proc_done", "proc_pending", "mapnodesubids", "procs", "_cwd"):
            assert hasattr(plugin, attr), f"MultiProcPlugin lost the attribute {attr}"
    finally:
        plugin.pool.shutdown()


def test_multiproc_pool_as_ours_replaces_it():
    """EventedMultiProc makes MultiProc's pool itself (its workers offer themselves to the OOM
    killer) and replaces it when a worker died: MultiProc must still make it this way, and a
    ProcessPoolExecutor must still say it is broken."""
    source = inspect.getsource(multiproc.MultiProcPlugin.__init__)
    for step in ("ProcessPoolExecutor(", "initializer=process_initializer", "initargs=(self._cwd,)", 'self.plugin_args.get("mp_context")'):
        assert step in source, f"MultiProc no longer makes its pool with {step}"
    from concurrent.futures import ProcessPoolExecutor

    pool = ProcessPoolExecutor(1)
    try:
        assert pool.submit(os.getpid).result() != os.getpid()
        assert getattr(pool, "_broken", None) is False  # read by EventedMultiProc._usable_pool
        os.kill(next(iter(pool._processes)), 9)
        with pytest.raises(Exception, match="terminated abruptly"):
            pool.submit(time.sleep, 1).result(timeout=30)
        assert pool._broken
    finally:
        pool.shutdown(wait=True)


def double(x):
    return x * 2


def test_node_dirs_input_source_and_mapflow(tmp_path):
    wf = Workflow("wf", base_dir=str(tmp_path))
    a = Node(Function(input_names=["x"], output_names=["y"], function=double), name="a")
    a.inputs.x = 1
    m = MapNode(Function(input_names=["x"], output_names=["y"], function=double), iterfield=["x"], name="m")
    wf.connect(a, "y", m, "x")
    wf.run(plugin="Linear")
    exec_graph = wf.run(plugin="Linear")
    nodes = {n.name: n for n in exec_graph.nodes()}
    ea, em = nodes["a"], nodes["m"]
    assert ea.output_dir() == str(tmp_path / "wf" / "a") and ea._output_dir == ea.output_dir()
    result_file, output_name = em.input_source["x"]
    assert result_file == str(tmp_path / "wf" / "a" / "result_a.pklz") and output_name == "y"
    assert (tmp_path / "wf" / "m" / "mapflow" / "_m0").is_dir(), "MapNode sub-nodes moved out of <dir>/mapflow"
    nx_.set_run_dir(ea, tmp_path / "elsewhere")
    assert ea.output_dir() == str(tmp_path / "elsewhere"), "Node.output_dir() no longer returns the cached _output_dir"
    hashed, value = ea.inputs.get_hashval(hash_method="timestamp")
    assert isinstance(hashed, list) and isinstance(value, str)


def test_expanded_graph_matches_what_run_executes(tmp_path):
    """sea plan rebuilds Workflow.run's execution graph from its private steps."""
    wf = Workflow("wf", base_dir=str(tmp_path))
    a = Node(Function(input_names=["x"], output_names=["y"], function=double), name="a")
    a.iterables = ("x", [1, 2])
    b = Node(Function(input_names=["x"], output_names=["y"], function=double), name="b")
    wf.connect(a, "y", b, "x")
    planned = {n.output_dir() for n in nx_.expanded_graph(wf).nodes()}
    executed = {n.output_dir() for n in wf.run(plugin="Linear").nodes()}
    assert planned == executed and len(planned) == 4


def _plugin_args_read_by(cls) -> set[str]:
    """The plugin_args keys the methods of ``cls`` and its Nipype bases read."""
    keys = set()
    for klass in cls.__mro__:
        if not klass.__module__.startswith("nipype."):
            continue
        source = inspect.getsource(klass)
        keys |= set(re.findall(r"""plugin_args(?:\.get\(|\[)\s*['"](\w+)['"]""", source))
        keys |= set(re.findall(r"""['"](\w+)['"]\s+in\s+(?:self\.)?plugin_args\b""", source))
    return keys


def test_every_plugin_args_key_multiproc_reads_is_known():
    """SeaMultiProc refuses plugin_args keys it does not know: a key a new Nipype reads must be added
    to nx_.MULTIPROC_ARGS, or SeaMultiProc would refuse a valid argument."""
    read = _plugin_args_read_by(multiproc.MultiProcPlugin)
    assert {"n_procs", "memory_gb", "status_callback", "max_jobs"} <= read, f"Nipype reads plugin_args differently now: found only {read}"
    unknown = read - set(nx_.MULTIPROC_ARGS)
    assert not unknown, f"MultiProc reads plugin_args {sorted(unknown)}, which nx_.MULTIPROC_ARGS does not list"
    legacy = _plugin_args_read_by(legacymultiproc.LegacyMultiProcPlugin) - read  # accepted as fMRIPrep passes them
    newer = {"n_gpu_procs"}  # read by the Nipype releases after 1.8, accepted (and ignored) by 1.8
    dead = set(nx_.MULTIPROC_ARGS) - read - legacy - newer - {"sea"}
    assert not dead, f"nx_.MULTIPROC_ARGS lists {sorted(dead)}, which no MultiProc reads"


def _same(x):
    return x


def test_evented_task_loop_runs_in_order_and_requeues(tmp_path):
    """SeaDask's loop (Nipype's DistributedPluginBase contract: proc_done, proc_pending,
    pending_tasks): every ready node submitted in the adapter's order, and a requeued producer
    runs again before its consumer that had not started."""
    class Inline(nx_.EventedTaskLoop):
        def __init__(self):
            super().__init__(plugin_args={})
            self.ran, self.outcomes, self.requeued = [], {}, False

        def _submit_job(self, node, updatehash=False):
            node.run()
            self.ran.append(node.name)
            taskid = len(self.ran)
            self.outcomes[taskid] = {"result": None, "traceback": None}
            return taskid

        def task_done(self, taskid):
            return taskid in self.outcomes

        def _get_result(self, taskid):
            return self.outcomes.get(taskid)

        def _clear_task(self, taskid):
            self.outcomes.pop(taskid, None)

        def before_submitting(self):
            if not self.requeued and self.ran == ["a", "b"] and not all(self.proc_done):
                self.requeued = True
                self.requeue([i for i, node in enumerate(self.procs) if node.name in ("a", "b")])

    wf = Workflow(name="wf", base_dir=str(tmp_path))
    a, b, c = (Node(Function(input_names=["x"], output_names=["x"], function=_same), name=n) for n in "abc")
    a.inputs.x = 1
    wf.connect([(a, b, [("x", "x")]), (b, c, [("x", "x")])])
    wf.config["execution"]["poll_sleep_duration"] = 0.01
    loop = Inline()
    wf.run(plugin=loop)
    assert loop.ran == ["a", "b", "a", "b", "c"]


def _first_line(in_file):
    with open(in_file) as f:
        return f.readline()


def test_a_node_keeps_the_hash_of_its_original_inputs_when_it_runs_on_copies(tmp_path):
    """read_copies (prefetch): Node._get_hashval computes the hash once and keeps it with the node,
    pickling included (MultiProc sends a copy to its process), and Node.run uses the kept hash for
    its directory's hash file while the interface reads the copy."""
    import pickle
    from copy import deepcopy

    from nipype import config
    from nipype.pipeline.engine.utils import merge_dict

    original, copy = tmp_path / "shared" / "sub-01.txt", tmp_path / "tier" / "sub-01.txt"
    for path in (original, copy):
        path.parent.mkdir()
        path.write_text("data\n")
    copy.touch()  # a later timestamp: a hash of the copy would differ

    def make() -> Node:
        node = Node(Function(input_names=["in_file"], output_names=["line"], function=_first_line), name="reader", base_dir=str(tmp_path / "work"))
        node.inputs.in_file = str(original)
        return node

    def configured(node: Node) -> Node:
        node.config = merge_dict(deepcopy(config._sections), {})  # as Node.run sets it
        return node

    expected = configured(make())._get_hashval()[1]
    node = make()
    assert nx_.read_copies(node, {str(original): str(copy)}) == 1
    assert node.inputs.in_file == str(copy) and node._hashvalue == expected
    node = pickle.loads(pickle.dumps(node))
    result = node.run()
    assert result.outputs.line == "data\n"
    assert (tmp_path / "work" / "reader" / f"_0x{expected}.json").is_file(), "the node ran under another hash"
    assert configured(make()).is_cached()[0], "a run without the copy does not find the node done"


def test_the_warning_of_an_empty_directory_nipype_cannot_remove_is_the_one_sea_leaves_unsaid(tmp_path):
    """In the view a node's directory is a bind mount: Nipype's ``emptydirs`` cannot remove it and
    warns (:func:`nipype_sea._nipype_internals._bound_directory_not_removed_quietly` hides that
    one warning): the message and its logger must be Nipype's."""
    import inspect
    import logging

    from nipype.utils import filemanip

    from nipype_sea._nipype_internals import _bound_directory_not_removed_quietly

    record = logging.LogRecord("nipype.utils", logging.WARNING, __file__, 0, "", (str(tmp_path),), None)
    record.msg = "An exception was raised trying to remove old %s, but the path seems empty. Is it an NFS mount?. Passing the exception."
    assert filemanip.fmlogger.name == "nipype.utils"
    assert '"An exception was raised trying to remove old %s, but the path"' in inspect.getsource(filemanip.emptydirs)
    with _bound_directory_not_removed_quietly(str(tmp_path)):
        assert not filemanip.fmlogger.filter(record)
    assert filemanip.fmlogger.filter(record)
