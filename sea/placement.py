"""Where a node's directory goes: the fastest tier with room, linked from its path in the home.

A node is placed when it is about to run (:meth:`Placer.place`); a node that ran out of space on
a tier, or could not run a program from a tier mounted ``noexec``, is placed again on the next
tier (:meth:`Placer.retry_elsewhere`); a MapNode's sub-node placed on its own is a *part* of its
node, evicted with it. Under Dask, a copy of another machine's directory is a *replica*
(:meth:`Placer.place_replica`). The caller holds ``Run.lock``.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from .graph import NodeSpec
from .run_state import NodeState, Placement, Run, State, part_kind
from .sizes import format_size

STAGING_DIR = "declared"  # on a tier: where sinks write their declared outputs
ENOSPC_TEXT = (os.strerror(errno.ENOSPC), f"[Errno {errno.ENOSPC}]")
EACCES_TEXT = (os.strerror(errno.EACCES), f"[Errno {errno.EACCES}]")  # a program not run: a noexec tier
EBUSY_TEXT = (os.strerror(errno.EBUSY), f"[Errno {errno.EBUSY}]")  # a mount point not replaced: a prefetched copy in the view
EXDEV_TEXT = (os.strerror(errno.EXDEV), f"[Errno {errno.EXDEV}]")  # an overlay's lower directory not renamed: beside a copy in the view


def _not_done_in_its_view(error_text: str, on_a_copy: bool, beside_a_copy: bool) -> str | None:
    """What a node could not do to a prefetched input, or beside it, that it could without its
    view's mounts (see :meth:`Placer.retry_elsewhere`), else ``None``."""
    if on_a_copy and any(t in error_text for t in EBUSY_TEXT):
        return "replace, rename or remove an input file it read from a prefetched copy (bound over the original in its view)"
    if beside_a_copy and any(t in error_text for t in EXDEV_TEXT):
        return "rename a directory beside an input file it read from a prefetched copy (that directory is an overlay in its view)"
    return None


class Placer:
    """``inputs_moved(key)`` is called when a placed directory is dropped or replicated here: the
    nodes that read it rank differently (:mod:`sea.ordering`)."""

    def __init__(self, run: Run, inputs_moved: Callable[[str], None]):
        self.run = run
        self._inputs_moved = inputs_moved

    def place(self, key: str, link: bool = True) -> Placement:
        """Create the node's directory on the fastest tier with room; link it from the home (see
        :meth:`SeaEngine.place`)."""
        run = self.run
        node = run.nodes.get(key) or self._add_part(key)
        if node.placement is not None and node.state is State.RUNNING:
            return node.placement  # a MapNode placed before its sub-nodes, submitted again
        owner = run.nodes[node.part_of] if node.part_of else None
        estimate = run.estimate(key)
        logical = run.home / key
        if key in run.fresh:
            run.fresh.discard(key)  # known absent: no need to ask the shared filesystem
        elif logical.is_symlink():
            logical.unlink()  # Sea's link, from an earlier placement of the node
        # A directory in the home before the run stays there: the node runs on a tier and its new
        # directory replaces the old one when evicted, or, if it reuses parts of its directory
        # (a MapNode's sub-nodes), in it, as the engine would run it.
        old_dir = key in run.home_dirs
        run.reserve_memory(key)  # before its directory: the room a RAM tier has left depends on it
        if (old_dir and node.spec.reuses_dir) or (owner is not None and owner.in_place):
            tier = run.hierarchy.home
            tier.stats.nodes_placed += 1
        else:
            tier = run.hierarchy.choose(estimate, exclude=node.tried)
        run.hierarchy.check(tier)  # never into a directory swapped under Sea
        node.in_place = tier.is_home and (old_dir or (owner is not None and owner.in_place))
        link = (link or owner is not None or tier.is_home) and not old_dir
        if link:
            run.makedirs(logical.parent)
        if owner is not None and tier is owner.placement.tier:
            physical = logical.resolve()  # inside its owner's directory, no link needed
            physical.mkdir(parents=True, exist_ok=True)
        elif tier.is_home and owner is None:
            physical = logical
        else:
            physical = (tier.workdir / key) if not tier.is_home else (run.home / ".sea" / "parts" / key)
            physical.mkdir(parents=True, exist_ok=True)
            if link:
                try:
                    os.symlink(physical, logical, target_is_directory=True)
                except OSError:
                    run.check_home()  # its directory gone with the home: say so
                    raise
                run.report.files_created_home += 1
        node.placement = Placement(key, logical, physical, tier, estimate)
        node.state = State.RUNNING
        node.started = time.monotonic()
        if owner is not None:
            return node.placement
        run.running[key] = node.spec.label or key
        if node.spec.sink_destination is not None and not tier.is_home:
            # The sink sees its destination's own absolute path under a neutral prefix, so its
            # substitutions (applied to the whole path) act as they would at home.
            root = tier.workdir / STAGING_DIR / f"{run.graph.index(key):05d}"
            node.placement.staging_root = root
            node.placement.staging = root / node.spec.sink_destination.relative_to("/")
        run.forget_pack(key)  # it runs again: an earlier run's pack of it is not its directory any more
        run.journal.write("started", key, chain=run.graph.chain(key))
        run.log.debug("[Sea] placed %s on %s (estimate %s)", key, tier.name, format_size(estimate))
        return node.placement

    def _add_part(self, key: str) -> NodeState:
        run = self.run
        owner_key = run.graph.owner(key)
        if owner_key is None:
            raise KeyError(f"{key!r} is not a node of this workflow nor inside one")
        owner = run.nodes[owner_key]
        if owner.placement is None:
            self.place(owner_key)
            run.release_memory(owner_key)  # its sub-nodes run, each with its memory; it only collects them
        part = NodeState(spec=NodeSpec(key, kind=part_kind(owner.spec.kind)), consumers_left=set(), part_of=owner_key)
        run.nodes[key] = part
        run.report.subnodes += 1
        owner.parts.append(key)
        return part

    def retry_elsewhere(self, key: str, error_text: str, link: bool = True, on_a_copy: bool = False, beside_a_copy: bool = False) -> Placement | None:
        """The node's new placement if it failed for want of space or of ``exec`` on its tier, or
        (``on_a_copy``: the error names a file it read from a prefetched copy) could not replace,
        rename or remove that file, or (``beside_a_copy``: it names a path in such a file's
        directory) could not rename a directory there, else ``None`` (see :meth:`SeaEngine.retry_elsewhere`)."""
        run = self.run
        node = run.nodes.get(key)
        p = node.placement if node else None
        if p is None or p.tier.is_home:
            return None
        if any(t in error_text for t in ENOSPC_TEXT):
            run.log.warning("[Sea] %s ran out of space on %s; rerunning it on the next tier", key, p.tier.name)
            run.report.enospc_retries += 1
            run.estimator.learn(node.spec.kind, 2 * p.reserved)
        elif (what := _not_done_in_its_view(error_text, on_a_copy, beside_a_copy)) is not None:
            run.log.warning("[Sea] %s could not %s; rerunning it on the original files", key, what)
            run.report.busy_retries += 1
        elif p.tier.noexec and any(t in error_text for t in EACCES_TEXT):
            run.log.warning("[Sea] %s could not run a program on %s, mounted noexec; rerunning it on the next tier", key, p.tier.name)
            run.report.noexec_retries += 1
        else:
            return None
        node.tried.add(p.tier.name)
        self.drop(node)
        node.state = State.WAITING
        return self.place(key, link=link)

    def expect_run(self, key: str, consumers: Iterable[str]) -> None:
        """``key`` runs on this machine again: what an earlier run of it left here goes."""
        run = self.run
        node = run.nodes[key]
        p = node.placement
        if p is not None and not node.evicted and not p.tier.is_home:
            if node.state is State.FINISHED:  # a replica, or a run whose consumers were lost
                run.hierarchy.remove(p.physical)
                run.hierarchy.release(p.tier, used=node.size)
            else:
                self.drop(node)
        run.nodes[key] = NodeState(spec=node.spec, consumers_left=set(consumers))

    def place_replica(self, key: str, size: int) -> Path:
        """A directory to unpack another machine's copy of node ``key`` into (see
        :meth:`SeaEngine.place_replica`)."""
        run = self.run
        node = run.nodes[key]
        if node.placement is not None and not node.evicted:
            raise RuntimeError(f"{key!r} is already on this machine")
        tier = run.hierarchy.choose(size)
        physical = tier.workdir / key if not tier.is_home else run.home / ".sea" / "replicas" / key
        run.hierarchy.remove(physical)
        physical.mkdir(parents=True)
        node.placement = Placement(key, run.home / key, physical, tier, size)
        node.state, node.replica, node.evicted, node.size = State.FINISHED, True, False, size
        run.hierarchy.settle(tier, size, size)
        run.report.bytes_received += size
        self._inputs_moved(key)
        return physical

    def place_unpacked(self, key: str, size: int) -> Placement:
        """A directory to unpack node ``key``'s pack into (a rerun reuses it, and a node that runs
        reads it), linked from its path in the home by :meth:`link_unpacked` once complete (an
        engine that polls its cache must never read it half-made); like a replica, it is never
        flushed and is evicted once its consumers finished (the pack stays)."""
        run = self.run
        node = run.nodes[key]
        tier = run.hierarchy.choose(size)
        logical = run.home / key
        if logical.is_symlink():
            logical.unlink()
        physical = tier.workdir / key if not tier.is_home else run.home / ".sea" / "unpacked" / key
        run.hierarchy.remove(physical)
        physical.mkdir(parents=True)
        node.placement = Placement(key, logical, physical, tier, size)
        # finished once complete (link_unpacked): a finished node's result may be read where it is
        node.state, node.replica, node.unpacked, node.evicted, node.size = State.RUNNING, True, True, False, size
        run.hierarchy.settle(tier, size, size)
        return node.placement

    def link_unpacked(self, node: NodeState) -> None:
        """The unpacked directory is complete, its paths rewritten: the node is finished, and its
        path in the home links to it from now on."""
        node.state = State.FINISHED
        p = node.placement
        self.run.makedirs(p.logical.parent)
        os.symlink(p.physical, p.logical, target_is_directory=True)
        self.run.report.files_created_home += 1

    def link_named(self, node: NodeState, targets: Iterable[str]) -> None:
        """``node`` finished with symbolic links naming ``targets``: a directory placed without a
        link from the home (:meth:`place`'s ``link=False``) that one names at its path in the home
        (where the node saw it, in its view) is linked from there while on its tier, so that the
        link resolves for every reader (the engine's own process too). Evicted, the link goes; home
        whole, the directory takes its place."""
        run = self.run
        for target in targets:
            path = Path(target)
            owner = run.nodes.get(run.owner_of(path) or "") if path.is_relative_to(run.home) else None
            if owner is None or owner is node or owner.part_of is not None or owner.evicted or owner.placement is None:
                continue
            p = owner.placement
            if p.tier.is_home or p.logical == p.physical or os.path.lexists(p.logical):
                continue
            try:
                run.makedirs(p.logical.parent)
                os.symlink(p.physical, p.logical, target_is_directory=True)
            except OSError as error:  # the link then resolves in the nodes' views only
                run.log.warning("[Sea] %s could not be linked from the home, where a link %s made names it (%s)", owner.spec.key, node.spec.key, error.strerror or error)
                continue
            run.report.files_created_home += 1

    def drop(self, node: NodeState) -> None:
        """Remove a placed directory (and its link, and a sink's staging area): it runs again."""
        run = self.run
        p = node.placement
        if p.logical.is_symlink():
            p.logical.unlink()
        run.hierarchy.remove(p.physical)
        if p.staging_root is not None:
            run.hierarchy.remove(p.staging_root)
        run.hierarchy.release(p.tier, reserved=p.reserved)
        run.release_memory(node.spec.key)
        node.placement = None
        self._inputs_moved(node.spec.key)

    def drop_with_parts(self, node: NodeState) -> None:
        for part in self.run.separate_parts(node):
            self.drop(part)
        self.drop(node)
