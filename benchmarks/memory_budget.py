"""RAM tiers are the job's memory: the incrementation workload inside a memory cgroup.

``python -m benchmarks.memory_budget [--out benchmarks/results]``

Under SLURM with cgroups a job's tmpfs pages count against its memory, and past the limit the
kernel's OOM killer kills one of its processes. Each configuration runs the issue's workload
(incrementation, 8 chunks x 64 MiB x 3 iterations, n_procs 2) in a fresh process moved into a fresh
memory cgroup (benchmarks.cgroup; cgroup v1 or v2), side by side in one run, on one busy slowfs
mount standing for the shared filesystem (30 MB/s writes, 200 MB/s reads, 5 ms per metadata
operation):

- MultiProc with its work directory on the shared filesystem (what a careful user does today);
- MultiProc with its work directory on ``/dev/shm`` by hand (what a user does to go faster), at two
  limits;
- SeaMultiProc, tiers ``/dev/shm`` then the local disk, at the same limits, and without a cgroup.

A run that outlives ``--timeout`` is killed and reported as hung. Every run that completes must
write byte-identical outputs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from benchmarks.cgroup import MemoryCgroup, writable_memory_cgroup
from benchmarks.run import REPO_ROOT, describe_machine, tree_digest

MIB = 1 << 20
BUSY = {"write_mbps": 30, "read_mbps": 200, "meta_latency_ms": 5}
WORKLOAD = {"chunks": 8, "chunk_mib": 64, "iterations": 3}
# (name, plugin, where the work directory is, memory limit in MiB or None)
CONFIGS = [
    ("MultiProc, work dir on the shared FS", "MultiProc", "home", 450),
    ("MultiProc, work dir on /dev/shm by hand", "MultiProc", "shm", 700),
    ("MultiProc, work dir on /dev/shm by hand", "MultiProc", "shm", 450),
    ("SeaMultiProc, /dev/shm then local disk", "SeaMultiProc", "sea", 700),
    ("SeaMultiProc, /dev/shm then local disk", "SeaMultiProc", "sea", 450),
    ("SeaMultiProc, /dev/shm then local disk, no cgroup", "SeaMultiProc", "sea", None),
]


def one_run(plugin: str, data: Path, work: Path, out: Path, local: Path | None) -> dict:
    """In the run's own process (inside the cgroup): build, run, time."""
    from example_workflows.incrementation import build_workflow

    wf = build_workflow(data, WORKLOAD["chunks"], WORKLOAD["iterations"], work, out)
    wf.config["execution"]["poll_sleep_duration"] = 0.05
    args: dict = {"n_procs": 2}
    if plugin == "SeaMultiProc":
        args["sea"] = {"tiers": [{"path": "/dev/shm"}, {"path": str(local)}], "progress": "off"}
    start = time.perf_counter()
    wf.run(plugin=plugin, plugin_args=args)
    return {"seconds": time.perf_counter() - start}


def run_all(timeout: float) -> list[dict]:
    from benchmarks.slowfs import SlowFS
    from example_workflows.incrementation import make_chunks

    records = []
    scratch = Path(tempfile.mkdtemp(prefix="sea-bench-memory-", dir="/var/tmp"))
    try:
        with SlowFS(scratch / "backing", scratch / "mnt", **BUSY) as fs:
            data = scratch / "data"  # the inputs: read once, the same for every run
            make_chunks(data, WORKLOAD["chunks"], WORKLOAD["chunk_mib"])
            for i, (name, plugin, where, limit) in enumerate(CONFIGS):
                home = fs.path / f"run{i}"
                out = home / "out"
                work = Path(tempfile.mkdtemp(prefix="sea-bench-work-", dir="/dev/shm")) if where == "shm" else home / "work"
                local = scratch / f"local{i}"
                local.mkdir()
                home.mkdir()
                code = (
                    "import json; from pathlib import Path; from benchmarks.memory_budget import one_run; "
                    f"print(json.dumps(one_run({plugin!r}, Path({str(data)!r}), Path({str(work)!r}), Path({str(out)!r}), Path({str(local)!r}))))"
                )
                record = {"name": name, "plugin": plugin, "limit_mib": limit}
                start = time.perf_counter()
                try:
                    record |= _launch(code, limit, timeout)
                finally:
                    record["wall_seconds"] = time.perf_counter() - start
                    if where == "shm":
                        shutil.rmtree(work, ignore_errors=True)
                if record["outcome"] == "completed":
                    record["outputs"] = tree_digest(fs.backing / f"run{i}" / "out")
                    report = fs.backing / f"run{i}" / "work" / "sea-report.json"
                    if report.exists():
                        sea = json.loads(report.read_text())
                        record["sea_memory"] = sea.get("memory")
                        record["lost_worker_retries"] = sea.get("lost_worker_retries", 0)
                        record["tiers"] = [{"path": t["path"], "peak": t["peak_bytes"], "dirs": t["nodes_placed"]} for t in sea["tiers"]]
                records.append(record)
                print(f"{name:>52} {limit or '-':>5} MiB: {record['outcome']:>9} in {record['wall_seconds']:.1f} s, OOM kills {record['oom_kills']}", flush=True)
                shutil.rmtree(fs.backing / f"run{i}" / "work", ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    digests = {r["outputs"] for r in records if "outputs" in r}
    if len(digests) != 1:
        raise RuntimeError("the outputs of the runs that completed differ")
    return records


def _launch(code: str, limit: int | None, timeout: float) -> dict:
    """Run ``code`` in a fresh process, inside a fresh cgroup of ``limit`` MiB (none: no cgroup)."""
    command = [sys.executable, "-c", code]
    if limit is None:
        done = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, timeout=timeout)
        return _outcome(done, 0, 0)
    with MemoryCgroup(limit * MIB) as cgroup:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT, preexec_fn=cgroup.enter)
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            return {"outcome": "hung", "oom_kills": cgroup.oom_kills(), "cgroup_peak": cgroup.peak(), "error": f"still running after {timeout:.0f} s: killed"}
        return _outcome(subprocess.CompletedProcess(command, process.returncode, stdout, stderr), cgroup.oom_kills(), cgroup.peak())


def _outcome(done: subprocess.CompletedProcess, oom_kills: int, peak: int) -> dict:
    record = {"oom_kills": oom_kills, "cgroup_peak": peak}
    if done.returncode == 0:
        return record | {"outcome": "completed", **json.loads(done.stdout.strip().splitlines()[-1])}
    last = [line for line in done.stderr.strip().splitlines() if line.strip()][-1:] or [f"exit {done.returncode}"]
    return record | {"outcome": "failed" if done.returncode > 0 else "killed", "error": last[0][:200]}


def render_markdown(records: list[dict], machine) -> str:
    lines = [
        f"# RAM tiers and the job's memory: incrementation ({WORKLOAD['chunks']} x {WORKLOAD['chunk_mib']} MiB x {WORKLOAD['iterations']}, n_procs 2) in a memory cgroup",
        "",
        f"One run each, side by side, each in a fresh memory cgroup (tmpfs pages count against it); home on one slowfs mount "
        f"({BUSY['write_mbps']} MB/s writes, {BUSY['read_mbps']} MB/s reads, {BUSY['meta_latency_ms']} ms per metadata operation). "
        f"Machine: {machine.nproc} cores, Python {machine.python}, nipype {machine.nipype}, commit {machine.repo_commit}, {machine.date}.",
        "",
        "| configuration | limit | outcome | seconds | OOM kills | Sea's peak (charged) | RAM tier peak | nodes held / dirs spilled for memory | nodes rerun |",
        "|---|--:|---|--:|--:|--:|--:|--:|--:|",
    ]
    for r in records:
        memory = r.get("sea_memory") or {}
        seconds = r.get("seconds", r["wall_seconds"])
        limit = f"{r['limit_mib']} MiB" if r["limit_mib"] else "none"
        outcome = r["outcome"] + (f" ({r['error']})" if r.get("error") else "")
        peak = f"{memory['peak_charged_bytes'] / MIB:.0f} MiB" if memory else "-"
        ram = f"{memory['ram_peak_bytes'] / MIB:.0f} MiB" if memory else "-"
        held = f"{memory['nodes_held']} / {memory['spills']}" if memory else "-"
        lines.append(f"| {r['name']} | {limit} | {outcome} | {seconds:.1f} | {r['oom_kills']} | {peak} | {ram} | {held} | {r.get('lost_worker_retries', '-')} |")
    lines += ["", "Outputs of every run that completed: byte-identical.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory_budget", description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--out", default=str(REPO_ROOT / "benchmarks" / "results"), help="directory for memory-budget.md and .json")
    parser.add_argument("--timeout", type=float, default=300, help="seconds after which a run is killed and reported as hung")
    args = parser.parse_args(argv)
    reason = writable_memory_cgroup()
    if reason is not None:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    machine = describe_machine()
    records = run_all(args.timeout)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "memory-budget.json").write_text(json.dumps({"machine": asdict(machine), "records": records}, indent=1) + "\n")
    (out / "memory-budget.md").write_text(render_markdown(records, machine))
    print(f"results: {out / 'memory-budget.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
