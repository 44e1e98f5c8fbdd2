"""Issue #7's benchmark: SeaDask against Dask without Sea placement, on one machine, busy shared FS.

``python -m benchmarks.dask_bench --size smoke|full [--reps 3] [--out benchmarks/results]``

Part 1, makespan. One Dask cluster of 3 single-threaded worker processes (``distributed.SpecCluster``,
``Nanny`` workers named w0, w1, w2, each with ``SEA_TIER`` set to its own directory under /dev/shm,
as three compute nodes would each have their own node-local disk; the scheduler in this process, no
dashboard) serves both configurations, interleaved in each repetition (D SD, then SD D, ...):

* D  "Dask without Sea placement": :class:`DaskNoPlacementPlugin`, Nipype's distributed loop
  (:class:`nipype_sea._nipype_internals.EventedTaskLoop`, the loop SeaDask uses) sending every
  ready node to Dask as ``nipype.pipeline.plugins.multiproc.run_node`` (MultiProc's task function),
  where Dask's scheduler puts it; every node directory is in the home on the busy shared FS, as
  Nipype's own plugins put it;
* SD SeaDask: ``plugin="SeaDask"``, ``sea: {"tiers": [{"path": "${SEA_TIER}"}]}``, the same
  cluster by address: node directories on the worker's own tier, a node sent to the worker that
  holds its inputs, declared outputs staged home.

Both open their own ``distributed.Client`` to the cluster inside ``wf.run`` (timed). The busy shared
filesystem is ``benchmarks.slowfs`` (30 MB/s write, 200 MB/s read, 5 ms per metadata operation, the
whole mount), holding the input chunks, the home (``base_dir``) and the DataSink directory. The
workload is ``example_workflows.incrementation``. Every repetition's outputs of D and SD are
compared byte for byte; a difference stops the benchmark. Files created on the shared filesystem are
counted through the unthrottled backing directory; SeaDask's locality hit rate and per-worker rows are
read from ``<home>/sea-report.json``.

Part 2, placement overhead per node, no cluster: on a 2,000-node :class:`sea.graph.WorkflowGraph`
(396 chains of 5 and 20 fan-ins joining 19 or 20 chains each), the client-side decisions SeaDask
makes per node (``LocalityPlanner.order`` of each batch of ready nodes, ``assign`` of each,
``finished`` and ``workers_to_tell`` when it ends) for 3 and 30 workers, in a simulated run where
every worker finishes its queue first in, first out. Then the whole client side of SeaDask and of D
on a Nipype workflow of about 2,000 nodes with a stand-in Dask client (:class:`FakeClient`: a task
"ends" as soon as it is submitted, after its arguments were pickled with cloudpickle as Dask's client
does), ``plugin.run`` timed in phases (:func:`timed_plugin`): before Nipype's loop, the plugin's own
methods, after the loop, the pickling, and Nipype's loop itself; SeaDask's own cost over D's is the
difference of the first three. The issue's target is 5 ms per node.

Everything runs in this process (the workers are the cluster's processes, fresh for each benchmark
invocation, not for each run). ``sea`` and the example come from ``sys.path`` (the working tree when
started as ``python -m`` from the repository), ``nipype_sea`` from the installed distribution (its
``.pth`` file imports it at interpreter start); the tables say where each came from and whether it
is the commit's code (``pip install .`` to benchmark working-tree changes to ``nipype_sea``). Results: ``<out>/dask-<size>.md``
and ``.json``. Leaves no mount, process or directory behind (scratch: ``/var/tmp/sea-bench-dask-*``,
``/dev/shm/sea-bench-dask-*``), also on SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

from nipype_sea.dask_tasks import DaskTaskLoop

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRATCH_PREFIX = "sea-bench-dask-"  # not "sea-": that prefix is Sea's own private directories
SHARED_PARENT = Path("/var/tmp")  # the busy shared filesystem's backing disk, and the workers' scratch
TMPFS_PARENT = Path("/dev/shm")  # the workers' node-local tiers
BUSY = {"write_mbps": 30, "read_mbps": 200, "meta_latency_ms": 5}
WORKERS = ("w0", "w1", "w2")
SEA = {"tiers": [{"path": "${SEA_TIER}"}]}
TARGET_MS_PER_NODE = 5.0
MIB = 2**20


@dataclass(frozen=True)
class Size:
    name: str
    chunks: int
    chunk_mib: float
    iterations: int
    planner_nodes: tuple[int, int]  # (chains of 5, fan-ins) of the placement graph
    nipype_groups: tuple[int, int]  # (groups, chains per group) of the Nipype graph for the client-side cost
    planner_reps: int
    run_timeout: float  # seconds per wf.run


SIZES = {
    # smoke: the whole benchmark in well under a minute (for tests/test_dask_bench_smoke.py)
    "smoke": Size("smoke", 3, 2, 2, planner_nodes=(396, 20), nipype_groups=(4, 10), planner_reps=2, run_timeout=120),
    "full": Size("full", 12, 16, 5, planner_nodes=(396, 20), nipype_groups=(20, 20), planner_reps=5, run_timeout=600),
}


# ====================================================================== D: Dask without placement
class DaskNoPlacementPlugin(DaskTaskLoop):
    """Nipype on Dask with no placement: each ready node is one Dask task running MultiProc's
    ``run_node`` wherever Dask's scheduler puts it; node directories stay where Nipype puts them
    (under ``base_dir``). Outcomes are collected by SeaDask's own loop (:class:`DaskTaskLoop`).
    ``plugin_args={"dask": {"address": ...}}``."""

    def __init__(self, plugin_args=None):
        plugin_args = dict(plugin_args or {})
        self.address = plugin_args.pop("dask")["address"]
        super().__init__(plugin_args=plugin_args)
        self.client_factory = None  # for the client-side measurement: a stand-in for distributed.Client

    def run(self, graph, config, updatehash=False):
        if self.client_factory is not None:
            opened = self.client_factory()
        else:
            from distributed import Client

            opened = Client(self.address, timeout=60)
        with opened as client:
            self.client = client
            try:
                return super().run(graph, config, updatehash=updatehash)
            finally:
                self.client = None

    def _submit_job(self, node, updatehash=False):
        from nipype.pipeline.plugins.multiproc import run_node

        return self.submit_task(run_node, node, updatehash, 0, name=f"nipype-{node.name}")  # (run_node echoes its taskid back)


# ====================================================================== measuring helpers
def footprint(root: Path) -> tuple[int, int]:
    """(bytes, regular files) under ``root``, read through the unthrottled backing directory."""
    from benchmarks.run import footprint as count_tree

    size, files, _links = count_tree(root)
    return size, files


@dataclass
class RunRecord:
    repetition: int
    config: str  # D or SD
    position: int  # 0: ran first in its repetition
    makespan_seconds: float  # wall time of wf.run(), SeaDask's final flush included
    shared_files: int  # regular files left on the shared FS (home and DataSink directory)
    shared_bytes: int
    output_files: int
    identical_to_d: bool | None = None  # on SD's record; None on D's
    differences: list[str] = field(default_factory=list)
    local_hit_rate: float | None = None
    sea: dict | None = None  # SeaDask's report without its timeline
    tier_leftovers: list[str] = field(default_factory=list)


@dataclass
class PlannerRecord:
    workers: int
    nodes: int
    repetitions: int
    ms_per_node: list[float]  # one per repetition: (order + assign + finished + workers_to_tell) / nodes
    worst_assign_ms: float
    worst_order_ms: float  # one batch of ready nodes
    largest_batch: int
    fetches: int  # inputs copied between workers in the simulation (fan-ins)
    local_hit_rate: float

    @property
    def median_ms(self) -> float:
        return statistics.median(self.ms_per_node)


@dataclass
class ClientRecord:
    plugin: str
    nodes: int
    run_seconds: list[float]  # plugin.run() (Nipype's loop and the plugin), one per repetition
    expand_seconds: list[float]  # wf.run() minus plugin.run(): Nipype's own graph expansion
    phases: list[dict[str, float]]  # seconds: total, before_loop, own_methods, after_loop, fake_client

    @property
    def ms_per_node(self) -> float:
        return statistics.median(self.run_seconds) * 1000 / self.nodes

    def phase_ms(self, phase: str) -> float:
        """Median over repetitions of one phase, in ms per node."""
        return statistics.median(p[phase] for p in self.phases) * 1000 / self.nodes

    @property
    def nipype_loop_ms(self) -> float:
        """Nipype's loop: the rest of plugin.run, per node (median over repetitions)."""
        rest = [p["total"] - p["before_loop"] - p["own_methods"] - p["after_loop"] - p["fake_client"] for p in self.phases]
        return statistics.median(rest) * 1000 / self.nodes


@dataclass
class Machine:
    date: str
    kernel: str
    nproc: int
    ram_bytes: int
    python: str
    nipype: str
    dask: str
    distributed: str
    repo_commit: str
    code: dict[str, str]  # package -> where it was imported from, and whether it is the commit's code
    load_average_start: tuple[float, float, float]
    load_average_end: tuple[float, float, float] | None = None


def code_origin(package: str) -> str:
    """Where ``package`` was imported from (the distribution's .pth imports ``nipype_sea`` from the
    installed copy at interpreter start, whatever the working directory) and whether its files are
    those of the repository's HEAD."""
    import importlib
    import subprocess

    directory = Path(importlib.import_module(package).__file__).parent
    differing = []
    for path in sorted(directory.rglob("*.py")):
        relative = f"{package}/{path.relative_to(directory)}"
        head = subprocess.run(["git", "-C", str(REPO_ROOT), "show", f"HEAD:{relative}"], capture_output=True)
        if head.returncode != 0 or head.stdout != path.read_bytes():
            differing.append(relative)
    return f"{directory}: " + ("identical to HEAD" if not differing else f"differs from HEAD in {', '.join(differing)}")


def describe_machine() -> Machine:
    import platform
    import subprocess

    import psutil

    git = ["git", "-C", str(REPO_ROOT)]
    try:
        commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        changed = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True).stdout.split("\n")
        changed = [line[3:] for line in changed if line.strip()]
        if changed:
            commit += f" (uncommitted changes in {', '.join(changed)})"
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return Machine(
        date=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        kernel=platform.release(),
        nproc=len(os.sched_getaffinity(0)),
        ram_bytes=psutil.virtual_memory().total,
        python=platform.python_version(),
        nipype=metadata.version("nipype"),
        dask=metadata.version("dask"),
        distributed=metadata.version("distributed"),
        repo_commit=commit,
        code={name: code_origin(name) for name in ("sea", "nipype_sea", "example_workflows")},
        load_average_start=os.getloadavg(),
    )


# ====================================================================== part 1: the cluster runs
@contextlib.contextmanager
def spec_cluster(tiers: dict[str, Path], local_directory: Path):
    """Three single-threaded Nanny workers w0..w2, ``SEA_TIER`` each one's own tier directory."""
    from distributed import Client, Nanny, Scheduler, SpecCluster

    workers = {
        name: {
            "cls": Nanny,
            "options": {"nthreads": 1, "name": name, "env": {"SEA_TIER": str(path)}, "local_directory": str(local_directory)},
        }
        for name, path in tiers.items()
    }
    with SpecCluster(workers=workers, scheduler={"cls": Scheduler, "options": {"dashboard": False}}, silence_logs=logging.ERROR) as cluster:
        with Client(cluster) as client:
            client.wait_for_workers(len(tiers), timeout=120)
        yield cluster.scheduler_address


def run_config(config: str, address: str, size: Size, data: Path, work: Path, out: Path) -> float:
    """One ``wf.run`` of D or SD; returns its wall time."""
    import threading

    from example_workflows.incrementation import build_workflow

    wf = build_workflow(data, size.chunks, size.iterations, work, out)
    wf.config["execution"]["poll_sleep_duration"] = 0.05  # EventedTaskLoop waits on wake-ups; this is only its fallback
    if config == "D":
        plugin, plugin_args = DaskNoPlacementPlugin(plugin_args={"dask": {"address": address}}), None
    else:
        plugin, plugin_args = "SeaDask", {"sea": SEA, "dask": {"address": address}}
    timer = threading.Timer(size.run_timeout, lambda: os.kill(os.getpid(), signal.SIGTERM))  # a hung run ends the benchmark, cleanly
    timer.start()
    try:
        start = time.monotonic()
        wf.run(plugin=plugin, plugin_args=plugin_args)
        return time.monotonic() - start
    finally:
        timer.cancel()


def run_cluster_part(size: Size, reps: int, scratch: Path, tmpfs: Path) -> list[RunRecord]:
    from benchmarks.run import compare_outputs, relative_files
    from benchmarks.slowfs import SlowFS
    from example_workflows.incrementation import make_chunks
    from sea.report import RunReport

    tiers = {name: tmpfs / name for name in WORKERS}
    for path in tiers.values():
        path.mkdir()
    backing = scratch / "backing"
    make_chunks(backing / "data", size.chunks, size.chunk_mib)  # written unthrottled, read through the mount
    records: list[RunRecord] = []
    with SlowFS(backing, scratch / "mnt", **BUSY) as fs, spec_cluster(tiers, scratch / "dask") as address:
        print(f"  cluster at {address}: workers {', '.join(WORKERS)}; busy shared FS at {fs.path}", flush=True)
        for repetition in range(1, reps + 1):
            order = ("D", "SD") if repetition % 2 else ("SD", "D")
            outs: dict[str, Path] = {}
            try:
                for position, config in enumerate(order):
                    name = f"{config}-{repetition}"
                    os.sync()  # the previous run's writeback must not land inside this run's timing
                    makespan = run_config(config, address, size, fs.path / "data", fs.path / name / "work", fs.path / name / "out")
                    size_b, files = footprint(backing / name)
                    outs[config] = backing / name / "out"
                    record = RunRecord(repetition, config, position, makespan, files, size_b, len(relative_files(outs[config])))
                    if config == "SD":
                        report = json.loads((backing / name / "work" / "sea-report.json").read_text())
                        report.pop("timeline", None)
                        record.sea = report
                        record.local_hit_rate = RunReport.from_json(backing / name / "work" / "sea-report.json").local_hit_rate
                        record.tier_leftovers = sorted(str(p) for t in tiers.values() for p in t.iterdir())
                    records.append(record)
                    print(progress_line(record), flush=True)
                sd = next(r for r in records if r.repetition == repetition and r.config == "SD")
                sd.differences = compare_outputs(outs["D"], outs["SD"])
                sd.identical_to_d = not sd.differences and sd.output_files > 0
                if not sd.identical_to_d:
                    raise SystemExit(f"FAILED: repetition {repetition}: SD's outputs differ from D's: {sd.differences[:5] or 'no output'}")
                print(f"  rep {repetition}: outputs of D and SD identical ({sd.output_files} files)", flush=True)
            finally:
                for config in order:  # through the backing directory: no throttle
                    shutil.rmtree(backing / f"{config}-{repetition}", ignore_errors=True)
                for path in tiers.values():
                    for leftover in path.iterdir():
                        shutil.rmtree(leftover, ignore_errors=True)
    return records


def progress_line(record: RunRecord) -> str:
    line = f"  rep {record.repetition} {record.config:<2} {record.makespan_seconds:8.2f} s  {record.shared_files:5d} files on the shared FS"
    if record.local_hit_rate is not None:
        line += f"  locality hit rate {record.local_hit_rate:.1%}"
    return line


# ====================================================================== part 2: placement overhead
def placement_graph(chains: int, fan_ins: int, length: int = 5):
    """``chains`` chains of ``length`` nodes, then ``fan_ins`` join nodes, join j reading the last
    node of every chain c with c % fan_ins == j. Keys look like Nipype's node directories."""
    from sea.graph import NodeSpec, WorkflowGraph

    def key(c: int, i: int) -> str:
        return f"wf/_subject_{c:04d}/step_{i}"

    specs = [NodeSpec(key(c, i), upstream=((key(c, i - 1), "out_file"),) if i else ()) for c in range(chains) for i in range(length)]
    specs += [
        NodeSpec(f"wf/join_{j:02d}", upstream=tuple((key(c, length - 1), "in_files") for c in range(j, chains, fan_ins)))
        for j in range(fan_ins)
    ]
    return WorkflowGraph.from_specs(specs)


def simulate_planner(graph, n_workers: int, node_bytes: int = 16 * MIB) -> dict:
    """One simulated run: every ready node is ordered and assigned as SeaDask does when Nipype
    hands it over; each round, every worker with work finishes the oldest task it was given; the
    planner is told (``finished``, ``workers_to_tell``). Returns the planner's time only."""
    from sea.dask.locality import LocalityPlanner

    clock = time.perf_counter_ns
    workers = [f"w{i}" for i in range(n_workers)]
    planner = LocalityPlanner(graph, dict.fromkeys(workers, 1))
    waiting = {key: len(graph.producers(key)) for key in graph.nodes}
    ready = [key for key, n in waiting.items() if n == 0]
    queues: dict[str, deque] = {w: deque() for w in workers}
    spent = worst_assign = worst_order = 0
    largest = fetches = done = 0
    while done < len(graph):
        if ready:
            largest = max(largest, len(ready))
            t0 = clock()
            ordered = planner.order(ready)
            t1 = clock()
            worst_order = max(worst_order, t1 - t0)
            for key in ordered:
                t2 = clock()
                assignment = planner.assign(key)
                t3 = clock()
                worst_assign = max(worst_assign, t3 - t2)
                queues[assignment.worker].append(key)
                fetches += len(assignment.fetch)
            spent += clock() - t0
            ready = []
        for worker in workers:
            if queues[worker]:
                key = queues[worker].popleft()
                t0 = clock()
                planner.finished(key, worker, node_bytes)
                planner.workers_to_tell(key)
                spent += clock() - t0
                done += 1
                for consumer in graph.consumers(key):
                    waiting[consumer] -= 1
                    if waiting[consumer] == 0:
                        ready.append(consumer)
    held = sum(r.with_inputs_held for r in planner.rows.values())
    hits = sum(r.local_hits for r in planner.rows.values())
    return {
        "ms_per_node": spent / 1e6 / len(graph),
        "worst_assign_ms": worst_assign / 1e6,
        "worst_order_ms": worst_order / 1e6,
        "largest_batch": largest,
        "fetches": fetches,
        "local_hit_rate": hits / held if held else 1.0,
    }


def run_planner_part(size: Size) -> list[PlannerRecord]:
    chains, fan_ins = size.planner_nodes
    graph = placement_graph(chains, fan_ins)
    records = []
    for n_workers in (3, 30):
        runs = [simulate_planner(graph, n_workers) for _ in range(size.planner_reps)]
        record = PlannerRecord(
            workers=n_workers,
            nodes=len(graph),
            repetitions=len(runs),
            ms_per_node=[r["ms_per_node"] for r in runs],
            worst_assign_ms=max(r["worst_assign_ms"] for r in runs),
            worst_order_ms=max(r["worst_order_ms"] for r in runs),
            largest_batch=runs[0]["largest_batch"],
            fetches=runs[0]["fetches"],
            local_hit_rate=runs[0]["local_hit_rate"],
        )
        records.append(record)
        print(
            f"  planner, {record.nodes} nodes, {n_workers:2d} workers: {record.median_ms:.4f} ms/node (worst assign {record.worst_assign_ms:.3f} ms)",
            flush=True,
        )
    return records


class FakeFuture:
    """A Dask future that is already finished: its done callbacks run at once."""

    status = "finished"

    def __init__(self, value):
        self.value = value
        self.key = "fake"

    def result(self, timeout=None):
        return self.value

    def add_done_callback(self, callback) -> None:
        callback(self)

    def cancel(self) -> None:
        pass


class FakeClient:
    """What SeaDaskPlugin and DaskNoPlacementPlugin call on ``distributed.Client``, with no cluster:
    ``submit`` pickles the task (function and arguments, with cloudpickle, as the real client
    serialises it) and returns a finished future whose outcome is a success on the chosen worker."""

    def __init__(self, n_workers: int):
        self.addresses = {f"w{i}": f"tcp://fake:{9000 + i}" for i in range(n_workers)}
        self.names = {a: n for n, a in self.addresses.items()}
        self.seconds = 0.0  # spent in this client's methods (pickling, mostly)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    @contextlib.contextmanager
    def _timed(self):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds += time.perf_counter() - start

    def register_plugin(self, plugin, name=None) -> None:
        import cloudpickle

        with self._timed():
            cloudpickle.dumps(plugin)  # the real client sends it to every worker

    def run_on_scheduler(self, function, *args, **kwargs):
        return dict(self.addresses)

    def run(self, function, *args, workers=None, wait=True, **kwargs):
        from sea.dask.node_storage import close_run
        from sea.report import RunReport

        if function is close_run:
            return {a: {"worker": n, "report": RunReport(), "flush_error": None} for n, a in self.addresses.items()}
        return None

    def submit(self, function, *args, workers=None, **kwargs):
        import cloudpickle

        from nipype_sea.dask_plugin import run_node_on_worker

        with self._timed():
            cloudpickle.dumps((function, args))
        if function is run_node_on_worker:
            return FakeFuture({"cached": False, "size": MIB, "worker": self.names[workers[0]], "traceback": None})
        if workers is None:  # MultiProc's run_node, for D: Dask would pick the worker
            return FakeFuture({"result": None, "traceback": None, "taskid": args[2]})
        return FakeFuture((b"", "/nowhere"))  # pack(): a copy between workers, never opened here


def _same(x):
    return x


def _pair(g, m):
    return m


def nipype_overhead_workflow(home: Path, groups: int, per_group: int, length: int = 5):
    """``groups`` x ``per_group`` chains of ``length`` Function nodes (the first one, ``member``,
    iterable over the chains of its group), the iterable ``group`` before them and one JoinNode per
    group: groups * (per_group * length + 2) nodes. (Identity nodes would be dropped by Nipype.)"""
    from nipype import Function, IdentityInterface, JoinNode, Node, Workflow

    wf = Workflow(name="overhead", base_dir=str(home))
    group = Node(Function(input_names=["x"], output_names=["x"], function=_same), name="group")
    group.iterables = ("x", list(range(groups)))
    member = Node(Function(input_names=["g", "m"], output_names=["x"], function=_pair), name="member")
    member.iterables = ("m", list(range(per_group)))
    wf.connect(group, "x", member, "g")
    previous = member
    for i in range(1, length):
        step = Node(Function(input_names=["x"], output_names=["x"], function=_same), name=f"step{i}")
        wf.connect(previous, "x", step, "x")
        previous = step
    join = JoinNode(IdentityInterface(fields=["x"]), joinsource="member", joinfield=["x"], name="join")
    wf.connect(previous, "x", join, "x")
    wf.config["execution"]["poll_sleep_duration"] = 0.05
    return wf


OWN_METHODS = ("make_ready", "_submit_job", "_collect", "_get_result", "before_submitting", "_clear_task")


def timed_plugin(base, fake: FakeClient):
    """``base`` with its run split in phases: before the first submission (graph translation,
    planner, plugin registration, and the jobs' dependency counts), the adapter's own methods
    (``OWN_METHODS``, outermost calls only, time in ``fake`` taken out), and after Nipype's loop
    (reports). Nipype's loop is the rest."""

    class Timed(base):
        def run(self, graph, config, updatehash=False):
            self.nodes = graph.number_of_nodes()
            self.own, self._depth, self._first, self._loop_end = 0.0, 0, None, None
            fake_before, start = fake.seconds, time.perf_counter()
            try:
                return super().run(graph, config, updatehash=updatehash)
            finally:
                end = time.perf_counter()
                self.phases = {
                    "total": end - start,
                    "before_loop": self._first - start,
                    "own_methods": self.own,
                    "after_loop": end - self._loop_end,
                    "fake_client": fake.seconds - fake_before,
                }

        def _start_ready(self, *args, **kwargs):
            if self._first is None:
                self._first = time.perf_counter()
            return super()._start_ready(*args, **kwargs)

        def _postrun_check(self):
            self._loop_end = time.perf_counter()
            return super()._postrun_check()

    def own(name: str):
        def method(self, *args, **kwargs):
            self._depth += 1
            outermost, fake_before, start = self._depth == 1, fake.seconds, time.perf_counter()
            try:
                return getattr(super(Timed, self), name)(*args, **kwargs)
            finally:
                self._depth -= 1
                if outermost:
                    self.own += time.perf_counter() - start - (fake.seconds - fake_before)

        return method

    for name in OWN_METHODS:
        setattr(Timed, name, own(name))
    Timed.__name__ = base.__name__  # Nipype names the plugin after its class
    return Timed


def run_client_part(size: Size, scratch: Path, reps: int) -> list[ClientRecord]:
    """plugin.run() of SD and D with a FakeClient, 3 workers, interleaved; Nipype's INFO log off."""
    from nipype_sea.dask_plugin import SeaDaskPlugin

    fake = FakeClient(len(WORKERS))

    class FakeOptions:
        busy_threshold = 4

        @contextlib.contextmanager
        def client(self):
            yield fake

    plugins = {"D": timed_plugin(DaskNoPlacementPlugin, fake), "SD": timed_plugin(SeaDaskPlugin, fake)}
    groups, per_group = size.nipype_groups
    logger = logging.getLogger("nipype.workflow")
    level = logger.level
    logger.setLevel(logging.WARNING)  # 2,000 "[Job n] Completed" lines would time the terminal
    results: dict[str, ClientRecord] = {}
    try:
        for repetition in range(reps):
            for key in ("D", "SD") if repetition % 2 == 0 else ("SD", "D"):
                home = scratch / f"client-{key}-{repetition}"
                wf = nipype_overhead_workflow(home, groups, per_group)
                if key == "SD":
                    plugin = plugins[key](plugin_args={"sea": SEA, "dask": {"address": "tcp://fake:8786"}})
                    plugin.dask = FakeOptions()
                else:
                    plugin = plugins[key](plugin_args={"dask": {"address": "tcp://fake:8786"}})
                    plugin.client_factory = lambda: fake
                start = time.perf_counter()
                wf.run(plugin=plugin)
                total = time.perf_counter() - start
                record = results.setdefault(key, ClientRecord(key, plugin.nodes, [], [], []))
                record.run_seconds.append(plugin.phases["total"])
                record.expand_seconds.append(total - plugin.phases["total"])
                record.phases.append(plugin.phases)
                shutil.rmtree(home, ignore_errors=True)
    finally:
        logger.setLevel(level)
    for record in results.values():
        print(
            f"  client side, {record.plugin:<2} on {record.nodes} Nipype nodes: {record.ms_per_node:.2f} ms/node "
            f"(plugin.run {statistics.median(record.run_seconds):.2f} s; its own methods {record.phase_ms('own_methods'):.3f} ms/node)",
            flush=True,
        )
    return [results["D"], results["SD"]]


def sea_added_ms(d: ClientRecord, sd: ClientRecord) -> float:
    """What SeaDask adds per node on the client over D, from the phases measured directly: its own
    methods, and its extra time before and after Nipype's loop (medians over repetitions)."""
    return sum(sd.phase_ms(p) - d.phase_ms(p) for p in ("before_loop", "own_methods", "after_loop"))


# ====================================================================== tables
def _med(values) -> float:
    return statistics.median(values) if values else float("nan")


def render_markdown(
    size: Size, reps: int, machine: Machine, runs: list[RunRecord], planner: list[PlannerRecord], client: list[ClientRecord]
) -> str:
    d = _med([r.makespan_seconds for r in runs if r.config == "D"])
    sd = _med([r.makespan_seconds for r in runs if r.config == "SD"])
    ratio = d / sd
    sd_runs = [r for r in runs if r.config == "SD"]
    identical = all(r.identical_to_d for r in sd_runs)
    hit = _med([r.local_hit_rate for r in sd_runs])
    nodes = size.chunks * (size.iterations + 2)
    lines = [
        f"# SeaDask vs Dask without Sea placement: {size.name} size, {reps} repetitions",
        "",
        f"Issue #7's benchmark, made by `python -m benchmarks.dask_bench --size {size.name} --reps {reps}` ({Path(__file__).name}).",
        "",
        f"Machine: {machine.nproc} cores, {machine.ram_bytes / 2**30:.1f} GiB RAM, kernel {machine.kernel}; Python {machine.python}, "
        f"nipype {machine.nipype}, dask {machine.dask}, distributed {machine.distributed}; repository at {machine.repo_commit}. "
        f"Code run: {'; '.join(f'`{k}` from {v}' for k, v in machine.code.items())}. {machine.date}. Load average {machine.load_average_start[0]:.2f} at the start, "
        f"{machine.load_average_end[0]:.2f} at the end (other people's tests ran on this machine meanwhile: compare the ratio, "
        "not the seconds, with other runs).",
        "",
        "## Setup",
        "",
        f"- Cluster: one `distributed.SpecCluster` on this machine, 3 `Nanny` worker processes ({', '.join(WORKERS)}), one thread each, "
        "each with `SEA_TIER` set to its own directory under /dev/shm (a node-local tier no other worker reads); scheduler in the "
        "benchmark's process, no dashboard. The same cluster serves both configurations.",
        "- Busy shared filesystem: `benchmarks.slowfs` over /var/tmp, 30 MB/s write, 200 MB/s read, 5 ms per metadata operation, "
        "one bucket for all processes. It holds the input chunks, the home (`base_dir`) and the DataSink directory.",
        f"- Workload: `example_workflows.incrementation`, {size.chunks} chunks x {size.chunk_mib:g} MiB x {size.iterations} iterations "
        f"({nodes} Nipype nodes: per chunk select, {size.iterations} increments, a DataSink; Nipype drops the iterable identity node).",
        "- **D** (Dask without Sea placement): `DaskNoPlacementPlugin` in benchmarks/dask_bench.py, Nipype's distributed loop "
        "(`EventedTaskLoop`, as SeaDask) submitting each ready node as MultiProc's `run_node` to Dask, where Dask's scheduler "
        "places it; every node directory is in the home on the busy FS, as Nipype's own plugins put it.",
        '- **SD** (SeaDask): `wf.run(plugin="SeaDask", plugin_args={"sea": {"tiers": [{"path": "${SEA_TIER}"}]}, '
        '"dask": {"address": ...}})`: node directories on the worker\'s tier, nodes sent to the worker holding their inputs, '
        "declared outputs staged home before `run()` returns.",
        "- Both open their own Dask client inside the timed `wf.run()`; they alternate (D SD, SD D, ...) in each repetition; "
        "outputs of D and SD are compared byte for byte every repetition.",
        "",
        "## Makespan",
        "",
        "| rep | config | makespan (s) | files on shared FS | MiB on shared FS | outputs | locality hit rate |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        same = "" if r.identical_to_d is None else ("identical to D's" if r.identical_to_d else "DIFFER from D's")
        hit_text = "" if r.local_hit_rate is None else f"{r.local_hit_rate:.1%}"
        lines.append(
            f"| {r.repetition} | {r.config} | {r.makespan_seconds:.2f} | {r.shared_files} | {r.shared_bytes / MIB:.1f} | {r.output_files} {same} | {hit_text} |"
        )
    d_files = _med([r.shared_files for r in runs if r.config == "D"])
    sd_files = _med([r.shared_files for r in sd_runs])
    lines += [
        "",
        "| | D | SD | D / SD |",
        "|---|---|---|---|",
        f"| median makespan (s) | {d:.2f} | {sd:.2f} | **{ratio:.2f}x** |",
        f"| median files created on the shared FS | {d_files:g} | {sd_files:g} | {d_files / sd_files if sd_files else float('nan'):.1f}x |",
        f"| outputs | | {'all identical to D' if identical else 'SOME DIFFER'} | |",
        f"| SeaDask locality hit rate (median) | | {hit:.1%} | |",
        "",
        "Per-ratio spread: "
        + ", ".join(
            f"rep {rep}: {dr.makespan_seconds / sr.makespan_seconds:.2f}x"
            for rep in sorted({r.repetition for r in runs})
            for dr in runs
            if dr.repetition == rep and dr.config == "D"
            for sr in sd_runs
            if sr.repetition == rep
        )
        + ".",  # fmt: skip
        "",
        "SeaDask's rows per worker (from `<home>/sea-report.json`; local = ran where every input some worker held was):",
        "",
        "| rep | worker | nodes run | with inputs held | local | hit rate | received (MiB) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in sd_runs:
        for w in r.sea["workers"]:
            rate = w["local_hits"] / w["inputs_held"] if w["inputs_held"] else 1.0
            lines.append(
                f"| {r.repetition} | {w['worker']} | {w['nodes_run']} | {w['inputs_held']} | {w['local_hits']} | {rate:.1%} | {w['bytes_received'] / MIB:.1f} |"
            )
    sea_home = [(r.sea["files_created_home"], r.sea["without_sea_files_home"]) for r in sd_runs]
    lines += [
        "",
        f"SeaDask's own count of files it created in the home: {', '.join(str(a) for a, _ in sea_home)} "
        f"(its estimate without Sea: {', '.join(str(b) for _, b in sea_home)}).",
        "",
        "## Placement overhead per node (no cluster)",
        "",
        f"A {planner[0].nodes}-node `sea.graph.WorkflowGraph` ({size.planner_nodes[0]} chains of 5, {size.planner_nodes[1]} fan-ins "
        "over the chains' last nodes), run through a simulated execution (every worker finishes its oldest task each round). "
        "Timed: `LocalityPlanner.order` of each batch of ready nodes, `assign` of each, `finished` and `workers_to_tell` "
        "when it ends: the client's decisions per node.",
        "",
        "| workers | nodes | ms per node (median of reps) | each rep | worst single assign (ms)* | worst order of a batch (ms)* | largest batch | inputs fetched | simulated hit rate |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in planner:
        lines.append(
            f"| {p.workers} | {p.nodes} | **{p.median_ms:.4f}** | {', '.join(f'{v:.4f}' for v in p.ms_per_node)} | {p.worst_assign_ms:.3f} | "
            f"{p.worst_order_ms:.3f} | {p.largest_batch} | {p.fetches} | {p.local_hit_rate:.1%} |"
        )
    lines += [
        "",
        "\\* the slowest single call over all repetitions, pauses of the garbage collector and preemption by other processes included.",
    ]
    d_client, sd_client = client
    added = sea_added_ms(d_client, sd_client)
    difference = sd_client.ms_per_node - d_client.ms_per_node
    lines += [
        "",
        f"The whole client side on a Nipype workflow of {sd_client.nodes} nodes ({size.nipype_groups[0]} groups x {size.nipype_groups[1]} "
        "chains of 5 Function nodes, the iterable nodes, one JoinNode per group), 3 workers, with `FakeClient` in place of "
        "`distributed.Client`: a task ends as soon as it is submitted, after its function and arguments were pickled with "
        "cloudpickle as the real client would; no node runs. `plugin.run()` is timed in phases: *before the loop* (SeaDask: "
        "node specs, graph, planner, NodeStorage registration; both: the jobs' dependency counts), *own methods* (the plugin's "
        f"{', '.join(f'`{m}`' for m in OWN_METHODS)}, the fake client's time taken out), *after the loop* (SeaDask: merged "
        "report), the fake client's pickling, and the rest, the loop (`EventedTaskLoop`'s "
        "rounds over Nipype's plugin contract, the deep copy of each node). Nipype's INFO log is off for both; D and SD alternate. Medians over repetitions.",
        "",
        "| plugin | nodes | plugin.run (s): each rep | ms per node, total | before the loop | own methods | after the loop | pickling (fake client) | Nipype's loop | Nipype's graph expansion before plugin.run (s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in client:
        lines.append(
            f"| {c.plugin} | {c.nodes} | {', '.join(f'{v:.2f}' for v in c.run_seconds)} | **{c.ms_per_node:.2f}** | {c.phase_ms('before_loop'):.3f} | "
            f"{c.phase_ms('own_methods'):.3f} | {c.phase_ms('after_loop'):.3f} | {c.phase_ms('fake_client'):.3f} | {c.nipype_loop_ms:.2f} | "
            f"{statistics.median(c.expand_seconds):.2f} |"
        )
    lines += [
        "",
        f"SeaDask's own client-side cost over D's, from its phases (before + own methods + after, SD - D): **{added:.3f} ms per node**; "
        f"the difference of the totals, which also carries the machine's noise: {difference:+.2f} ms per node.",
        "",
    ]
    worst = max(p.median_ms for p in planner)
    lines += [
        "## Targets",
        "",
        "| target | measured | |",
        "|---|---|---|",
        f"| ratio D / SD (issue #7 sets no figure: reported) | {ratio:.2f}x | SeaDask {'faster' if ratio > 1 else 'NOT faster'} than Dask without placement |",
        f"| placement decisions <= {TARGET_MS_PER_NODE:g} ms per node (3 and 30 workers) | {worst:.4f} ms (worst of the two) | "
        f"{'met' if worst <= TARGET_MS_PER_NODE else 'missed'} |",
        f"| SeaDask's own client-side cost over D's <= {TARGET_MS_PER_NODE:g} ms per node | {added:.3f} ms | "
        f"{'met' if added <= TARGET_MS_PER_NODE else 'missed'} |",
        f"| SeaDask's whole client side, Nipype's loop included, <= {TARGET_MS_PER_NODE:g} ms per node | {sd_client.ms_per_node:.2f} ms "
        f"(D: {d_client.ms_per_node:.2f} ms; Nipype's loop alone: {sd_client.nipype_loop_ms:.2f} ms) | "
        f"{'met' if sd_client.ms_per_node <= TARGET_MS_PER_NODE else 'missed'} |",
        f"| outputs identical | {sum(bool(r.identical_to_d) for r in sd_runs)}/{len(sd_runs)} | {'met' if identical else 'missed'} |",
        "",
    ]
    return "\n".join(lines)


# ====================================================================== main
def _raise_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)  # so the finally clauses stop the cluster, unmount and remove the scratch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="smoke")
    parser.add_argument("--reps", type=int, default=3, help="repetitions of D and SD (default 3)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results", help="where dask-<size>.md and .json go")
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error("--reps must be at least 1")
    os.environ.setdefault("NIPYPE_NO_ET", "1")  # no version check over the network inside the timing
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    size = SIZES[args.size]
    machine = describe_machine()
    scratch = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=SHARED_PARENT))
    tmpfs = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=TMPFS_PARENT))
    print(f"Dask benchmark, {size.name} size, {args.reps} repetitions; scratch: {scratch} {tmpfs}", flush=True)
    try:
        runs = run_cluster_part(size, args.reps, scratch, tmpfs)
        planner = run_planner_part(size)
        client = run_client_part(size, tmpfs, args.reps)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(tmpfs, ignore_errors=True)
    machine.load_average_end = os.getloadavg()
    markdown = render_markdown(size, args.reps, machine, runs, planner, client)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"dask-{size.name}"
    stem.with_suffix(".md").write_text(markdown)
    raw = {
        "size": asdict(size),
        "repetitions": args.reps,
        "machine": asdict(machine),
        "busy_shared_fs": BUSY,
        "sea": SEA,
        "runs": [asdict(r) for r in runs],
        "planner": [{**asdict(p), "median_ms_per_node": p.median_ms} for p in planner],
        "client_side": [{**asdict(c), "ms_per_node": c.ms_per_node, "nipype_loop_ms_per_node": c.nipype_loop_ms} for c in client],
        "sea_added_client_ms_per_node": sea_added_ms(*client),
        "target_ms_per_node": TARGET_MS_PER_NODE,
    }
    stem.with_suffix(".json").write_text(json.dumps(raw, indent=1) + "\n")
    print()
    print(markdown)
    print(f"Written: {stem}.md and .json")
    return 0


if __name__ == "__main__":
    try:
        status = main()
    except SystemExit as stop:
        if stop.code == 128 + signal.SIGTERM:  # stopped: the cluster, the mount and the scratch are gone already;
            sys.stdout.flush()  # do not wait at exit for a Dask callback thread still asking a closed
            sys.stderr.flush()  # client for a cancelled task's result (it would wait for ever)
            os._exit(stop.code)
        raise
    sys.exit(status)
