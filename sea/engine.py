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

The engine is a façade over one run's duties, each a module a newcomer finds by name:
:mod:`sea.placement` (where a directory goes), :mod:`sea.ordering` (which ready node starts first),
:mod:`sea.flushing` (what goes home, and when its copy is in place, through :mod:`sea.stager`),
:mod:`sea.eviction` (when a directory leaves its tier), :mod:`sea.resume` (what a rerun finds) and
:mod:`sea.report`; what they share is a :class:`sea.run_state.Run`.

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

import contextlib
import functools
import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from .backpressure import BackPressure
from .checkpoint import Budget, CheckpointPolicy, CopyCost, Deliverables
from .config import SeaConfig, SeaConfigError, headroom_bytes
from .console import SeaError
from .estimate import SizeEstimator
from .eviction import Evictor
from .flushing import Flusher
from .graph import NodeSpec, WorkflowGraph
from .homespace import HomeSpace
from .journal import Journal
from .lock import RunLock
from .memory import MemoryBudget, job_memory_limit
from .ordering import ReadyQueue, input_tier_rank, order_ready, rank
from .pack import unpack
from .placement import Placer
from .prefetch import Prefetcher
from .private import SeaTierSwapped
from .probe import remembered
from .progress import Progress, Rate, Snapshot, WorkLeft
from .puts import PutRecords
from .records import Records
from .report import MemoryReport, RunReport, TierReport, announce
from .resume import RerunPlan, admit, plan_rerun, sweep_orphan_packs, sweep_partial_copies
from .run_state import NodeState, Placement, Run, SeaFlushError, SeaHomeMoved, State, disk_usage
from .sizes import format_size
from .stager import CHECKPOINT, KEPT, Stager
from .tiers import StorageHierarchy, Tier
from .view import VIEWS_DIR, View

__all__ = ["JOURNAL", "HISTORY", "Placement", "SeaEngine", "SeaFlushError", "SeaHomeMoved", "State", "sweep_partial_copies"]

SEA_FILES_BYTES = 64 * 2**10  # Sea's history and report (and its copy) in the home, about
MAX_LOST = 2  # times a node may lose its worker process (sea.engine.SeaEngine.worker_lost) before it fails
HISTORY = Path(".sea") / "history.json"  # sizes and run times learned, for the next run and `sea plan`
JOURNAL = Path(".sea") / "journal.jsonl"  # what Sea did with each node, for a rerun (sea.journal)


def check_sea_files(home: Path) -> None:
    """Sea's own place in the home (``.sea/``: its journal, history, lock) is a directory of this
    user's, and its journal a file: else one line saying what is in the way (before anything is
    written there)."""
    for path, kind in ((home / ".sea", "a directory"), (home / JOURNAL, "a file")):
        is_kind = path.is_dir() if kind == "a directory" else path.is_file()
        if os.path.lexists(path) and (os.path.islink(path) or not is_kind):
            raise SeaError(
                f"{path} is not {kind}: Sea keeps its journal, history and lock in {home / '.sea'}; "
                "move what is there away (or give the workflow another base_dir)"
            )
    owner = os.lstat(home / ".sea").st_uid if (home / ".sea").is_dir() else os.geteuid()
    if owner != os.geteuid():  # in a base_dir others can write, someone else may have made it first
        raise SeaError(
            f"{home / '.sea'} belongs to another user (uid {owner}): Sea would trust a journal and records they can change; "
            "remove it if it is not yours to keep (or give the workflow another base_dir)"
        )


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
        memory: int | None = None,
        slots: int | None = None,
        records: Callable[[Path], Iterable[Path]] | None = None,
        engine_files: Iterable[Path] = (),
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
        client's is the run's); else ``config.progress`` decides how (:mod:`sea.progress`).

        ``memory``: the bytes of memory the engine was told the run may use (MultiProc's
        ``memory_gb``, when set); a memory cgroup's limit comes first (:mod:`sea.memory`).

        ``slots``: how many nodes this machine runs at once, when the adapter knows (a Dask
        worker's threads): prefetch makes as many copies at once (else two).

        ``records(directory)``: the files of a node directory in which the engine records the
        node (Nipype's ``result_<name>.pklz``): kept in one file in the home as the directory
        leaves its tier (:mod:`sea.records`), for what reads them after the run.

        ``engine_files``: files the engine itself keeps in the home beside the node directories
        (Nipype's workflow report): with Sea's own, they count against the checkpoints' budget."""
        self.config = config
        self.log = log or logging.getLogger("sea")
        self.home = Path(home).resolve()
        self.home.mkdir(parents=True, exist_ok=True)
        check_sea_files(self.home)
        # one run per home: an engine of several (one per machine) is covered by its run's client
        self._run_lock = RunLock.acquire(self.home) if machine is None else None
        self.hierarchy = None
        try:  # a start that fails leaves neither the lock nor a directory on a tier
            self.hierarchy = StorageHierarchy.build(config, self.home)
            if any(t.ram for t in self.hierarchy.fast_tiers):
                limit = job_memory_limit(memory)
                self.hierarchy.memory = MemoryBudget(limit, headroom_bytes(config.memory_headroom, limit.bytes))
            self.machine = machine
            self._history = self.home / (HISTORY if machine is None else HISTORY.with_name(f"history-{machine}.json"))
            self._report_path = self.home / (self.config.report if machine is None else Path(".sea") / f"report-{machine}.json")
            if self._report_path.is_dir() or not self._report_path.parent.is_dir() and self._report_path.parent.exists():
                raise SeaConfigError(f"report: {self.config.report!r} names a directory in the home {self.home} (a workflow's?); give a file name such as 'sea-report.json'")
            self.estimator = SizeEstimator.load(self._history, config.default_node_size)
            self.run = Run(
                config,
                self.home,
                self.log,
                self.hierarchy,
                self.estimator,
                CheckpointPolicy(config.checkpoint_mode, self._copy_cost_prior(), config.checkpoint_factor, Budget(config.checkpoint_budget)),
                Stager(config.stager_threads, guard=lambda: self.run.check_home()),  # no copy makes a new home
                Journal(self.home / (JOURNAL if machine is None else JOURNAL.with_name(f"journal-{machine}.jsonl"))),
                RunReport(started_at=time.time()),
                relocate,
                on_event or (lambda: None),
                records=Records(self.home, records) if records is not None and machine is None else None,
            )
            self.run.homespace = HomeSpace.read(self.home)
            self.deliverables = Deliverables(self._delivery_estimate)
            policy = self.run.checkpoints
            policy.expected_delivered = self._expected_delivered
            policy.total_seconds = lambda: self._work_left.busy + (self._work_left.seconds() or 0.0)
            policy.home_room = self._home_room
            beside = sum(os.stat(f).st_size for f in engine_files if os.path.isfile(f)) + SEA_FILES_BYTES
            policy.overhead = lambda: beside + self.journal.bytes + (self.run.records.bytes if self.run.records is not None else 0)
            self.placer = Placer(self.run, self._inputs_moved)
            self.evictor = Evictor(self.run)
            self.backpressure = BackPressure(self.run)
            self.flusher = Flusher(self.run, self.evictor, self.placer)
            self.rerun_plan = RerunPlan()
            self._lock = self.run.lock
            self.prefetcher = (
                Prefetcher(config.prefetch, self.hierarchy, self.order, self.run.wake, threads=slots or 2, headroom=self._largest_node)
                if config.prefetch.enabled
                else None
            )
            self._closed = False
            self.concurrency_cap: int | None = None  # set once a worker process was lost: see worker_lost
            self._over_memory: set[str] = set()  # kinds measured above the memory they declare (logged once)
            self._work_left = WorkLeft(self.estimator.seconds)
            self._open_ended = 0  # nodes that may still get consumers: the graph is still growing
            self._copy_rate = Rate()
            self._queues: list[ReadyQueue] = []  # adapters' ready jobs, in self.rank's order
            self.progress = Progress(self.progress_snapshot, config.progress if machine is None else "off", self.log)
        except BaseException:
            if self.hierarchy is not None:
                self.hierarchy.close()
            self._release_lock()
            raise
        self.log.info("[Sea] tiers: %s", self.hierarchy.describe())

    # what the adapters and the report read of the run
    @property
    def graph(self) -> WorkflowGraph:
        return self.run.graph

    @property
    def report(self) -> RunReport:
        return self.run.report

    @property
    def stager(self) -> Stager:
        return self.run.stager

    @property
    def journal(self) -> Journal:
        return self.run.journal

    @property
    def checkpoints(self) -> CheckpointPolicy:
        return self.run.checkpoints

    # ---------------------------------------------------------------- graph
    def update_graph(self, graph: WorkflowGraph, keys_like: tuple[str, ...] = (), plan_resume: bool = True) -> None:
        """Take the workflow graph: check the rules against it, plan what a rerun can skip.
        ``keys_like``: examples of the keys nodes added during the run will have (an engine that
        creates its nodes as it goes, like Pydra), so the rules can be checked against them too.
        ``plan_resume=False``: the engine's own cache check decides what reruns (one engine of
        several, each knowing only the nodes that ran on its machine)."""
        self.flusher.check_rules(graph, keys_like)
        if self.machine is None:  # an engine of several leaves it to the run's client: the others may be flushing
            sweep_partial_copies(graph, self.home, self.log)
            sweep_orphan_packs(self.journal, self.home, self.log)
        with self._lock:
            self.run.graph = graph
            self.rerun_plan = plan_rerun(graph, self.journal, self.home) if plan_resume else RerunPlan()
            self.run.skip = self.rerun_plan.skip
            self._admit(list(graph.nodes))
            self.report.nodes_total = len(graph)
            self.report.rerun_plan = self.rerun_plan.counts() if plan_resume else {}
        if self.run.skip or self.run.home_dirs:
            self.log.info("[Sea] rerun of %d nodes: %s", len(graph), self.rerun_plan.summary())
        self.progress.start()  # once the total is known

    def add_nodes(self, specs: list[NodeSpec], open_ended: bool = False) -> None:
        """Nodes the engine created after the run started (Pydra makes a job once its inputs are
        known). Their producers must be in the graph and not evicted yet. ``open_ended``: more
        consumers of these nodes may still be added, so they are not evicted until :meth:`seal`.
        Resume plans are made by :meth:`update_graph` only; added nodes rely on the engine's cache."""
        with self._lock:
            nodes = self.run.nodes
            for spec in specs:
                for producer, _label in spec.upstream:
                    node = nodes.get(producer)
                    if node is not None and node.evicted:
                        raise RuntimeError(f"{spec.key!r} reads {producer!r}, which was evicted already; add consumers before sealing their producers")
            self.graph.add(specs)
            keys = [spec.key for spec in specs]
            self._admit(keys, open_ended)
            self._open_ended += len(keys) if open_ended else 0
            for key in keys:
                nodes[key].open_ended = open_ended
                for producer in self.graph.producers(key):
                    nodes[producer].consumers_left.add(key)
                    self.evictor.consumer_added(producer, key)
            self.report.nodes_total = len(self.graph)

    def seal(self, keys: list[str]) -> None:
        """No more consumers of ``keys`` will be added: they may be evicted once those known finished."""
        with self._lock:
            for key in keys:
                node = self.run.nodes[key]
                self._open_ended -= node.open_ended
                node.open_ended = False
                self.evictor.sealed(key)
                self.evictor.maybe_evict(key)

    def _admit(self, keys: list[str], open_ended: bool = False) -> None:
        admit(self.run, keys)  # what the home holds of them (sea.resume)
        for key in keys:
            spec = self.graph.nodes[key]
            self._work_left.add(spec.kind)
            if self._delivers(spec, open_ended):
                self.deliverables.add(spec.kind)
            record = self.journal.get(key)
            if key in self.run.skip and record is not None and record.pack is not None:
                pinned = key in self.rerun_plan.restore  # a node that runs reads it: it stays until unpacked
                self.checkpoints.known_pack(key, record.pack[1], self.estimator.seconds.get(spec.kind, 0.0), pinned)  # the budget holds it

    def _delivery_estimate(self, kind: str) -> int:
        """What a node of ``kind`` will deliver: what the last one delivered, else at least the default
        node size (not the first of its interface's: one sink's small mask says nothing of the next
        sink's image, and too small a budget early drops checkpoints for good)."""
        learned = self.estimator.learned.get(kind)
        return learned if learned is not None else max(self.estimator.estimate(kind), self.estimator.default)

    def _home_room(self) -> int | None:
        """What the home can still take (its free space, the quota) beyond the copies the run needs that are on their way."""
        room = self.run.homespace.room()
        return None if room is None else room - self.stager.needed_backlog

    def _expected_delivered(self) -> int:
        """What the run is expected to deliver home, for the checkpoints' budget: what it delivered,
        and the estimates of what its nodes still to run deliver; while the graph still grows (Pydra
        makes its jobs as it goes), at least what the last run delivered, else one default node's size."""
        expected = self.deliverables.expected()
        if self._open_ended:
            expected = max(expected, self.estimator.delivered or (0 if self.deliverables.known else self.estimator.default))
        return expected

    def _delivers(self, spec: NodeSpec, open_ended: bool = False) -> bool:
        """What the node makes goes home in any case: declared outputs, a directory that persists,
        or one nothing reads (the workflow's result)."""
        return spec.sink_destination is not None or spec.persist_dir or (not open_ended and not self.graph.consumers(spec.key))

    # ---------------------------------------------------------------- what a node is now
    def is_fresh(self, key: str) -> bool:
        """Nothing of this node exists in the home: it must run, and no cache check can say otherwise."""
        return key in self.run.fresh

    def is_skipped(self, key: str) -> bool:
        return key in self.run.skip

    def is_settled(self, key: str) -> bool:
        """The node's directory will not move before the run ends: evicted (its copy home, if it
        persists, in place), in the home already, kept by a rule, or kept on its tier because a
        flush failed (the run will then end in SeaFlushError)."""
        node = self.run.nodes[key]
        if node.evicted or node.state is State.FAILED:
            return True
        p = node.placement
        return node.state is State.FINISHED and not node.flushes_pending and (node.keep or node.flush_failed or p is None or p.tier.is_home)

    def is_quiet(self, key: str) -> bool:
        """Nothing of the node will move into its path in the home any more: it is not running, and
        no copy of its directory is on its way there (a node's copies home are decided when it
        finishes; a checkpoint's pack goes elsewhere, and may wait for the run's end)."""
        node = self.run.nodes[key]
        return node.state is not State.RUNNING and not (node.flushes_pending and node.home_copy is not None)

    def holds(self, key: str) -> bool:
        """This machine has the node's directory (its own run, or a replica), not evicted."""
        node = self.run.nodes.get(key)
        return node is not None and node.placement is not None and not node.evicted and node.state is State.FINISHED

    def sent_home_with(self, key: str) -> tuple[str, ...]:
        """The nodes whose directories go home whole with ``key``'s, which names files in them (see
        :meth:`node_finished`): an adapter reading ``key``'s outputs in the home waits for them too."""
        node = self.run.nodes.get(key)
        return node.needs if node is not None and node.spec.persist_dir else ()

    @property
    def killed_run(self) -> dict | None:
        """The previous run of this home, if it was killed (its lock was taken over): its ``host``,
        ``pid`` and ``started`` (when), by which an adapter can tell the files its engine's own
        locking left then."""
        return self._run_lock.killed_run if self._run_lock is not None else None

    @property
    def closed(self) -> bool:
        return self._closed

    def held_bytes(self, key: str) -> int:
        """The measured size of a finished node's directory."""
        return self.run.nodes[key].size

    def physical_dir(self, key: str) -> Path | None:
        """Where a placed, not yet evicted node's directory really is (to read its results without
        going through its link in the home)."""
        node = self.run.nodes.get(key)
        if node is None or node.placement is None or node.evicted:
            return None
        return node.placement.physical

    def key_for(self, directory: Path) -> str:
        """The key of a node directory given by its logical path or by its path on a tier (the
        engine may resolve links: a MapNode's sub-nodes report their real directory)."""
        key = self.run.relative_path(directory)
        if key is None:
            raise ValueError(f"{directory} is neither in the home {self.home} nor on a tier")
        return key

    # ---------------------------------------------------------------- order (sea.ordering)
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

    def _input_rank(self, key: str) -> int:
        return input_tier_rank(self.run, key)

    def _inputs_moved(self, key: str) -> None:
        if key not in self.graph:  # a MapNode's sub-node: its consumers are its MapNode's, which waits for it
            return
        consumers = self.graph.consumers(key)
        for queue in self._queues:
            queue.rerank(consumers)

    # ---------------------------------------------------------------- placement (sea.placement)
    def place(self, key: str, link: bool = True) -> Placement:
        """Create the node's directory on the fastest tier with room; link it from the home.

        ``key`` may also name a directory inside a placed node (a MapNode's sub-node): it becomes a
        part of that node, placed on its own, evicted with it. ``link=False`` when the adapter points
        everything that would read the node's directory at its real place: then the shared
        filesystem sees nothing of the node at all.
        """
        with self._lock:
            return self.placer.place(key, link)

    def may_start(self, key: str, running: int) -> bool:
        """Whether ready node ``key`` may start now, beside ``running`` nodes; if not, the adapter
        holds it until a node ends or a copy home commits (``on_event``). With a RAM tier, its
        declared memory must fit in the job's memory beside what running nodes reserve and RAM
        tiers hold (:mod:`sea.memory`; its directory goes to a RAM tier only if that fits too; with
        nothing running, it starts). And the link home must keep up: a node that would add
        declared bytes waits while the stager's backlog would not drain before they arrive
        (:mod:`sea.backpressure`; the backlog drains whatever runs). With prefetch, a node whose
        input is being copied to a tier waits for the copy (the adapter's loop, not blocked in
        :meth:`prefetched`, starts what else is ready meanwhile; the copy's end wakes it)."""
        budget = self.hierarchy.memory
        if self.prefetcher is not None and self.prefetcher.pending(key):
            return False
        with self._lock:
            if running and budget is not None and not budget.fits(self.run.node_memory(key), *self.hierarchy.ram_bytes()):
                budget.held.add(key)
                return False
            if self.backpressure.holds(key, running):
                return False
            # its memory counts from now, not from its placement: an adapter may let another node
            # start before it places this one (Pydra's worker places a job in its own coroutine)
            self.run.reserve_memory(key)
            return True

    def may_go_ahead(self, key: str) -> bool:
        """Whether ready node ``key`` may be placed now to wait for a process in the adapter's pool
        (Pydra's worker keeps a few jobs queued there, as ``cf`` queues them all, so that no process
        waits for the engine's loop): only where a fast tier has room for it beside what is placed,
        so that no node spills for one that only waits. One whose input files prefetch may copy
        goes ahead only once they are copied: prefetch copies the inputs of the next jobs in the
        order processes are handed out, and a job placed ahead of that order would read the shared
        filesystem instead."""
        if self.prefetcher is not None and not self.prefetcher.copied(key):
            return False
        with self._lock:
            return self.hierarchy.has_room(self.run.estimate(key))

    def retry_elsewhere(self, key: str, error_text: str, link: bool = True) -> Placement | None:
        """A node failed: if it ran out of space on a fast tier, or could not run a program from
        its directory on a tier mounted ``noexec`` (where the engine's own plugin, in the home,
        would have), or could not replace, rename or remove an input file it read from a prefetched
        copy (bound over the original in its view: a mount point, where the engine's own plugin
        would have), or could not rename a directory beside such a file (an overlay's lower layer in
        its view: EXDEV), place it on the next tier and return the new placement so the adapter
        reruns it, on the original input files; otherwise ``None``."""
        handed = self.prefetcher.handed(key) if self.prefetcher is not None else []
        on_a_copy = any(path in error_text for path in handed)  # the error names a file it read from a copy
        beside_a_copy = any(os.path.join(os.path.dirname(path), "") in error_text for path in handed)
        with self._lock:
            placement = self.placer.retry_elsewhere(key, error_text, link, on_a_copy, beside_a_copy)
        if placement is not None and handed:
            self.prefetcher.reads_originals(key)  # what the first attempt did to its copies is not its work
        return placement

    def worker_lost(self, key: str, running: int) -> bool:
        """The process running ``key`` died under it, one of ``running`` nodes: the OOM killer takes
        a process when the job passes its memory. Its directory goes; the adapter queues the node
        again (placed anew when it starts), and from now on fewer nodes run at once
        (:attr:`concurrency_cap`: one fewer than ran then). False once it was lost
        :data:`MAX_LOST` times: it fails, as it would under the engine's own plugin."""
        with self._lock:
            node = self.run.nodes.get(key)
            if node is None or node.placement is None or node.lost >= MAX_LOST:
                return False
            node.lost += 1
            self.concurrency_cap = max(1, min(self.concurrency_cap or running, running - 1))
            self.report.lost_worker_retries += 1
            self.log.warning("[Sea] %s lost its worker process (killed by the OOM killer?); rerunning it, %d node(s) at a time from now on", key, self.concurrency_cap)
            self.placer.drop(node)
            node.state = State.WAITING
            return True

    # ---------------------------------------------------------------- transitions
    def node_skipped(self, key: str) -> None:
        """Sea's resume plan found the node done (:meth:`is_skipped`): it does not run. A node that
        runs reads it from its checkpoint, unpacked now (:meth:`restore`)."""
        restored = key in self.rerun_plan.restore and self.restore(key, required=True)
        with self._lock:
            node = self.run.nodes[key]
            if not restored:
                node.state, node.evicted = State.SKIPPED, True
            self._found_done(node, kept=restored or self._in_home(key))
        self._reader_done(key)
        self._progress(key)

    def node_cached(self, key: str) -> None:
        """The engine found the node done in the home by its own hash check (in its directory
        there, or in the one :meth:`restore` unpacked)."""
        with self._lock:
            node = self._whole_node(key)
            if node is None:
                return
            if node.unpacked:  # its consumers read it where it was unpacked, until they finished
                self._found_done(node, kept=True)
            else:
                if node.placement is not None and not node.placement.tier.is_home:
                    self.placer.drop(node)
                node.state = State.CACHED
                self._found_done(node, kept=True)  # it is in the home
        self._reader_done(key)
        self._progress(key)

    def _found_done(self, node: NodeState, kept: bool) -> None:
        key = node.spec.key
        self.report.nodes_cached += 1
        if self._delivers(node.spec, node.open_ended):  # an earlier run delivered it: what its record says, else what was learned
            record = self.journal.get(key)
            delivered = sum(size for size, _ in record.committed.values()) if record is not None and record.committed else None
            self.deliverables.done(node.spec.kind, delivered if delivered is not None else self.estimator.learned.get(node.spec.kind, 0))
            self.checkpoints.delivered = self.deliverables.delivered
        self.checkpoints.known(key, self.estimator.seconds.get(node.spec.kind, 0.0), kept=kept)
        self.evictor.release_producers(key)
        self.evictor.maybe_evict(key)

    def _in_home(self, key: str) -> bool:
        record = self.journal.get(key)
        return record is not None and (record.checkpoint is not None or record.pack is not None)

    def restore(self, key: str, required: bool = False) -> bool:
        """Unpack the checkpoint an earlier run packed of node ``key`` (:mod:`sea.pack`) to a tier,
        linked from its path in the home, where the engine's own cache finds it and the nodes that
        run read it; it goes once they finished (the pack stays). False when there is none, or it
        is not as Sea left it. A pack that cannot be read is dropped (a rerun recomputes the node);
        ``required`` (the resume plan counted on it): that ends the run, in one line."""
        with self._lock:
            node, record = self.run.nodes.get(key), self.journal.get(key)
            if node is None or record is None or record.pack is None or node.placement is not None:
                return False
            pack = self.run.pack_path(key)
            try:
                st = os.lstat(pack)
                same = (pack.name, st.st_size, st.st_mtime_ns) == record.pack
            except OSError:
                same = False
            if not same:
                if required:  # the plan found it when the run started: someone removed or replaced it since
                    self.run.forget_pack(key)
                    raise SeaError(f"the checkpoint of {key} ({pack}) was removed or replaced during the run; run the same command again, and the node is recomputed")
                return False
            placement = self.placer.place_unpacked(key, st.st_size)
        try:
            made_under = unpack(pack, placement.physical)
            if self.run.relocate is not None:
                self.run.relocate(placement.physical, {Path(d): self.home for d in made_under})
        except Exception as error:  # noqa: BLE001 - a damaged pack: the node is recomputed
            with self._lock:
                self.placer.drop(node)
                node.state, node.replica, node.unpacked = State.WAITING, False, False
                self.run.forget_pack(key)
            message = f"the checkpoint of {key} ({pack}) could not be unpacked ({error}); it is dropped"
            if required:
                raise SeaError(message + ": run the same command again, and the node is recomputed") from None
            self.log.warning("[Sea] %s: the node runs again", message)
            return False
        with self._lock:
            self.placer.link_unpacked(node)  # complete, its paths rewritten: the engine's cache may see it
            size, _ = disk_usage(placement.physical)
            self.hierarchy.resize(placement.tier, node.size, size)  # it was placed at the pack's size
            node.size = size
            self.run.fresh.discard(key)
            self.report.checkpoints_restored += 1
            self.checkpoints.unpin(key)
        self.log.debug("[Sea] unpacked the checkpoint of %s to %s", key, placement.tier.name)
        return True

    def node_finished(
        self,
        key: str,
        reads: Iterable[str] = (),
        gives: Iterable[str] = (),
        memory: int | None = None,
        started: float | None = None,
        ended: float | None = None,
    ) -> None:
        """``reads``: paths the node's inputs named; those of files outside the home and the tiers
        (the workflow's input data) are fingerprinted in the journal, so that a rerun after one of
        them changed does not reuse what was made from it. ``gives``: paths its outputs name; those
        in other nodes' directories (inputs it passes on) stay until its consumers finished.
        ``memory``: the most memory the node held, measured in its process (:class:`sea.memory.JobPeak`):
        nodes of its kind reserve at least that from now on, in later runs too. ``started``: when it
        began to run (``time.monotonic()``), where that is later than its placement (a job placed to
        wait in a pool's queue): its run time, which nodes of its kind are expected to take, counts from then.
        ``ended``: when it ended there, where that is earlier than now (its result waited for the
        engine's loop, busy with other jobs): its run time ends then. A run time that counted that
        wait made a trivial task of a big fan-out seem worth a checkpoint."""
        with self._lock:
            if memory:
                self._measured(key, memory)
            node = self._whole_node(key)
            if node is None or self._closed:  # closed: stopped while it ran, its directory dropped
                return
            p = node.placement
            if p is None:  # ran outside Sea's placement (e.g. in the engine's main process)
                p = node.placement = Placement(key, self.home / key, self.home / key, self.hierarchy.home, 0)
                node.in_place = key in self.run.home_dirs
            self.hierarchy.check(p.tier)  # its results are read from there
            node.state = State.FINISHED
            node.finished = time.monotonic()
            if started is not None and node.started and node.started < started <= node.finished:
                node.started = started
            links: list[Path] = []
            size, files = disk_usage(p.physical, links)
            staged = staged_files = 0
            if p.staging_root is not None:
                staged, staged_files = disk_usage(p.staging_root)
                size += staged
            separate = self.run.separate_parts(node)
            inside = sum(self.run.nodes[k].size for k in node.parts) - sum(n.size for n in separate)
            node.size = size - inside  # parts inside the directory were settled on their own
            self.hierarchy.settle(p.tier, p.reserved, node.size)
            self.run.sample()
            ran_until = ended if ended is not None and node.started and node.started <= ended <= node.finished else node.finished
            seconds = ran_until - node.started if node.started else None
            self.estimator.learn(node.spec.kind, size, seconds, files + staged_files)
            self.backpressure.node_ran(seconds, size)
            if self._delivers(node.spec, node.open_ended):  # a sink delivers its outputs, the rest its directory
                self.deliverables.done(node.spec.kind, staged if p.staging_root is not None else size)
                self.checkpoints.delivered = self.deliverables.delivered
            node.checkpoint = self.checkpoints.decide(
                key,
                seconds or 0.0,
                files,
                size,
                self.graph.producers(key),
                forced=node.in_place or key in self.run.home_dirs or node.spec.persist_dir or node.spec.keep_dir or self.flusher.is_result(node),
                consumed=bool(node.consumers_left) or node.open_ended,
            )
            self.report.nodes_run += 1
            self.report.without_sea_bytes_home += size + sum(n.size for n in separate)
            self.report.without_sea_files_home += files
            if p.tier.is_home:
                self.report.files_created_home += files
                self.report.bytes_written_home += size
            fingerprints = {path: list(fingerprint) for path in set(reads) if (fingerprint := self.run.fingerprint(path)) is not None}
            self.journal.write("done", key, chain=self.graph.chain(key), **({"reads": fingerprints} if fingerprints else {}))
            gives = list(gives)
            node.links = self._links_named(node, links, gives)
            gives += node.links  # a link into another node's directory names a file of it too
            self.placer.link_named(node, node.links)
            self.flusher.schedule(node, gives)
            node.needs = tuple(sorted({o for o in map(self.run.owner_of, gives) if o is not None and o != key}))  # a pack of it needs them too
            if node.spec.persist_dir or self.flusher.is_result(node):  # what goes home whole names files in their directories: they go home whole too
                for lender in map(self.run.nodes.get, node.needs):
                    if lender is not None and not lender.spec.persist_dir and not lender.evicted and lender.state is State.FINISHED and not lender.placement.tier.is_home:
                        self.flusher.send_home_whole(lender)
            self.evictor.hand_on(key, gives)
            self.evictor.release_producers(key)
            self.evictor.maybe_evict(key)
        self._reader_done(key)
        self._progress(key)

    def _links_named(self, node: NodeState, links: list[Path], gives: list[str]) -> tuple[str, ...]:
        """Where the symbolic links in ``node``'s directory (``links``) and in its parts placed apart
        that its outputs (``gives``) name point (:meth:`Run.link_targets`)."""
        places = [(node.placement, links)]
        for part in self.run.separate_parts(node):
            found: list[Path] = []
            disk_usage(part.placement.physical, found)
            places.append((part.placement, found))
        if not any(found for _, found in places):
            return ()
        named = {str(path) for given in gives for path in (Path(given), *Path(given).parents)}
        return tuple(target for placement, found in places for target in self.run.link_targets(placement, found, named))

    def _measured(self, key: str, memory: int) -> None:
        node = self.run.nodes.get(key)
        owner = node if node is not None and node.part_of is None else self.run.nodes.get(self.run.graph.owner(key) or "")
        if owner is None or not self.estimator.learn_memory(owner.spec.kind, memory):
            return
        declared = owner.spec.memory
        if self.hierarchy.memory is not None and 0 < declared < memory and owner.spec.kind not in self._over_memory:
            self._over_memory.add(owner.spec.kind)
            self.log.warning(
                "[Sea] %s held %s of memory, more than the %s it declares: nodes of its kind reserve that from now on "
                "(Nipype: set its mem_gb to %.2f)", owner.spec.kind, format_size(memory), format_size(declared), memory / 2**30,
            )  # fmt: skip

    def _whole_node(self, key: str) -> NodeState | None:
        """The node ``key`` names; ``None`` for a sub-node, which is settled here as a part of its
        owner (or was never placed: the engine found it cached)."""
        node = self.run.nodes.get(key)
        if node is not None and node.part_of is not None:
            self._part_finished(node)
            return None
        return node

    def _part_finished(self, part: NodeState) -> None:
        p = part.placement
        if p is None or part.state is State.FINISHED:
            return
        part.state = State.FINISHED
        part.size, _ = disk_usage(p.physical)
        self.hierarchy.settle(p.tier, p.reserved, part.size)
        self.estimator.learn(part.spec.kind, part.size)
        self.run.release_memory(part.spec.key)

    def node_failed(self, key: str) -> None:
        """The node failed for good (the engine writes its crash file); its directory comes home at close."""
        with self._lock:
            node = self.run.nodes[key]
            if node.state is State.FAILED:
                return
            node.state = State.FAILED
            self.report.nodes_failed += 1
            self.report.failed_nodes.append(node.spec.label or key)
            self._ended(node)
            for producer in self.graph.producers(key):  # what its crash file names, to rerun it by hand
                self.flusher.bring_home(self.run.nodes[producer])
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
            self.evictor.release_producers(key)

    def expect_run(self, key: str, consumers: Iterable[str]) -> None:
        """``key`` is about to run on this machine, one of several; ``consumers``: those that will
        still read it (the client knows which finished elsewhere). A directory kept here from an
        earlier run of it (it runs again because a machine holding its data was lost) is dropped."""
        with self._lock:
            self.placer.expect_run(key, consumers)

    def place_replica(self, key: str, size: int) -> Path:
        """A directory to unpack another machine's copy of node ``key`` into, for consumers here.
        It is never flushed (its own machine does that) and is evicted once its consumers finished."""
        with self._lock:
            return self.placer.place_replica(key, size)

    # ---------------------------------------------------------------- views (sea.view)
    def view(self, key: str, copies: dict[str, str] | None = None, whole_home: bool = False) -> View | None:
        """How node ``key``, placed, sees the home when it runs in a worker process: at its path
        there, its producers at theirs, the prefetched ``copies`` (original -> copy) at their
        originals' (``None``: it runs at its real path; ``logical_paths: false``, or no fast tier).
        ``whole_home``: the engine writes beside the node's directory too (Pydra's lock files)."""
        with self._lock:
            node = self.run.nodes.get(key)
            tiers = self.hierarchy.fast_tiers
            if not self.config.logical_paths or self.report.paths_recorded or node is None or node.placement is None or not tiers:
                return None
            if self.machine is not None:  # one machine of a Dask run: its worker processes are threaded
                return None
            impossible = self._unmapped_group or self._home_named_in_other_bytes
            if impossible:
                self.view_refused(impossible)
                return None
            p = node.placement
            roots = tuple(t.workdir for t in tiers) + tuple(self.home / ".sea" / name for name in ("parts", "unpacked", "replicas"))
            scratch = (tiers[0] if p.tier.is_home else p.tier).workdir / VIEWS_DIR
            return View(self.home, p.logical, p.physical, roots, scratch, tuple((copies or {}).items()), whole_home, self.run._home_identity,
                        self._mounted_inside_home, self._puts)  # fmt: skip

    @functools.cached_property
    def _puts(self) -> PutRecords | None:
        """The record of the files the views put back beside node directories (:mod:`sea.puts`):
        the user's runs' on this node, else this run's own. Made as the first view is."""
        own = self.hierarchy.fast_tiers[0].workdir / VIEWS_DIR / "replays"
        with contextlib.suppress(OSError):
            own.parent.mkdir(parents=True, exist_ok=True)
        return PutRecords.shared(fallback=own)

    @functools.cached_property
    def _mounted_inside_home(self) -> tuple[str, ...]:
        """Filesystems mounted inside the work directory (a reference dataset bound there), which a
        node's view must bind again over its overlay (an overlay does not show what is mounted below
        its layers); the tiers aside. Looked at once."""
        from .durable import mount_table

        home, tiers = str(self.home), [str(t.root) for t in self.hierarchy.fast_tiers]
        try:
            inside = sorted({m.mountpoint for m in mount_table() if m.mountpoint.startswith(home + "/")})
        except OSError:
            return ()
        return tuple(m for m in inside if not any(m == t or m.startswith(t + "/") or t.startswith(m + "/") for t in tiers))

    @functools.cached_property
    def _unmapped_group(self) -> str:
        """Why a view would fail nodes, if it would (looked at once): a user without privileges sees
        it through a user namespace that maps their own group only (:func:`sea.view.enter`), and a
        work directory of another of their groups (a lab's setgid directory) holds files the view
        cannot change (``EOVERFLOW`` when a node appends to a file beside its directory)."""
        try:
            group = os.stat(self.home).st_gid
        except OSError:
            return ""
        if os.geteuid() == 0 or group == os.getegid():
            return ""
        return (f"the work directory {self.home} belongs to group {group}, not to your own group {os.getegid()}, and a "
                "private mount namespace of a user without privileges maps only their own group")

    @functools.cached_property
    def _home_named_in_other_bytes(self) -> str:
        """Why a view would fail nodes, if it would: a work directory whose name is not UTF-8 text
        makes the mount table of a process with a view unreadable to programs that list it as text
        (``mount``; Pydra's, as a task copies a file), where the engine's own plugin mounts nothing."""
        try:
            str(self.home).encode("utf-8")
        except UnicodeEncodeError:
            return f"the work directory {str(self.home)!r} has a name that is not UTF-8 text, which a view's mounts would put in the mount table"
        return ""

    def view_refused(self, reason: str) -> None:
        """A worker process could not show a node its view (:func:`sea.view.enter`): nodes run at
        their tier paths from now on; said once, and in the report."""
        with self._lock:
            if self.report.paths_recorded:
                return
            self.report.paths_recorded = reason
        self.log.warning("[Sea] nodes run at their tier paths, which programs that record their command line will name: %s", reason)

    # ---------------------------------------------------------------- prefetch (sea.prefetch)
    @property
    def prefetching(self) -> bool:
        """Prefetch may still copy (on, or ``auto`` not decided yet): the adapters skip the work of
        telling it what nodes read, and of asking for copies, once it is not."""
        return self.prefetcher is not None and self.prefetcher.active

    def expect_reads(self, key: str, paths: list[str], position: int | None = None) -> None:
        """Node ``key`` will read these files: those on the shared filesystem (not in the home, not
        on a tier) are copied to a fast tier ahead of it when prefetch is on. ``position``: its
        place in the order nodes start on this machine, when the adapter knows it (a Dask
        worker's queue); else the engine's order decides which readers come next."""
        if not self.prefetching:
            return
        shared = [Path(p) for p in self.shared_inputs(paths)]
        if shared:
            self.prefetcher.expect(key, shared, position)

    def shared_inputs(self, paths: Iterable[str]) -> list[str]:
        """Those of ``paths`` that are input data: files on the shared filesystem, not in the home
        and on none of this machine's tiers."""
        return [p for p in paths if self.run.is_shared_input(Path(p))]

    def prefetched(self, key: str) -> dict[str, str]:
        """Node ``key`` starts now: input path -> the path of its complete copy on a fast tier.
        May wait for a copy under way; call it without holding the engine's lock."""
        return self.prefetcher.copies_for(key) if self.prefetcher is not None else {}

    def _largest_node(self) -> int:
        """The largest node directory this workflow makes, as learned (else the default size): the
        room prefetch's copies leave on a tier for the next node."""
        return max(self.estimator.learned.values(), default=self.estimator.default)

    def _reader_done(self, key: str) -> None:
        if self.prefetcher is not None:
            self.prefetcher.reader_done(key)

    # ---------------------------------------------------------------- progress (sea.progress)
    def _progress(self, key: str) -> None:
        with self._lock:
            node = self.run.nodes.get(key)
            if node is not None and node.part_of is None:
                self._ended(node)
            done = self.report.nodes_run + self.report.nodes_cached
        self.log.debug("[Sea] %d/%d nodes done (%s), stager queue %d files", done, self.report.nodes_total, key, self.stager.queue_length)

    def _ended(self, node: NodeState) -> None:
        """The node will not run any more in this run (finished, found done, failed)."""
        self.run.running.pop(node.spec.key, None)
        self.run.release_memory(node.spec.key)
        ran = node.finished - node.started if node.started and node.finished else None
        self._work_left.done(node.spec.kind, ran, node.started or None)

    def progress_snapshot(self) -> Snapshot:
        """The run's figures now, as :mod:`sea.progress` shows them."""
        now = time.monotonic()
        with self._lock:
            elapsed = now - self.run.start
            done = self.report.nodes_run + self.report.nodes_cached + self.report.nodes_failed
            running = list(self.run.running.values())
            held = [(t, t.used) for t in self.hierarchy.fast_tiers]
            eta = self._work_left.eta(now)
        tiers = [(str(t.root), used, t.room_in_all()) for t, used in held]  # a statfs each: outside the lock
        backlog_bytes, backlog_files = self.stager.backlog
        rate = self._copy_rate(now, self.stager.committed_bytes)
        if rate and backlog_bytes:  # the run ends when its outputs are home
            eta = max(eta or 0.0, backlog_bytes / rate)
        return Snapshot(elapsed, done, self.report.nodes_total, self._open_ended > 0, running, tiers, backlog_bytes, backlog_files, rate, eta)

    # ---------------------------------------------------------------- the end
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
        run, report = self.run, self.report
        report.interrupted = interrupted
        moved = run.home_moved()
        if moved is not None:  # nothing more goes into it but what the run must deliver
            self.log.error("[Sea] %s", run.home_moved_message(moved))
            self.stager.abandon(KEPT)
            self.stager.abandon(CHECKPOINT)
        # what the run must deliver, then what must go home; auto's checkpoints not started yet are
        # abandoned, never waited for (they would only spare a rerun some recomputation)
        report.stager_wait_seconds += self.stager.drain(before=CHECKPOINT)
        self.stager.abandon(CHECKPOINT)
        report.stager_wait_seconds += self.stager.drain()
        if moved is None:  # moved while the last copies were committed
            moved = run.home_moved()
            if moved is not None:
                self.log.error("[Sea] %s", run.home_moved_message(moved))
        with self._lock:
            if moved is not None and report.flush_errors:
                self.flusher.forget_failed()
            self.flusher.settle_unfinished(interrupted, moved)
        report.stager_wait_seconds += self.stager.drain()
        if moved is None:
            with self._lock:  # the packs fit the budget of what the run delivered (or, stopped early, expected to)
                self.checkpoints.unpin()
                for key in self.checkpoints.trim(final=success and not interrupted):
                    self.flusher.drop_pack(key)
        if interrupted:
            self.journal.write("interrupted", "", committed=report.files_flushed)
            self.log.warning("[Sea] interrupted: %d files committed home before stopping; nodes that were running will run again", report.files_flushed)
        with self._lock:
            self.evictor.evict_all()
            if moved is None and self.machine is None:  # (on a Dask worker, another node of the run may still write there)
                self.flusher.strays_home()
            if self.__dict__.get("_puts") is not None:  # what the views noted of the files they put back (sea.puts)
                self._puts.close()
            for tier in self.hierarchy.fast_tiers[:1]:
                if tier.private is not None and not tier.private.closed:
                    self.hierarchy.remove(tier.workdir / VIEWS_DIR / "replays")
            nodes = run.nodes.values()
            # a sink's outputs wait in its staging area (which mirrors absolute paths); any other node's, in its directory
            failed = [n.placement for n in nodes if n.flush_failed and n.placement and not n.placement.tier.is_home]
            kept = {p.staging_root: Path("/") for p in failed if p.staging_root is not None}
            kept |= {p.physical: p.logical for p in failed if p.staging_root is None}
            by_rule = [n.placement.physical for n in nodes if n.keep and n.placement and not n.placement.tier.is_home]
            lost = self._lost_tier({p.tier for p in failed})  # the copies failed because their tier went
        self.stager.close()
        if run.records is not None and moved is None:
            run.records.close(keys=set(self.graph.nodes))
        if self.prefetcher is not None:
            self.prefetcher.close()
            stats = self.prefetcher.stats
            report.prefetch_files, report.prefetch_bytes = stats.files, stats.bytes
            report.prefetch_hits, report.prefetch_misses = stats.hits, stats.misses
            report.prefetch_slowdown, report.prefetch_stopped = stats.slowdown, stats.stopped
        run.prune_created_dirs()
        self._end_figures(success and not report.flush_errors and moved is None)
        if moved:  # Sea's own files go where the home is now, for the rerun once it is moved back
            self._rebase_home(Path(moved))
        self.journal.close(compact=moved != "")
        if self.checkpoints.cost.measured:
            self.estimator.copy_home = self.checkpoints.cost.to_dict()
        if success and not interrupted:
            self.estimator.delivered = self.deliverables.delivered
        report.kept_dirs = [str(d) for d in self.hierarchy.close(kept, by_rule, reason="their flush home failed" if kept else "")]
        if moved != "":
            try:
                self.estimator.save(self._history)
                if self.machine is None:
                    report.save(self._report_path, Path(moved) if moved else self.home)
                else:
                    report.to_json(self._report_path)  # a part of the run's: the client saves the run's
            except OSError as exc:  # the home refuses writes (full, read-only, failing): the report is still said
                self.log.warning("[Sea] the run's history and report could not be written in the home (%s)", exc.strerror or exc)
        self._release_lock()
        self.progress.stop()
        announce(report, self.log)
        if moved is not None and not report.flush_errors:
            raise SeaHomeMoved(run.home_moved_message(moved))
        if lost is not None:
            raise lost  # say that, as a node failing for it does: the copies' errors are in the report
        if report.flush_errors:
            where = [str(p.staging or p.physical) for p in failed]
            raise SeaFlushError(
                f"{len(report.flush_errors)} output(s) could not be committed home, first: "
                f"{report.flush_errors[0]}; the fast-tier copies are kept in {', '.join(where)}"
                + (f"; once the home is fixed, `sea recover {' '.join(report.kept_dirs)}` brings them home" if report.kept_dirs else "")
            )
        return report

    def _lost_tier(self, tiers: Iterable[Tier]) -> SeaTierSwapped | None:
        """Why one of ``tiers`` is no longer Sea's (emptied, unmounted, swapped), else ``None``."""
        for tier in tiers:
            try:
                self.hierarchy.check(tier)
            except SeaTierSwapped as exc:
                return exc
        return None

    def _end_figures(self, success: bool) -> None:
        """The report's figures of the whole run (:mod:`sea.report`)."""
        report = self.report
        report.success = success
        report.makespan_seconds = time.monotonic() - self.run.start
        report.live_peak_bytes = self.run.live_working_set_peak()
        report.tiers = [
            TierReport(t.name, str(t.root), t.stats.peak_bytes, t.stats.bytes_written, t.stats.nodes_placed, t.stats.spills, t.stats.bytes_evicted)
            for t in self.hierarchy.all
        ]
        report.bytes_evicted = sum(t.stats.bytes_evicted for t in self.hierarchy.fast_tiers)
        report.files_created_home += 4  # the journal, the history, the report and this run's copy of it
        report.checkpoint_mode = self.checkpoints.mode.value
        policy = self.checkpoints
        report.checkpoint_budget = policy.budget.spec or ""
        report.checkpoint_budget_bytes = policy.budget.bytes(policy.delivered) if policy.budget.spec is not None else 0
        report.checkpoint_held_bytes, report.checkpoint_packs = policy.held_bytes(), len(policy.held_keys())
        report.checkpoints_over_budget, report.checkpoint_stop_reason = policy.over_budget, policy.stopped
        report.delivered_bytes = policy.delivered
        report.checkpoint_seconds = self.checkpoints.saved_seconds
        worst, report.rerun_worst_seconds = self.checkpoints.worst_rerun()
        report.rerun_worst_node = worst or ""
        report.nodes_held_for_link = len(self.backpressure.held)
        budget = self.hierarchy.memory
        if budget is not None:
            report.memory = MemoryReport(
                budget.limit.bytes, budget.limit.source, budget.headroom, budget.peak_charged, budget.peak_committed,
                self.run.ram_peak, len(budget.held), budget.spills, budget.oom_kills(), len(self._over_memory),
            )

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
