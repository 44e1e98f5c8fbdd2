"""The busy-shared-filesystem benchmark: what users run today against Sea, side by side.

``python -m benchmarks.busy [--workload incrementation|filtering] [--size smoke|issue] [--reps 3]``

The shared filesystem is ``benchmarks.slowfs`` (30 MB/s write, 200 MB/s read, 5 ms per metadata
operation, shared by every process), mounted over a disk directory. Interleaved, each run a fresh
process in fresh directories, outputs compared byte for byte with A's:

* A2 MultiProc with Nipype's default 2 s poll, work dir and DataSink on the busy filesystem;
* A  the same, poll tuned to 0.05 s (the fair best MultiProc);
* B  MultiProc with the work dir on tmpfs by hand (``-w $SLURM_TMPDIR``), DataSink on the busy
  filesystem: what careful users do (it loses resume, and fails when tmpfs fills);
* C  SeaMultiProc, home on the busy filesystem, tiers /dev/shm then local disk;
* C' SeaMultiProc with ``keep_intermediates: true`` (the seeds' flush-all);
* T  MultiProc with everything on tmpfs (nothing on the busy filesystem);
* L  the limit, computed: max(T, declared output bytes at the throttled bandwidth) plus the last
  output's flush.
The model's predictions (``sea.model``) are printed next to the measured medians.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_PARENT, TMPFS_PARENT = Path("/var/tmp"), Path("/dev/shm")
PROCESSES = 2


@dataclass(frozen=True)
class Size:
    name: str
    units: int  # chunks (incrementation) or subjects (filtering)
    unit_mib: float
    iterations: int  # incrementation only


SIZES = {"smoke": Size("smoke", 4, 8, 3), "issue": Size("issue", 8, 32, 5)}


@dataclass(frozen=True)
class Config:
    key: str
    name: str
    plugin: str
    poll: float = 0.05
    work_on_tmpfs: bool = False
    out_on_tmpfs: bool = False
    sea: dict | None = None


SEA_TIERS = [{"path": str(TMPFS_PARENT)}, {"path": str(SHARED_PARENT)}]
CONFIGS = [
    Config("A2", "MultiProc, default 2 s poll", "MultiProc", poll=2.0),
    Config("A", "MultiProc, tuned 0.05 s poll", "MultiProc"),
    Config("B", "MultiProc, work dir on tmpfs by hand", "MultiProc", work_on_tmpfs=True),
    Config("C", "SeaMultiProc", "SeaMultiProc", sea={"tiers": SEA_TIERS}),
    Config("C'", "SeaMultiProc, keep_intermediates", "SeaMultiProc", sea={"tiers": SEA_TIERS, "keep_intermediates": True}),
    Config("T", "MultiProc, all on tmpfs", "MultiProc", work_on_tmpfs=True, out_on_tmpfs=True),
]
BY_KEY = {c.key: c for c in CONFIGS}


# ------------------------------------------------------------------------------ worker process
def build(workload: str, size: Size, data: Path, work: Path, out: Path):
    if workload == "incrementation":
        from example_workflows.incrementation import build_workflow

        return build_workflow(data, size.units, size.iterations, work, out)
    from example_workflows.filtering import build_workflow

    return build_workflow(data, size.units, work, out)


def make_data(workload: str, size: Size, data: Path) -> None:
    if workload == "incrementation":
        from example_workflows.incrementation import make_chunks

        make_chunks(data, size.units, size.unit_mib)
    else:
        from example_workflows.filtering import make_images

        make_images(data, size.units, size.unit_mib)


def worker(args: argparse.Namespace) -> None:
    config = BY_KEY[args.worker]
    wf = build(args.workload, SIZES[args.size], args.data, args.work, args.out)
    wf.config["execution"]["poll_sleep_duration"] = config.poll
    plugin_args = {"n_procs": PROCESSES, **({"sea": config.sea} if config.sea else {})}
    start = time.monotonic()
    wf.run(plugin=config.plugin, plugin_args=plugin_args)
    result = {"makespan": time.monotonic() - start}
    if config.sea:
        result["sea"] = json.loads((args.work / "sea-report.json").read_text())
    args.result.write_text(json.dumps(result))


# ------------------------------------------------------------------------------ parent process
def footprint(*roots: Path) -> tuple[int, int]:
    """(bytes, regular files) under ``roots``, not following links."""
    total = files = 0
    for root in roots:
        for dirpath, _dirs, names in os.walk(root):
            for name in names:
                st = os.lstat(os.path.join(dirpath, name))
                if not os.path.islink(os.path.join(dirpath, name)):
                    total, files = total + st.st_size, files + 1
    return total, files


def same_tree(a: Path, b: Path) -> bool:
    import filecmp

    def files(root: Path) -> set[str]:
        return {str(Path(d, n).relative_to(root)) for d, _, ns in os.walk(root) for n in ns}

    return files(a) == files(b) and all(filecmp.cmp(a / f, b / f, shallow=False) for f in files(a))


def run_one(config: Config, rep: int, args: argparse.Namespace, shared: Path, backing: Path, tmpfs: Path) -> dict:
    name = f"{config.key.replace(chr(39), 'p')}-{rep}"
    work = (tmpfs if config.work_on_tmpfs else shared) / name / "work"
    out = (tmpfs if config.out_on_tmpfs else shared) / name / "out"
    result = tmpfs / f"{name}.json"
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", config.key, "--workload", args.workload,
               "--size", args.size, "--data", str(shared / "data"), "--work", str(work), "--out", str(out), "--result", str(result)]  # fmt: skip
    os.sync()
    proc = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "NIPYPE_NO_ET": "1"}, cwd=tmpfs)
    if proc.returncode != 0:
        raise RuntimeError(f"{config.name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    record = json.loads(result.read_text())
    # count what reached the shared filesystem through its backing directory (no metadata latency)
    on_shared = [backing / name / sub for sub, on_tmp in (("work", config.work_on_tmpfs), ("out", config.out_on_tmpfs)) if not on_tmp]
    record["shared_bytes"], record["shared_files"] = footprint(*on_shared)
    record["out_dir"] = str(out)
    record.update(config=config.key, rep=rep)
    return record


def model_rows(size: Size, workload: str, t_median: float, write_bps: float, read_bps: float) -> dict[str, tuple[float, float]]:
    from sea.model import Bandwidth, TierModel, Workload, predict_sea, predict_shared

    unit = size.unit_mib * 2**20
    nodes = size.iterations if workload == "incrementation" else 3
    w = Workload(
        input_bytes=size.units * unit,
        intermediate_bytes=size.units * nodes * unit,
        output_bytes=size.units * unit,
        last_output_bytes=unit,
        compute_seconds=t_median * PROCESSES,
        processes=PROCESSES,
    )
    shared = Bandwidth(read=read_bps, write=write_bps)
    tmpfs = TierModel("tmpfs", float("inf"), Bandwidth(read=6e9, write=2.5e9))
    a, c = predict_shared(w, shared), predict_sea(w, [tmpfs], shared, live_peak=PROCESSES * 2 * unit)
    return {"A": (a.lower, a.upper), "C": (c.lower, c.upper)}


def report(args: argparse.Namespace, records: list[dict], throttle) -> str:
    size = SIZES[args.size]
    med = {c.key: statistics.median(r["makespan"] for r in records if r["config"] == c.key) for c in CONFIGS}
    rng = {c.key: (min(r["makespan"] for r in records if r["config"] == c.key), max(r["makespan"] for r in records if r["config"] == c.key)) for c in CONFIGS}
    write_bps, read_bps = throttle.write_mbps * 1e6, throttle.read_mbps * 1e6
    unit = size.unit_mib * 2**20
    limit = max(med["T"], size.units * unit / write_bps) + unit / write_bps
    model = model_rows(size, args.workload, med["T"], write_bps, read_bps)
    rows = ["| configuration | median (s) | min–max (s) | speed-up over A | files on shared FS | bytes on shared FS | predicted (s) |", "|:--|--:|--:|--:|--:|--:|--:|"]
    for c in CONFIGS:
        runs = [r for r in records if r["config"] == c.key]
        files = statistics.median(r["shared_files"] for r in runs)
        size_b = statistics.median(r["shared_bytes"] for r in runs)
        pred = model.get(c.key)
        rows.append(
            f"| {c.key} {c.name} | {med[c.key]:.2f} | {rng[c.key][0]:.2f}–{rng[c.key][1]:.2f} | {med['A'] / med[c.key]:.2f}x | "
            f"{files:.0f} | {size_b / 2**20:.1f} MiB | {f'{pred[0]:.1f}–{pred[1]:.1f}' if pred else '–'} |"
        )
    rows.append(f"| L limit (computed) | {limit:.2f} | | {med['A'] / limit:.2f}x | | | |")
    sea_runs = [r for r in records if r["config"] == "C"]
    peak = statistics.median(max(t["peak_bytes"] for t in r["sea"]["tiers"][:-1]) for r in sea_runs)
    files_a = statistics.median(r["shared_files"] for r in records if r["config"] == "A")
    files_c = statistics.median(r["shared_files"] for r in sea_runs)
    targets = [
        ("C at least 5x faster than A", med["A"] / med["C"], ">= 5"),
        ("C within 1.15x of the limit L", med["C"] / limit, "<= 1.15"),
        ("C at least 1.3x faster than B", med["B"] / med["C"], ">= 1.3"),
        ("C' not slower than A", med["A"] / med["C'"], ">= 1.0"),
        ("C creates 10x fewer files on the shared FS than A", files_a / max(files_c, 1), ">= 10"),
    ]
    lines = [
        f"# Busy shared filesystem: {args.workload}, {size.name} size",
        "",
        f"- Date: {time.strftime('%Y-%m-%d %H:%M %Z')}; {os.cpu_count()} CPUs; Linux {os.uname().release}; Python {sys.version.split()[0]}",
        f"- Shared filesystem: benchmarks.slowfs over {SHARED_PARENT}: {throttle.write_mbps:g} MB/s write, "
        f"{throttle.read_mbps:g} MB/s read, {throttle.meta_latency_ms:g} ms per metadata operation, one bucket for all processes",
        f"- Workload: {args.workload}, {size.units} x {size.unit_mib:g} MiB" + (f" x {size.iterations} iterations" if args.workload == "incrementation" else " images, 3 steps") + f"; n_procs={PROCESSES}",
        f"- {args.reps} repetitions, interleaved ({' '.join(c.key for c in CONFIGS)}); outputs of every run compared byte for byte with A's: "
        + ("all identical" if all(r.get("identical", True) for r in records) else "SOME DIFFER"),
        "",
        *rows,
        "",
        "| target | measured | goal |",
        "|:--|--:|--:|",
        *(f"| {name} | {value:.2f} | {goal} |" for name, value, goal in targets),
        "",
        f"Sea's peak tier usage (median): {peak / 2**20:.1f} MiB. Predicted ranges come from `sea.model` "
        "(bandwidth model with compute from T as the second bound).",
        "",
    ]
    return "\n".join(lines)


def plot(records: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [c.key for c in CONFIGS]
    meds = [statistics.median(r["makespan"] for r in records if r["config"] == k) for k in keys]
    lows = [m - min(r["makespan"] for r in records if r["config"] == k) for m, k in zip(meds, keys, strict=True)]
    highs = [max(r["makespan"] for r in records if r["config"] == k) - m for m, k in zip(meds, keys, strict=True)]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar(keys, meds, yerr=[lows, highs], capsize=4, color=["#999", "#777", "#c96", "#3a7", "#7b5", "#36c"])
    ax.set_ylabel("makespan (s), median and min–max")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", choices=["incrementation", "filtering"], default="incrementation")
    parser.add_argument("--size", choices=sorted(SIZES), default="smoke")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results")
    for hidden in ("--worker", "--data", "--work", "--result"):
        parser.add_argument(hidden, help=argparse.SUPPRESS, type=str if hidden == "--worker" else Path)
    args = parser.parse_args(argv)
    if args.worker:
        args.out = Path(args.out)
        worker(args)
        return 0
    sys.path.insert(0, str(REPO_ROOT))
    from benchmarks.slowfs import SlowFS, Throttle

    throttle = Throttle(write_mbps=30, read_mbps=200, meta_latency_ms=5)
    scratch = Path(tempfile.mkdtemp(prefix="busy-bench-", dir=SHARED_PARENT))
    tmpfs = Path(tempfile.mkdtemp(prefix="busy-bench-", dir=TMPFS_PARENT))
    records: list[dict] = []
    try:
        make_data(args.workload, SIZES[args.size], scratch / "backing" / "data")  # written unthrottled, read through the mount
        with SlowFS(scratch / "backing", scratch / "mnt", throttle) as fs:
            for rep in range(1, args.reps + 1):
                reference = None
                for config in CONFIGS:
                    record = run_one(config, rep, args, fs.path, fs.backing, tmpfs)
                    out = Path(record["out_dir"])
                    if reference is None:
                        reference = out  # the first MultiProc run of the repetition
                    else:
                        record["identical"] = same_tree(reference, out)
                    records.append(record)
                    print(f"  rep {rep} {config.key:<3} {config.name:<38} {record['makespan']:7.2f} s  {record['shared_files']} files on the shared FS", flush=True)
                for config in CONFIGS:  # free the space (through the backing directory: no throttle)
                    shutil.rmtree(fs.backing / f"{config.key.replace(chr(39), 'p')}-{rep}", ignore_errors=True)
                    shutil.rmtree(tmpfs / f"{config.key.replace(chr(39), 'p')}-{rep}", ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(tmpfs, ignore_errors=True)
    text = report(args, records, throttle)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"busy-{args.workload}-{args.size}"
    stem.with_suffix(".md").write_text(text)
    stem.with_suffix(".json").write_text(json.dumps(records, indent=1))
    plot(records, stem.with_suffix(".png"), f"{args.workload}, {args.size}: busy shared FS (30 MB/s, 5 ms)")
    print(text)
    return 0 if all(r.get("identical", True) for r in records) else 1


if __name__ == "__main__":
    raise SystemExit(main())
