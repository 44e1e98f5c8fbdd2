"""``sea plan``: what a run will do and how long it should take, before anything runs.

An adapter (found through the ``sea.adapters`` entry points) turns the user's workflow object into a
:class:`PlanInput`; sizes and run times come from the history an earlier run left in the home
(``.sea/history.json``), else from the defaults; bandwidths from ``sea probe`` or the command line.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import networkx as nx

from .config import SeaConfig, SeaConfigError
from .estimate import SizeEstimator
from .graph import NodeSpec, WorkflowGraph
from .model import Bandwidth, Prediction, Simulation, TierModel, Workload, predict_sea, predict_shared, simulate
from .prefetch import PAYS_FROM
from .sizes import format_size

DEFAULT_SECONDS = 1.0  # a node's run time before any run measured it
DEFAULT_FILES = 8  # files in a node directory before any run counted them (a Nipype node's own are 6 to 8)


@dataclass
class PlanInput:
    home: Path | None
    specs: list[NodeSpec]
    input_bytes: int
    poll_seconds: float = 0.0  # the engine's own plugin sleeps this long between two scheduling rounds (MultiProc's poll)


SEA_FILES = 5  # Sea's own in the home: the journal, the history, the report and its copy in the list of runs, the records


@dataclass
class Footprint:
    """What a run leaves in its home (the work directory, on the shared filesystem), as planned."""

    result_bytes: float  # directories nothing consumes (the workflow's results), kept whole
    result_files: float
    checkpoint_bytes: float  # at most: the budget of what the run delivers
    delivered_bytes: float  # declared outputs (at their destinations) and the results
    engine_bytes: float  # under the engine's own plugin: every node directory
    engine_files: float
    budget: str = ""

    @property
    def bytes(self) -> float:
        return self.result_bytes + self.checkpoint_bytes

    def to_text(self) -> str:
        return "\n".join([
            f"  left in base_dir (on the shared filesystem): at most {format_size(self.bytes)}, in {self.result_files + SEA_FILES:.0f} files and the checkpoints'",
            f"    results kept whole {format_size(self.result_bytes)} ({self.result_files:.0f} files); checkpoints at most {format_size(self.checkpoint_bytes)}, "
            f"one file each (checkpoint_budget {self.budget} of the {format_size(self.delivered_bytes)} delivered); Sea's own {SEA_FILES} files",
            f"    under MultiProc: {format_size(self.engine_bytes)} in {self.engine_files:.0f} files",
        ])  # fmt: skip


def footprint(graph: WorkflowGraph, sizes: dict[str, float], files: dict[str, float], config: SeaConfig) -> Footprint:
    """What :class:`Footprint` says, from each node's estimated bytes and files."""
    from .checkpoint import Budget
    from .config import Checkpoints

    results = [k for k, s in graph.nodes.items() if not graph.consumers(k) and s.sink_destination is None]
    kept = list(graph.nodes) if config.checkpoint_mode is Checkpoints.ALL else [*results, *(k for k, s in graph.nodes.items() if s.keep_dir or s.persist_dir)]
    kept = list(dict.fromkeys(kept))
    delivered = sum(sizes[k] for k, s in graph.nodes.items() if s.sink_destination is not None) + sum(sizes[k] for k in results)
    budget = Budget(config.checkpoint_budget).bytes(int(delivered)) if config.checkpoint_mode is Checkpoints.AUTO else 0
    return Footprint(
        result_bytes=sum(sizes[k] for k in kept),
        result_files=sum(files[k] for k in kept),
        checkpoint_bytes=budget,
        delivered_bytes=delivered,
        engine_bytes=sum(sizes.values()),
        engine_files=sum(files.values()),
        budget=config.checkpoint_budget if config.checkpoint_mode is Checkpoints.AUTO else f"unused: checkpoints {config.checkpoint_mode.value}",
    )


@dataclass
class Plan:
    nodes: int
    learned: bool  # sizes came from an earlier run
    sizes: dict[str, float]
    simulation: Simulation
    workload: Workload
    shared: Prediction
    sea: Prediction
    poll_seconds: float = 0.0
    footprint: Footprint | None = None

    def to_text(self) -> str:
        kinds: dict[str, list[float]] = {}
        for key, size in self.sizes.items():
            kinds.setdefault(key.rsplit("/", 1)[-1], []).append(size)
        lines = [
            f"{self.nodes} nodes; sizes {'learned from the last run' if self.learned else 'not known yet (defaults): run once to learn them'}",
            "  predicted bytes per node:",
            *(f"    {name:<28} x{len(v):<4} {format_size(max(v))}" for name, v in sorted(kinds.items())),
            "  predicted peak per tier (Sea, depth-first, evicting):",
            *(f"    {tier:<28} {format_size(peak)}" for tier, peak in self.simulation.peak_bytes.items()),
            f"  spills: {self.simulation.spills}; live working set: {format_size(self.simulation.live_peak)}",
            f"  persisted home: {format_size(self.workload.output_bytes)} of declared outputs",
            *([self.footprint.to_text()] if self.footprint is not None else []),
            f"  makespan, MultiProc, everything on the shared FS: {self.shared.lower:.1f}-{self.shared.upper:.1f} s"
            + (f" (of which {self.shared.wait_seconds:.1f} s its {self.poll_seconds:g} s poll: execution.poll_sleep_duration)" if self.poll_seconds else ""),
            f"  makespan, Sea (wakes when a node ends):  {self.sea.lower:.1f}-{self.sea.upper:.1f} s"
            + (f" (prefetch hides {self.sea.hidden_seconds:.1f} s of input reads behind compute)" if self.sea.hidden_seconds else ""),
        ]
        return "\n".join(lines)


def make_plan(
    graph: WorkflowGraph,
    history: SizeEstimator,
    tiers: list[TierModel],
    shared: Bandwidth,
    processes: int,
    input_bytes: float,
    learned: bool,
    poll_seconds: float = 0.0,
    prefetch: bool | str = False,
    config: SeaConfig | None = None,
) -> Plan:
    """``prefetch``: the configuration's ``prefetch.enabled``; ``auto`` counts as on where the first
    tier reads the inputs :data:`sea.prefetch.PAYS_FROM` times as fast as the shared filesystem."""
    sizes = {k: float(history.estimate(s.kind)) for k, s in graph.nodes.items()}
    files = {k: float(history.files.get(s.kind, DEFAULT_FILES)) for k, s in graph.nodes.items()}
    seconds = {k: history.seconds.get(s.kind, DEFAULT_SECONDS) for k, s in graph.nodes.items()}
    home = TierModel("home", float("inf"), shared)
    sim = simulate(graph, sizes, seconds, [*tiers, home], processes)
    outputs = [sizes[k] for k, s in graph.nodes.items() if s.sink_destination is not None]
    workload = Workload(
        input_bytes=input_bytes,
        intermediate_bytes=sum(sizes.values()) - sum(outputs),
        output_bytes=sum(outputs),
        last_output_bytes=max(outputs, default=0.0),
        compute_seconds=sim.makespan_compute * processes,
        processes=processes,
        # the first readers' inputs: what no copy ahead can hide (the graph's sources read the inputs)
        first_input_bytes=input_bytes * min(1.0, processes / max(sum(1 for k in graph.nodes if not graph.producers(k)), 1)),
    )
    if prefetch == "auto":
        prefetch = bool(tiers) and tiers[0].bandwidth.read >= PAYS_FROM * shared.read
    return Plan(
        nodes=len(graph),
        learned=learned,
        sizes=sizes,
        simulation=sim,
        workload=workload,
        shared=replace(predict_shared(workload, shared), wait_seconds=poll_seconds * _rounds(graph, processes)),
        sea=predict_sea(workload, tiers, shared, sim.live_peak, prefetch=bool(prefetch)),
        poll_seconds=poll_seconds,
        footprint=footprint(graph, sizes, files, config or SeaConfig()),
    )


def _rounds(graph: WorkflowGraph, processes: int) -> int:
    """Scheduling rounds of a plugin that polls, when nodes are shorter than its poll: each node of
    the longest chain starts a round after its producer, and a round starts at most ``processes``
    nodes."""
    if not len(graph):
        return 0
    return max(nx.dag_longest_path_length(graph.dag) + 1, -(-len(graph) // processes))


def load_target(target: str) -> object:
    """Call ``module:function`` or ``path/to/file.py:function`` and return what it returns."""
    if ":" not in target:
        raise SeaConfigError(f"{target!r} is not MODULE:FUNCTION; write e.g. example_workflows.incrementation.plan:workflow")
    where, name = target.rsplit(":", 1)
    if not where or not name:
        raise SeaConfigError(f"{target!r} is not MODULE:FUNCTION; write e.g. example_workflows.incrementation.plan:workflow")
    try:
        if where.endswith(".py"):
            spec = importlib.util.spec_from_file_location(Path(where).stem, where)
            if spec is None or not Path(where).is_file():
                raise FileNotFoundError(f"no Python file {where!r}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
        else:
            if "" not in sys.path and os.getcwd() not in sys.path:  # as `python -m` does: a module of the current directory
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(where)
        factory = getattr(module, name)
    except (ImportError, OSError, AttributeError, ValueError, TypeError, SyntaxError) as exc:  # (a relative name, a directory, bad code)
        raise SeaConfigError(f"cannot load {target!r}: {exc}; give an importable MODULE:FUNCTION") from None
    if not callable(factory):
        raise SeaConfigError(f"{target!r} names a {type(factory).__name__}, not a function; give MODULE:FUNCTION, a function returning the workflow")
    return factory()


def describe(obj: object, config: SeaConfig) -> PlanInput:
    """Ask each installed adapter whether it knows ``obj``."""
    for entry in importlib.metadata.entry_points(group="sea.adapters"):
        found = entry.load()(obj, config)
        if found is not None:
            if found.home is None:
                raise SeaConfigError("the workflow has no base_dir; set it: Sea's history and outputs live there")
            return found
    raise SeaConfigError(f"no installed Sea adapter knows a {type(obj).__name__}; return a Nipype Workflow")
