"""The end-of-run report: what Sea placed where, what it flushed and evicted, and what it saved."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from .sizes import format_size

RUNS = Path(".sea") / "reports"  # in the home: every run's report, one file each (the latest is also at config.report)


def peak_concurrent_bytes(intervals: list[tuple[float, float, int]]) -> int:
    """The largest total of ``size`` over ``(start, end, size)`` intervals alive at one instant.

    >>> peak_concurrent_bytes([(0, 2, 10), (1, 3, 5), (2.5, 4, 7)])
    15
    """
    events = sorted([(start, size) for start, _, size in intervals] + [(end, -size) for _, end, size in intervals])
    peak = live = 0
    for _, change in events:  # at equal times ends (negative) sort first: a handover is not an overlap
        live += change
        peak = max(peak, live)
    return peak


@dataclass
class TierReport:
    name: str
    path: str
    peak_bytes: int
    bytes_written: int
    nodes_placed: int
    spills: int
    bytes_evicted: int
    machine: str = ""  # the worker it belongs to, in a run over several machines (their paths may be the same)

    @property
    def where(self) -> str:
        return f"{self.machine}:{self.path}" if self.machine else self.path


@dataclass
class MemoryReport:
    """The job's memory, when RAM tiers share it with the nodes (:mod:`sea.memory`)."""

    limit_bytes: int
    source: str
    headroom_bytes: int
    peak_charged_bytes: int  # the most the job was charged (tmpfs pages, anonymous memory, dirty pages) at a decision
    peak_committed_bytes: int  # ... or Sea counted committed (running nodes' memory, RAM tiers)
    ram_peak_bytes: int  # the most RAM tiers held at once
    nodes_held: int  # ready nodes that waited because their memory did not fit
    spills: int  # directories a RAM tier had space for but not the job's memory: placed on the next tier
    oom_kills: int = 0  # processes of the job's cgroup the OOM killer took during the run
    over_declared: int = 0  # kinds of node measured holding more memory than they declare (then reserved)

    def to_text(self) -> str:
        peak = max(self.peak_charged_bytes, self.peak_committed_bytes)
        return (
            f"  memory: peak {format_size(peak)} of the job's {format_size(self.limit_bytes)} ({self.source}; "
            f"headroom {format_size(self.headroom_bytes)}), RAM tiers up to {format_size(self.ram_peak_bytes)} of it"
            + (f"; {self.nodes_held} nodes waited for memory" if self.nodes_held else "")
            + (f"; {self.spills} directories placed past a RAM tier for want of memory" if self.spills else "")
            + (f"; the OOM killer killed {self.oom_kills} process(es)" if self.oom_kills else "")
            + (f"; {self.over_declared} kind(s) of node held more than they declare, reserved since" if self.over_declared else "")
        )


@dataclass
class WorkerReport:
    """One Dask worker's line: what ran there, and how often its inputs were already there."""

    worker: str
    nodes_run: int
    inputs_held: int  # nodes run here whose inputs some worker held (sources and inputs in the home aside)
    local_hits: int  # ... of which every such input was on this worker already
    bytes_received: int  # node directories copied here from other workers
    memory: MemoryReport | None = None  # its machine's memory, when its tiers include a RAM tier

    @property
    def local_hit_rate(self) -> float:
        return self.local_hits / self.inputs_held if self.inputs_held else 1.0


@dataclass
class RunReport:
    success: bool = True
    nodes_total: int = 0
    nodes_run: int = 0
    nodes_cached: int = 0  # the engine's own cache check, or Sea's resume plan
    nodes_failed: int = 0
    failed_nodes: list[str] = field(default_factory=list)  # their names
    paths_recorded: str = ""  # why nodes ran at their tier paths, not at their paths in the home (sea.view), if they did
    late_writes: list[str] = field(default_factory=list)  # nodes whose directories grew after they returned (evicted with them)
    strays_home: list[str] = field(default_factory=list)  # files nodes at their tier paths wrote beside their directories, put in the home at the end
    strays_left: list[str] = field(default_factory=list)  # ... not put there: the home has a file of that name (the node did not see it)
    interrupted: bool = False  # stopped by Ctrl-C or SIGTERM: the nodes that were running run again next time
    enospc_retries: int = 0
    noexec_retries: int = 0  # nodes that could not run a program on a noexec tier, rerun on the next
    busy_retries: int = 0  # nodes that could not replace, rename or remove a prefetched input (a mount point in the view), or rename a directory beside one (an overlay), rerun on the originals
    lost_worker_retries: int = 0  # nodes rerun after their worker process died (the OOM killer)
    nodes_held_for_link: int = 0  # ready nodes held back while the link home caught up (sea.backpressure)
    tiers: list[TierReport] = field(default_factory=list)
    bytes_flushed: int = 0
    files_flushed: int = 0
    bytes_evicted: int = 0
    stager_wait_seconds: float = 0.0
    files_created_home: int = 0
    bytes_written_home: int = 0
    without_sea_bytes_home: int = 0
    without_sea_files_home: int = 0
    live_peak_bytes: int = 0  # the live working set's peak: see peak_concurrent_bytes
    bytes_received: int = 0  # node directories copied here from another machine, for consumers here
    flush_retries: int = 0  # copies home that failed once (EIO, a vanished directory) and were tried again
    flush_errors: list[str] = field(default_factory=list)
    makespan_seconds: float = 0.0
    timeline: list = field(default_factory=list)  # [seconds, [bytes held per fast tier], stager queue]
    workers: list[WorkerReport] = field(default_factory=list)  # a distributed run's rows, one per worker
    nodes_recomputed: int = 0  # finished nodes run again because the worker holding their data was lost
    prefetch_files: int = 0  # input files copied from the shared filesystem ahead of their readers
    prefetch_bytes: int = 0
    prefetch_hits: int = 0  # inputs a node read from a prefetched copy
    prefetch_misses: int = 0  # ... from the shared filesystem, the copy not ready (or no room for it)
    prefetch_slowdown: float | None = None  # prefetch: auto: a copy from the shared filesystem over copying it again within the tier
    prefetch_stopped: bool = False  # ... too little for prefetch to pay: it stopped
    checkpoint_mode: str = ""  # the checkpoints setting: auto, none or all
    checkpoints: int = 0  # node directories copied home for reruns (sea.checkpoint)
    checkpoint_bytes: int = 0
    checkpoint_files: int = 0
    checkpoints_abandoned: int = 0  # auto's checkpoints not copied: the run ended before their turn
    checkpoint_files_dropped: int = 0  # ... files of theirs already copied home, then removed (counted as created)
    checkpoints_failed: int = 0  # auto's checkpoints whose copy failed (no space, over quota, I/O): dropped
    checkpoint_stop_reason: str = ""  # ... the first such failure: no more checkpoints after it
    checkpoints_dropped: int = 0  # packs removed from the home: a better one took their room, or the budget's trim
    checkpoint_packs_made: int = 0  # auto's packs this run copied home (of checkpoints)
    checkpoint_pack_bytes: int = 0  # ... their bytes
    checkpoints_restored: int = 0  # packs unpacked to a tier for a rerun (sea.engine.SeaEngine.restore)
    checkpoints_over_budget: int = 0  # checkpoints worth their copy but not kept: no room in the budget
    checkpoint_budget: str = ""  # checkpoint_budget as configured ("": no limit)
    checkpoint_budget_bytes: int = 0  # what checkpoints may hold (checkpoint_budget, of what the run delivered)
    checkpoint_held_bytes: int = 0  # what auto's packs hold in the home at the end (this run's and earlier runs' still in use)
    checkpoint_packs: int = 0  # ... how many
    delivered_bytes: int = 0  # what the run delivered home: declared outputs, directories that persist, results
    checkpoint_seconds: float = 0.0  # recomputation the directories kept in the home spare a rerun that needs them
    rerun_worst_seconds: float = 0.0  # the most a rerun would recompute (evicted producers) to feed one node ...
    rerun_worst_node: str = ""  # ... that one
    rerun_plan: dict = field(default_factory=dict)  # what Sea's journal said of each node at the start (sea.resume)
    kept_dirs: list[str] = field(default_factory=list)  # Sea's directories left on the tiers on purpose (sea recover)
    subnodes: int = 0  # directories placed inside a node's own (a MapNode's sub-nodes): in the tiers' counts, not in nodes_total
    started_at: float = 0.0  # when the run started (seconds since the epoch)
    memory: MemoryReport | None = None  # with a RAM tier: the job's memory (sea.memory)

    def to_json(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        tmp.replace(path)

    def save(self, path: Path, home: Path) -> Path:
        """This run's report in ``home``'s list of runs (:data:`RUNS`) and, as the latest, at ``path``;
        returns the first."""
        started = self.started_at or time.time()
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(started)) + f".{int(started * 1e6) % 10**6:06d}"
        own = Path(home) / RUNS / f"{stamp}-{os.getpid()}.json"  # two runs of one process in one second have two
        self.to_json(own)
        self.to_json(path)
        return own

    @classmethod
    def from_json(cls, path: Path) -> RunReport:
        data = json.loads(Path(path).read_text())
        data["tiers"] = [TierReport(**t) for t in data.get("tiers", [])]
        data["workers"] = [WorkerReport(**{**w, "memory": MemoryReport(**w["memory"]) if w.get("memory") else None}) for w in data.get("workers", [])]
        data["memory"] = MemoryReport(**data["memory"]) if data.get("memory") else None
        return cls(**{k: v for k, v in data.items() if k in _FIELDS})  # a newer Sea's report: what this one knows

    @property
    def status(self) -> str:
        return "interrupted" if self.interrupted else "succeeded" if self.success else "FAILED"

    def one_line(self) -> str:
        """When, how it ended, what ran: a line of ``sea report --list``."""
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started_at)) if self.started_at else "(time unknown)"
        return (
            f"{when}  {self.status:<11} {self.makespan_seconds:8.1f} s  {self.nodes_total} nodes: {self.nodes_run} run, "
            f"{self.nodes_cached} cached, {self.nodes_failed} failed; {format_size(self.bytes_flushed)} home"
        )

    @property
    def local_hit_rate(self) -> float:
        """Across workers: nodes that ran where all their inputs were / nodes whose inputs a worker held."""
        held = sum(w.inputs_held for w in self.workers)
        return sum(w.local_hits for w in self.workers) / held if held else 1.0

    def to_text(self) -> str:
        lines = [
            f"Sea run {self.status} in {self.makespan_seconds:.1f} s: {self.nodes_total} nodes, "
            f"{self.nodes_run} run, {self.nodes_cached} cached, {self.nodes_failed} failed"
            + (", the nodes that were running run again next time" if self.interrupted else "")
            + (f", {self.enospc_retries} rerun after 'no space left'" if self.enospc_retries else "")
            + (f", {self.noexec_retries} rerun off a noexec tier" if self.noexec_retries else "")
            + (f", {self.busy_retries} rerun on their original input files" if self.busy_retries else "")
            + (f", {self.lost_worker_retries} rerun after their worker process died" if self.lost_worker_retries else ""),
            f"  {'tier':<34} {'peak':>10} {'written':>10} {'evicted':>10} {'dirs':>6} {'spills':>6}",
        ]
        for t in self.tiers:
            lines.append(
                f"  {ellipsis(t.where, 34):<34} {format_size(t.peak_bytes):>10} {format_size(t.bytes_written):>10} "
                f"{format_size(t.bytes_evicted):>10} {t.nodes_placed:>6} {t.spills:>6}"
            )
        if self.subnodes:
            lines.append(f"  dirs: node directories, {self.subnodes} of them MapNode sub-nodes placed on their own")
        if self.late_writes:
            lines.append(f"  {len(self.late_writes)} node directories grew after their node returned (a process left running?), first {self.late_writes[0]}: evicted with them")
        if self.strays_left:
            lines.append(f"  {len(self.strays_left)} file(s) written beside node directories on a tier not put in the home, where a file of that name is, first {self.strays_left[0]}")
        if self.strays_home:
            lines.append(f"  {len(self.strays_home)} file(s) written beside node directories on a tier put at their paths in the home, first {self.strays_home[0]}")
        if self.paths_recorded:
            lines.append(f"  paths recorded by programs name the tiers, not the home: {self.paths_recorded} (logical_paths)")
        if self.failed_nodes:
            shown = ", ".join(self.failed_nodes[:5]) + (f" and {len(self.failed_nodes) - 5} more" if len(self.failed_nodes) > 5 else "")
            lines.append(f"  failed: {shown}; their directories are in the home, their crash files where the engine writes them (Nipype: execution.crashdump_dir)")
        lines += [
            f"  live working set (files some unfinished node still needs) peaked at {format_size(self.live_peak_bytes)}",
            f"  flushed home: {format_size(self.bytes_flushed)} in {self.files_flushed} files"
            + (f" ({self.flush_retries} copies tried again after an error)" if self.flush_retries else "")
            + "; "
            f"evicted: {format_size(self.bytes_evicted)}; waited on the stager: {self.stager_wait_seconds:.2f} s"
            + (f"; {self.nodes_held_for_link} nodes waited for the link home to catch up" if self.nodes_held_for_link else ""),
            f"  shared filesystem: {self.files_created_home} files, {format_size(self.bytes_written_home)} written "
            f"(without Sea: {self.without_sea_files_home} files, {format_size(self.without_sea_bytes_home)})",
        ]
        if self.memory is not None:
            lines.append(self.memory.to_text())
        if self.prefetch_files or self.prefetch_misses or self.prefetch_stopped:
            lines.append(
                f"  prefetched: {self.prefetch_files} input files ({format_size(self.prefetch_bytes)}); "
                f"read from the copy {self.prefetch_hits} times, from the shared filesystem {self.prefetch_misses}"
                + (f"; stopped (auto): {_measured(self.prefetch_slowdown)}" if self.prefetch_stopped else "")
            )
        if self.checkpoint_mode:
            lines += self._checkpoint_lines()
        if any(v for k, v in self.rerun_plan.items() if k != "changed"):
            lines.append("  rerun: " + ", ".join(f"{v} {k}" for k, v in self.rerun_plan.items()))
        if self.nodes_recomputed:
            lines.append(f"  {self.nodes_recomputed} finished node(s) ran again: a worker holding their data was lost")
        if self.workers:
            lines.append(f"  {'worker':<34} {'nodes':>6} {'local inputs':>13} {'received':>10}")
        for w in self.workers:
            lines.append(f"  {ellipsis(w.worker, 34):<34} {w.nodes_run:>6} {w.local_hit_rate:>12.1%} {format_size(w.bytes_received):>10}")
        for w in self.workers:
            if w.memory is not None:
                lines.append(f"  {w.worker}'s" + w.memory.to_text()[1:])
        for error in self.flush_errors:
            lines.append(f"  FLUSH ERROR: {error}")
        for kept in self.kept_dirs:
            lines.append(f"  KEPT on a tier: {kept} (no later run removes it; `sea recover {kept}` brings its copies home)")
        lines.append("  `sea report BASE_DIR --plot usage.png` draws tier usage and the stager's queue over time; `--list` lists every run")
        return "\n".join(lines)


    def _checkpoint_lines(self) -> list[str]:
        """What the checkpoints left in the home, within what budget, and what they spare a rerun."""
        dirs = self.checkpoints - self.checkpoint_packs_made
        lines = []
        if self.checkpoint_mode == "auto":
            budget = (
                f"budget {self.checkpoint_budget}: {format_size(self.checkpoint_budget_bytes)} for {format_size(self.delivered_bytes)} delivered"
                if self.checkpoint_budget
                else "no budget"
            )
            lines.append(
                f"  checkpoints (auto, {budget}): {self.checkpoint_packs} packs in the home ({format_size(self.checkpoint_held_bytes)}, "
                f"one file each)"
                + (f"; {self.checkpoint_packs_made} made in this run" if self.checkpoint_packs_made else "")
                + (f", {self.checkpoints_restored} unpacked for it" if self.checkpoints_restored else "")
                + (f", {self.checkpoints_dropped} dropped for better ones or to fit the budget" if self.checkpoints_dropped else "")
                + (f", {self.checkpoints_over_budget} left out for want of room in it" if self.checkpoints_over_budget else "")
                + (f", {self.checkpoints_abandoned} left out as their copy could not start in time" if self.checkpoints_abandoned else "")
            )
        if dirs > 0:
            lines.append(f"  node directories copied home whole: {dirs} ({format_size(self.checkpoint_bytes - self.checkpoint_pack_bytes)}, {self.checkpoint_files - self.checkpoint_packs_made} files)")
        if self.checkpoints_failed:
            lines.append(f"  checkpoints stopped: {self.checkpoints_failed} could not be copied home ({self.checkpoint_stop_reason}); the run went on without them")
        lines.append(
            f"  a rerun that needs them is spared {self.checkpoint_seconds:.1f} s of recomputation; it would recompute at most "
            f"{self.rerun_worst_seconds:.1f} s of evicted producers to feed one node" + (f" ({self.rerun_worst_node})" if self.rerun_worst_node else "")
        )
        return lines


_FIELDS = {f for f in RunReport.__dataclass_fields__}


def announce(report: RunReport, log) -> None:
    """Log the end-of-run report, its lines from the start of a line (after the logger's prefix)."""
    log.info("[Sea] end-of-run report:\n%s", report.to_text())


def ellipsis(text: str, width: int) -> str:
    """``text`` cut from the left to ``width`` characters, the cut shown.

    >>> ellipsis("/scratch/user/work/wf/sub-01", 16)
    '…/work/wf/sub-01'
    """
    return text if len(text) <= width else "…" + text[-(width - 1):]


def runs(home: Path) -> list[Path]:
    """Every run's report saved in ``home``, oldest first."""
    directory = Path(home) / RUNS
    return sorted(directory.glob("*.json")) if directory.is_dir() else []


_SUMMED = ("nodes_run", "nodes_cached", "nodes_failed", "enospc_retries", "noexec_retries", "busy_retries", "lost_worker_retries", "nodes_held_for_link", "bytes_flushed", "files_flushed", "bytes_evicted",
           "stager_wait_seconds", "files_created_home", "bytes_written_home", "without_sea_bytes_home", "without_sea_files_home",
           "bytes_received", "flush_retries", "prefetch_files", "prefetch_bytes", "prefetch_hits", "prefetch_misses",
           "checkpoints", "checkpoint_bytes", "checkpoint_files", "checkpoint_seconds", "checkpoints_abandoned",
           "checkpoint_files_dropped", "subnodes", "checkpoints_failed", "checkpoints_dropped", "checkpoints_over_budget",
           "checkpoint_packs_made", "checkpoint_pack_bytes", "checkpoints_restored", "delivered_bytes")  # fmt: skip


def combine_tiers(tiers: list[TierReport]) -> list[TierReport]:
    """One row per tier name, for runs that used a tier one after the other: their figures summed,
    the highest peak kept."""
    combined: dict[str, TierReport] = {}
    for tier in tiers:
        if tier.name not in combined:
            combined[tier.name] = replace(tier)
            continue
        row = combined[tier.name]
        row.peak_bytes = max(row.peak_bytes, tier.peak_bytes)
        row.bytes_written += tier.bytes_written
        row.nodes_placed += tier.nodes_placed
        row.spills += tier.spills
        row.bytes_evicted += tier.bytes_evicted
    return list(combined.values())


def merge_reports(parts: list[tuple[str, RunReport]], rows) -> RunReport:
    """One report for a run spread over several machines, from each ``(worker, its report)``: their
    figures summed, each tier listed under its worker's name (machines may have the same paths),
    and one row per worker (``rows``: :class:`sea.dask.locality.WorkerRow`)."""
    merged = RunReport()
    reports = []
    for worker, report in parts:
        report = replace(report, tiers=[t if t.name.startswith("home:") else replace(t, name=f"{worker}:{t.name}", machine=worker) for t in report.tiers])
        reports.append(report)
        merged.started_at = min(merged.started_at or report.started_at, report.started_at or merged.started_at)
        for name in _SUMMED:
            setattr(merged, name, getattr(merged, name) + getattr(report, name))
        merged.interrupted |= report.interrupted
        merged.nodes_total = max(merged.nodes_total, report.nodes_total)
        merged.live_peak_bytes = max(merged.live_peak_bytes, report.live_peak_bytes)
        merged.makespan_seconds = max(merged.makespan_seconds, report.makespan_seconds)
        merged.flush_errors += report.flush_errors
        merged.checkpoint_mode = merged.checkpoint_mode or report.checkpoint_mode
        if report.prefetch_stopped:  # each machine's prefetch (auto) measures and decides for itself
            merged.prefetch_stopped = True
            if report.prefetch_slowdown is not None:
                merged.prefetch_slowdown = max(merged.prefetch_slowdown or 0.0, report.prefetch_slowdown)
        if report.rerun_worst_seconds > merged.rerun_worst_seconds:
            merged.rerun_worst_seconds, merged.rerun_worst_node = report.rerun_worst_seconds, report.rerun_worst_node
        merged.tiers += [t for t in report.tiers if not t.name.startswith("home:")]
    merged.tiers += [t for t in reports[0].tiers if t.name.startswith("home:")][:1] if reports else []
    memory = {worker: report.memory for worker, report in parts}
    merged.workers = [WorkerReport(r.worker, r.nodes_run, r.with_inputs_held, r.local_hits, r.bytes_received, memory.get(r.worker)) for r in sorted(rows, key=lambda r: r.worker)]
    return merged


def _measured(slowdown: float | None) -> str:
    """What stopped ``prefetch: auto``: its measure, or that the measure failed (the log says why)."""
    if slowdown is None:
        return "the shared filesystem could not be measured"
    return f"a copy took {slowdown:.1f}x one within the tier"
