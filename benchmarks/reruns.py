"""Reruns side by side: what a user's second run costs, and what each run leaves in the work directory.

``python -m benchmarks.reruns --size smoke|full [--reps 3] [--throttles busy,unloaded]
[--workloads fmri_preproc,incrementation] [--configs A,CN,C,C'] [--kill-at 0.5] [--out benchmarks/results]``

Each configuration in turn (A MultiProc; CN, C, C' SeaMultiProc with ``checkpoints: none``, the
default ``auto``, ``all``), each step a fresh worker process (``benchmarks.run``'s), on the shared
filesystem ``benchmarks.run`` uses, for each workload: the fMRIPrep-like example (``fmri_preproc``)
and the incrementation chain (at full size 8 chunks x 64 MiB x 30 iterations, issue 32's):

1. *first*: the first run, from scratch; what it leaves in the work directory (bytes, files);
2. *rerun*: the same work directory, a late step changed: fmri_preproc's band-pass upper cut-off
   (``high_hz``, in the confound regression) from 0.1 to 0.08 Hz; incrementation's iteration at
   five sixths of the chain adding 2 instead of 1: the everyday "change a late option, run again";
3. *resumed*: from scratch again, SIGKILLed at ``--kill-at`` of the configuration's own first-run
   time (a wall-time limit), then the same command once more.

Each step records its time, the nodes it executed (MultiProc's ``status_callback``, which
SeaMultiProc calls too: a node sent to a worker process) and what it left on the shared filesystem;
outputs are compared byte for byte with A's at the same step. Results: ``<out>/reruns-<size>.md`` and
``.json``. The targets are issue 32's, for the default (C): what it leaves in the work directory at
most the declared outputs' bytes and at least 20 times fewer files than A's; its first run within
1.03x of CN's; its rerun and its resumed run within 1.2x of A's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from benchmarks.matrix import BY_KEY, SIZES, THROTTLES, Configuration, Size, Throttle, describe_workload, make_inputs
from benchmarks.run import (
    REPO_ROOT,
    Stage,
    WorkerFailed,
    _raise_on_sigterm,
    compare_outputs,
    describe_machine,
    footprint,
    launch,
    scratch_space,
    selection,
    staged,
)

WORKLOADS = ("fmri_preproc", "incrementation")
CONFIGS = ("A", "CN", "C", "C'", "C2", "C4")
STEPS = ("first", "rerun", "resumed")
# issue 32's incrementation chain (8 x 64 MiB x 30); fmri_preproc at the matrix's sizes
INCREMENTATION = {"smoke": replace(SIZES["smoke"], units=2, unit_mib=4, iterations=6), "full": replace(SIZES["full"], units=8, unit_mib=64, iterations=30)}


def workload_size(workload: str, size: Size) -> Size:
    return INCREMENTATION[size.name] if workload == "incrementation" else size


def change(workload: str, size: Size) -> dict:
    """The rerun's change: a late step's parameter."""
    if workload == "incrementation":
        return {"changed": -(-5 * size.iterations // 6), "delta": 2.0}  # the iteration at five sixths of the chain
    return {"high_hz": 0.08}  # the default is 0.1


@dataclass
class StepRecord:
    workload: str
    throttle: str
    config: str
    repetition: int
    step: str
    seconds: float  # the worker's workflow.run(), Sea's final flush included
    executed: int  # nodes sent to a worker process
    shared_files: int  # regular files on the shared filesystem after the step (work dir and outputs)
    shared_bytes: int
    work_files: int = 0  # ... of which in the work directory (base_dir)
    work_bytes: int = 0
    output_bytes: int = 0  # the declared outputs'
    executed_before_kill: int | None = None  # resumed: nodes the killed run had started
    identical_to_a: bool | None = None
    differences: list[str] = field(default_factory=list)
    sea: dict | None = None


def run_config(
    stage: Stage, workload: str, size: Size, config: Configuration, repetition: int, kill_at: float, references: dict[str, Path]
) -> list[StepRecord]:
    records = []
    name = f"reruns-{workload}-{config.file_key}-{repetition}"
    killed = f"{name}-killed"
    try:
        first = None
        for step, run_name, params in (("first", name, None), ("rerun", name, change(workload, size)), ("resumed", killed, None)):
            before_kill = None
            if step == "resumed":  # killed at the same share of its own first run's time (or ended before)
                measured, _ = launch(stage, workload, size, config, run_name, kill_after=kill_at * first)
                before_kill = len(measured["executed"])
            measured, _ = launch(stage, workload, size, config, run_name, params=params)
            first = measured["makespan_seconds"] if step == "first" else first
            work, out = stage.backing / run_name / "work", stage.backing / run_name / "out"
            size_b, files, _ = footprint(work, out)
            work_b, work_files, _ = footprint(work)
            record = StepRecord(workload, stage.throttle.name, config.key, repetition, step, measured["makespan_seconds"], len(measured["executed"]),
                                files, size_b, work_files, work_b, footprint(out)[0], before_kill, sea=measured.get("sea"))  # fmt: skip
            if record.sea:
                record.sea.pop("timeline", None)
            if config.key == "A":
                references[step] = stage.tmpfs / f"reference-{step}"
                shutil.rmtree(references[step], ignore_errors=True)
                shutil.copytree(stage.backing / run_name / "out", references[step])
            else:
                record.differences = compare_outputs(references[step], stage.backing / run_name / "out")
                record.identical_to_a = not record.differences
            records.append(record)
            print(progress_line(record), flush=True)
    finally:
        for run_name in (name, killed):
            shutil.rmtree(stage.backing / run_name, ignore_errors=True)
    return records


def progress_line(r: StepRecord) -> str:
    line = f"  {r.workload:<14} {r.throttle:<8} rep {r.repetition} {r.config:<3} {r.step:<8} {r.seconds:7.2f} s  {r.executed:4d} nodes executed"
    if r.executed_before_kill is not None:
        line += f" ({r.executed_before_kill} started before the kill)"
    line += f"  work dir {r.work_files:4d} files, {r.work_bytes / 2**20:8.1f} MiB"
    if r.identical_to_a is not None:
        line += "  outputs identical to A's" if r.identical_to_a else "  OUTPUTS DIFFER from A's"
    return line


def run_reruns(size: Size, reps: int, throttles: list[Throttle], configs: list[Configuration], kill_at: float, workloads: list[str]) -> list[StepRecord]:
    records: list[StepRecord] = []
    with scratch_space(configs) as (scratch, tmpfs, fast, configs):
        for workload in workloads:
            wsize = workload_size(workload, size)
            for throttle in throttles:
                with staged(scratch, tmpfs, fast, throttle, workload) as stage:
                    make_inputs(workload, wsize, stage.backing / workload)
                    references: dict[str, Path] = {}
                    for repetition in range(1, reps + 1):
                        for config in configs:
                            records += run_config(stage, workload, wsize, config, repetition, kill_at, references)
                    shutil.rmtree(stage.backing / workload, ignore_errors=True)
    return records


# ---------------------------------------------------------------------------------- tables
def medians(records: list[StepRecord], workload: str, throttle: str, step: str, attribute: str) -> dict[str, float]:
    found: dict[str, list[float]] = {}
    for r in records:
        if r.workload == workload and r.throttle == throttle and r.step == step:
            found.setdefault(r.config, []).append(getattr(r, attribute))
    return {key: statistics.median(values) for key, values in found.items()}


def targets(t: dict, work_bytes: dict, work_files: dict, outputs: dict) -> list[tuple[str, float | None, str, float]]:
    """Issue 32's targets for the default (C): (what, measured, <= or >=, bound)."""
    if "C" not in t["first"]:
        return []
    return [
        ("work directory: C's bytes / the declared outputs'", work_bytes["C"] / max(outputs["C"], 1), "<=", 1.0),
        ("work directory: A's files / C's", work_files["A"] / max(work_files["C"], 1), ">=", 20.0),
        ("first run: C / CN (checkpoints: none)", t["first"]["C"] / t["first"]["CN"] if "CN" in t["first"] else None, "<=", 1.03),
        ("rerun after a late change: C / A", t["rerun"]["C"] / t["rerun"]["A"], "<=", 1.2),
        ("resumed after a kill: C / A", t["resumed"]["C"] / t["resumed"]["A"], "<=", 1.2),
    ]


def render_markdown(size: Size, reps: int, machine, throttles: list[Throttle], records: list[StepRecord], kill_at: float, workloads: list[str]) -> str:
    lines = [
        f"# Reruns and what is left in the work directory, {size.name} size",
        "",
        f"{reps} repetitions; medians. Machine: {machine.nproc} cores, kernel {machine.kernel}, Python {machine.python}, "
        f"nipype {machine.nipype}, commit {machine.repo_commit}, {machine.date}.",
        "Steps: *first* run from scratch (and what it leaves in the work directory, base_dir: bytes, files); *rerun* of the same "
        f"work directory with a late step changed; *resumed*: from scratch, SIGKILLed at {kill_at:.0%} of the configuration's own "
        "first-run time, then the same command again. Nodes executed: sent to a worker process (MultiProc's status callback).",
        "",
    ]
    for workload in workloads:
        wsize = workload_size(workload, size)
        for throttle in throttles:
            name = throttle.name
            t = {step: medians(records, workload, name, step, "seconds") for step in STEPS}
            if not t["first"]:
                continue
            n = {step: medians(records, workload, name, step, "executed") for step in STEPS}
            work_bytes = medians(records, workload, name, "first", "work_bytes")
            work_files = medians(records, workload, name, "first", "work_files")
            outputs = medians(records, workload, name, "first", "output_bytes")
            killed = medians([r for r in records if r.executed_before_kill is not None], workload, name, "resumed", "executed_before_kill")
            lines += [f"## {describe_workload(workload, wsize)}; rerun: {change(workload, wsize)}", "", f"{name}: {throttle.describe(workload)}", "",
                      "| config | first run (s) | / CN | work dir after it | files, A / config | rerun (s) | / A's | nodes rerun | "
                      "resumed (s) | / A's | nodes run again (started before the kill) |",
                      "|:--|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]  # fmt: skip
            for key in t["first"]:
                config = BY_KEY[key]
                against_cn = f"{t['first'][key] / t['first']['CN']:.2f}x" if "CN" in t["first"] else ""
                lines.append(
                    f"| {key} {config.name} | {t['first'][key]:.2f} | {against_cn} | {work_bytes[key] / 2**20:.1f} MiB in {work_files[key]:.0f} files | "
                    f"{work_files['A'] / max(work_files[key], 1):.1f}x | "
                    f"{t['rerun'][key]:.2f} | {t['rerun'][key] / t['rerun']['A']:.2f}x | {n['rerun'][key]:.0f} | "
                    f"{t['resumed'][key]:.2f} | {t['resumed'][key] / t['resumed']['A']:.2f}x | {n['resumed'][key]:.0f} ({killed.get(key, 0):.0f}) |"
                )
            lines += ["", f"Declared outputs: {next(iter(outputs.values())) / 2**20:.1f} MiB.", "", "| target (issue 32) | measured | met |", "|:--|--:|:--|"]
            for label, value, op, bound in targets(t, work_bytes, work_files, outputs):
                if value is None:
                    continue
                met = value <= bound if op == "<=" else value >= bound
                lines.append(f"| {label} {op} {bound:g} | {value:.2f} | {'met' if met else '**missed**'} |")
            lines.append("")
    differing = [r for r in records if r.identical_to_a is False]
    lines.append(f"Outputs identical to A's at every step: {'yes' if not differing else 'NO: ' + ', '.join(f'{r.workload} {r.config} {r.step}' for r in differing)}.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="smoke")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--throttles", default="busy", help=f"comma-separated, from {', '.join(THROTTLES)}")
    parser.add_argument("--configs", default="A,CN,C,C'", help=f"comma-separated, from {', '.join(CONFIGS)} (A is the reference; C2 and C4: auto's factor 2 and 4, C's is 1)")
    parser.add_argument("--kill-at", type=float, default=0.5, help="the kill, as a share of each configuration's first-run time")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated, from {', '.join(WORKLOADS)}")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    if args.reps < 1 or not 0 < args.kill_at < 1:
        parser.error("--reps must be at least 1 and --kill-at between 0 and 1")
    throttles = [THROTTLES[t] for t in selection(args.throttles, THROTTLES, "throttle")]
    configs = [BY_KEY[c] for c in selection(args.configs, CONFIGS, "configuration")]
    workloads = selection(args.workloads, WORKLOADS, "workload")
    configs.sort(key=lambda c: c.key != "A")  # A first: the others are compared with it
    if configs[0].key != "A":
        parser.error("the configurations must include A, the reference")
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    size = SIZES[args.size]
    machine = describe_machine()
    print(f"Reruns, {size.name} size, {args.reps} repetitions: {', '.join(t.name for t in throttles)} x {' '.join(c.key for c in configs)}", flush=True)
    try:
        records = run_reruns(size, args.reps, throttles, configs, args.kill_at, workloads)
    except WorkerFailed as error:
        print(f"benchmark failed: {error}", file=sys.stderr)
        return 2
    machine.load_average_end = os.getloadavg()
    markdown = render_markdown(size, args.reps, machine, throttles, records, args.kill_at, workloads)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"reruns-{size.name}"
    stem.with_suffix(".md").write_text(markdown)
    raw = {"size": asdict(size), "repetitions": args.reps, "kill_at": args.kill_at, "workloads": {w: {"size": asdict(workload_size(w, size)), "change": change(w, workload_size(w, size))} for w in workloads}, "machine": asdict(machine),
           "throttles": [asdict(t) for t in throttles], "steps": [asdict(r) for r in records]}  # fmt: skip
    stem.with_suffix(".json").write_text(json.dumps(raw, indent=1) + "\n")
    print()
    print(markdown)
    print(f"Written: {stem}.md and .json")
    return 1 if any(r.identical_to_a is False for r in records) else 0


if __name__ == "__main__":
    raise SystemExit(main())
