"""The side-by-side benchmark: what users run today against Sea, on a busy and an unloaded shared filesystem.

``python -m benchmarks.run --size smoke|full [--reps 3] [--throttles busy,unloaded]
[--workloads incrementation,filtering] [--configs A2,A,B,C,CN,C',CP,T,S,P,PS,PSP] [--out benchmarks/results]``

For each shared-filesystem throttle (``busy``: ``benchmarks.slowfs`` at 30 MB/s write, 200 MB/s read,
5 ms per metadata operation, mounted afresh for each workload, in its page cache mode for dwi_mrtrix,
whose MRtrix3 tools memory-map their images; ``unloaded``: the bare local disk) and each workload
(incrementation, data-intensive; filtering, real scipy compute per node), the configurations run interleaved,
each repetition starting one further on (A2 A B C C' T S, A B C C' T S A2, ...), each a fresh process in
fresh directories, outputs compared byte for byte with A's:

* A2 MultiProc with Nipype's default 2 s poll, work dir and DataSink on the shared filesystem;
* A  the same, poll tuned to 0.05 s: the fair best MultiProc;
* B  MultiProc with the work dir on tmpfs by hand (``-w $SLURM_TMPDIR``), DataSink on the shared
  filesystem: what careful users do today (it loses resume, and fails when tmpfs fills);
* C  SeaMultiProc, home on the shared filesystem, tiers /dev/shm then the local disk, its defaults:
  ``checkpoints: auto`` (node directories costly to recompute are copied home too) and ``prefetch:
  auto`` (input files copied ahead once the shared filesystem proves slow to read); C0 is C with
  ``prefetch: false``, C before that default (issue 20, not in the default run);
* CN SeaMultiProc with ``checkpoints: none`` (only declared outputs go home);
* C' SeaMultiProc with ``checkpoints: all`` (``keep_intermediates: true``, the seeds' flush-all);
* CP SeaMultiProc with ``prefetch: true``: the input files (on the shared filesystem) copied to the
  tier ahead of the nodes reading them;
* T  MultiProc with everything on tmpfs (nothing on the shared filesystem);
* S  SeaMultiProc with everything on tmpfs (its tier a tmpfs mounted for the benchmark): Sea's own cost;
* P  Pydra 1.0 with its cf worker, cache_root on the shared filesystem (incrementation only);
* PS Pydra with SeaWorker, same tiers as C; P, PS and PSP outputs are compared with P's;
* PSP PS with ``prefetch: true``;
* PD P, with the workflow's outputs ``fsync``'ed inside the timing (Sea makes them durable before a
  run returns, cf does not); PSN PS with ``checkpoints: none``; PSV PS and CV C with
  ``logical_paths: false`` (no view: what running each node at its home path costs); PSB PS with ``backpressure: false``
  (issue 20's, not in the default run);
* L  (computed, busy only) the limit: max(T, declared output bytes at the throttled bandwidth) plus
  the last output's flush.

Why it is built this way: interleaving spreads a slow drift of the machine over every configuration;
a fresh process per run shares no page cache entry, import or Nipype cache with the previous one
(``os.sync()`` runs before each run so its writeback does not land in the next; a virtual disk may
still be absorbing it, hence a pause of a second at full size, and the shifted order); the worker is
started by this file's path, not ``-m``, so ``sea`` and ``nipype_sea`` both come from the installed
package (``pip install .`` to benchmark working-tree changes). Results: ``<out>/<size>.md``, ``.json``
and ``.png``; the model's predictions (``sea.model``) are printed next to the measured medians.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import filecmp
import hashlib
import json
import os
import platform
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from importlib import metadata
from pathlib import Path

if __package__ in (None, ""):  # started by path as a worker: `benchmarks` from here, last, so that
    sys.path.append(str(Path(__file__).resolve().parent.parent))  # sea and the examples stay the installed ones

from benchmarks.matrix import (  # noqa: E402
    BY_KEY,
    DEFAULT_CONFIGURATIONS,
    EXTRA_WORKLOADS,
    PROCESSES,
    SHARED_PARENT,
    SIZES,
    STARTED,
    THROTTLES,
    TMPFS_PARENT,
    WORKLOADS,
    Configuration,
    Size,
    Throttle,
    build_workflow,
    make_inputs,
    record_start,
    sea_tiers,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
# Not "sea-": that prefix is Sea's own private directories, which people sweep with rm -rf /dev/shm/sea-*
SCRATCH_PREFIX = "sea-bench-run-"
SEA_OWNER_FILE = ".sea-owner"


# ---------------------------------------------------------------------------------- records
@dataclass
class RunRecord:
    """One run of one configuration, as stored in the JSON file."""

    throttle: str
    workload: str
    config: str
    repetition: int
    makespan_seconds: float  # wall time of workflow.run() in the worker, Sea's final flush included
    process_seconds: float  # the whole worker process, interpreter start-up included
    shared_bytes: int  # regular files left on the shared filesystem (work dir and DataSink dir)
    shared_files: int
    shared_symlinks: int
    output_files: int
    identical_to_a: bool | None = None  # None for the reference run itself
    differences: list[str] = field(default_factory=list)
    sea: dict | None = None  # Sea's report, without its timeline
    sea_leftovers: list[str] = field(default_factory=list)


@dataclass
class Machine:
    date: str
    kernel: str
    nproc: int
    ram_bytes: int
    python: str
    nipype: str
    sea_workflows: str
    repo_commit: str
    load_average_start: tuple[float, float, float]
    load_average_end: tuple[float, float, float] | None = None


def describe_machine() -> Machine:
    import psutil

    try:
        git = ["git", "-C", str(REPO_ROOT)]
        commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        if subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True).stdout.strip():
            commit += " (with uncommitted changes)"
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return Machine(
        date=dt.datetime.now(dt.timezone.utc).astimezone().isoformat(timespec="seconds"),
        kernel=platform.release(),
        nproc=len(os.sched_getaffinity(0)),
        ram_bytes=psutil.virtual_memory().total,
        python=platform.python_version(),
        nipype=metadata.version("nipype"),
        sea_workflows=metadata.version("sea-workflows"),
        repo_commit=commit,
        load_average_start=os.getloadavg(),
    )


# ---------------------------------------------------------------------------------- worker process
def chosen_size(args: argparse.Namespace) -> Size:
    if getattr(args, "size_spec", None):  # a worker process: the size its orchestrator runs, whole
        return Size(**json.loads(args.size_spec))
    size = SIZES[args.size]
    return replace(size, units=args.units) if args.units else size


def worker(args: argparse.Namespace) -> None:
    """Run one configuration once in this fresh process; write what only the process knows."""
    config, size = BY_KEY[args.worker], chosen_size(args)
    if config.engine == "pydra":
        return pydra_worker(args, config, size)
    wf = build_workflow(args.workload, size, args.data, args.work, args.out, **json.loads(args.params or "{}"))
    wf.config["execution"]["poll_sleep_duration"] = config.poll
    plugin_args: dict = {"n_procs": PROCESSES}
    if args.count:  # the nodes this run executes (sent to a worker process), one per line
        os.environ[STARTED] = str(args.count)
        plugin_args["status_callback"] = record_start
    if config.sea:
        plugin_args["sea"] = {"tiers": json.loads(args.tiers), "checkpoints": config.checkpoints, "checkpoint_factor": config.checkpoint_factor,
                              "prefetch": config.prefetch, "backpressure": config.backpressure, "logical_paths": config.logical_paths,
                              "sinks": ["DataSink", "DerivativesDataSink"]}  # fmt: skip
    start = time.monotonic()
    wf.run(plugin=config.plugin, plugin_args=plugin_args)
    result: dict = {"makespan_seconds": time.monotonic() - start}
    if config.sea:
        report = json.loads((args.work / "sea-report.json").read_text())
        report.pop("timeline", None)
        result["sea"] = report
    args.result.write_text(json.dumps(result))


def pydra_worker(args: argparse.Namespace, config: Configuration, size: Size) -> None:
    from pydra.engine.submitter import Submitter

    from example_workflows.incrementation import make_chunks
    from example_workflows.incrementation.pydra_workflow import Incrementation

    chunks = make_chunks(args.data, size.units, size.unit_mib)  # already there: only lists them
    options = {"sea": {"tiers": json.loads(args.tiers), "prefetch": config.prefetch, "checkpoints": config.checkpoints,
                        "backpressure": config.backpressure, "logical_paths": config.logical_paths}} if config.sea else {}
    start = time.monotonic()
    with Submitter(worker=config.plugin, cache_root=args.work, n_procs=PROCESSES, **options) as submitter:
        result = submitter(Incrementation(in_files=chunks, iterations=size.iterations))
    if config.durable_outputs and not result.errored:
        make_durable([Path(p) for p in result.outputs.out_files])
    measured: dict = {"makespan_seconds": time.monotonic() - start}
    if result.errored:
        raise SystemExit(f"the Pydra workflow failed; see {args.work}")
    args.out.mkdir(parents=True)
    for path in result.outputs.out_files:
        shutil.copyfile(path, args.out / Path(path).name)
    if config.sea:
        report = json.loads((args.work / "sea-report.json").read_text())
        report.pop("timeline", None)
        measured["sea"] = report
    args.result.write_text(json.dumps(measured))


def make_durable(paths: list[Path]) -> None:
    """``fsync`` of each file and of each directory holding one, as Sea's copies home are made durable."""
    from sea.durable import fsync_dir

    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    for directory in {p.parent for p in paths}:
        fsync_dir(directory)


def pydra_available() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("pydra.compose") is not None
    except ImportError:
        return False


# ---------------------------------------------------------------------------------- measuring
def footprint(*roots: Path) -> tuple[int, int, int]:
    """(bytes, regular files, symlinks) under ``roots``, never following a link. Hard links to
    one file count once: they take no more room or inodes (Pydra links a workflow's outputs into
    its directory)."""
    size = files = links = 0
    seen: set[tuple[int, int]] = set()
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:  # a link to a directory is listed with the directories
                st = os.lstat(os.path.join(dirpath, name))
                if stat.S_ISLNK(st.st_mode):
                    links += 1
                elif stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    files, size = files + 1, size + st.st_size
    return size, files, links


def tree_digest(root: Path) -> str:
    """One hash of the files under ``root``: their paths and bytes."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def relative_files(root: Path) -> set[str]:
    return {os.path.relpath(os.path.join(d, n), root) for d, _, names in os.walk(root) for n in names}


def compare_outputs(reference: Path, candidate: Path) -> list[str]:
    """Why ``candidate`` differs from ``reference`` (missing, extra or different files); [] if identical."""
    expected, got = relative_files(reference), relative_files(candidate)
    problems = [f"missing {p}" for p in sorted(expected - got)] + [f"extra {p}" for p in sorted(got - expected)]
    problems += [f"differs {p}" for p in sorted(expected & got) if not filecmp.cmp(reference / p, candidate / p, shallow=False)]
    return problems


def remove_sea_leftovers(tier_roots: list[Path], under: Path) -> list[str]:
    """Remove private directories Sea left on a tier for a home in ``under`` (a leak worth reporting,
    or the trace of a run we killed); other runs' directories are not touched."""
    removed = []
    for tier_root in tier_roots:
        for candidate in tier_root.glob("sea-*"):
            try:
                home = Path((candidate / SEA_OWNER_FILE).read_text().split(" ", 2)[2].strip())
            except (OSError, IndexError):
                continue
            if home == under or under in home.parents:
                shutil.rmtree(candidate, ignore_errors=True)
                removed.append(str(candidate))
    return removed


# ---------------------------------------------------------------------------------- running
class WorkerFailed(RuntimeError):
    pass


@dataclass
class Stage:
    """Where one throttle's runs happen: ``shared`` is what the workflows see (the FUSE mount when
    throttled), ``backing`` the same tree without the throttle (to count and clean for free)."""

    throttle: Throttle
    shared: Path
    backing: Path
    tmpfs: Path  # scratch on /dev/shm
    fast_tmpfs: Path  # S's tier
    logs: Path


def run_dirs(stage: Stage, config: Configuration, name: str) -> tuple[Path, Path]:
    """(work, out) of the run ``name``: on the shared filesystem, or on tmpfs for the configurations that put them there."""
    work = (stage.tmpfs if config.work_on_tmpfs else stage.shared) / name / "work"
    out = (stage.tmpfs if config.out_on_tmpfs else stage.shared) / name / "out"
    return work, out


def launch(
    stage: Stage, workload: str, size: Size, config: Configuration, name: str, params: dict | None = None, kill_after: float | None = None
) -> tuple[dict | None, float]:
    """Run the worker process for the run ``name`` (its directories as they are: fresh, or left by
    an earlier run of it); (what it measured, seconds of the whole process). ``params``: the
    workload's parameters; ``kill_after``: SIGKILL it after that many seconds (a wall time), unless
    it ended first: what it measured is then only the nodes it started (``executed``)."""
    work, out = run_dirs(stage, config, name)
    result = stage.logs / f"{stage.throttle.name}-{name}.json"
    log = stage.logs / f"{stage.throttle.name}-{name}.log"
    result.unlink(missing_ok=True)
    count = stage.logs / f"{stage.throttle.name}-{name}.started"  # not on the shared filesystem: no throttle
    count.unlink(missing_ok=True)
    command = [
        sys.executable, str(Path(__file__).resolve()), "--worker", config.key, "--workload", workload, "--size", size.name, "--size-spec", json.dumps(asdict(size)),
        "--data", str(stage.shared / workload), "--work", str(work), "--out", str(out), "--result", str(result),
        "--tiers", json.dumps(sea_tiers(config, stage.throttle, stage.fast_tmpfs)), "--params", json.dumps(params or {}),
        "--count", str(count),
    ]  # fmt: skip
    os.sync()  # the previous run's writeback must not land inside this run's timing
    time.sleep(size.settle_seconds)  # os.sync() returns before a virtual disk has absorbed it (see run_workload)
    start = time.monotonic()
    timeout = size.timeout_seconds if kill_after is None else kill_after
    with open(log, "ab") as log_file:
        env = dict(os.environ, NIPYPE_NO_ET="1")  # no version check over the network inside the timing
        process = subprocess.Popen(command, cwd=stage.tmpfs, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = process.wait(timeout=timeout)
        except BaseException as error:  # the timeout (or the kill asked for), or Ctrl-C: take its process pool down with it
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            if not isinstance(error, subprocess.TimeoutExpired):
                raise
            code = None
    process_seconds = time.monotonic() - start
    executed = count.read_text().split() if count.exists() else []
    if kill_after is not None and code is None:
        return {"executed": executed}, process_seconds
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        why = f"timed out after {size.timeout_seconds:.0f} s" if code is None else f"exit {code}"
        raise WorkerFailed(f"{stage.throttle.name}/{workload}/{config.key} ({config.name}) failed ({why}); its log ends:\n{tail}")
    measured = json.loads(result.read_text())
    measured["executed"] = executed
    return measured, process_seconds


def run_one(stage: Stage, workload: str, size: Size, config: Configuration, repetition: int) -> tuple[RunRecord, str]:
    """One run in fresh directories; returns its record and its run name (the caller cleans it)."""
    name = f"{workload}-{config.file_key}-{repetition}"
    measured, process_seconds = launch(stage, workload, size, config, name)
    return record_of(stage, workload, config, repetition, name, measured, process_seconds), name


def record_of(stage: Stage, workload: str, config: Configuration, repetition: int, name: str, measured: dict, process_seconds: float) -> RunRecord:
    """What the run ``name`` measured, and left on the shared filesystem."""
    work, out = run_dirs(stage, config, name)
    tiers = sea_tiers(config, stage.throttle, stage.fast_tmpfs)
    leftovers = remove_sea_leftovers([Path(t["path"]) for t in tiers], work) if config.sea else []
    # count what reached the shared filesystem through its backing directory: no metadata latency
    on_shared = [
        stage.backing / name / sub for sub, on_tmpfs in (("work", config.work_on_tmpfs), ("out", config.out_on_tmpfs)) if not on_tmpfs
    ]
    size_b, files, links = footprint(*on_shared)
    record = RunRecord(
        throttle=stage.throttle.name,
        workload=workload,
        config=config.key,
        repetition=repetition,
        makespan_seconds=measured["makespan_seconds"],
        process_seconds=process_seconds,
        shared_bytes=size_b,
        shared_files=files,
        shared_symlinks=links,
        output_files=len(relative_files(out)),
        sea=measured.get("sea"),
        sea_leftovers=leftovers,
    )
    return record


def progress_line(record: RunRecord) -> str:
    config = BY_KEY[record.config]
    line = f"  {record.throttle:<8} {record.workload:<14} rep {record.repetition} {config.key:<3} {config.name:<36} {record.makespan_seconds:7.2f} s"
    line += f"  {record.shared_files:4d} files on the shared FS"
    if record.identical_to_a is not None:
        line += "  outputs identical to the reference's" if record.identical_to_a else "  OUTPUTS DIFFER from the reference's"
    return line


def run_workload(stage: Stage, workload: str, size: Size, reps: int, configs: list[Configuration]) -> list[RunRecord]:
    make_inputs(workload, size, stage.backing / workload)  # written unthrottled, read through the mount
    records = []
    try:
        runnable = [c for c in configs if c.engine != "pydra" or workload == "incrementation"]  # Pydra's: incrementation only
        for repetition in range(1, reps + 1):
            names, outs = [], {}
            try:
                # each repetition starts one configuration further on: a run pays for the writeback the
                # run before it left (os.sync() returns before a virtual disk has absorbed it: a cf run
                # after one that wrote 1.3 GB measured 3.6 s instead of 2.3 s), so no configuration
                # always follows the same one
                shift = (repetition - 1) % len(runnable)
                for config in runnable[shift:] + runnable[:shift]:
                    record, name = run_one(stage, workload, size, config, repetition)
                    names.append(name)
                    outs[config.key] = (record, (stage.tmpfs if config.out_on_tmpfs else stage.backing) / name / "out")
                    print(progress_line(record), flush=True)
                references = {}  # A's for Nipype, P's for Pydra (their layouts differ): the first of each engine in configs
                for config in runnable:
                    record, out = outs[config.key]
                    if config.engine not in references:
                        references[config.engine] = out
                    else:
                        record.differences = compare_outputs(references[config.engine], out)
                        record.identical_to_a = not record.differences
                        if record.differences:
                            print(f"  {config.key}: OUTPUTS DIFFER from the reference's", flush=True)
                    records.append(record)
            finally:
                for name in names:  # through the backing directory: no throttle
                    shutil.rmtree(stage.backing / name, ignore_errors=True)
                    shutil.rmtree(stage.tmpfs / name, ignore_errors=True)
    finally:
        shutil.rmtree(stage.backing / workload, ignore_errors=True)
    return records


def mount_tmpfs(path: Path) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8g,mode=0755", "sea-bench", str(path)], capture_output=True).returncode == 0


@contextlib.contextmanager
def scratch_space(configs: list[Configuration]):
    """The benchmark's scratch directories (on the shared filesystem's disk and on /dev/shm) and S's
    tmpfs; (scratch, tmpfs, fast tmpfs, the configurations that can run); all removed at the end."""
    scratch = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=SHARED_PARENT))
    tmpfs = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=TMPFS_PARENT))
    fast = scratch / "fast-tmpfs"
    mounted = any(c.sea == "fast" for c in configs) and mount_tmpfs(fast)
    if not mounted and any(c.sea == "fast" for c in configs):
        print("  (could not mount a tmpfs for S: not root? S is left out)", flush=True)
        configs = [c for c in configs if c.sea != "fast"]
    (scratch / "logs").mkdir()
    try:
        yield scratch, tmpfs, fast, configs
    finally:
        if mounted:
            subprocess.run(["umount", str(fast)], check=False)
        remove_sea_leftovers([TMPFS_PARENT, SHARED_PARENT], scratch)
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(tmpfs, ignore_errors=True)


@contextlib.contextmanager
def staged(scratch: Path, tmpfs: Path, fast: Path, throttle: Throttle, workload: str):
    """The shared filesystem of one throttle for one workload: a slowfs mount of its own when
    throttled (dwi_mrtrix's in the page cache mode: MRtrix3 maps its images), else the bare disk."""
    from benchmarks.slowfs import SlowFS
    from benchmarks.slowfs import Throttle as SlowThrottle

    backing = scratch / throttle.name / "backing"
    backing.mkdir(parents=True, exist_ok=True)
    if throttle.throttled:
        with SlowFS(backing, scratch / throttle.name / "mnt", SlowThrottle(**throttle.slowfs_settings(workload))) as fs:
            yield Stage(throttle, fs.path, fs.backing, tmpfs, fast, scratch / "logs")
    else:
        yield Stage(throttle, backing, backing, tmpfs, fast, scratch / "logs")


def run_matrix(size: Size, reps: int, throttles: list[Throttle], workloads: list[str], configs: list[Configuration]) -> list[RunRecord]:
    records: list[RunRecord] = []
    with scratch_space(configs) as (scratch, tmpfs, fast, configs):
        for throttle in throttles:
            for workload in workloads:
                with staged(scratch, tmpfs, fast, throttle, workload) as stage:
                    records += run_workload(stage, workload, size, reps, configs)
    return records


def _raise_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)  # so the finally clauses unmount and remove the scratch directories


def selection(text: str, known, what: str) -> list[str]:
    chosen = [item.strip() for item in text.split(",") if item.strip()]
    unknown = [item for item in chosen if item not in known]
    if unknown or not chosen:
        raise SystemExit(f"unknown {what} {', '.join(unknown) or '(none given)'}; choose from {', '.join(known)}")
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="smoke", help="smoke: seconds per run, for CI; full: the issue's size")
    parser.add_argument("--units", type=int, help="chunks or subjects, instead of the size's (full: 8)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions of each configuration (default 3)")
    parser.add_argument("--throttles", default="busy,unloaded", help=f"comma-separated, from {', '.join(THROTTLES)} (default: busy,unloaded)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated, from {', '.join(WORKLOADS + EXTRA_WORKLOADS)}")
    parser.add_argument("--configs", default=",".join(DEFAULT_CONFIGURATIONS), help=f"comma-separated, from {', '.join(BY_KEY)} (A is the reference)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results", help="where <size>.md, .json and .png go")
    internal = parser.add_argument_group("internal: one run in a worker process")
    for name in ("--worker", "--workload", "--data", "--work", "--result", "--tiers", "--params", "--count", "--size-spec"):
        internal.add_argument(name, help=argparse.SUPPRESS, type=str if name in ("--worker", "--workload", "--tiers", "--params", "--size-spec") else Path)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    if args.reps < 1:
        parser.error("--reps must be at least 1")
    if args.units is not None and args.units < 1:
        parser.error("--units must be at least 1")
    throttles = [THROTTLES[t] for t in selection(args.throttles, THROTTLES, "throttle")]
    workloads = selection(args.workloads, WORKLOADS + EXTRA_WORKLOADS, "workload")
    configs = [BY_KEY[c] for c in selection(args.configs, BY_KEY, "configuration")]
    configs.sort(key=lambda c: (c.engine, c.key not in ("A", "P")))  # A (P) first: the others are compared with it
    if any(c.engine == "pydra" for c in configs) and not pydra_available():
        print("  (Pydra 1.0 is not installed: P, PS and PSP are left out)", flush=True)
        configs = [c for c in configs if c.engine != "pydra"]

    from benchmarks.tables import plot, render_markdown

    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    size = chosen_size(args)
    machine = describe_machine()
    print(
        f"Benchmark, {size.name} size, {args.reps} repetitions: {', '.join(t.name for t in throttles)} x {', '.join(workloads)} x {' '.join(c.key for c in configs)}",
        flush=True,
    )
    try:
        records = run_matrix(size, args.reps, throttles, workloads, configs)
    except WorkerFailed as error:
        print(f"benchmark failed: {error}", file=sys.stderr)
        return 2
    machine.load_average_end = os.getloadavg()
    markdown = render_markdown(size, args.reps, machine, throttles, workloads, records)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / size.name
    stem.with_suffix(".md").write_text(markdown)
    raw = {"size": asdict(size), "repetitions": args.reps, "n_procs": PROCESSES, "machine": asdict(machine),
           "throttles": [asdict(t) for t in throttles], "configurations": [asdict(c) for c in configs], "runs": [asdict(r) for r in records]}  # fmt: skip
    stem.with_suffix(".json").write_text(json.dumps(raw, indent=1) + "\n")
    plot(records, throttles, workloads, stem.with_suffix(".png"))
    print()
    print(markdown)
    print(f"Written: {stem}.md, .json and .png")
    if any(r.identical_to_a is False for r in records):
        print("FAILED: some outputs differ from A's", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
