"""What one run's duties share: each node's state, the home and its tiers, the journal, the report.

:class:`SeaEngine` (the seam) owns a :class:`Run` and hands it to the collaborators that do the
work, each in its own module: :mod:`sea.placement` (where a node's directory goes),
:mod:`sea.ordering` (which ready node starts first), :mod:`sea.flushing` (what goes home, and
when its copy is in place), :mod:`sea.eviction` (when a directory leaves its tier) and
:mod:`sea.resume` (what a rerun finds). They change the run's state only under ``Run.lock``.
"""

from __future__ import annotations

import enum
import functools
import logging
import os
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .checkpoint import CheckpointPolicy
from .config import SeaConfig
from .console import SeaError
from .estimate import SizeEstimator
from .graph import NodeSpec, WorkflowGraph
from .homespace import HomeSpace
from .journal import Journal
from .pack import pack_path
from .records import Records
from .report import RunReport, peak_concurrent_bytes
from .stager import Stager, walk_files
from .tiers import StorageHierarchy, Tier

MAX_SAMPLES = 4000  # points kept in the report's tier-usage timeline


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
class NodeState:
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
    lost: int = 0  # times its worker process died under it (SeaEngine.worker_lost)
    started: float = 0.0
    finished: float = 0.0
    open_ended: bool = False  # more consumers may still be added (see SeaEngine.add_nodes)
    checkpoint: bool = False  # its directory goes home (sea.checkpoint), or stays there if it ran there
    in_place: bool = False  # it runs in its directory in the home, which was there before the run
    home_recorded: bool = False  # the journal says its directory is in the home (a checkpoint)
    needs: tuple[str, ...] = ()  # other nodes whose directories its results name
    links: tuple[str, ...] = ()  # where the symbolic links in its directory its results name point (Run.link_targets)
    replica: bool = False  # a copy of a directory made on another machine, for consumers here
    unpacked: bool = False  # ... or unpacked from its checkpoint's pack, linked from the home (SeaEngine.restore)
    part_of: str | None = None  # a sub-directory placed on its own (a MapNode's sub-node)
    parts: list[str] = field(default_factory=list)


@dataclass(eq=False)
class Run:
    """One run of one workflow, as its duties see it. ``relocate`` and ``wake`` are the adapter's
    (see :class:`SeaEngine`)."""

    config: SeaConfig
    home: Path
    log: logging.Logger
    hierarchy: StorageHierarchy
    estimator: SizeEstimator
    checkpoints: CheckpointPolicy
    stager: Stager
    journal: Journal
    report: RunReport
    relocate: Callable[[Path, dict[Path, Path]], Iterable[str]] | None = None
    wake: Callable[[], None] = lambda: None
    records: Records | None = None  # the nodes' result records, kept as their directories go (sea.records)
    homespace: HomeSpace | None = None  # what the home can still take (sea.homespace)
    graph: WorkflowGraph = field(default_factory=WorkflowGraph)
    nodes: dict[str, NodeState] = field(default_factory=dict)
    skip: set[str] = field(default_factory=set)  # nodes the resume plan found done
    fresh: set[str] = field(default_factory=set)  # nodes with nothing in the home: their path needs no clearing
    home_dirs: set[str] = field(default_factory=set)  # nodes with a directory in the home before the run: never removed
    created_dirs: set[Path] = field(default_factory=set)
    known_dirs: set[Path] = field(default_factory=set)  # directories of the home known to exist
    running: dict[str, str] = field(default_factory=dict)  # key -> name, of nodes running now
    start: float = field(default_factory=time.monotonic)
    ram_peak: int = 0  # the most RAM tiers held at once (sampled as nodes finish)

    def __post_init__(self) -> None:
        st = os.stat(self.home)
        self._home_identity = (st.st_dev, st.st_ino)  # see home_moved

    @property
    def lock(self):
        return self.hierarchy.lock

    def made_under(self) -> list[str]:
        """The directories node directories are made under (a tier's, the home's parts), which
        their result files name: rewritten for the home when one is put there."""
        return [str(t.workdir) for t in self.hierarchy.fast_tiers] + [str(self.home / ".sea" / "parts")]

    def pack_path(self, key: str) -> Path:
        """Where node ``key``'s checkpoint is packed in the home (:mod:`sea.pack`)."""
        return pack_path(self.home, key)

    def forget_pack(self, key: str) -> None:
        """Node ``key`` runs again: the pack an earlier run left of it is no longer its directory."""
        record = self.journal.get(key)
        if record is not None and record.pack is not None:
            self.journal.write("dropped", key)
            self.pack_path(key).unlink(missing_ok=True)
            self.checkpoints.forget(key)

    def separate_parts(self, node: NodeState) -> list[NodeState]:
        """Parts placed away from their owner's directory (reached through a link in it)."""
        return [
            self.nodes[k]
            for k in node.parts
            if self.nodes[k].placement is not None and not self.nodes[k].placement.physical.is_relative_to(node.placement.physical)
        ]

    def relative_path(self, path: str | Path) -> str | None:
        """``path`` relative to the home or to the tier holding it (a key, or a path in a node's
        directory), or ``None`` when it is in neither."""
        path = Path(path)
        for root in [self.home] + [t.workdir for t in self.hierarchy.fast_tiers]:
            if path.is_relative_to(root):
                return str(path.relative_to(root))
        return None

    def link_targets(self, placement: Placement, links: Iterable[Path], named: set[str]) -> tuple[str, ...]:
        """Where the symbolic ``links`` in a node's directory (``placement``'s) that its outputs
        name (``named``: the paths they name, and every directory above them) point: a relative one
        from its place in the home (where its node sees it, and where it comes), and on through
        links in other nodes' directories (a chain of links, a node's each). A link into another
        node's directory that an output names is a file of it, as if the output named it (a task
        returning ``ln -s ../make/a.dat``): that directory stays while the link's readers run, and
        goes home with it. A link no output names (an input Nipype links in, ``copyfile=False``)
        is read by no consumer."""
        targets = []
        for link in links:
            where = placement.logical / link.relative_to(placement.physical)
            if str(where) not in named and str(link) not in named:
                continue
            for _hop in range(MAX_LINK_HOPS):
                try:
                    target = os.path.normpath(os.path.join(where.parent, os.readlink(link)))
                except OSError:
                    break
                targets.append(target)
                owner = self.nodes.get(self.owner_of(target) or "")
                relative = self.relative_path(target)
                if owner is None or owner.placement is None or relative is None or owner.evicted:
                    break
                inside = Path(relative).relative_to(owner.spec.key)
                link, where = owner.placement.physical / inside, owner.placement.logical / inside
                if not link.is_symlink():
                    break
        return tuple(targets)

    def home_form(self, path: str) -> str | None:
        """An absolute ``path`` on a tier as the home names it (a link a node made at its tier path,
        without a view: :mod:`sea.view`); ``None`` for any other path."""
        if not os.path.isabs(path):
            return None
        for root in [t.workdir for t in self.hierarchy.fast_tiers] + [self.home / ".sea" / "parts"]:
            if Path(path).is_relative_to(root):
                return str(self.home / Path(path).relative_to(root))
        return None

    def owner_of(self, path: str | Path) -> str | None:
        """The node whose directory holds ``path`` (in the home, or on a tier), if any."""
        relative = self.relative_path(path)
        return self.graph.owner(relative) if relative is not None else None

    def is_shared_input(self, path: Path) -> bool:
        """A file outside the home on none of the tiers' filesystems (the workflow's input data).
        By filesystem, not by path: a shared filesystem may be mounted below a tier's directory (a
        local disk tier at /var/tmp, the shared filesystem at /var/tmp/mnt)."""
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

    def fingerprint(self, path: str) -> tuple[int, int] | None:
        """(size, mtime_ns) of an input data file (see :meth:`is_shared_input`), else ``None``."""
        if not self.is_shared_input(Path(path)):
            return None
        try:
            st = os.stat(path)
        except OSError:
            return None
        return st.st_size, st.st_mtime_ns

    def live_working_set_peak(self) -> int:
        """The most bytes that ever had to exist at once: a node's files from its start until it and
        every consumer finished. What a perfect placement would hold; the tiers' peak is compared to it."""
        end = time.monotonic()
        intervals = []
        for key, node in self.nodes.items():
            if node.part_of is not None or node.state is not State.FINISHED or not node.started:
                continue
            size = node.size + sum(self.nodes[k].size for k in node.parts)
            consumers = [self.nodes[c] for c in self.graph.consumers(key)]
            last = max([node.finished] + [c.finished if c.state is State.FINISHED else end for c in consumers])
            intervals.append((node.started, last, size))
        return peak_concurrent_bytes(intervals)

    def sample(self) -> None:
        """One point of the tier-usage timeline (bytes held per fast tier, stager queue)."""
        timeline = self.report.timeline
        timeline.append([round(time.monotonic() - self.start, 3), [t.used for t in self.hierarchy.fast_tiers], self.stager.queue_length])
        if self.hierarchy.memory is not None:
            ram_used, ram_reserved = self.hierarchy.ram_bytes()
            self.ram_peak = max(self.ram_peak, ram_used)
            self.hierarchy.memory.committed(ram_used, ram_reserved)  # a sample of what the job is charged
        if len(timeline) > MAX_SAMPLES:
            del timeline[1:-1:2]  # halve the resolution, keep the first and last points

    def estimate(self, key: str) -> int:
        """The bytes node ``key``'s directory is expected to take (a MapNode's sub-node: from its
        MapNode's producers), from what the nodes it reads measured."""
        node = self.nodes.get(key)
        if node is None:  # a MapNode's sub-node not placed yet
            owner = self.graph.owner(key)
            kind = part_kind(self.nodes[owner].spec.kind)
        else:
            owner, kind = node.part_of, node.spec.kind
        producers = self.graph.producers(owner or key)
        return self.estimator.estimate(kind, sum(self.nodes[p].size for p in producers))

    # ---------------------------------------------------------------- memory (sea.memory)
    def node_memory(self, key: str) -> int:
        """The memory node ``key`` declares, or the most a node of its kind was measured to hold
        (in this run or an earlier one), whichever is larger; a MapNode's sub-node, its MapNode's."""
        node = self.nodes.get(key)
        if node is None or node.part_of is not None:
            node = self.nodes.get(self.graph.owner(key))
            if node is None:
                return 0
        return max(node.spec.memory, self.estimator.memory.get(node.spec.kind, 0))

    def reserve_memory(self, key: str) -> None:
        if self.hierarchy.memory is not None:
            self.hierarchy.memory.reserve(key, self.node_memory(key))

    def release_memory(self, key: str) -> None:
        if self.hierarchy.memory is not None:
            self.hierarchy.memory.release(key)

    # ---------------------------------------------------------------- the home
    def makedirs(self, path: Path) -> None:
        missing = []
        while path not in self.known_dirs and not path.exists():
            missing.append(path)
            path = path.parent
        if missing:
            self.check_home()  # never a new home in place of one moved away
        for p in reversed(missing):
            p.mkdir(exist_ok=True)
            self.created_dirs.add(p)
        self.known_dirs.update(missing)
        self.known_dirs.add(path)

    def home_moved(self) -> str | None:
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

    def home_moved_message(self, now: str) -> str:
        return (
            f"the work directory {str(self.home)!r} was moved or removed during the run"
            + (f" (it is now {now!r})" if now else "")
            + "; Sea stopped rather than make a new one in its place: move it back, and the same command resumes the run"
        )

    def check_home(self) -> None:
        """Raise :class:`SeaHomeMoved` if the home is no longer the directory the run started in."""
        now = self.home_moved()
        if now is not None:
            raise SeaHomeMoved(self.home_moved_message(now))

    def prune_created_dirs(self) -> None:
        for path in sorted(self.created_dirs, key=lambda p: len(p.parts), reverse=True):
            try:
                path.rmdir()
            except OSError:
                pass


def part_kind(kind: str) -> str:
    """The kind a MapNode's sub-nodes are estimated as, from their MapNode's."""
    return f"{kind}[part]"


MAX_LINK_HOPS = 8  # links followed from one a node's outputs name, through other nodes' directories


def disk_usage(path: Path, links: list[Path] | None = None) -> tuple[int, int]:
    """(bytes, files) under ``path``, not following links; the symbolic links found are added to ``links``."""
    total = files = 0
    for f in walk_files(path):
        try:
            st = f.lstat()
        except FileNotFoundError:
            continue
        total += st.st_size
        files += 1
        if links is not None and stat.S_ISLNK(st.st_mode):
            links.append(f)
    return total, files
