"""When a node's directory leaves its tier: once every consumer finished and every copy of it home
committed, never earlier (:meth:`Evictor.maybe_evict`).

A directory that ran in the home and is kept there (a checkpoint) is not removed: once its
consumers finished, the paths its results give into tiers are rewritten for the home and the
journal vouches for it. One that spilled to the home is an intermediate there too, removed as
Nipype's ``remove_node_directories`` would. The caller holds ``Run.lock``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

from .resume import checkpoint_identity
from .run_state import NodeState, Run, SeaHomeMoved, State, disk_usage
from .stager import atomic_copy, copy_tree_in, walk_files


class Evictor:
    def __init__(self, run: Run):
        self.run = run
        self._lent: dict[str, set[str]] = {}  # reader -> nodes whose files it reads through another's results
        self._lenders: dict[str, set[str]] = {}  # node -> nodes whose files its results name
        # a directory done with that waits only for an optional copy home may give it up (sea.flushing)
        self.give_up_copy: Callable[[NodeState], bool] = lambda node: False

    def release_producers(self, key: str) -> None:
        """``key`` will not read its producers any more (nor the directories its producers handed
        on to it): those nothing else needs go."""
        for producer in [*self.run.graph.producers(key), *self._lent.pop(key, ())]:
            self.run.nodes[producer].consumers_left.discard(key)
            self.maybe_evict(producer)

    def hand_on(self, key: str, paths: Iterable[str]) -> None:
        """``key`` finished, and its results name ``paths``: those in other nodes' directories (a
        node that passes its inputs on, as Nipype's ``Merge`` or a Pydra task returning its input
        files) are read by ``key``'s consumers, so those directories stay until they finished too,
        including consumers added later (while ``key`` is open-ended, until it is sealed)."""
        run = self.run
        node = run.nodes[key]
        for owner in {run.owner_of(path) for path in paths} - {None, key}:
            lender = run.nodes.get(owner)
            if lender is None or lender.evicted or lender.part_of is not None:
                continue
            self._lenders.setdefault(key, set()).add(owner)
            for reader in node.consumers_left:
                if not _is_open(reader):
                    self._lend(owner, reader)
            if node.open_ended:
                lender.consumers_left.add(_open(key))

    def consumer_added(self, key: str, consumer: str) -> None:
        """``consumer`` reads ``key`` (added after ``key`` finished): and what ``key`` handed on."""
        for owner in self._lenders.get(key, ()):
            self._lend(owner, consumer)

    def sealed(self, key: str) -> None:
        """No consumer of ``key`` will be added: what it handed on waits for the known ones only."""
        for owner in self._lenders.get(key, ()):
            self.run.nodes[owner].consumers_left.discard(_open(key))
            self.maybe_evict(owner)

    def _lend(self, owner: str, reader: str) -> None:
        lender = self.run.nodes[owner]
        if reader not in lender.consumers_left:
            lender.consumers_left.add(reader)
            self._lent.setdefault(reader, set()).add(owner)

    def maybe_evict(self, key: str) -> None:
        """Evict once every consumer finished and every flush committed; never earlier."""
        run = self.run
        node = run.nodes[key]
        if (
            node.evicted
            or node.keep
            or node.state is not State.FINISHED
            or node.consumers_left
            or node.open_ended
            or node.flush_failed
        ):
            return
        if node.flushes_pending:
            self.give_up_copy(node)  # given up, the copy settles and evicts the directory (in this call)
            return
        if node.part_of is not None:
            return  # evicted with its owner
        p = node.placement
        if node.replica:
            if node.unpacked and run.records is not None:
                run.records.keep(key, p.physical)
            if node.unpacked and p.logical.is_symlink():
                p.logical.unlink()  # the link to an unpacked checkpoint (sea.engine.SeaEngine.restore)
            run.hierarchy.remove(p.physical)
            run.hierarchy.release(p.tier, used=node.size)
            node.evicted = True
            return
        if p.tier.is_home and node.checkpoint:  # it ran in the home, and stays
            for part in run.separate_parts(node):
                if not part.evicted and not part.placement.tier.is_home:
                    self._bring_home(part)
            if not node.home_recorded:
                self._record_home_dir(node)
            return
        if run.records is not None:
            run.records.keep(key, p.physical, run.made_under())  # node.result reads it after the run
        for part in run.separate_parts(node):
            run.hierarchy.remove(part.placement.physical)
        for part_key in node.parts:
            part = run.nodes[part_key]
            if part.placement is not None:
                run.hierarchy.release(part.placement.tier, used=part.size)
                part.evicted = True
        self._late_writes(node)
        if p.tier.is_home:  # spilled there: an intermediate like any other
            run.hierarchy.remove(p.physical)
            run.hierarchy.release(p.tier, used=node.size)
        else:
            if p.logical.is_symlink():
                p.logical.unlink()  # the link Sea made
            run.hierarchy.remove(p.physical)
            if p.staging_root is not None:
                run.hierarchy.remove(p.staging_root)
            run.hierarchy.release(p.tier, used=node.size)
        node.evicted = True
        run.sample()
        if not node.home_recorded:
            run.journal.write("evicted", key)

    def _bring_home(self, part: NodeState) -> None:
        """A sub-node placed on a tier apart from its owner, whose directory stays in the home (a
        checkpoint): its directory is copied home in place of the link to it, and leaves the tier
        (it stayed there after the run, and the home's link into it dangled once it went)."""
        p, run = part.placement, self.run
        try:
            copy_tree_in(p.physical, p.logical, guard=run.check_home)
        except OSError as error:
            run.log.warning("[Sea] %s could not be put in its owner's directory in the home (%s)", part.spec.key, error.strerror or error)
            return
        run.hierarchy.remove(p.physical)
        run.hierarchy.release(p.tier, used=part.size)
        part.evicted = True

    def _late_writes(self, node: NodeState) -> None:
        """Files written in the node's directory after it returned (a process it left running, a tool
        that daemonized, a consumer at its tier path writing a note beside its input): where the
        node's directory is in the home (a checkpoint), new files are put there, as MultiProc's
        directory keeps them; else they go with it. Counted and said."""
        p = node.placement
        size, _ = disk_usage(p.physical)
        if size <= node.size or node.parts:  # (parts placed apart were measured on their own)
            return
        report = self.run.report
        report.late_writes.append(node.spec.key)
        home_dir = node.checkpoint and p.logical != p.physical and p.logical.is_dir() and not p.logical.is_symlink()
        kept = self._keep_late_files(p.physical, p.logical) if home_dir else []
        if kept:
            self.run.log.warning("[Sea] %s: %d file(s) written in its directory after it returned were put in its directory in the home, first %s",
                                 node.spec.key, len(kept), kept[0])  # fmt: skip
        elif len(report.late_writes) == 1:
            advice = "" if self.run.config.checkpoints.value == "all" else " (set checkpoints: all to keep directories whole)"
            self.run.log.warning(
                "[Sea] %s: %d bytes were written in its directory after it returned (a process it left running?); they are "
                "evicted with it%s", node.spec.key, size - node.size, advice,
            )  # fmt: skip

    def _keep_late_files(self, physical: Path, home_dir: Path) -> list[str]:
        """Copy into ``home_dir`` the files under ``physical`` it does not have; their names."""
        kept = []
        for src in walk_files(physical):
            rel = src.relative_to(physical)
            if os.path.lexists(home_dir / rel):
                continue  # made before it returned: home already, as committed
            try:
                atomic_copy(src, home_dir / rel, guard=self.run.check_home)
                kept.append(str(rel))
            except SeaHomeMoved:
                break  # the run's end says so
            except OSError as error:
                self.run.log.warning("[Sea] %s could not be put in the home (%s)", home_dir / rel, error.strerror or error)
        return kept

    def evict_all(self) -> None:
        """The run ended: whatever may go, goes."""
        for key in self.run.nodes:
            self.maybe_evict(key)

    def _record_home_dir(self, node: NodeState) -> None:
        """A node that ran in the home keeps its directory there: once its consumers finished, the
        paths its results give into tiers (its producers') are rewritten for the home, and the
        journal records the directory as a checkpoint."""
        node.home_recorded = True  # tried once
        if self.run.relocate is not None:
            try:
                self.relocate(node, node.placement.physical)
            except Exception as error:  # noqa: BLE001 - then the journal does not vouch for it
                self.run.log.warning("[Sea] %s stays in the home, but its results could not be rewritten (%s)", node.spec.key, error)
                return
        self.record_checkpoint(node)

    def relocate(self, node: NodeState, directory: Path) -> None:
        """Rewrite the paths the results in ``directory`` (the node's, or its copy on its way home)
        give into tiers for the home (the adapter's ``relocate``), and note which other nodes'
        directories they name: those must be in the home too for this one to be reused."""
        run = self.run
        moves = {tier.workdir: run.home for tier in run.hierarchy.fast_tiers}
        moves[run.home / ".sea" / "parts"] = run.home
        if node.placement.staging_root is not None:  # a sink's outputs, at their destinations
            moves[node.placement.staging_root] = Path("/")
        node.needs = self._needs(node.spec.key, [*run.relocate(directory, moves), *node.links])

    def _needs(self, key: str, named: Iterable[str]) -> tuple[str, ...]:
        """The other nodes whose directories the paths a node's results name are in."""
        return tuple(sorted({owner for owner in map(self.run.owner_of, named) if owner is not None and owner != key}))

    def record_checkpoint(self, node: NodeState) -> None:
        """The journal vouches for the node's directory in the home (a rerun may reuse it)."""
        record = self.run.journal.get(node.spec.key)
        if record is None or not record.done:  # a failed node's directory, brought home to inspect
            return
        try:
            mtime_ns = checkpoint_identity(node.placement.logical)
        except OSError:
            return
        node.home_recorded = True
        self.run.journal.write("checkpointed", node.spec.key, mtime_ns=mtime_ns, needs=list(node.needs))


def _open(key: str) -> str:
    """What stands in a lender's readers for the consumers an open-ended node may still get."""
    return f"{key}\0open-ended"


def _is_open(reader: str) -> bool:
    return reader.endswith("\0open-ended")
