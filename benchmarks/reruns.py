"""Reruns side by side: what a user's second run costs under MultiProc and under Sea's checkpoint modes.

``python -m benchmarks.reruns --size smoke|full [--reps 3] [--throttles busy,unloaded]
[--configs A,CN,C,C'] [--kill-at 0.6] [--out benchmarks/results]``

On the fMRIPrep-like example (``fmri_preproc``), each configuration in turn (A MultiProc; CN, C, C'
SeaMultiProc with ``checkpoints: none``, ``auto``, ``all``), each step a fresh worker process
(``benchmarks.run``'s), on the shared filesystem ``benchmarks.run`` uses:

1. *first*: the first run, from scratch;
2. *rerun*: the same work directory, the band-pass's upper cut-off (``high_hz``, in the confound
   regression, a late step) changed from 0.1 to 0.08 Hz: the everyday "change a late option, run again";
3. *resumed*: from scratch again, SIGKILLed at ``--kill-at`` of the configuration's own first-run time
   (a wall-time limit), then the same command once more.

Each step records its time, the nodes it executed (MultiProc's ``status_callback``, which
SeaMultiProc calls too: a node sent to a worker process) and what it left on the shared filesystem;
outputs are compared byte for byte with A's at the same step. Results: ``<out>/reruns-<size>.md`` and
``.json``. The targets are issue 15's: the first run with ``auto`` (C) within 1.10x of ``none`` (CN)
and at least 3x faster than A; C's rerun within 1.2x of A's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
from dataclasses import asdict, dataclass, field
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

WORKLOAD = "fmri_preproc"
CONFIGS = ("A", "CN", "C", "C'", "C2", "C4")
CHANGE = {"high_hz": 0.08}  # the default is 0.1
STEPS = ("first", "rerun", "resumed")


@dataclass
class StepRecord:
    throttle: str
    config: str
    repetition: int
    step: str
    seconds: float  # the worker's workflow.run(), Sea's final flush included
    executed: int  # nodes sent to a worker process
    shared_files: int  # regular files on the shared filesystem after the step (work dir and outputs)
    shared_bytes: int
    executed_before_kill: int | None = None  # resumed: nodes the killed run had started
    identical_to_a: bool | None = None
    differences: list[str] = field(default_factory=list)
    sea: dict | None = None


def run_config(stage: Stage, size: Size, config: Configuration, repetition: int, kill_at: float, references: dict[str, Path]) -> list[StepRecord]:
    records = []
    name = f"reruns-{config.file_key}-{repetition}"
    killed = f"{name}-killed"
    try:
        first = None
        for step, run_name, params in (("first", name, None), ("rerun", name, CHANGE), ("resumed", killed, None)):
            before_kill = None
            if step == "resumed":  # killed at the same share of its own first run's time (or ended before)
                measured, _ = launch(stage, WORKLOAD, size, config, run_name, kill_after=kill_at * first)
                before_kill = len(measured["executed"])
            measured, _ = launch(stage, WORKLOAD, size, config, run_name, params=params)
            first = measured["makespan_seconds"] if step == "first" else first
            size_b, files, _ = footprint(stage.backing / run_name / "work", stage.backing / run_name / "out")
            record = StepRecord(stage.throttle.name, config.key, repetition, step, measured["makespan_seconds"], len(measured["executed"]),
                                files, size_b, before_kill, sea=measured.get("sea"))  # fmt: skip
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
    line = f"  {r.throttle:<8} rep {r.repetition} {r.config:<3} {r.step:<8} {r.seconds:7.2f} s  {r.executed:4d} nodes executed"
    if r.executed_before_kill is not None:
        line += f" ({r.executed_before_kill} started before the kill)"
    line += f"  {r.shared_files:4d} files on the shared FS"
    if r.identical_to_a is not None:
        line += "  outputs identical to A's" if r.identical_to_a else "  OUTPUTS DIFFER from A's"
    return line


def run_reruns(size: Size, reps: int, throttles: list[Throttle], configs: list[Configuration], kill_at: float) -> list[StepRecord]:
    records: list[StepRecord] = []
    with scratch_space(configs) as (scratch, tmpfs, fast, configs):
        for throttle in throttles:
            with staged(scratch, tmpfs, fast, throttle, WORKLOAD) as stage:
                make_inputs(WORKLOAD, size, stage.backing / WORKLOAD)
                references: dict[str, Path] = {}
                for repetition in range(1, reps + 1):
                    for config in configs:
                        records += run_config(stage, size, config, repetition, kill_at, references)
    return records


# ---------------------------------------------------------------------------------- tables
def medians(records: list[StepRecord], throttle: str, step: str, attribute: str) -> dict[str, float]:
    found: dict[str, list[float]] = {}
    for r in records:
        if r.throttle == throttle and r.step == step:
            found.setdefault(r.config, []).append(getattr(r, attribute))
    return {key: statistics.median(values) for key, values in found.items()}


def render_markdown(size: Size, reps: int, machine, throttles: list[Throttle], records: list[StepRecord], kill_at: float) -> str:
    lines = [
        f"# Reruns, {size.name} size: {describe_workload(WORKLOAD, size)}",
        "",
        f"{reps} repetitions; medians. Machine: {machine.nproc} cores, kernel {machine.kernel}, Python {machine.python}, "
        f"nipype {machine.nipype}, commit {machine.repo_commit}, {machine.date}.",
        f"Steps: *first* run from scratch; *rerun* of the same work directory with the band-pass's upper cut-off "
        f"changed ({CHANGE}); *resumed*: from scratch, SIGKILLed at {kill_at:.0%} of the configuration's own first-run "
        "time, then the same command again. Nodes executed: sent to a worker process (MultiProc's status callback).",
        "",
    ]
    for throttle in throttles:
        name = throttle.name
        t = {step: medians(records, name, step, "seconds") for step in STEPS}
        n = {step: medians(records, name, step, "executed") for step in STEPS}
        files = medians(records, name, "first", "shared_files")
        killed = medians([r for r in records if r.executed_before_kill is not None], name, "resumed", "executed_before_kill")
        lines += [f"## {name}: {throttle.describe(WORKLOAD)}", "",
                  "| config | first run (s) | A / config | files on the shared FS | rerun (s) | / A's rerun | nodes rerun | "
                  "resumed (s) | / A's | nodes run again (started before the kill) |",
                  "|:--|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]  # fmt: skip
        for key in t["first"]:
            config = BY_KEY[key]
            lines.append(
                f"| {key} {config.name} | {t['first'][key]:.2f} | {t['first']['A'] / t['first'][key]:.2f}x | {files[key]:.0f} | "
                f"{t['rerun'][key]:.2f} | {t['rerun'][key] / t['rerun']['A']:.2f}x | {n['rerun'][key]:.0f} | "
                f"{t['resumed'][key]:.2f} | {t['resumed'][key] / t['resumed']['A']:.2f}x | {n['resumed'][key]:.0f} ({killed.get(key, 0):.0f}) |"
            )
        targets = [
            ("first run: C (auto) within 1.10x of CN (none)", t["first"].get("C", 0) / t["first"]["CN"] if "CN" in t["first"] else None, "<=", 1.10),
            ("first run: C at least 3x faster than A", t["first"]["A"] / t["first"]["C"] if "C" in t["first"] else None, ">=", 3.0),
            ("rerun: C within 1.2x of A's rerun", t["rerun"]["C"] / t["rerun"]["A"] if "C" in t["rerun"] else None, "<=", 1.2),
        ]
        lines += ["", "| target | measured | met |", "|:--|--:|:--|"]
        for label, value, op, bound in targets:
            if value is None:
                continue
            met = value <= bound if op == "<=" else value >= bound
            lines.append(f"| {label} | {value:.2f} | {'met' if met else '**missed**'} |")
        lines.append("")
    differing = [r for r in records if r.identical_to_a is False]
    lines.append(f"Outputs identical to A's at every step: {'yes' if not differing else 'NO: ' + ', '.join(f'{r.config} {r.step}' for r in differing)}.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="smoke")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--throttles", default="busy", help=f"comma-separated, from {', '.join(THROTTLES)}")
    parser.add_argument("--configs", default="A,CN,C,C'", help=f"comma-separated, from {', '.join(CONFIGS)} (A is the reference; C2 and C4: auto's factor 2 and 4, C's is 1)")
    parser.add_argument("--kill-at", type=float, default=0.6, help="the kill, as a share of each configuration's first-run time")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    if args.reps < 1 or not 0 < args.kill_at < 1:
        parser.error("--reps must be at least 1 and --kill-at between 0 and 1")
    throttles = [THROTTLES[t] for t in selection(args.throttles, THROTTLES, "throttle")]
    configs = [BY_KEY[c] for c in selection(args.configs, CONFIGS, "configuration")]
    configs.sort(key=lambda c: c.key != "A")  # A first: the others are compared with it
    if configs[0].key != "A":
        parser.error("the configurations must include A, the reference")
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    size = SIZES[args.size]
    machine = describe_machine()
    print(f"Reruns, {size.name} size, {args.reps} repetitions: {', '.join(t.name for t in throttles)} x {' '.join(c.key for c in configs)}", flush=True)
    try:
        records = run_reruns(size, args.reps, throttles, configs, args.kill_at)
    except WorkerFailed as error:
        print(f"benchmark failed: {error}", file=sys.stderr)
        return 2
    machine.load_average_end = os.getloadavg()
    markdown = render_markdown(size, args.reps, machine, throttles, records, args.kill_at)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"reruns-{size.name}"
    stem.with_suffix(".md").write_text(markdown)
    raw = {"size": asdict(size), "repetitions": args.reps, "kill_at": args.kill_at, "change": CHANGE, "machine": asdict(machine),
           "throttles": [asdict(t) for t in throttles], "steps": [asdict(r) for r in records]}  # fmt: skip
    stem.with_suffix(".json").write_text(json.dumps(raw, indent=1) + "\n")
    print()
    print(markdown)
    print(f"Written: {stem}.md and .json")
    return 1 if any(r.identical_to_a is False for r in records) else 0


if __name__ == "__main__":
    raise SystemExit(main())
