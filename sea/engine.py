"""The seam between Sea's core and a workflow engine's adapter.

An adapter tells the engine what happens, the engine owns every decision::

    engine = SeaEngine(SeaConfig.load(...), home=base_dir)     # checks tiers: SeaConfigError if bad
    engine.update_graph(WorkflowGraph.from_specs(specs))      # checks rules; plans the resume
    for key in engine.order(ready_keys):                       # locality first, depth-first
        if engine.is_skipped(key):   engine.node_skipped(key); continue
        placement = engine.place(key)                          # where the node's directory goes
        ... run the node in placement.logical (a link to placement.physical) ...
        engine.node_finished(key)       # or node_cached(key), retry_elsewhere(key, error), node_failed(key)
    report = engine.close(success=True)                        # drains the stager, evicts, reports

A runnable example with real files::

    >>> import tempfile, pathlib
    >>> from sea.config import SeaConfig
    >>> from sea.graph import NodeSpec, WorkflowGraph
    >>> home = pathlib.Path(tempfile.mkdtemp(dir="/var/tmp")); out = home / "out"
    >>> engine = SeaEngine(SeaConfig.load({"tiers": [{"path": "/dev/shm"}]}), home)
    >>> engine.update_graph(WorkflowGraph.from_specs([
    ...     NodeSpec("wf/make"),
    ...     NodeSpec("wf/sink", kind="DataSink", upstream=(("wf/make", "x"),), sink_destination=out)]))
    >>> p = engine.place("wf/make"); _ = (p.logical / "x.txt").write_text("hello")
    >>> p.physical.is_relative_to("/dev/shm"), p.logical.is_symlink()
    (True, True)
    >>> engine.node_finished("wf/make")
    >>> s = engine.place("wf/sink"); s.staging.mkdir(parents=True); _ = (s.staging / "x.txt").write_text("hello")
    >>> engine.node_finished("wf/sink")
    >>> report = engine.close(success=True)
    >>> (out / "x.txt").read_text(), (home / "wf/make").exists(), report.files_flushed
    ('hello', False, 1)
    >>> import shutil; shutil.rmtree(home)
"""

from __future__ import annotations

import enum
import errno
import functools
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .checkpoint import CheckpointPolicy, CopyCost
from .config import Checkpoints, Mode, Rule, SeaConfig, SeaConfigError
from .console import SeaError
from .estimate import SizeEstimator
from .graph import NodeSpec, WorkflowGraph
from .journal import Journal
from .lock import RunLock
from .ordering import ReadyQueue, order_ready, rank
from .prefetch import Prefetcher
from .probe import remembered
from .progress import Progress, Rate, Snapshot, WorkLeft
from .report import RunReport, TierReport, announce, peak_concurrent_bytes
from .resume import RerunPlan, checkpoint_identity, plan_rerun
from .sizes import format_size
from .stager import CHECKPOINT, DECLARED, KEPT, FlushBatch, Stager, sweep_temporaries, temporary_name, walk_files
from .tiers import StorageHierarchy, Tier

STAGING_DIR = "declared"
MAX_SAMPLES = 4000  # points kept in the report's tier-usage timeline
HISTORY = Path(".sea") / "history.json"  # sizes and run times learned, for the next run and `sea plan`
JOURNAL = Path(".sea") / "journal.jsonl"  # what Sea did with each node, for a rerun (sea.journal)
ENOSPC_TEXT = (os.strerror(errno.ENOSPC), f"[Errno {errno.ENOSPC}]")
EACCES_TEXT = (os.strerror(errno.EACCES), f"[Errno {errno.EACCES}]")  # a program not run: a noexec tier
# files every Nipype/Pydra node directory holds: used to tell whether a rule can ever match
_PROBE_NAMES = ("_report/report.rst", "result_node.pklz", "_inputs.pklz", "_node.pklz", "_0x0.json", "command.txt", "_result.pklz", "_job.pklz")


class SeaFlushError(SeaError, RuntimeError):
    """A declared output could not be committed home; its fast-tier copy is kept."""


class SeaHomeMoved(SeaError, RuntimeError):
    """The work directory (the home) was moved, renamed or removed while the run went on: Sea stops
    rather than make a new one in its place (a user's ``mv``, a cleanup of a job's directory)."""


class State(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    CACHED = "cached"  # the engine's own cache check found it done in the home
    SKIPPED = "skipped"  # Sea's resume plan found it done
    FAILED = "failed"


@dataclass
class Placement:
    """Where a node runs: ``logical`` (in the home, what the engine records) links to ``physical``."""

    key: str
    logical: Path
    physical: Path
    tier: Tier
    reserved: int
    staging: Path | None = None  # a sink's base_directory: it writes its declared outputs here
    staging_root: Path | None = None  # staging mirrors absolute paths: <root>/<destination path>


@dataclass
class _Node:
    spec: NodeSpec
    consumers_left: set[str]
    state: State = State.WAITING
    placement: Placement | None = None
    size: int = 0
    flushes_pending: int = 0
    flush_failed: bool = False
    home_copy: Path | None = None  # node files on their way home, put at its path once all committed
    home_copy_complete: bool = False  # ... all of them (no rule left any out)
    keep: bool = False
    evicted: bool = False
    tried: set[str] = field(default_factory=set)
    started: float = 0.0
    finished: float = 0.0
    open_ended: bool = False  # more consumers may still be added (see SeaEngine.add_nodes)
    checkpoint: bool = False  # its directory goes home (sea.checkpoint), or stays there if it ran there
    in_place: bool = False  # it runs in its directory in the home, which was there before the run
    home_recorded: bool = False  # the journal says its directory is in the home (a checkpoint)
    needs: tuple[str, ...] = ()  # other nodes whose directories its results name
    replica: bool = False  # a copy of a directory made on another machine, for consumers here
    part_of: str | None = None  # a sub-directory placed on its own (a MapNode's sub-node)
    parts: list[str] = field(default_factory=list)


def sweep_partial_copies(graph: WorkflowGraph, home: Path, log: logging.Logger) -> None:
    """Remove the temporary copies a killed run left in the home and the sinks' destinations. A
    run spread over machines does it once, on its client, before any machine starts flushing."""
    destinations = {s.sink_destination for s in graph.nodes.values() if s.sink_destination is not None}
    swept = sum(sweep_temporaries(root) for root in {Path(home), *destinations} if root.is_dir())
    if swept:
        log.warning("[Sea] removed %d partial copies left by a run that was killed", swept)


class SeaEngine:
    """Placement, staging, eviction and resume for one run of one workflow."""

    def __init__(
        self,
        config: SeaConfig,
        home: Path,
        log: logging.Logger | None = None,
        on_event: Callable[[], None] | None = None,
        relocate: Callable[[Path, dict[Path, Path]], Iterable[str]] | None = None,
        machine: str | None = None,
    ):
        """``on_event`` is called (from a stager thread) after each flush commits, so a waiting
        adapter can look again. ``relocate(directory, moves)`` is called once a node's whole
        directory has been copied home, before the copy replaces the node's path in the home (and
        on a directory kept where it ran in the home, once its consumers finished): an engine
        whose result files record absolute paths (Nipype's ``result_*.pklz``, Pydra's
        ``_result.pklz``) rewrites those under each old directory of ``moves`` (a tier's, where
        node directories ran) to the new one (the home), so the copy is right the moment it
        appears; it returns the paths it wrote (the directories of other nodes they name must be
        in the home too for this one to be reused).

        ``machine``: this engine is one of several sharing the home, one per machine (a Dask worker
        with its own tiers); its journal, history and report get the machine's name, and nodes that
        run elsewhere are told by :meth:`finished_elsewhere`. Its progress is not shown (the
        client's is the run's); else ``config.progress`` decides how (:mod:`sea.progress`)."""
        self.config = config
        self.log = log or logging.getLogger("sea")
        self.home = Path(home).resolve()
        self.home.mkdir(parents=True, exist_ok=True)
        st = os.stat(self.home)
        self._home_identity = (st.st_dev, st.st_ino)  # see _home_moved
        # one run per home: an engine of several (one per machine) is covered by its run's client
        self._run_lock = RunLock.acquire(self.home) if machine is None else None
        self.hierarchy = None
        try:  # a start that fails leaves neither the lock nor a directory on a tier
            self.hierarchy = StorageHierarchy.build(config, self.home)
            self.machine = machine
            self._history = self.home / (HISTORY if machine is None else HISTORY.with_name(f"history-{machine}.json"))
            self._report_path = self.home / (self.config.report if machine is None else Path(".sea") / f"report-{machine}.json")
            self.estimator = SizeEstimator.load(self._history, config.default_node_size)
            self.checkpoints = CheckpointPolicy(config.checkpoint_mode, self._copy_cost_prior(), config.checkpoint_factor)
            self.stager = Stager(config.stager_threads)
            self.journal = Journal(self.home / (JOURNAL if machine is None else JOURNAL.with_name(f"journal-{machine}.jsonl")))
            self.report = RunReport(started_at=time.time())
            self.graph = WorkflowGraph.from_specs([])
            self._nodes: dict[str, _Node] = {}
            self._skip: set[str] = set()
            self._created_dirs: set[Path] = set()
            self._known_dirs: set[Path] = set()  # directories of the home known to exist
            self._fresh: set[str] = set()  # nodes with nothing in the home: their path needs no clearing
            self._home_dirs: set[str] = set()  # nodes with a directory in the home before the run: never removed
            self.rerun_plan = RerunPlan()
            self._wake = on_event or (lambda: None)
            self._relocate = relocate
            self._lock = self.hierarchy.lock
            self.prefetcher = Prefetcher(config.prefetch, self.hierarchy, self.order) if config.prefetch.enabled else None
            self._start = time.monotonic()
            self._closed = False
            self._work_left = WorkLeft(self.estimator.seconds)
            self._running: dict[str, str] = {}  # key -> name, of nodes running now
            self._queues: list[ReadyQueue] = []  # adapters' ready jobs, in self.rank's order
            self._open_ended = 0  # nodes that may still get consumers: the graph is still growing
            self._copy_rate = Rate()
            self.progress = Progress(self.progress_snapshot, config.progress if machine is None else "off", self.log)
        except BaseException:
            if self.hierarchy is not None:
                self.hierarchy.close()
            self._release_lock()
            raise
        self.log.info("[Sea] tiers: %s", self.hierarchy.describe())

    # ---------------------------------------------------------------- graph
    def update_graph(self, graph: WorkflowGraph, keys_like: tuple[str, ...] = (), plan_resume: bool = True) -> None:
        """Take the workflow graph: check the rules against it, plan what a rerun can skip.
        ``keys_like``: examples of the keys nodes added during the run will have (an engine that
        creates its nodes as it goes, like Pydra), so the rules can be checked against them too.
        ``plan_resume=False``: the engine's own cache check decides what reruns (one engine of
        several, each knowing only the nodes that ran on its machine)."""
        self._check_rules(graph, keys_like)
        if self.machine is None:  # an engine of several leaves it to the run's client: the others may be flushing
            sweep_partial_copies(graph, self.home, self.log)
        with self._lock:
            self.graph = graph
            self.rerun_plan = plan_rerun(graph, self.journal, self.home) if plan_resume else RerunPlan()
            self._skip = self.rerun_plan.skip
            self._admit(list(graph.nodes))
            self.report.nodes_total = len(graph)
            self.report.rerun_plan = self.rerun_plan.counts() if plan_resume else {}
        if self._skip or self._home_dirs:
            self.log.info("[Sea] rerun of %d nodes: %s", len(graph), self.rerun_plan.summary())
        self.progress.start()  # once the total is known

    def add_nodes(self, specs: list[NodeSpec], open_ended: bool = False) -> None:
        """Nodes the engine created after the run started (Pydra makes a job once its inputs are
        known). Their producers must be in the graph and not evicted yet. ``open_ended``: more
        consumers of these nodes may still be added, so they are not evicted until :meth:`seal`.
        Resume plans are made by :meth:`update_graph` only; added nodes rely on the engine's cache."""
        with self._lock:
            for spec in specs:
                for producer, _label in spec.upstream:
                    node = self._nodes.get(producer)
                    if node is not None and node.evicted:
                        raise RuntimeError(f"{spec.key!r} reads {producer!r}, which was evicted already; add consumers before sealing their producers")
            self.graph.add(specs)
            keys = [spec.key for spec in specs]
            self._admit(keys)
            self._open_ended += len(keys) if open_ended else 0
            for key in keys:
                self._nodes[key].open_ended = open_ended
                for producer in self.graph.producers(key):
                    self._nodes[producer].consumers_left.add(key)
            self.report.nodes_total = len(self.graph)

    def seal(self, keys: list[str]) -> None:
        """No more consumers of ``keys`` will be added: they may be evicted once those known finished."""
        with self._lock:
            for key in keys:
                node = self._nodes[key]
                self._open_ended -= node.open_ended
                node.open_ended = False
                self._maybe_evict(key)

    def _admit(self, keys: list[str]) -> None:
        """Track new nodes; remove the links a killed run left at their paths; note those known
        absent. A directory at a node's path (another plugin's, an earlier run's, a checkpoint) is
        the engine's cache: it is never removed; the engine's own check decides whether the node
        runs, and a node that runs again replaces it with its new directory, as the engine would."""
        present = self._entries_in_home(keys)
        for key in keys:
            spec = self.graph.nodes[key]
            self._nodes[key] = _Node(spec=spec, consumers_left=set(self.graph.consumers(key)))
            self._work_left.add(spec.kind)
            if key in self._skip:
                continue
            if present.get(key) == "link":
                (self.home / key).unlink(missing_ok=True)  # a link into a tier of a run that was killed
            elif key in present:
                self._home_dirs.add(key)
                continue
            self._fresh.add(key)

    def _entries_in_home(self, keys: list[str]) -> dict[str, str]:
        """What exists at each node's path in the home ("link" or "dir"), one listing per parent
        directory: on a shared filesystem every metadata operation is a round trip to its server."""
        found: dict[str, str] = {}
        by_parent: dict[Path, list[str]] = {}
        for key in keys:
            by_parent.setdefault((self.home / key).parent, []).append(key)
        for parent, keys in by_parent.items():
            try:
                entries = {e.name: e for e in os.scandir(parent)}
            except (FileNotFoundError, NotADirectoryError):
                continue
            self._known_dirs.add(parent)
            for key in keys:
                entry = entries.get(Path(key).name)
                if entry is not None:
                    found[key] = "link" if entry.is_symlink() else "dir"
        return found

    def is_fresh(self, key: str) -> bool:
        """Nothing of this node exists in the home: it must run, and no cache check can say otherwise."""
        return key in self._fresh

    def is_settled(self, key: str) -> bool:
        """The node's directory will not move before the run ends: evicted (its copy home, if it
        persists, in place), in the home already, kept by a rule, or kept on its tier because a
        flush failed (the run will then end in SeaFlushError)."""
        node = self._nodes[key]
        if node.evicted or node.state is State.FAILED:
            return True
        p = node.placement
        return node.state is State.FINISHED and not node.flushes_pending and (node.keep or node.flush_failed or p is None or p.tier.is_home)

    def is_quiet(self, key: str) -> bool:
        """Nothing of the node will move into the home any more: it is not running, and no copy of
        it is on its way there (a node's copies home are decided when it finishes)."""
        node = self._nodes[key]
        return node.state is not State.RUNNING and not node.flushes_pending

    def holds(self, key: str) -> bool:
        """This machine has the node's directory (its own run, or a replica), not evicted."""
        node = self._nodes.get(key)
        return node is not None and node.placement is not None and not node.evicted and node.state is State.FINISHED

    @property
    def killed_run_started(self) -> float | None:
        """When the previous run of this home started, if it was killed (its lock was taken over):
        an adapter can tell the files its engine's own locking left then by their times."""
        return self._run_lock.killed_run_started if self._run_lock is not None else None

    @property
    def closed(self) -> bool:
        return self._closed

    def held_bytes(self, key: str) -> int:
        """The measured size of a finished node's directory."""
        return self._nodes[key].size

    def physical_dir(self, key: str) -> Path | None:
        """Where a placed, not yet evicted node's directory really is (to read its results without
        going through its link in the home)."""
        node = self._nodes.get(key)
        if node is None or node.placement is None or node.evicted:
            return None
        return node.placement.physical

    def _check_rules(self, graph: WorkflowGraph, keys_like: tuple[str, ...] = ()) -> None:
        anchors = [*graph.nodes, *keys_like]
        probes = [f"{key}/{name}" for key in anchors for name in _PROBE_NAMES]
        for spec in graph.nodes.values():
            if spec.sink_destination is not None:
                dest = self._rule_path(spec.sink_destination / "x")
                probes.append(dest)
                anchors.append(str(Path(dest).parent))
        for i, rule in enumerate(self.config.rules):
            if any(rule.matches(p) for p in probes):
                continue
            prefix = _literal_prefix(rule)
            if any(a.startswith(prefix) or prefix.startswith(a) for a in anchors):
                self.log.warning("[Sea] rules[%d] %r matches no file known before the run; it may match files made at run time", i, rule.pattern)
                continue
            example = next(iter(anchors), "wf/node")
            raise SeaConfigError(
                f"rules[{i}]: pattern {rule.pattern!r} matches no path this workflow can produce "
                f"(paths are relative to the home, like {example + '/_report/report.rst'!r}); fix the pattern or remove the rule"
            )

    def _rule_path(self, path: Path) -> str:
        path = Path(path)
        return str(path.relative_to(self.home)) if path.is_relative_to(self.home) else str(path)

    def _mode(self, relpath: str, default: Mode) -> Mode:
        for rule in self.config.rules:
            if rule.matches(relpath):
                return rule.mode
        return default

    def key_for(self, directory: Path) -> str:
        """The key of a node directory given by its logical path or by its path on a tier (the
        engine may resolve links: a MapNode's sub-nodes report their real directory)."""
        directory = Path(directory)
        for root in [self.home] + [t.workdir for t in self.hierarchy.fast_tiers]:
            if directory.is_relative_to(root):
                return str(directory.relative_to(root))
        raise ValueError(f"{directory} is neither in the home {self.home} nor on a tier")

    # ---------------------------------------------------------------- scheduling
    def is_skipped(self, key: str) -> bool:
        return key in self._skip

    def order(self, ready: list[str]) -> list[str]:
        """Ready nodes, best first: inputs on the fastest tier, then deepest (depth-first)."""
        with self._lock:
            return order_ready(ready, self.graph, self._input_rank)

    def rank(self, key: str) -> tuple:
        """The sort key of :meth:`order` for one ready node (:func:`sea.ordering.rank`)."""
        with self._lock:
            return rank(key, self.graph, self._input_rank)

    def ready_queue(self) -> ReadyQueue:
        """A queue of an adapter's ready jobs in this engine's order (:class:`ReadyQueue`): push a
        job with its node's key as it becomes ready, pop the next to start. The engine reranks the
        jobs whose inputs move (a producer's directory dropped or replicated here)."""
        queue = ReadyQueue(self.rank)
        self._queues.append(queue)
        return queue

    def _inputs_moved(self, key: str) -> None:
        consumers = self.graph.consumers(key)
        for queue in self._queues:
            queue.rerank(consumers)

    def _input_rank(self, key: str) -> int:
        ranks = []
        tiers = self.hierarchy.all
        for producer in self.graph.producers(key):
            p = self._nodes[producer].placement
            ranks.append(tiers.index(p.tier) if p and not self._nodes[producer].evicted else len(tiers))
        return min(ranks, default=len(tiers))

    # ---------------------------------------------------------------- placement
    def place(self, key: str, link: bool = True) -> Placement:
        """Create the node's directory on the fastest tier with room; link it from the home.

        ``key`` may also name a directory inside a placed node (a MapNode's sub-node): it becomes a
        part of that node, placed on its own, evicted with it. ``link=False`` when the adapter points
        everything that would read the node's directory at its real place: then the shared
        filesystem sees nothing of the node at all.
        """
        with self._lock:
            node = self._nodes.get(key) or self._add_part(key)
            if node.placement is not None and node.state is State.RUNNING:
                return node.placement  # a MapNode placed before its sub-nodes, submitted again
            owner = self._nodes[node.part_of] if node.part_of else None
            producers = self.graph.producers(owner.spec.key if owner else key)
            estimate = self.estimator.estimate(node.spec.kind, sum(self._nodes[p].size for p in producers))
            logical = self.home / key
            if key in self._fresh:
                self._fresh.discard(key)  # known absent: no need to ask the shared filesystem
            elif logical.is_symlink():
                logical.unlink()  # Sea's link, from an earlier placement of the node
            # A directory in the home before the run stays there: the node runs on a tier and its new
            # directory replaces the old one when evicted, or, if it reuses parts of its directory
            # (a MapNode's sub-nodes), in it, as the engine would run it.
            old_dir = key in self._home_dirs
            if (old_dir and node.spec.reuses_dir) or (owner is not None and owner.in_place):
                tier = self.hierarchy.home
                tier.stats.nodes_placed += 1
            else:
                tier = self.hierarchy.choose(estimate, exclude=node.tried)
            self.hierarchy.check(tier)  # never into a directory swapped under Sea
            node.in_place = tier.is_home and (old_dir or (owner is not None and owner.in_place))
            link = (link or owner is not None or tier.is_home) and not old_dir
            if link:
                self._makedirs(logical.parent)
            if owner is not None and tier is owner.placement.tier:
                physical = logical.resolve()  # inside its owner's directory, no link needed
                physical.mkdir(parents=True, exist_ok=True)
            elif tier.is_home and owner is None:
                physical = logical
            else:
                physical = (tier.workdir / key) if not tier.is_home else (self.home / ".sea" / "parts" / key)
                physical.mkdir(parents=True, exist_ok=True)
                if link:
                    try:
                        os.symlink(physical, logical, target_is_directory=True)
                    except OSError:
                        self._check_home()  # its directory gone with the home: say so
                        raise
                    self.report.files_created_home += 1
            node.placement = Placement(key, logical, physical, tier, estimate)
            node.state = State.RUNNING
            node.started = time.monotonic()
            if owner is not None:
                return node.placement
            self._running[key] = node.spec.label or key
            if node.spec.sink_destination is not None and not tier.is_home:
                # The sink sees its destination's own absolute path under a neutral prefix, so its
                # substitutions (applied to the whole path) act as they would at home.
                root = tier.workdir / STAGING_DIR / f"{self.graph.index(key):05d}"
                node.placement.staging_root = root
                node.placement.staging = root / node.spec.sink_destination.relative_to("/")
            self.journal.write("started", key, chain=self.graph.chain(key))
            self.log.debug("[Sea] placed %s on %s (estimate %s)", key, tier.name, format_size(estimate))
            return node.placement

    def _add_part(self, key: str) -> _Node:
        owner_key = self.graph.owner(key)
        if owner_key is None:
            raise KeyError(f"{key!r} is not a node of this workflow nor inside one")
        owner = self._nodes[owner_key]
        if owner.placement is None:
            self.place(owner_key)
        part = _Node(spec=NodeSpec(key, kind=f"{owner.spec.kind}[part]"), consumers_left=set(), part_of=owner_key)
        self._nodes[key] = part
        self.report.subnodes += 1
        owner.parts.append(key)
        return part

    def _separate_parts(self, node: _Node) -> list[_Node]:
        """Parts placed away from their owner's directory (reached through a link in it)."""
        return [
            self._nodes[k]
            for k in node.parts
            if self._nodes[k].placement is not None and not self._nodes[k].placement.physical.is_relative_to(node.placement.physical)
        ]

    def _makedirs(self, path: Path) -> None:
        missing = []
        while path not in self._known_dirs and not path.exists():
            missing.append(path)
            path = path.parent
        if missing:
            self._check_home()  # never a new home in place of one moved away
        for p in reversed(missing):
            p.mkdir(exist_ok=True)
            self._created_dirs.add(p)
        self._known_dirs.update(missing)
        self._known_dirs.add(path)

    def _home_moved(self) -> str | None:
        """``None`` while the home is the directory the run started in; else where it is now (the
        journal, held open, moved with it), or ``""`` if it is gone."""
        try:
            st = os.stat(self.home)
            if (st.st_dev, st.st_ino) == self._home_identity:
                return None
        except OSError:
            pass
        now = self.journal.current_path()
        return str(now.parent.parent) if now is not None else ""

    def _home_moved_message(self, now: str) -> str:
        return (
            f"the work directory {str(self.home)!r} was moved or removed during the run"
            + (f" (it is now {now!r})" if now else "")
            + "; Sea stopped rather than make a new one in its place: move it back, and the same command resumes the run"
        )

    def _check_home(self) -> None:
        """Raise :class:`SeaHomeMoved` if the home is no longer the directory the run started in."""
        now = self._home_moved()
        if now is not None:
            raise SeaHomeMoved(self._home_moved_message(now))

    # ---------------------------------------------------------------- transitions
    def node_skipped(self, key: str) -> None:
        with self._lock:
            node = self._nodes[key]
            node.state, node.evicted = State.SKIPPED, True
            self.report.nodes_cached += 1
            record = self.journal.get(key)
            self.checkpoints.known(key, self.estimator.seconds.get(node.spec.kind, 0.0), kept=record is not None and record.checkpoint is not None)
            self._release_producers(key)
        self._reader_done(key)
        self._progress(key)

    def node_cached(self, key: str) -> None:
        """The engine found the node done in the home by its own hash check."""
        with self._lock:
            node = self._whole_node(key)
            if node is None:
                return
            if node.placement is not None and not node.placement.tier.is_home:
                self._drop_placement(node)
            node.state = State.CACHED
            self.report.nodes_cached += 1
            self.checkpoints.known(key, self.estimator.seconds.get(node.spec.kind, 0.0), kept=True)  # it is in the home
            self._release_producers(key)
        self._reader_done(key)
        self._progress(key)

    def node_finished(self, key: str, reads: Iterable[str] = ()) -> None:
        """``reads``: paths the node's inputs named; those of files outside the home and the tiers
        (the workflow's input data) are fingerprinted in the journal, so that a rerun after one of
        them changed does not reuse what was made from it."""
        with self._lock:
            node = self._whole_node(key)
            if node is None or self._closed:  # closed: stopped while it ran, its directory dropped
                return
            p = node.placement
            if p is None:  # ran outside Sea's placement (e.g. in the engine's main process)
                p = node.placement = Placement(key, self.home / key, self.home / key, self.hierarchy.home, 0)
                node.in_place = key in self._home_dirs
            self.hierarchy.check(p.tier)  # its results are read from there
            node.state = State.FINISHED
            node.finished = time.monotonic()
            size, files = disk_usage(p.physical)
            if p.staging_root is not None:
                size += disk_usage(p.staging_root)[0]
            inside = sum(self._nodes[k].size for k in node.parts) - sum(n.size for n in self._separate_parts(node))
            node.size = size - inside  # parts inside the directory were settled on their own
            self.hierarchy.settle(p.tier, p.reserved, node.size)
            self._sample()
            seconds = node.finished - node.started if node.started else None
            self.estimator.learn(node.spec.kind, size, seconds)
            node.checkpoint = self.checkpoints.decide(
                key,
                seconds or 0.0,
                files,
                size,
                self.graph.producers(key),
                forced=node.in_place or key in self._home_dirs or node.spec.persist_dir or self._is_result(node),
                consumed=bool(node.consumers_left) or node.open_ended,
            )
            self.report.nodes_run += 1
            self.report.without_sea_bytes_home += size + sum(n.size for n in self._separate_parts(node))
            self.report.without_sea_files_home += files
            if p.tier.is_home:
                self.report.files_created_home += files
                self.report.bytes_written_home += size
            fingerprints = {path: list(fingerprint) for path in set(reads) if (fingerprint := self._fingerprint(path)) is not None}
            self.journal.write("done", key, chain=self.graph.chain(key), **({"reads": fingerprints} if fingerprints else {}))
            self._schedule_flushes(node)
            self._release_producers(key)
            self._maybe_evict(key)
        self._reader_done(key)
        self._progress(key)

    def _whole_node(self, key: str) -> _Node | None:
        """The node ``key`` names; ``None`` for a sub-node, which is settled here as a part of its
        owner (or was never placed: the engine found it cached)."""
        node = self._nodes.get(key)
        if node is not None and node.part_of is not None:
            self._part_finished(node)
            return None
        return node

    def _part_finished(self, part: _Node) -> None:
        p = part.placement
        if p is None or part.state is State.FINISHED:
            return
        part.state = State.FINISHED
        part.size, _ = disk_usage(p.physical)
        self.hierarchy.settle(p.tier, p.reserved, part.size)
        self.estimator.learn(part.spec.kind, part.size)

    def retry_elsewhere(self, key: str, error_text: str, link: bool = True) -> Placement | None:
        """A node failed: if it ran out of space on a fast tier, or could not run a program from
        its directory on a tier mounted ``noexec`` (where the engine's own plugin, in the home,
        would have), place it on the next tier and return the new placement so the adapter reruns
        it; otherwise ``None``."""
        with self._lock:
            node = self._nodes.get(key)
            p = node.placement if node else None
            if p is None or p.tier.is_home:
                return None
            if any(t in error_text for t in ENOSPC_TEXT):
                self.log.warning("[Sea] %s ran out of space on %s; rerunning it on the next tier", key, p.tier.name)
                self.report.enospc_retries += 1
                self.estimator.learn(node.spec.kind, 2 * p.reserved)
            elif p.tier.noexec and any(t in error_text for t in EACCES_TEXT):
                self.log.warning("[Sea] %s could not run a program on %s, mounted noexec; rerunning it on the next tier", key, p.tier.name)
                self.report.noexec_retries += 1
            else:
                return None
            node.tried.add(p.tier.name)
            self._drop_placement(node)
            node.state = State.WAITING
            return self.place(key, link=link)

    def node_failed(self, key: str) -> None:
        """The node failed for good (the engine writes its crash file); its directory comes home at close."""
        with self._lock:
            node = self._nodes[key]
            if node.state is State.FAILED:
                return
            node.state = State.FAILED
            self.report.nodes_failed += 1
            self._ended(node)
            p = node.placement
            if p is not None:
                self.hierarchy.check(p.tier)  # it failed because its tier went: say that, not its traceback
                node.size, _ = disk_usage(p.physical)
                self.hierarchy.settle(p.tier, p.reserved, node.size)
        self._reader_done(key)

    # ---------------------------------------------------------------- other machines
    def finished_elsewhere(self, key: str) -> None:
        """``key`` ran on another machine: what it read from here may go once its other readers finished."""
        with self._lock:
            self._release_producers(key)

    def expect_run(self, key: str, consumers: Iterable[str]) -> None:
        """``key`` is about to run on this machine, one of several; ``consumers``: those that will
        still read it (the client knows which finished elsewhere). A directory kept here from an
        earlier run of it (it runs again because a machine holding its data was lost) is dropped."""
        with self._lock:
            node = self._nodes[key]
            p = node.placement
            if p is not None and not node.evicted and not p.tier.is_home:
                if node.state is State.FINISHED:  # a replica, or a run whose consumers were lost
                    self.hierarchy.remove(p.physical)
                    self.hierarchy.release(p.tier, used=node.size)
                else:
                    self._drop_placement(node)
            self._nodes[key] = _Node(spec=node.spec, consumers_left=set(consumers))

    def place_replica(self, key: str, size: int) -> Path:
        """A directory to unpack another machine's copy of node ``key`` into, for consumers here.
        It is never flushed (its own machine does that) and is evicted once its consumers finished."""
        with self._lock:
            node = self._nodes[key]
            if node.placement is not None and not node.evicted:
                raise RuntimeError(f"{key!r} is already on this machine")
            tier = self.hierarchy.choose(size)
            physical = tier.workdir / key if not tier.is_home else self.home / ".sea" / "replicas" / key
            self.hierarchy.remove(physical)
            physical.mkdir(parents=True)
            node.placement = Placement(key, self.home / key, physical, tier, size)
            node.state, node.replica, node.evicted, node.size = State.FINISHED, True, False, size
            self.hierarchy.settle(tier, size, size)
            self._inputs_moved(key)
            self.report.bytes_received += size
            return physical

    def _forget_failed_flushes(self) -> None:
        """The home was moved away under copies going into it: they failed because of the move (their
        destination vanished), so their nodes are dropped as running ones are, and run again once the
        home is moved back; the run ends in SeaHomeMoved, not SeaFlushError."""
        failed = [n for n in self._nodes.values() if n.flush_failed]
        self.log.warning("[Sea] %d copies home failed as the work directory moved (first: %s); their nodes will run again", len(failed), self.report.flush_errors[0])
        self.report.flush_errors.clear()
        for node in failed:
            node.flush_failed = False
            node.state = State.FAILED if node.state is State.FINISHED else node.state
            if node.placement is not None and not node.placement.tier.is_home and not node.part_of:
                for part in self._separate_parts(node):
                    self._drop_placement(part)
                self._drop_placement(node)

    def _drop_placement(self, node: _Node) -> None:
        p = node.placement
        if p.logical.is_symlink():
            p.logical.unlink()
        self.hierarchy.remove(p.physical)
        if p.staging_root is not None:
            self.hierarchy.remove(p.staging_root)
        self.hierarchy.release(p.tier, reserved=p.reserved)
        node.placement = None
        self._inputs_moved(node.spec.key)

    # ---------------------------------------------------------------- prefetch
    def expect_reads(self, key: str, paths: list[str]) -> None:
        """Node ``key`` will read these files: those on the shared filesystem (not in the home, not
        on a tier) are copied to a fast tier ahead of it when prefetch is on."""
        if self.prefetcher is None:
            return
        shared = [Path(p) for p in paths if self._is_shared_input(Path(p))]
        if shared:
            self.prefetcher.expect(key, shared)

    def prefetched(self, key: str) -> dict[str, str]:
        """Node ``key`` starts now: input path -> the path of its complete copy on a fast tier.
        May wait for a copy under way; call it without holding the engine's lock."""
        return self.prefetcher.copies_for(key) if self.prefetcher is not None else {}

    def _fingerprint(self, path: str) -> tuple[int, int] | None:
        """(size, mtime_ns) of a file outside the home and the tiers, else ``None``."""
        if not self._is_shared_input(Path(path)):
            return None
        try:
            st = os.stat(path)
        except OSError:
            return None
        return st.st_size, st.st_mtime_ns

    def _is_shared_input(self, path: Path) -> bool:
        """A file outside the home on none of the tiers' filesystems. By filesystem, not by path:
        a shared filesystem may be mounted below a tier's directory (a local disk tier at /var/tmp,
        the shared filesystem at /var/tmp/mnt)."""
        if not path.is_absolute() or path == self.home or self.home in path.parents:
            return False
        try:
            if not path.is_file():
                return False
            device = path.stat().st_dev
        except OSError:
            return False
        return device not in self._tier_devices

    @functools.cached_property
    def _tier_devices(self) -> set[int]:
        return {t.root.stat().st_dev for t in self.hierarchy.fast_tiers}

    def _reader_done(self, key: str) -> None:
        if self.prefetcher is not None:
            self.prefetcher.reader_done(key)

    def _release_producers(self, key: str) -> None:
        for producer in self.graph.producers(key):
            self._nodes[producer].consumers_left.discard(key)
            self._maybe_evict(producer)

    # ---------------------------------------------------------------- flush
    def _schedule_flushes(self, node: _Node) -> None:
        p = node.placement
        key = node.spec.key
        if node.spec.sink_destination is not None and p.staging_root is None:
            self.journal.write("committed", key, files=[])  # a sink that ran at home wrote its outputs itself
        if p.staging_root is not None:
            files = []
            for src in walk_files(p.staging_root, empty_dirs=True):
                dst = Path("/") / src.relative_to(p.staging_root)
                mode = self._mode(self._rule_path(dst), Mode.MOVE)
                if mode.flushes:
                    files.append((src, dst))
                node.keep |= mode is Mode.KEEP
            self._submit(node, FlushBatch(key, files, self._sink_committed))
        if p.tier.is_home:
            return
        default = Mode.COPY if node.checkpoint else Mode.REMOVE
        files, all_files = [], 0
        copy_dir = p.logical.parent / temporary_name(p.logical.name, "dir")
        for src, rel in self._node_files(node):
            all_files += 1
            mode = self._mode(f"{key}/{rel}", default)
            node.keep |= mode is Mode.KEEP
            if mode.flushes:
                files.append((src, copy_dir / rel))
        if files:
            node.home_copy = copy_dir
            node.home_copy_complete = len(files) == all_files
            # a directory the workflow delivers goes with the declared outputs; one that must go home
            # (checkpoints: all, or it replaces one that was there) after them; auto's choice last
            self._submit(node, FlushBatch(key, files, self._dir_committed), self._priority(node))

    def _is_result(self, node: _Node) -> bool:
        """Nothing consumes the node: its results are what the workflow made (what a user reads
        after the run, where a later run's cache check finds them), so its directory goes home like a
        declared output. Not a sink's: a sink's result is what it delivers."""
        return (
            not self.graph.consumers(node.spec.key)
            and not node.open_ended
            and node.part_of is None
            and node.spec.sink_destination is None
            and not node.spec.persist_dir
        )

    def _priority(self, node: _Node) -> int:
        if node.spec.persist_dir:
            return DECLARED
        if self.checkpoints.mode is Checkpoints.AUTO and not (node.in_place or node.spec.key in self._home_dirs or self._is_result(node)):
            return CHECKPOINT
        return KEPT

    def _node_files(self, node: _Node):
        """(file, path relative to the node directory) for the node and its separate parts."""
        p = node.placement
        separate = self._separate_parts(node)
        links = {p.physical / Path(part.spec.key).relative_to(node.spec.key) for part in separate}
        for src in walk_files(p.physical, empty_dirs=True):
            if src not in links:
                yield src, src.relative_to(p.physical)
        for part in separate:
            prefix = Path(part.spec.key).relative_to(node.spec.key)
            for src in walk_files(part.placement.physical, empty_dirs=True):
                yield src, prefix / src.relative_to(part.placement.physical)

    def _submit(self, node: _Node, batch: FlushBatch, priority: int = DECLARED) -> None:
        if batch.files and batch.files[0][1].is_relative_to(self.home):
            self._check_home()  # the copy would make a new home in place of one moved away
        node.flushes_pending += 1
        self.stager.submit(batch, priority)

    def _settle_batch(self, batch: FlushBatch) -> _Node:
        node = self._nodes[batch.key]
        node.flushes_pending -= 1
        self.report.bytes_flushed += batch.bytes
        self.report.files_flushed += len(batch.committed)
        self.report.bytes_written_home += batch.bytes
        self.report.files_created_home += len(batch.committed)
        self.report.flush_retries += batch.retries
        for nbytes, seconds in batch.timings:
            self.checkpoints.cost.observe(nbytes, seconds)
        if batch.errors:
            node.flush_failed = True
            self.report.flush_errors.extend(batch.errors)
        self._sample()
        return node

    def _sink_committed(self, batch: FlushBatch) -> None:
        with self._lock:
            self._settle_batch(batch)
            self.report.without_sea_files_home += len(batch.committed)  # a sink writes them home either way
            self.report.without_sea_bytes_home += batch.bytes
            if not batch.errors:
                files = [[str(dst), size, mtime] for dst, size, mtime in batch.committed]
                self.journal.write("committed", batch.key, files=files)
            self._maybe_evict(batch.key)
        self._wake()

    def _dir_committed(self, batch: FlushBatch) -> None:
        node = self._nodes[batch.key]
        gone = [dst for dst, _, _ in batch.committed if not os.path.lexists(dst)]
        if gone:  # the copy's directory was removed under it: putting it in place would lose files
            batch.committed = [c for c in batch.committed if c[0] not in gone]
            batch.errors.append(f"{gone[0]}: removed from the home while {node.home_copy} was being committed")
        if self._relocate is not None and not batch.errors and node.home_copy_complete:
            try:
                node.needs = self._needs(node.spec.key, self._relocate(node.home_copy, self._moves(node)))
            except Exception as error:  # the copy would not be right: keep the tier's, report it
                batch.errors.append(f"{node.home_copy}: paths not rewritten for the home ({error})")
        if batch.abandoned and not batch.errors:  # the run ended before the copy was done: no checkpoint
            shutil.rmtree(node.home_copy, ignore_errors=True)
            node.home_copy, node.checkpoint = None, False
            with self._lock:
                self.checkpoints.abandoned(batch.key)
                self.report.checkpoints_abandoned += 1
                self.report.checkpoint_files_dropped += len(batch.committed)  # written home, then removed
        elif batch.errors and node.home_copy is not None:
            # the directory goes home whole or not at all: drop the copy, the tier's is kept
            shutil.rmtree(node.home_copy, ignore_errors=True)
            batch.committed = []  # none of it reached its final path
        elif node.home_copy is not None:
            # at its path at once, while its consumers still read the tier's (a run killed now
            # resumes from it); nothing evicts the node before the batch is settled below
            p = node.placement
            if p.logical.is_symlink():
                p.logical.unlink()  # the link Sea made
            _swap_in(node.home_copy, p.logical)
            node.home_copy = None
            if node.home_copy_complete:
                self._journal_checkpoint(node)
        with self._lock:
            self._settle_batch(batch)
            if node.checkpoint and node.home_recorded and not node.spec.persist_dir:
                self.report.checkpoints += 1
                self.report.checkpoint_bytes += batch.bytes
                self.report.checkpoint_files += len(batch.committed)
            self._maybe_evict(batch.key)
        self._wake()

    def _moves(self, node: _Node) -> dict[Path, Path]:
        """Where node directories ran -> where they are in the home (for :meth:`_relocate`)."""
        moves = {tier.workdir: self.home for tier in self.hierarchy.fast_tiers}
        moves[self.home / ".sea" / "parts"] = self.home
        if node.placement.staging_root is not None:  # a sink's outputs, at their destinations
            moves[node.placement.staging_root] = Path("/")
        return moves

    def _needs(self, key: str, named: Iterable[str]) -> tuple[str, ...]:
        """The other nodes whose directories the paths a node's results name are in."""
        needs = set()
        for path in map(Path, named):
            if path.is_relative_to(self.home):
                owner = self.graph.owner(str(path.relative_to(self.home)))
                if owner is not None and owner != key:
                    needs.add(owner)
        return tuple(sorted(needs))

    # ---------------------------------------------------------------- eviction
    def _maybe_evict(self, key: str) -> None:
        """Evict once every consumer finished and every flush committed; never earlier."""
        node = self._nodes[key]
        if (
            node.evicted
            or node.keep
            or node.state is not State.FINISHED
            or node.consumers_left
            or node.open_ended
            or node.flushes_pending
            or node.flush_failed
        ):
            return
        if node.part_of is not None:
            return  # evicted with its owner
        p = node.placement
        if node.replica:
            self.hierarchy.remove(p.physical)
            self.hierarchy.release(p.tier, used=node.size)
            node.evicted = True
            return
        if p.tier.is_home and node.checkpoint:  # it ran in the home, and stays
            if not node.home_recorded:
                self._record_home_dir(node)
            return
        for part in self._separate_parts(node):
            self.hierarchy.remove(part.placement.physical)
        for part_key in node.parts:
            part = self._nodes[part_key]
            if part.placement is not None:
                self.hierarchy.release(part.placement.tier, used=part.size)
                part.evicted = True
        if p.tier.is_home:
            self._evict_home_dir(node)
        else:
            if p.logical.is_symlink():
                p.logical.unlink()  # the link Sea made
            self.hierarchy.remove(p.physical)
            if p.staging_root is not None:
                self.hierarchy.remove(p.staging_root)
            self.hierarchy.release(p.tier, used=node.size)
        node.evicted = True
        self._sample()
        if not node.home_recorded:
            self.journal.write("evicted", key)

    def _record_home_dir(self, node: _Node) -> None:
        """A node that ran in the home keeps its directory there: once its consumers finished, the
        paths its results give into tiers (its producers') are rewritten for the home, and the
        journal records the directory as a checkpoint."""
        node.home_recorded = True  # tried once
        if self._relocate is not None:
            try:
                node.needs = self._needs(node.spec.key, self._relocate(node.placement.physical, self._moves(node)))
            except Exception as error:  # noqa: BLE001 - then the journal does not vouch for it
                self.log.warning("[Sea] %s stays in the home, but its results could not be rewritten (%s)", node.spec.key, error)
                return
        self._journal_checkpoint(node)

    def _journal_checkpoint(self, node: _Node) -> None:
        record = self.journal.get(node.spec.key)
        if record is None or not record.done:  # a failed node's directory, brought home to inspect
            return
        try:
            mtime_ns = checkpoint_identity(node.placement.logical)
        except OSError:
            return
        node.home_recorded = True
        self.journal.write("checkpointed", node.spec.key, mtime_ns=mtime_ns, needs=list(node.needs))

    def _evict_home_dir(self, node: _Node) -> None:
        """A node that spilled to the home is an intermediate there too: remove it like Nipype's
        ``remove_node_directories`` would, once nothing needs it."""
        self.hierarchy.remove(node.placement.physical)
        self.hierarchy.release(node.placement.tier, used=node.size)

    # ---------------------------------------------------------------- progress and end
    def _live_working_set_peak(self) -> int:
        """The most bytes that ever had to exist at once: a node's files from its start until it and
        every consumer finished. What a perfect placement would hold; the tiers' peak is compared to it."""
        end = time.monotonic()
        intervals = []
        for key, node in self._nodes.items():
            if node.part_of is not None or node.state is not State.FINISHED or not node.started:
                continue
            size = node.size + sum(self._nodes[k].size for k in node.parts)
            consumers = [self._nodes[c] for c in self.graph.consumers(key)]
            last = max([node.finished] + [c.finished if c.state is State.FINISHED else end for c in consumers])
            intervals.append((node.started, last, size))
        return peak_concurrent_bytes(intervals)

    def _sample(self) -> None:
        """One point of the tier-usage timeline (bytes held per fast tier, stager queue)."""
        timeline = self.report.timeline
        timeline.append([round(time.monotonic() - self._start, 3), [t.used for t in self.hierarchy.fast_tiers], self.stager.queue_length])
        if len(timeline) > MAX_SAMPLES:
            del timeline[1:-1:2]  # halve the resolution, keep the first and last points

    def _progress(self, key: str) -> None:
        with self._lock:
            node = self._nodes.get(key)
            if node is not None and node.part_of is None:
                self._ended(node)
            done = self.report.nodes_run + self.report.nodes_cached
        self.log.debug("[Sea] %d/%d nodes done (%s), stager queue %d files", done, self.report.nodes_total, key, self.stager.queue_length)

    def _ended(self, node: _Node) -> None:
        """The node will not run any more in this run (finished, found done, failed)."""
        self._running.pop(node.spec.key, None)
        ran = node.finished - node.started if node.started and node.finished else None
        self._work_left.done(node.spec.kind, ran)

    def progress_snapshot(self) -> Snapshot:
        """The run's figures now, as :mod:`sea.progress` shows them."""
        now = time.monotonic()
        with self._lock:
            elapsed = now - self._start
            done = self.report.nodes_run + self.report.nodes_cached + self.report.nodes_failed
            running = list(self._running.values())
            held = [(t, t.used) for t in self.hierarchy.fast_tiers]
            eta = self._work_left.eta(elapsed)
        tiers = [(str(t.root), used, t.room_in_all()) for t, used in held]  # a statfs each: outside the lock
        backlog_bytes, backlog_files = self.stager.backlog
        rate = self._copy_rate(now, self.stager.committed_bytes)
        if rate and backlog_bytes:  # the run ends when its outputs are home
            eta = max(eta or 0.0, backlog_bytes / rate)
        return Snapshot(elapsed, done, self.report.nodes_total, self._open_ended > 0, running, tiers, backlog_bytes, backlog_files, rate, eta)

    def close(self, success: bool = True, interrupted: bool = False) -> RunReport:
        """Wait for every flush to commit, evict what is left on the tiers, write the report.

        ``interrupted`` (Ctrl-C, SIGTERM): the flushes already submitted still commit (they are a
        rerun's starting point), the directories of nodes that were running are dropped (they run
        again; their journal record says started, not done), and the journal records the stop.

        Raises :class:`SeaFlushError` when a declared output could not be committed; its fast-tier
        copy is kept and its location is in the message.
        """
        if self._closed:
            return self.report
        self._closed = True
        self.report.interrupted = interrupted
        moved = self._home_moved()
        if moved is not None:  # nothing more goes into it but what the run must deliver
            self.log.error("[Sea] %s", self._home_moved_message(moved))
            self.stager.abandon(KEPT)
            self.stager.abandon(CHECKPOINT)
        # what the run must deliver, then what must go home; auto's checkpoints not started yet are
        # abandoned, never waited for (they would only spare a rerun some recomputation)
        self.report.stager_wait_seconds += self.stager.drain(before=CHECKPOINT)
        self.stager.abandon(CHECKPOINT)
        self.report.stager_wait_seconds += self.stager.drain()
        if moved is None:  # moved while the last copies were committed
            moved = self._home_moved()
            if moved is not None:
                self.log.error("[Sea] %s", self._home_moved_message(moved))
        with self._lock:
            if moved is not None and self.report.flush_errors:
                self._forget_failed_flushes()
            for node in self._nodes.values():
                node.consumers_left.clear()  # nothing runs any more
                node.open_ended = False
                if interrupted and node.state is State.RUNNING and node.placement is not None and not node.part_of:
                    for part in self._separate_parts(node):
                        self._drop_placement(part)
                    if not node.placement.tier.is_home:
                        self._drop_placement(node)
                    continue
                if node.state in (State.FAILED, State.RUNNING) and node.placement and not node.placement.tier.is_home and not node.part_of:
                    copy = node.placement.logical.parent / temporary_name(node.placement.logical.name, "dir")
                    files = [(f, copy / rel) for f, rel in self._node_files(node)]
                    if moved is not None:  # no home to bring it to: it runs again
                        for part in self._separate_parts(node):
                            self._drop_placement(part)
                        self._drop_placement(node)
                        continue
                    if not files:  # stopped before it wrote anything: nothing to inspect
                        self._drop_placement(node)
                        continue
                    node.state = State.FINISHED  # bring a crashed node's directory home to inspect
                    node.home_copy, node.home_copy_complete = copy, True
                    self._submit(node, FlushBatch(node.spec.key, files, self._dir_committed))
        self.report.stager_wait_seconds += self.stager.drain()
        if interrupted:
            self.journal.write("interrupted", "", committed=self.report.files_flushed)
            self.log.warning("[Sea] interrupted: %d files committed home before stopping; nodes that were running will run again", self.report.files_flushed)
        with self._lock:
            for key in self._nodes:
                self._maybe_evict(key)
            # a sink's outputs wait in its staging area (which mirrors absolute paths); any other node's, in its directory
            failed = [n.placement for n in self._nodes.values() if n.flush_failed and n.placement and not n.placement.tier.is_home]
            kept = {p.staging_root: Path("/") for p in failed if p.staging_root is not None}
            kept |= {p.physical: p.logical for p in failed if p.staging_root is None}
            by_rule = [n.placement.physical for n in self._nodes.values() if n.keep and n.placement and not n.placement.tier.is_home]
        self.stager.close()
        if self.prefetcher is not None:
            self.prefetcher.close()
            stats = self.prefetcher.stats
            self.report.prefetch_files, self.report.prefetch_bytes = stats.files, stats.bytes
            self.report.prefetch_hits, self.report.prefetch_misses = stats.hits, stats.misses
        self._prune_created_dirs()
        self.report.success = success and not self.report.flush_errors and moved is None
        self.report.makespan_seconds = time.monotonic() - self._start
        self.report.live_peak_bytes = self._live_working_set_peak()
        self.report.tiers = [
            TierReport(t.name, str(t.root), t.stats.peak_bytes, t.stats.bytes_written, t.stats.nodes_placed, t.stats.spills, t.stats.bytes_evicted)
            for t in self.hierarchy.all
        ]
        self.report.bytes_evicted = sum(t.stats.bytes_evicted for t in self.hierarchy.fast_tiers)
        self.report.files_created_home += 4  # the journal, the history, the report and this run's copy of it
        self.report.checkpoint_mode = self.checkpoints.mode.value
        self.report.checkpoint_seconds = self.checkpoints.saved_seconds
        worst, self.report.rerun_worst_seconds = self.checkpoints.worst_rerun()
        self.report.rerun_worst_node = worst or ""
        if moved:  # Sea's own files go where the home is now, for the rerun once it is moved back
            self._rebase_home(Path(moved))
        self.journal.close(compact=moved != "")
        if self.checkpoints.cost.measured:
            self.estimator.copy_home = self.checkpoints.cost.to_dict()
        self.report.kept_dirs = [str(d) for d in self.hierarchy.close(kept, by_rule, reason="their flush home failed" if kept else "")]
        if moved != "":
            self.estimator.save(self._history)
            if self.machine is None:
                self.report.save(self._report_path, Path(moved) if moved else self.home)
            else:
                self.report.to_json(self._report_path)  # a part of the run's: the client saves the run's
        self._release_lock()
        self.progress.stop()
        announce(self.report, self.log)
        if moved is not None and not self.report.flush_errors:
            raise SeaHomeMoved(self._home_moved_message(moved))
        if self.report.flush_errors:
            where = [str(p.staging or p.physical) for p in failed]
            raise SeaFlushError(
                f"{len(self.report.flush_errors)} output(s) could not be committed home, first: "
                f"{self.report.flush_errors[0]}; the fast-tier copies are kept in {', '.join(where)}"
                + (f"; once the home is fixed, `sea recover {' '.join(self.report.kept_dirs)}` brings them home" if self.report.kept_dirs else "")
            )
        return self.report

    def _rebase_home(self, now: Path) -> None:
        """Point Sea's files in the home (journal, history, report, lock) at where it is ``now``."""
        def rebased(path: Path) -> Path:
            return now / path.relative_to(self.home) if path.is_relative_to(self.home) else path

        self.journal.path = rebased(self.journal.path)
        self._history, self._report_path = rebased(self._history), rebased(self._report_path)
        if self._run_lock is not None:
            self._run_lock.path = rebased(self._run_lock.path)

    def abort(self) -> None:
        """Undo a start that failed before any node ran (e.g. a rule the graph cannot match)."""
        if self._closed:
            return
        self._closed = True
        self.progress.stop()
        self.stager.close()
        if self.prefetcher is not None:
            self.prefetcher.close()
        self.journal.close()
        self.hierarchy.close()
        self._release_lock()

    def _release_lock(self) -> None:
        if self._run_lock is not None:
            self._run_lock.release()
            self._run_lock = None

    def _copy_cost_prior(self) -> CopyCost:
        """What copying home cost in the last run here, else what ``sea probe`` measured of the home
        (or a directory above it), else :mod:`sea.checkpoint`'s defaults."""
        if self.estimator.copy_home:
            return CopyCost.from_dict(self.estimator.copy_home)
        for directory in [self.home, *self.home.parents]:
            bandwidth = remembered(directory)
            if bandwidth is not None:
                return CopyCost(per_byte=1 / max(bandwidth.write, 1.0))
        return CopyCost()

    def _prune_created_dirs(self) -> None:
        for path in sorted(self._created_dirs, key=lambda p: len(p.parts), reverse=True):
            try:
                path.rmdir()
            except OSError:
                pass


def _swap_in(copy: Path, logical: Path) -> None:
    """Put a node directory's complete copy at its path in the home, in place of the directory an
    earlier run left there (which the engine would have emptied to run the node again there)."""
    old = None
    if os.path.lexists(logical):
        old = logical.parent / temporary_name(logical.name, "old")
        shutil.rmtree(old, ignore_errors=True)
        os.rename(logical, old)
    os.rename(copy, logical)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def disk_usage(path: Path) -> tuple[int, int]:
    """(bytes, files) under ``path``, not following links."""
    total = files = 0
    for f in walk_files(path):
        try:
            total += f.lstat().st_size
            files += 1
        except FileNotFoundError:
            pass
    return total, files


def _literal_prefix(rule: Rule) -> str:
    if rule.pattern.startswith("re:"):
        match = re.match(r"[^.^$*+?{}\[\]\\|()]*", rule.pattern[3:].removeprefix("^"))
    else:
        match = re.match(r"[^*?\[]*", rule.pattern)
    return match.group(0) if match else ""
