"""Which nodes a rerun may skip, and why the others run.

Nipype and Pydra decide "cached" by re-hashing a node's inputs, which needs its input files; Sea
evicts intermediates, so that check cannot work for a node whose producer was evicted. The journal
records each finished node's chain hash (its own inputs and code, chained with everything
upstream) and the size and time of the input data files it read (the files a grabber named, which
no hash upstream covers). A node is *reusable* when the journal says it finished with the same chain
hash, its committed outputs are still at home, the data it read has not changed, and each of its
producers is reusable. It is *in the home* when its whole directory is there as Sea put it (a
checkpoint: same directory, and every directory its results name in the home too).

A reusable node is skipped when it is in the home (a consumer that runs reads it there) or when every
consumer is skipped (nobody needs its data) and it is no result of the workflow (a node nothing
reads, whose directory the user reads in the home); otherwise it runs again, and the plan says why. A node
the journal does not know that has a directory in the home (another plugin's, an older run's) is
left to the engine's own cache check, as under MultiProc or cf (:func:`admit`). A killed run's
partial copies are removed first (:func:`sweep_partial_copies`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .graph import WorkflowGraph
from .journal import Journal, NodeRecord
from .pack import PACKS, SUFFIX, pack_path
from .run_state import NodeState, Run
from .stager import sweep_temporaries

REUSED = "reused"  # Sea's journal: done with the same inputs, skipped
CHANGED = "changed"  # never finished, or its inputs or code changed since
EVICTED = "evicted"  # done, but its directory was evicted and a node that runs needs it
CACHE_CHECK = "cache check"  # a directory in the home Sea did not record: the engine's own check decides


@dataclass
class RerunPlan:
    """What a rerun will do with each node: ``skip`` (Sea's journal found it done) and, for every
    node, one of :data:`REUSED`, :data:`CHANGED`, :data:`EVICTED`, :data:`CACHE_CHECK`, with the
    consumer that needs an evicted node."""

    skip: set[str] = field(default_factory=set)
    restore: set[str] = field(default_factory=set)  # skipped, packed, and read by a node that runs: unpacked to a tier first
    status: dict[str, str] = field(default_factory=dict)
    needed_by: dict[str, str] = field(default_factory=dict)  # evicted key -> a consumer that runs

    def counts(self) -> dict[str, int]:
        out = {s: 0 for s in (REUSED, CHANGED, EVICTED, CACHE_CHECK)}
        for status in self.status.values():
            out[status] += 1
        return out

    def summary(self) -> str:
        c = self.counts()
        return (
            f"{c[REUSED]} reused from the journal, {c[CHANGED]} new or changed, {c[EVICTED]} evicted and needed "
            f"by a node that runs, {c[CACHE_CHECK]} left to the engine's cache check (directories Sea did not record)"
        )

    def why(self, key: str) -> str:
        status = self.status.get(key, CHANGED)
        if status == EVICTED and self.needed_by[key] == key:
            return "what the workflow made, not in the home"
        if status == EVICTED:
            return f"evicted, needed by {self.needed_by[key]}"
        if status == CACHE_CHECK:
            return "its directory is in the home: the engine's own cache check decides"
        return status


def plan_rerun(graph: WorkflowGraph, journal: Journal | Mapping[str, NodeRecord], home: Path) -> RerunPlan:
    """The plan for ``graph`` rerun in ``home`` given its ``journal`` (or the records read from it)."""
    plan = RerunPlan()
    order = graph.topological()
    reusable: dict[str, bool] = {}
    in_home: dict[str, bool] = {}
    for key in order:  # producers first: a node made from a changed one changed too
        reusable[key] = all(reusable[p] for p in graph.producers(key)) and _reusable(journal.get(key), graph, key)
        # a checkpoint needs the directories its results name in the home too
        in_home[key] = reusable[key] and (_checkpoint_in_home(journal.get(key), home / key, in_home, home) or _packed(journal.get(key), home, key, in_home))
    for key in reversed(order):
        runs = [c for c in graph.consumers(key) if c not in plan.skip]
        spec = graph.nodes[key]
        # what the workflow made (a node nothing reads, a Pydra output job) is read in the home:
        # skipped only when it is there (a directory removed by hand is made again, as under MultiProc)
        made = spec.persist_dir or (not graph.consumers(key) and spec.sink_destination is None)
        if reusable[key] and (in_home[key] or (not runs and not made)):
            plan.skip.add(key)
            plan.status[key] = REUSED
            if runs and journal.get(key).pack is not None and journal.get(key).checkpoint is None:
                plan.restore.add(key)
        elif reusable[key]:
            plan.status[key] = EVICTED
            plan.needed_by[key] = runs[0] if runs else key
        elif journal.get(key) is None and _real_dir(home / key):
            plan.status[key] = CACHE_CHECK
        else:
            plan.status[key] = CHANGED
    return plan


def _reusable(record: NodeRecord | None, graph: WorkflowGraph, key: str) -> bool:
    if record is None or not record.done or record.chain != graph.chain(key):
        return False
    if graph.nodes[key].sink_destination is not None and not record.flushed:
        return False
    # what it wrote home is still there, and the input data it read is still what it was
    return _unchanged(record.committed, os.lstat) and _unchanged(record.reads, os.stat)


def _unchanged(fingerprints: dict[str, tuple[int, int]], stat) -> bool:
    for path, (size, mtime_ns) in fingerprints.items():
        try:
            st = stat(path)
        except OSError:
            return False
        if st.st_size != size or st.st_mtime_ns != mtime_ns:
            return False
    return True


def _checkpoint_in_home(record: NodeRecord, logical: Path, in_home: dict[str, bool], home: Path) -> bool:
    """Sea's copy of the node's directory is at its path, unchanged since (not rewritten by another
    run), and the directories its results name are in the home too."""
    if record.checkpoint is None:
        return False
    try:
        st = os.lstat(logical)
    except OSError:
        return False
    if st.st_mtime_ns != record.checkpoint:
        return False
    return all(in_home.get(needed, False) or _real_dir(home / needed) for needed in record.needs)


def _packed(record: NodeRecord, home: Path, key: str, in_home: dict[str, bool]) -> bool:
    """The node's pack is in the home as Sea left it, nothing else stands at its path (a directory
    there is the engine's to check), and the directories its results name are in the home too."""
    if record.pack is None or os.path.lexists(home / key) and not os.path.islink(home / key):
        return False
    name, size, mtime_ns = record.pack
    try:
        st = os.lstat(pack_path(home, key))
    except OSError:
        return False
    if pack_path(home, key).name != name or st.st_size != size or st.st_mtime_ns != mtime_ns:
        return False
    return all(in_home.get(needed, False) or _real_dir(home / needed) for needed in record.needs)


def checkpoint_identity(directory: Path) -> int:
    """What the journal records of a directory Sea put in the home (see :func:`_checkpoint_in_home`)."""
    return os.lstat(directory).st_mtime_ns


def _real_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()


def sweep_partial_copies(graph: WorkflowGraph, home: Path, log: logging.Logger) -> None:
    """Remove the temporary copies a killed run left in the home and the sinks' destinations. A
    run spread over machines does it once, on its client, before any machine starts flushing."""
    destinations = {s.sink_destination for s in graph.nodes.values() if s.sink_destination is not None}
    swept = sum(sweep_temporaries(root) for root in {Path(home), *destinations} if root.is_dir())
    if swept:
        log.warning("[Sea] removed %d partial copies left by a run that was killed", swept)


def sweep_orphan_packs(journal: Journal, home: Path, log: logging.Logger) -> None:
    """Remove the packs in the home the journal does not record: a run killed after one was put in
    place and before its record reached the journal (or after its record said it was dropped).
    Only Sea writes there, and only one run at a time (the run lock)."""
    directory = Path(home) / PACKS
    recorded = {record.pack[0] for record in journal.records.values() if record.pack is not None}
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    orphans = [e for e in entries if e.is_file(follow_symlinks=False) and e.name.endswith(SUFFIX) and e.name not in recorded]
    for entry in orphans:
        Path(entry.path).unlink(missing_ok=True)
    if orphans:
        log.info("[Sea] removed %d checkpoint(s) a killed run left unrecorded", len(orphans))


def admit(run: Run, keys: list[str]) -> None:
    """Track new nodes; remove the links a killed run left at their paths; note those known
    absent. A directory at a node's path (another plugin's, an earlier run's, a checkpoint) is
    the engine's cache: it is never removed; the engine's own check decides whether the node
    runs, and a node that runs again replaces it with its new directory, as the engine would."""
    present = _entries_in_home(run, keys)
    for key in keys:
        run.nodes[key] = NodeState(spec=run.graph.nodes[key], consumers_left=set(run.graph.consumers(key)))
        if key in run.skip:
            continue
        if present.get(key) == "link":
            (run.home / key).unlink(missing_ok=True)  # a link into a tier of a run that was killed
        elif key in present:
            run.home_dirs.add(key)
            continue
        run.fresh.add(key)


def _entries_in_home(run: Run, keys: list[str]) -> dict[str, str]:
    """What exists at each node's path in the home ("link" or "dir"), one listing per parent
    directory: on a shared filesystem every metadata operation is a round trip to its server."""
    found: dict[str, str] = {}
    by_parent: dict[Path, list[str]] = {}
    for key in keys:
        by_parent.setdefault((run.home / key).parent, []).append(key)
    for parent, keys in by_parent.items():
        try:
            entries = {e.name: e for e in os.scandir(parent)}
        except (FileNotFoundError, NotADirectoryError):
            continue
        run.known_dirs.add(parent)
        for key in keys:
            entry = entries.get(Path(key).name)
            if entry is not None:
                found[key] = "link" if entry.is_symlink() else "dir"
    return found
