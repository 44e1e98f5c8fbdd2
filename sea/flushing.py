"""What goes home, in which order, and how its copy takes its place (the stager does the copying).

When a node finishes (:meth:`Flusher.schedule`): a sink's declared outputs, waiting in its staging
area on a tier, go to their destinations; a node directory goes home whole when it is a checkpoint
(:mod:`sea.checkpoint`), what the workflow made (nothing consumes it), or when a rule says so
(``rules``: per file, ``move``, ``copy``, ``keep`` or ``remove``). A directory's files are copied
beside its path in the home and put in place by one rename once all committed
(:meth:`Flusher.dir_committed`), so a partial copy never looks complete. Declared outputs go first,
then directories that must go home, then ``auto``'s checkpoints (which a run's end abandons).

An ``auto`` checkpoint copies only on an idle link (:mod:`sea.stager`). Its directory stays on its
tier until the copy commits; on a busy link that can be long after its last consumer finished,
holding room that nothing live needs (on the busy benchmark, half the tier's peak again over the
live working set). So a directory done with whose checkpoint copy has not started and cannot start
now (a needed copy has the link, or every stager thread is writing) gives it up
(:meth:`Flusher.give_up_checkpoint`) and goes: a rerun recomputes it, as without the checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from .config import Checkpoints, Mode, Rule, SeaConfigError
from .eviction import Evictor
from .graph import WorkflowGraph
from .pack import PackSource
from .placement import STAGING_DIR, Placer
from .prefetch import PREFETCH_DIR
from .private import rmtree
from .run_state import NodeState, Run, SeaHomeMoved, State
from .stager import CHECKPOINT, DECLARED, KEPT, FlushBatch, atomic_copy, link_beside, swap_in, temporary_name, walk_files
from .view import VIEWS_DIR

# files every Nipype/Pydra node directory holds: used to tell whether a rule can ever match
_PROBE_NAMES = ("_report/report.rst", "result_node.pklz", "_inputs.pklz", "_node.pklz", "_0x0.json", "command.txt", "_result.pklz", "_job.pklz")


class Flusher:
    """The stager's copies of one run: submitted under ``Run.lock`` by the caller; their commit
    callbacks (:meth:`sink_committed`, :meth:`dir_committed`, in a stager thread) take it."""

    def __init__(self, run: Run, evictor: Evictor, placer: Placer):
        self.run = run
        self.evictor = evictor
        self.placer = placer
        self._optional: dict[str, FlushBatch] = {}  # key -> its auto checkpoint's copy, until it settles
        self._done_with: set[str] = set()  # ... of a directory done with, on an idle link: given up if it turns busy first
        evictor.give_up_copy = self.give_up_checkpoint

    # ---------------------------------------------------------------- rules
    def check_rules(self, graph: WorkflowGraph, keys_like: tuple[str, ...] = ()) -> None:
        """A rule that matches no path the workflow can produce is a mistake: say so before any node runs."""
        anchors = [*graph.nodes, *keys_like]
        probes = [f"{key}/{name}" for key in anchors for name in _PROBE_NAMES]
        outputs = {}  # a declared output's probe path -> its sink
        for spec in graph.nodes.values():
            if spec.sink_destination is not None:
                dest = self._rule_path(spec.sink_destination / "x")
                probes.append(dest)
                anchors.append(str(Path(dest).parent))
                outputs[dest] = spec.key
        for i, rule in enumerate(self.run.config.rules):
            self._refuse_dropped_outputs(i, rule, outputs)
            if any(rule.matches(p) for p in probes):
                continue
            prefix = _literal_prefix(rule)
            if any(a.startswith(prefix) or prefix.startswith(a) for a in anchors):
                self.run.log.warning("[Sea] rules[%d] %r matches no file known before the run; it may match files made at run time", i, rule.pattern)
                continue
            example = next(iter(anchors), "wf/node")
            raise SeaConfigError(
                f"rules[{i}]: pattern {rule.pattern!r} matches no path this workflow can produce "
                f"(paths are relative to the home, like {example + '/_report/report.rst'!r}); fix the pattern or remove the rule"
            )

    @staticmethod
    def _refuse_dropped_outputs(i: int, rule: Rule, outputs: dict[str, str]) -> None:
        """A ``remove`` rule that matches declared outputs without naming where they go (``**``): the
        run would succeed with an empty destination. One that names it removes them on purpose."""
        if rule.mode is not Mode.REMOVE:
            return
        prefix = _literal_prefix(rule)
        for probe, sink in outputs.items():
            where = str(Path(probe).parent)
            if rule.matches(probe) and not prefix.startswith(where):
                raise SeaConfigError(
                    f"rules[{i}]: pattern {rule.pattern!r} with mode remove matches the declared outputs of {sink} (to {where}): "
                    f"they would never reach it; narrow the pattern, or name the destination in it ({where + '/**'!r}) to remove them on purpose"
                )

    def _rule_path(self, path: Path) -> str:
        path = Path(path)
        return str(path.relative_to(self.run.home)) if path.is_relative_to(self.run.home) else str(path)

    def _mode(self, relpath: str, default: Mode) -> Mode:
        return self._ruled(relpath) or default

    def _ruled(self, relpath: str) -> Mode | None:
        """The mode the first rule matching ``relpath`` gives it; ``None`` where no rule matches."""
        for rule in self.run.config.rules:
            if rule.matches(relpath):
                return rule.mode
        return None

    # ---------------------------------------------------------------- copies home
    def schedule(self, node: NodeState, gives: Iterable[str] = ()) -> None:
        """The node finished: submit what of it goes home. ``gives``: the paths its outputs name."""
        run, p, key = self.run, node.placement, node.spec.key
        if node.spec.sink_destination is not None and p.staging_root is None:
            run.journal.write("committed", key, files=[])  # a sink that ran at home wrote its outputs itself
        if p.staging_root is not None:
            files = []
            for src in walk_files(p.staging_root, empty_dirs=True):
                dst = Path("/") / src.relative_to(p.staging_root)
                mode = self._mode(self._rule_path(dst), Mode.MOVE)
                if mode.flushes:
                    files.append((src, dst))
                node.keep |= mode is Mode.KEEP
            self.submit(node, FlushBatch(key, files, self.sink_committed))
        if p.tier.is_home:
            return
        copy_dir = p.logical.parent / temporary_name(p.logical.name, "dir")
        ruled = [(src, rel, self._ruled(f"{key}/{rel}")) for src, rel in self.node_files(node)]
        node.keep |= any(mode is Mode.KEEP for _, _, mode in ruled)
        priority = self._priority(node)
        asked = priority == CHECKPOINT and any(mode is not None and mode.flushes for _, _, mode in ruled)
        if asked:  # a file a rule sends home is the user's to read there: never in a pack, never given up
            priority = KEPT
        # auto's own choice of the directory gives way to such a file (a rerun recomputes the
        # node); and no directory goes home without a file its outputs name: the engine's cache
        # check would take the node as done, and its consumers would fail on every rerun
        if node.checkpoint and (asked or (not node.spec.persist_dir and self._drops_an_output(p, ruled, gives))):
            node.checkpoint = False
            self.run.checkpoints.abandoned(key)
        default = Mode.COPY if node.checkpoint else Mode.REMOVE
        files = [(src, copy_dir / rel) for src, rel, mode in ruled if (mode or default).flushes]
        all_files = len(ruled)
        if files and priority == CHECKPOINT and len(files) == all_files:  # auto's own choice, whole: one file
            members = [(src, str(dst.relative_to(copy_dir))) for src, dst in files]
            batch = FlushBatch(key, [(PackSource(members, self.run.made_under()), self.run.pack_path(key))], self.pack_committed)
            self._optional[key] = batch
            self.submit(node, batch, priority)
            return
        if files:
            node.home_copy = copy_dir
            node.home_copy_complete = len(files) == all_files
            # a directory the workflow delivers goes with the declared outputs; one that must go home
            # (checkpoints: all, or it replaces one that was there) after them; auto's choice last
            batch = self._dir_batch(key, files)
            if priority == CHECKPOINT:
                self._optional[key] = batch
            self.submit(node, batch, priority)

    @staticmethod
    def _drops_an_output(p, ruled, gives: Iterable[str]) -> bool:
        """A rule removes or keeps on the tier a file of the node's directory its outputs name."""
        given = {str(path) for path in gives}
        return any(
            mode is not None and not mode.flushes and (str(p.physical / rel) in given or str(p.logical / rel) in given)
            for _, rel, mode in ruled
        )

    def bring_home(self, node: NodeState) -> None:
        """``node``'s directory comes home whole, as under the engine's own plugin: a consumer of it
        failed, and its crash file names it (to rerun that node by hand)."""
        p = node.placement
        if p is None or p.tier.is_home or node.evicted or node.state is not State.FINISHED or node.part_of or node.home_copy is not None:
            return
        copy = p.logical.parent / temporary_name(p.logical.name, "dir")
        files = [(src, copy / rel) for src, rel in self.node_files(node)]
        if files:
            node.home_copy, node.home_copy_complete, node.checkpoint = copy, True, True
            self.submit(node, self._dir_batch(node.spec.key, files), KEPT)

    def _dir_batch(self, key: str, files: list[tuple[Path, Path]]) -> FlushBatch:
        """The copy of a node directory's ``files``; a file's other names in it (hard links, as a tool
        that links its inputs makes) are linked again in the copy once it is complete, not copied."""
        first: dict[tuple[int, int], Path] = {}
        copied, links, relinks = [], [], []
        for src, dst in files:
            try:
                st = os.lstat(src)
            except OSError:
                st = None
            if st is not None and stat.S_ISLNK(st.st_mode) and (home_form := self.run.home_form(os.readlink(src))) is not None:
                relinks.append((dst, home_form))  # a link into a tier points where that is in the home
            if st is not None and stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                if (st.st_dev, st.st_ino) in first:
                    links.append((first[(st.st_dev, st.st_ino)], dst))
                    continue
                first[(st.st_dev, st.st_ino)] = dst
            copied.append((src, dst))
        batch = FlushBatch(key, copied, self.dir_committed)
        batch.links, batch.relinks = links, relinks
        return batch

    def send_home_whole(self, node: NodeState) -> None:
        """``node``'s directory goes home whole after all, as a declared output's: a directory that
        goes home names files in it (a task that returns its input file), which must be there too,
        or the engine's copy of the workflow's outputs fails, and on every rerun. Its ``auto`` copy,
        if one waits, gives way (the directory's own copy is submitted first: nothing evicts it meanwhile)."""
        waiting = self._optional.get(node.spec.key)
        logical = node.placement.logical
        if waiting is None and ((node.home_copy is not None and node.home_copy_complete) or (logical.is_dir() and not logical.is_symlink())):
            return  # whole on its way home already (checkpoints: all), or there
        node.spec = replace(node.spec, persist_dir=True)
        node.checkpoint = True
        self.schedule(node)
        if waiting is not None:
            self.run.stager.cancel(waiting)

    def give_up_checkpoint(self, node: NodeState) -> bool:
        """``node``'s directory is done with (every consumer finished) and waits only for its
        ``auto`` checkpoint copy: if the copy has not started and cannot start now, it is given up
        (see the module); the copy settles as abandoned, which evicts the directory."""
        batch = self._optional.get(node.spec.key)
        if batch is None:
            return False
        if not self.run.stager.optional_waits:
            self._done_with.add(node.spec.key)  # its copy starts now: given up if a needed one comes first
            return False
        return self.run.stager.cancel(batch)

    def is_result(self, node: NodeState) -> bool:
        """Nothing consumes the node: its results are what the workflow made (what a user reads
        after the run, where a later run's cache check finds them), so its directory goes home like a
        declared output. Not a sink's: a sink's result is what it delivers."""
        return (
            not self.run.graph.consumers(node.spec.key)
            and not node.open_ended
            and node.part_of is None
            and node.spec.sink_destination is None
            and not node.spec.persist_dir
        )

    def _priority(self, node: NodeState) -> int:
        if node.spec.persist_dir:
            return DECLARED
        if self.run.checkpoints.mode is Checkpoints.AUTO and not (node.in_place or node.spec.keep_dir or node.spec.key in self.run.home_dirs or self.is_result(node)):
            return CHECKPOINT
        return KEPT

    def node_files(self, node: NodeState):
        """(file, path relative to the node directory) for the node and its separate parts."""
        p = node.placement
        separate = self.run.separate_parts(node)
        links = {p.physical / Path(part.spec.key).relative_to(node.spec.key) for part in separate}
        for src in walk_files(p.physical, empty_dirs=True):
            if src not in links:
                yield src, src.relative_to(p.physical)
        for part in separate:
            prefix = Path(part.spec.key).relative_to(node.spec.key)
            for src in walk_files(part.placement.physical, empty_dirs=True):
                yield src, prefix / src.relative_to(part.placement.physical)

    def submit(self, node: NodeState, batch: FlushBatch, priority: int = DECLARED) -> None:
        if batch.files and batch.files[0][1].is_relative_to(self.run.home):
            self.run.check_home()  # the copy would make a new home in place of one moved away
        node.flushes_pending += 1
        self.run.stager.submit(batch, priority)
        if priority != CHECKPOINT:  # the link is busy now: copies of directories done with that did not start give way
            for key in list(self._done_with):
                self._done_with.discard(key)
                waiting = self._optional.get(key)
                if waiting is not None:
                    self.run.stager.cancel(waiting)  # settled as abandoned, it evicts its directory (dir_committed)

    # ---------------------------------------------------------------- commits (stager threads)
    def _settle_batch(self, batch: FlushBatch) -> NodeState:
        run = self.run
        node = run.nodes[batch.key]
        node.flushes_pending -= 1
        run.report.bytes_flushed += batch.bytes
        run.report.files_flushed += len(batch.committed)
        run.report.bytes_written_home += batch.bytes
        run.report.files_created_home += len(batch.committed)
        if run.homespace is not None:
            run.homespace.wrote(batch.bytes)
        run.report.flush_retries += batch.retries
        for nbytes, seconds in batch.timings:
            run.checkpoints.cost.observe(nbytes, seconds)
        if batch.errors:
            node.flush_failed = True
            run.report.flush_errors.extend(batch.errors)
        run.sample()
        return node

    def sink_committed(self, batch: FlushBatch) -> None:
        run = self.run
        with run.lock:
            self._settle_batch(batch)
            run.report.without_sea_files_home += len(batch.committed)  # a sink writes them home either way
            run.report.without_sea_bytes_home += batch.bytes
            if not batch.errors:
                files = [[str(dst), size, mtime] for dst, size, mtime in batch.committed]
                run.journal.write("committed", batch.key, files=files)
            self.evictor.maybe_evict(batch.key)
        run.wake()

    def pack_committed(self, batch: FlushBatch) -> None:
        """An ``auto`` checkpoint's pack is home (the journal vouches for it from now on), or it was
        given up, or its copy failed: that stops checkpointing for the run, never the run."""
        run, key = self.run, batch.key
        node = run.nodes[key]
        self._optional.pop(key, None)
        self._done_with.discard(key)
        with run.lock:
            if batch.committed and not batch.abandoned and not batch.errors:
                _, size, mtime_ns = batch.committed[0]
                run.journal.write("packed", key, pack=run.pack_path(key).name, size=size, mtime_ns=mtime_ns, needs=list(node.needs))
                node.home_recorded = True
                run.report.checkpoints += 1
                run.report.checkpoint_bytes += size
                run.report.checkpoint_files += 1
                run.report.checkpoint_packs_made += 1
                run.report.checkpoint_pack_bytes += size
                for victim in run.checkpoints.committed(key, size):
                    self.drop_pack(victim)
            else:
                node.checkpoint = False
                if batch.failed_optional:
                    run.report.checkpoints_failed += 1
                    if run.checkpoints.failed(key, batch.failed_optional):
                        run.log.warning("[Sea] a checkpoint could not be copied home (%s); no more checkpoints in this run, which goes on", batch.failed_optional)
                        run.stager.abandon(CHECKPOINT)  # those queued are dropped too: their directories may go
                else:
                    run.checkpoints.abandoned(key)
                    run.report.checkpoints_abandoned += 1
            self._settle_batch(batch)
            self.evictor.maybe_evict(key)
        run.wake()

    def drop_pack(self, key: str) -> None:
        """Remove ``key``'s pack from the home (a better one takes its room, or the budget's trim)."""
        run = self.run
        run.journal.write("dropped", key)
        try:
            run.pack_path(key).unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            run.log.warning("[Sea] could not remove the checkpoint %s (%s)", run.pack_path(key), exc.strerror or exc)
        node = run.nodes.get(key)
        if node is not None:
            node.checkpoint = node.home_recorded = False
        run.report.checkpoints_dropped += 1

    def dir_committed(self, batch: FlushBatch) -> None:
        run = self.run
        node = run.nodes[batch.key]
        gone = [dst for dst, _, _ in batch.committed if not os.path.lexists(dst)]
        if gone:  # the copy's directory was removed under it: putting it in place would lose files
            batch.committed = [c for c in batch.committed if c[0] not in gone]
            batch.errors.append(f"{gone[0]}: removed from the home while {node.home_copy} was being committed")
        if batch.links and not batch.errors and not batch.abandoned:
            try:
                for existing, other in batch.links:
                    other.parent.mkdir(parents=True, exist_ok=True)  # inside the copy: a directory of nothing but links
                    os.link(existing, other)
            except OSError as error:
                batch.errors.append(f"{node.home_copy}: a hard link not made again ({error.strerror or error})")
        if batch.relinks and not batch.errors and not batch.abandoned:
            try:
                for link, target in batch.relinks:
                    made = link.parent / temporary_name(link.name, "link")
                    os.symlink(target, made)
                    os.replace(made, link)
            except OSError as error:
                batch.errors.append(f"{node.home_copy}: a link not pointed at the home ({error.strerror or error})")
        if run.relocate is not None and not batch.errors and not batch.abandoned and node.home_copy_complete:  # an abandoned copy is dropped
            try:
                self.evictor.relocate(node, node.home_copy)
            except Exception as error:  # the copy would not be right: keep the tier's, report it
                batch.errors.append(f"{node.home_copy}: paths not rewritten for the home ({error})")
        self._optional.pop(batch.key, None)
        self._done_with.discard(batch.key)
        if batch.abandoned and not batch.errors:  # given up, or the run ended before the copy was done: no checkpoint
            # even a copy cancelled before a file of it was written may have made its directory (a
            # first write that gave way to a needed copy): nothing of it stays
            rmtree(node.home_copy)
            node.home_copy, node.checkpoint = None, False
            with run.lock:
                run.checkpoints.abandoned(batch.key)
                run.report.checkpoints_abandoned += 1
                run.report.checkpoint_files_dropped += len(batch.committed)  # written home, then removed
        elif batch.errors and node.home_copy is not None:
            # the directory goes home whole or not at all: drop the copy, the tier's is kept
            rmtree(node.home_copy)
            batch.committed = []  # none of it reached its final path
        elif node.home_copy is not None:
            # at its path at once, while its consumers still read the tier's (a run killed now
            # resumes from it); nothing evicts the node before the batch is settled below
            p = node.placement
            with contextlib.suppress(OSError):  # the node's own mode (a 0700 it gave its directory), as it had it; its files' are theirs
                os.chmod(node.home_copy, stat.S_IMODE(os.lstat(p.physical).st_mode))
            if p.logical.is_symlink():
                p.logical.unlink()  # the link Sea made
            swap_in(node.home_copy, p.logical)
            node.home_copy = None
            if node.home_copy_complete:
                self.evictor.record_checkpoint(node)
        with run.lock:
            self._settle_batch(batch)
            if node.checkpoint and node.home_recorded and not node.spec.persist_dir:
                run.report.checkpoints += 1
                run.report.checkpoint_bytes += batch.bytes
                run.report.checkpoint_files += len(batch.committed)
            self.evictor.maybe_evict(batch.key)
        run.wake()

    # ---------------------------------------------------------------- the run's end
    def strays_home(self) -> None:
        """Files nodes wrote beside their own directories on a tier (``../shared.txt``), as nodes
        running at their tier paths do (no view: :mod:`sea.view`): under the engine's own plugin
        they are in the home, at the same place relative to it. Put there at the run's end (each
        by the stager's atomic copy), and said; one that cannot be is named, and goes with the tier.
        Run once every node directory was evicted: what is left outside them is what they wrote."""
        run = self.run
        ours = {p for n in run.nodes.values() if n.placement is not None for p in (n.placement.physical, n.placement.staging_root) if p is not None}
        linked: dict[tuple[int, int], Path] = {}  # a file with several names: where its first went
        for tier in run.hierarchy.fast_tiers:
            if tier.private is None or tier.private.closed:
                continue
            for rel in tier.private.files(empty_dirs=True):
                src = tier.workdir / rel
                if rel.split("/", 1)[0] in (VIEWS_DIR, STAGING_DIR, PREFETCH_DIR) or src in ours or any(d in ours for d in src.parents):
                    continue
                if os.path.lexists(run.home / rel):  # the node, at its tier path, did not see it: it stays
                    if not (src.is_dir() and (run.home / rel).is_dir()):  # an empty directory there already: as made
                        run.report.strays_left.append(rel)
                else:
                    try:
                        _copy_or_link(src, run.home / rel, linked, guard=run.check_home)  # never a new home in place of one moved away
                        run.report.strays_home.append(rel)
                    except SeaHomeMoved:
                        return  # the run's end says so
                    except OSError as error:
                        run.log.warning("[Sea] %s, written beside its node's directory, could not be put in the home (%s): it goes with the tier", rel, error.strerror or error)
                run.hierarchy.remove(src)
        if run.report.strays_left:
            run.log.warning(
                "[Sea] %d file(s) nodes wrote beside their directories on a tier were not put in the home, where a file of that "
                "name is (the nodes, at their tier paths, did not see it), first %s: they go with the tier", len(run.report.strays_left), run.report.strays_left[0],
            )  # fmt: skip
        if run.report.strays_home:
            run.log.warning(
                "[Sea] %d file(s) nodes wrote beside their directories on a tier were put at their paths in the home, first %s",
                len(run.report.strays_home), run.report.strays_home[0],
            )  # fmt: skip

    def forget_failed(self) -> None:
        """The home was moved away under copies going into it: they failed because of the move (their
        destination vanished), so their nodes are dropped as running ones are, and run again once the
        home is moved back; the run ends in SeaHomeMoved, not SeaFlushError."""
        run = self.run
        failed = [n for n in run.nodes.values() if n.flush_failed]
        run.log.warning("[Sea] %d copies home failed as the work directory moved (first: %s); their nodes will run again", len(failed), run.report.flush_errors[0])
        run.report.flush_errors.clear()
        for node in failed:
            node.flush_failed = False
            node.state = State.FAILED if node.state is State.FINISHED else node.state
            if node.placement is not None and not node.placement.tier.is_home and not node.part_of:
                self.placer.drop_with_parts(node)

    def settle_unfinished(self, interrupted: bool, moved: str | None) -> None:
        """The run is over: the directories of nodes still running are dropped when it was
        interrupted (they run again); those of nodes that failed (or were running) come home to
        inspect, unless there is no home to bring them to (then they run again)."""
        for node in self.run.nodes.values():
            node.consumers_left.clear()  # nothing runs any more
            node.open_ended = False
            if node.unpacked and node.state is State.RUNNING:  # a checkpoint half unpacked: the pack stays
                self.placer.drop(node)
                continue
            if interrupted and node.state is State.RUNNING and node.placement is not None and not node.part_of:
                for part in self.run.separate_parts(node):
                    self.placer.drop(part)
                if not node.placement.tier.is_home:
                    self.placer.drop(node)
                continue
            if node.state in (State.FAILED, State.RUNNING) and node.placement and not node.placement.tier.is_home and not node.part_of:
                copy = node.placement.logical.parent / temporary_name(node.placement.logical.name, "dir")
                files = [(f, copy / rel) for f, rel in self.node_files(node)]
                if moved is not None:  # no home to bring it to: it runs again
                    self.placer.drop_with_parts(node)
                    continue
                if not files:  # stopped before it wrote anything: nothing to inspect
                    self.placer.drop(node)
                    continue
                node.state = State.FINISHED  # bring a crashed node's directory home to inspect
                node.home_copy, node.home_copy_complete = copy, True
                self.submit(node, self._dir_batch(node.spec.key, files))


def _literal_prefix(rule: Rule) -> str:
    if rule.pattern.startswith("re:"):
        match = re.match(r"[^.^$*+?{}\[\]\\|()]*", rule.pattern[3:].removeprefix("^"))
    else:
        match = re.match(r"[^*?\[]*", rule.pattern)
    return match.group(0) if match else ""


def _copy_or_link(src: Path, dst: Path, linked: dict[tuple[int, int], Path], guard) -> None:
    """``src`` to ``dst`` by the stager's atomic copy, or, for another name of a file already put
    in the home (``linked``: by its device and inode on the tier), as a hard link to it there."""
    st = os.lstat(src)
    first = linked.get((st.st_dev, st.st_ino)) if stat.S_ISREG(st.st_mode) else None  # (its other names may be gone from the tier now)
    if first is None or not dst.parent.is_dir():  # (a name in a directory not made yet: a copy)
        atomic_copy(src, dst, guard=guard)
        if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
            linked.setdefault((st.st_dev, st.st_ino), dst)
        return
    guard()
    os.replace(link_beside(first, dst), dst)
