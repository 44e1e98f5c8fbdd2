"""How the scheduler's cost grows with the graph: a fan-out/fan-in of N trivial nodes, side by side.

``python -m benchmarks.scaling --size smoke|full [--plugins MultiProc,SeaMultiProc,cf,sea]
[--repeat 3] [--cap 600] [--out benchmarks/results]``

The workload is issue 19's: N iterable Function nodes that each double a number, joined by one
JoinNode (Nipype); for Pydra, one task split over N values and combined, then a total. Nodes do
no I/O to speak of, so the time is the plugin's own: the scheduling loop, hashing, bookkeeping.
n_procs 2, Sea's tier /dev/shm, MultiProc with the tuned 0.05 s poll. SeaDask's row is its client
side alone, on a stand-in client whose tasks end as they are submitted (no node runs). Each run is a fresh process
in fresh directories, timed around ``workflow.run`` / the Submitter call. A plugin that took more
than ``--cap`` seconds at one N is not run at larger ones. Results: ``<out>/scaling-<size>.md``
and ``.json``, with ms per node and each size's time over the previous size's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from benchmarks.run import REPO_ROOT, describe_machine

SIZES = {"smoke": (20, 60), "part": (200, 1000, 2000), "full": (200, 500, 1000, 2000, 5000, 20000)}
PLUGINS = ("MultiProc", "SeaMultiProc", "SeaDask", "cf", "sea")  # Nipype's three (SeaDask: its client side), then Pydra's two workers
TIER_PATHS = ("SeaMultiProc-tierpaths", "sea-tierpaths")  # on request: nodes at their tier paths (logical_paths: false), the cost of sea.view
TIER = "/dev/shm"


def double(i: int) -> int:
    return 2 * i


def total(values: list) -> int:
    return sum(values)


def nipype_fan(n: int, base: Path):
    from nipype import Function, IdentityInterface, JoinNode, Node, Workflow

    wf = Workflow(name="scaling", base_dir=str(base))
    source = Node(IdentityInterface(fields=["i"]), name="source")
    source.iterables = ("i", list(range(n)))
    work = Node(Function(input_names=["i"], output_names=["o"], function=double), name="double")
    join = JoinNode(Function(input_names=["values"], output_names=["total"], function=total), joinsource="source", joinfield=["values"], name="total")
    wf.connect([(source, work, [("i", "i")]), (work, join, [("o", "values")])])
    wf.config["execution"]["poll_sleep_duration"] = 0.05
    return wf


def pydra_fan(n: int):
    from pydra.compose import python, workflow

    @python.define(outputs=["out"])
    def Double(i: int) -> int:
        return 2 * i

    @python.define(outputs=["out"])
    def Total(values: list[int]) -> int:
        return sum(values)

    @workflow.define(outputs=["total"])
    def Fan(values: list[int]) -> int:
        doubled = workflow.add(Double().split(i=values).combine("i"), name="double")
        return workflow.add(Total(values=doubled.out), name="total").out

    return Fan(values=list(range(n)))


def one_run(plugin: str, n: int, root: Path) -> dict:
    """In the worker process: build, run, time."""
    plugin, tier_paths = plugin.removesuffix("-tierpaths"), plugin.endswith("-tierpaths")
    sea = {"tiers": [{"path": TIER}], "progress": "off", **({"logical_paths": False} if tier_paths else {})}
    if plugin in ("MultiProc", "SeaMultiProc", "SeaDask"):
        wf = nipype_fan(n, root / "work")
        runner, waits = _timed_nipype_plugin(plugin, sea)
        start = time.perf_counter()
        graph = wf.run(plugin=runner)
        seconds = time.perf_counter() - start
        loop, waited = waits()
        return {"seconds": seconds, "nodes": graph.number_of_nodes(), "loop": loop, "waited": waited}
    from pydra.engine.submitter import Submitter

    options = {"sea": sea} if plugin == "sea" else {}
    start = time.perf_counter()
    with Submitter(worker=plugin, cache_root=root / "cache", n_procs=2, **options) as submitter:
        result = submitter(pydra_fan(n))
    seconds = time.perf_counter() - start
    if result.errored or result.outputs.total != n * (n - 1):
        raise RuntimeError(f"{plugin} at N={n}: wrong result")
    return {"seconds": seconds, "nodes": n + 1}


def _fake_cluster_plugin():
    """SeaDask with a stand-in for ``distributed.Client`` (:class:`benchmarks.dask_bench.FakeClient`,
    3 workers): each task ends as soon as it is submitted, pickled as the real client would; no node
    runs. What is timed is SeaDask's client side: the graph, the locality planner, the loop."""
    import contextlib

    from benchmarks.dask_bench import FakeClient
    from nipype_sea.dask_plugin import SeaDaskPlugin

    fake = FakeClient(3)

    class FakeOptions:
        busy_threshold = 4

        @contextlib.contextmanager
        def client(self):
            yield fake

    runner = SeaDaskPlugin(plugin_args={"sea": {"tiers": [{"path": TIER}], "progress": "off"}, "dask": {"address": "tcp://fake:8786"}})
    runner.dask = FakeOptions()
    return runner, lambda: (runner.loop_seconds, runner.waited_seconds)


def _timed_nipype_plugin(plugin: str, sea: dict):
    """The plugin, and a function giving (seconds in its scheduling loop, of which waiting for
    workers) after the run: the rest is the plugin's own work in this process. SeaMultiProc
    measures its loop itself; MultiProc's loop is ``DistributedPluginBase.run``, whose waits are
    its ``sleep`` between rounds (counted here by wrapping it)."""
    if plugin == "SeaDask":
        return _fake_cluster_plugin()
    if plugin == "SeaMultiProc":
        from nipype_sea import SeaMultiProcPlugin

        runner = SeaMultiProcPlugin(plugin_args={"n_procs": 2, "sea": sea})
        return runner, lambda: (runner.loop_seconds, runner.waited_seconds)
    from nipype.pipeline.plugins import base
    from nipype.pipeline.plugins.multiproc import MultiProcPlugin

    slept, run = [0.0], base.DistributedPluginBase.run
    loop = [0.0]

    def sleep(seconds):
        start = time.perf_counter()
        time.sleep(seconds)
        slept[0] += time.perf_counter() - start

    def timed_run(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return run(self, *args, **kwargs)
        finally:
            loop[0] = time.perf_counter() - start

    base.sleep, base.DistributedPluginBase.run = sleep, timed_run
    return MultiProcPlugin(plugin_args={"n_procs": 2}), lambda: (loop[0], slept[0])


def measure(plugin: str, n: int, cap: float) -> dict:
    """One run in a fresh process and fresh directories; ``None`` seconds past ``cap``."""
    with tempfile.TemporaryDirectory(prefix="sea-scaling-", dir="/var/tmp") as root:
        code = f"import json; from benchmarks.scaling import one_run; from pathlib import Path; print(json.dumps(one_run({plugin!r}, {n}, Path({root!r}))))"
        try:
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=cap + 60)
        except subprocess.TimeoutExpired:
            return {"plugin": plugin, "n": n, "seconds": None, "nodes": None}
        if done.returncode != 0:
            raise RuntimeError(f"{plugin} at N={n} failed:\n{done.stderr[-3000:]}")
        return {"plugin": plugin, "n": n, **json.loads(done.stdout.strip().splitlines()[-1])}


def run_all(sizes: tuple[int, ...], plugins: list[str], cap: float, repeat: int = 1) -> list[dict]:
    """Each size in turn, ``repeat`` rounds of every plugin at it (interleaved: a slow minute of
    the machine falls on all of them, not on one plugin's cells)."""
    records, capped = [], set()
    for n in sizes:
        for rep in range(repeat):
            for plugin in plugins:
                if plugin in capped:
                    continue
                record = {**measure(plugin, n, cap), "rep": rep}
                records.append(record)
                shown = f"{record['seconds']:.2f} s" if record["seconds"] is not None else f"over {cap:.0f} s"
                print(f"{plugin:>13} N={n:<6} {shown}", flush=True)
                if record["seconds"] is None or record["seconds"] > cap:
                    capped.add(plugin)  # larger graphs would only take longer
    return records


PAIRS = (("sea", "cf"), ("SeaMultiProc", "MultiProc"))  # Sea's adapter over its engine's own, shown as a ratio


def _cell(runs: list[dict]) -> dict | None:
    """A cell's runs as one: the median run's figures, with the spread of its seconds."""
    timed = sorted((r for r in runs if r["seconds"] is not None), key=lambda r: r["seconds"])
    if not timed or len(timed) < len(runs) / 2:
        return None
    median = dict(timed[(len(timed) - 1) // 2])
    median["low"], median["high"], median["runs"] = timed[0]["seconds"], timed[-1]["seconds"], len(timed)
    return median


def render_markdown(size: str, records: list[dict], machine, cap: float) -> str:
    sizes = sorted({r["n"] for r in records})
    runs: dict[tuple[str, int], list[dict]] = {}
    for r in records:
        runs.setdefault((r["plugin"], r["n"]), []).append(r)
    by = {key: cell for key, group in runs.items() if (cell := _cell(group)) is not None}
    repeat = max(len(group) for group in runs.values())
    plugins = [p for p in PLUGINS + TIER_PATHS if any(r["plugin"] == p for r in records)]
    pairs = [(a, b) for a, b in PAIRS if a in plugins and b in plugins]
    how = "One run per cell" if repeat == 1 else f"{repeat} runs per cell, the plugins in turn at each N; the median, with the fastest and slowest run in brackets"
    lines = [
        f"# Scheduler scaling, {size}: a fan-out/fan-in of N trivial nodes, n_procs 2, Sea's tier {TIER}",
        "",
        f"{how}, each run in a fresh process. Machine: {machine.nproc} cores, kernel {machine.kernel}, Python {machine.python}, "
        f"nipype {machine.nipype}, commit {machine.repo_commit}, {machine.date}. A plugin over {cap:.0f} s at one N is not run at larger ones. "
        "SeaDask's cells are its client side alone: a stand-in client whose tasks end as they are submitted (no node runs).",
        "",
        "| N | " + " | ".join(f"{p} (s)" for p in plugins) + " | " + " | ".join(f"{p} ms/node" for p in plugins) + "".join(f" | {a} / {b}" for a, b in pairs) + " |",
        "|--:|" + "--:|" * (2 * len(plugins) + len(pairs)),
    ]
    for n in sizes:
        cells = [by.get((p, n)) for p in plugins]
        seconds = [(f"{c['seconds']:.2f}" + (f" ({c['low']:.2f}–{c['high']:.2f})" if c["runs"] > 1 else "")) if c else "–" for c in cells]
        per_node = [f"{1000 * c['seconds'] / c['nodes']:.1f}" if c else "–" for c in cells]
        ratios = [f"{by[(a, n)]['seconds'] / by[(b, n)]['seconds']:.2f}" if (a, n) in by and (b, n) in by else "–" for a, b in pairs]
        lines.append(f"| {n:,} | " + " | ".join(seconds + per_node + ratios) + " |")
    looped = [p for p in plugins if any(r["plugin"] == p and r.get("loop") is not None for r in records)]
    if looped:
        lines += [
            "",
            "The plugin's own work per node: seconds in its scheduling loop less those it spent waiting for workers "
            "(MultiProc: its sleeps between polls), over N. Hashing, placement, bookkeeping and the copy of each node sent to a "
            "worker are in it; the workers' time and the workflow's graph expansion before the loop are not.",
            "",
            "| N | " + " | ".join(f"{p} own ms/node" for p in looped) + " |",
            "|--:|" + "--:|" * len(looped),
        ]
        for n in sizes:
            cells = [by.get((p, n)) for p in looped]
            own = [f"{1000 * (c['loop'] - c['waited']) / c['nodes']:.2f}" if c and c.get("loop") is not None else "–" for c in cells]
            lines.append(f"| {n:,} | " + " | ".join(own) + " |")
    lines += ["", "Time at each N over the time at the previous N (linear is the ratio of the N's):", ""]
    for p in plugins:
        done = [(n, by[(p, n)]["seconds"]) for n in sizes if (p, n) in by]
        ratios = [f"{b[0]}/{a[0]}: {b[1] / a[1]:.2f} (linear {b[0] / a[0]:.1f})" for a, b in zip(done, done[1:], strict=False)]
        lines.append(f"- {p}: " + ("; ".join(ratios) if ratios else "one size only"))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scaling", description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="smoke", help="smoke: N = 20, 60; part: 200 to 2,000; full: 200, 500, 1,000, 2,000, 5,000, 20,000")
    parser.add_argument("--sizes", help="comma-separated N to run instead of --size's (e.g. 1000,5000); results in scaling-n<N>-<N>.md")
    parser.add_argument("--plugins", default=",".join(PLUGINS), help="comma-separated, of " + ", ".join(PLUGINS + TIER_PATHS))
    parser.add_argument("--repeat", type=int, default=1, help="runs of each plugin at each N (the plugins in turn); cells show the median and the spread")
    parser.add_argument("--cap", type=float, default=600.0, help="seconds after which a plugin is not run at larger N")
    parser.add_argument("--out", default=str(REPO_ROOT / "benchmarks" / "results"), help="directory for scaling-<size>.md and .json")
    args = parser.parse_args(argv)
    plugins = [p for p in args.plugins.split(",") if p]
    unknown = [p for p in plugins if p not in PLUGINS + TIER_PATHS]
    if unknown:
        parser.error(f"unknown plugin(s) {', '.join(unknown)}; choose among {', '.join(PLUGINS + TIER_PATHS)}")
    try:
        sizes = tuple(int(n) for n in args.sizes.split(",")) if args.sizes else SIZES[args.size]
    except ValueError:
        parser.error(f"--sizes {args.sizes!r}: give whole numbers separated by commas, e.g. 1000,5000")
    if args.sizes:
        args.size = "n" + "-".join(map(str, sizes))
    machine = describe_machine()
    if args.repeat < 1:
        parser.error("--repeat: give 1 or more")
    records = run_all(sizes, plugins, args.cap, args.repeat)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"scaling-{args.size}" + ("-tierpaths" if any(p in TIER_PATHS for p in plugins) else "")
    (out / f"{name}.json").write_text(json.dumps({"machine": asdict(machine), "records": records}, indent=1) + "\n")
    (out / f"{name}.md").write_text(render_markdown(args.size, records, machine, args.cap))
    print(f"results: {out / f'{name}.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
