"""Issue 20, part 3 under SeaDask: prefetch on a Dask cluster, side by side with it off.

``python -m benchmarks.dask_prefetch --size smoke|full [--reps 3] [--units 8] [--out benchmarks/results]``

One Dask cluster of 2 single-threaded worker processes (:func:`benchmarks.dask_bench.spec_cluster`,
each with its own tier under /dev/shm, as two compute nodes would have) runs the ``read_compute``
workload (:mod:`benchmarks.read_compute`: per subject, a first step reads its input whole, then
computes twice as long as the read takes at 30 MB/s) through SeaDask in two configurations,
interleaved (each repetition in an order shifted by one):

* SD0: ``prefetch: false``;
* SD: the default, ``prefetch: auto`` (it measures the shared filesystem first and stops where
  prefetch does not pay).

on two shared filesystems: ``slow-reads`` (:mod:`benchmarks.slowfs`, 30 MB/s reads and writes for
the whole mount, 5 ms per metadata operation) and ``unloaded`` (the bare local disk under
/var/tmp). Every run's outputs are compared byte for byte with SD0's of the same repetition. The
bound: SD0 less the reads prefetch can hide (:func:`benchmarks.tables.prefetch_bound`). Results:
``<out>/dask-prefetch-<size>.md`` and ``.json`` (``dask-prefetch<units>-<size>`` with ``--units``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.dask_bench import REPO_ROOT, SCRATCH_PREFIX, SHARED_PARENT, TMPFS_PARENT, _raise_on_sigterm, describe_machine, spec_cluster
from benchmarks.matrix import SIZES as MATRIX_SIZES
from benchmarks.matrix import THROTTLES

WORKERS = ("w0", "w1")
CONFIGS = {"SD0": {"prefetch": False}, "SD": {}}
DESCRIBED = {"SD0": "SeaDask, prefetch: false", "SD": "SeaDask, prefetch: auto (the default)"}
SEA = {"tiers": [{"path": "${SEA_TIER}"}]}
GOALS = {"slow-reads": 1.5, "unloaded": 0.98}  # SD0 / SD: prefetch pays 1.5x where reads are slow, costs at most 2% elsewhere


@dataclass
class Record:
    throttle: str
    repetition: int
    config: str
    makespan_seconds: float
    identical_to_sd0: bool | None = None
    prefetch_files: int = 0
    prefetch_hits: int = 0
    prefetch_misses: int = 0
    prefetch_stopped: bool = False
    prefetch_slowdown: float | None = None


def run_one(config: str, address: str, data: Path, subjects: int, unit_mib: float, work: Path, out: Path, timeout: float) -> float:
    import threading

    from benchmarks.read_compute import build_workflow

    wf = build_workflow(data, subjects, unit_mib, work, out)
    wf.config["execution"]["poll_sleep_duration"] = 0.05
    timer = threading.Timer(timeout, lambda: os.kill(os.getpid(), signal.SIGTERM))  # a hung run ends the benchmark, cleanly
    timer.start()
    try:
        start = time.monotonic()
        wf.run(plugin="SeaDask", plugin_args={"sea": {**SEA, **CONFIGS[config]}, "dask": {"address": address}})
        return time.monotonic() - start
    finally:
        timer.cancel()


def run_throttle(throttle, subjects: int, unit_mib: float, reps: int, scratch: Path, address: str, tiers: dict[str, Path], timeout: float) -> list[Record]:
    import contextlib

    from benchmarks.read_compute import make_inputs
    from benchmarks.run import compare_outputs
    from benchmarks.slowfs import SlowFS

    backing = scratch / throttle.name
    make_inputs(backing / "data", subjects, unit_mib)  # written unthrottled, read through the mount
    records: list[Record] = []
    mount = (
        SlowFS(backing, scratch / f"mnt-{throttle.name}", write_mbps=throttle.write_mbps, read_mbps=throttle.read_mbps, meta_latency_ms=throttle.meta_latency_ms)
        if throttle.throttled
        else contextlib.nullcontext(type("Bare", (), {"path": backing})())
    )
    with mount as fs:
        for repetition in range(1, reps + 1):
            configs = list(CONFIGS)
            shift = (repetition - 1) % len(configs)
            order = configs[shift:] + configs[:shift]
            try:
                for config in order:
                    name = f"{config}-{repetition}"
                    os.sync()  # the previous run's writeback must not land inside this run's timing
                    time.sleep(1)
                    seconds = run_one(config, address, fs.path / "data", subjects, unit_mib, fs.path / name / "work", fs.path / name / "out", timeout)
                    report = json.loads((backing / name / "work" / "sea-report.json").read_text())
                    record = Record(throttle.name, repetition, config, seconds, **{k: report[k] for k in ("prefetch_files", "prefetch_hits", "prefetch_misses", "prefetch_stopped", "prefetch_slowdown")})
                    records.append(record)
                    print(f"  {throttle.name} rep {repetition} {config:<3} {seconds:7.2f} s  prefetched {record.prefetch_files} files, "
                          f"{record.prefetch_hits} read from copies, {record.prefetch_misses} missed" + ("; auto stopped" if record.prefetch_stopped else ""), flush=True)  # fmt: skip
                for record in records[-len(order):]:
                    differences = compare_outputs(backing / f"SD0-{repetition}" / "out", backing / f"{record.config}-{repetition}" / "out")
                    record.identical_to_sd0 = not differences
                    if differences:
                        raise SystemExit(f"FAILED: {throttle.name} repetition {repetition}: {record.config}'s outputs differ from SD0's: {differences[:5]}")
            finally:
                for config in order:
                    shutil.rmtree(backing / f"{config}-{repetition}", ignore_errors=True)
                for path in tiers.values():
                    for leftover in path.iterdir():
                        shutil.rmtree(leftover, ignore_errors=True)
    return records


def render(records: list[Record], size, subjects: int, reps: int, machine) -> str:
    from benchmarks.tables import prefetch_bound

    lines = [
        f"# Prefetch under SeaDask, {size.name} size",
        "",
        f"- Date: {machine.date}; {machine.nproc} CPUs, {machine.ram_bytes / 2**30:.0f} GiB RAM, Linux {machine.kernel}, Python {machine.python}, "
        f"Nipype {machine.nipype}, distributed {machine.distributed}; repository at {machine.repo_commit}; nipype_sea from {machine.code['nipype_sea']}",
        f"- Dask: {len(WORKERS)} single-threaded worker processes, each with its own tier under /dev/shm; "
        f"workload read_compute, {subjects} subjects x {size.unit_mib:g} MiB (compute twice a read at 30 MB/s)",
        f"- {reps} repetitions, interleaved (each in an order shifted by one); medians and min–max; outputs compared byte for byte with SD0's: "
        + ("all identical" if all(r.identical_to_sd0 for r in records) else "DIFFERENCES"),
        "",
        "| shared filesystem | SD0 prefetch off (s) | SD prefetch auto (s) | SD0 / SD | bound (s) | goal | | prefetched (SD) | read from copies / missed (SD) |",
        "|:--|--:|--:|--:|--:|--:|:--|--:|--:|",
    ]
    for throttle in dict.fromkeys(r.throttle for r in records):
        runs = {c: [r for r in records if r.throttle == throttle and r.config == c] for c in CONFIGS}
        med = {c: statistics.median(r.makespan_seconds for r in rs) for c, rs in runs.items()}
        span = {c: f"{med[c]:.2f} ({min(r.makespan_seconds for r in rs):.2f}–{max(r.makespan_seconds for r in rs):.2f})" for c, rs in runs.items()}
        ratio = med["SD0"] / med["SD"]
        bound = prefetch_bound(size, THROTTLES[throttle], "read_compute", med["SD0"], processes=len(WORKERS))
        bound_text = f"{bound:.2f} ({med['SD0'] / bound:.2f}x)" if bound else "–"
        sd = runs["SD"]
        stopped = sum(r.prefetch_stopped for r in sd)
        lines.append(
            f"| {throttle} | {span['SD0']} | {span['SD']} | **{ratio:.2f}x** | {bound_text} | >= {GOALS[throttle]} | {'met' if ratio >= GOALS[throttle] else 'MISSED'} "
            f"| {statistics.median(r.prefetch_files for r in sd):g} files{f' (auto stopped in {stopped} of {len(sd)})' if stopped else ''} "
            f"| {statistics.median(r.prefetch_hits for r in sd):g} / {statistics.median(r.prefetch_misses for r in sd):g} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--size", choices=("smoke", "full"), default="smoke")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--units", type=int, help="subjects, instead of the size's (full: 8)")
    parser.add_argument("--throttles", default="slow-reads,unloaded", help="comma-separated, from slow-reads, unloaded")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    os.environ.setdefault("NIPYPE_NO_ET", "1")
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    size = MATRIX_SIZES[args.size]
    subjects = args.units or size.units
    if args.units:
        size = type(size)(**{**asdict(size), "units": args.units})
    machine = describe_machine()
    scratch = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=SHARED_PARENT))
    tmpfs = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=TMPFS_PARENT))
    tiers = {name: tmpfs / name for name in WORKERS}
    for path in tiers.values():
        path.mkdir()
    print(f"Prefetch under SeaDask, {size.name} size, {args.reps} repetitions, {subjects} subjects; scratch: {scratch} {tmpfs}", flush=True)
    records: list[Record] = []
    try:
        with spec_cluster(tiers, scratch / "dask") as address:
            for name in args.throttles.split(","):
                records += run_throttle(THROTTLES[name], subjects, size.unit_mib, args.reps, scratch, address, tiers, timeout=600)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(tmpfs, ignore_errors=True)
    markdown = render(records, size, subjects, args.reps, machine)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / (f"dask-prefetch{args.units}-{size.name}" if args.units else f"dask-prefetch-{size.name}")
    stem.with_suffix(".md").write_text(markdown)
    stem.with_suffix(".json").write_text(json.dumps({"machine": asdict(machine), "subjects": subjects, "runs": [asdict(r) for r in records]}, indent=1) + "\n")
    print(markdown)
    print(f"Written: {stem}.md and .json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
