"""An fMRIPrep-shaped graph, ~300 nodes per subject with mixed sizes, on the busy filesystem.

``python -m benchmarks.fmriprep_shaped --size smoke|part|full [--out benchmarks/results]``

fMRIPrep builds one workflow per participant and adds them to one top workflow; per subject an
anatomical branch (a chain of ~2 MB images, a MapNode over tissues, small reports) and, per BOLD
run, a chain of ~4 MB series, a fan of ~30 small confound nodes merged into one table, a few small
reports and a sink writing the run's derivatives. This module builds that shape from Function
nodes that read their inputs whole and write deterministic bytes of a given size: 300 nodes per
subject (6 runs). Its cost is the scheduler's at fMRIPrep's size plus what the shared filesystem
makes of many intermediates: the same machine's measure of issue 19 (a loop whose cost follows the
graph) and of Sea's reason to exist (intermediates on a fast tier, only derivatives home).

MultiProc (poll 0.05 s) and SeaMultiProc (tier /dev/shm, sinks staged) run side by side, each in a
fresh process, on one busy mount (30 MB/s writes, 200 MB/s reads, 5 ms per metadata operation);
the derivatives of both must be byte-identical.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from benchmarks.run import REPO_ROOT, describe_machine, footprint, tree_digest

SIZES = {"smoke": (1, 1), "part": (10, 6), "full": (20, 6)}  # (subjects, BOLD runs per subject)
PLUGINS = ("MultiProc", "SeaMultiProc")
BUSY = {"write_mbps": 30, "read_mbps": 200, "meta_latency_ms": 5}
MIB = 1 << 20
CONFOUNDS = 30  # small nodes per run, merged into one table


def step(in_files, size: int, tag: str):
    """Read every input whole, write ``size`` bytes derived from them and ``tag`` to ``<tag>.bin``
    (named after the tag: a sink gathers several nodes' files in one folder)."""
    import hashlib
    import os

    digest = hashlib.sha256(tag.encode())
    for path in in_files if isinstance(in_files, list) else [in_files]:
        if path:
            with open(path, "rb") as fh:
                while chunk := fh.read(1 << 20):
                    digest.update(chunk[:64])
    seed = digest.digest()
    out = os.path.abspath(tag.replace("/", "_") + ".bin")
    with open(out, "wb") as fh:
        fh.write((seed * (size // len(seed) + 1))[:size])
    return out


def _node(name: str, size: int, tag: str):
    from nipype import Function, Node

    node = Node(Function(input_names=["in_files", "size", "tag"], output_names=["out_file"], function=step), name=name)
    node.inputs.size, node.inputs.tag = size, tag
    return node


def subject_workflow(subject: str, runs: int, raw: Path, derivatives: Path):
    """One participant's workflow: 300 nodes with 6 runs (18 anatomical, 46 per run, 6 of the subject's)."""
    from nipype import DataSink, Function, MapNode, Node, Workflow
    from nipype.interfaces.utility import Merge

    wf = Workflow(name=f"sub_{subject}_wf")
    previous = _node("anat_source", 2 * MIB, f"{subject}/anat")
    previous.inputs.in_files = str(raw / f"sub-{subject}_T1w.bin")
    for i in range(1, 12):
        node = _node(f"anat_{i:02d}", 2 * MIB, f"{subject}/anat/{i}")
        wf.connect(previous, "out_file", node, "in_files")
        previous = node
    anat = previous
    tissues = MapNode(Function(input_names=["in_files", "size", "tag"], output_names=["out_file"], function=step), iterfield=["tag"], name="tissues")
    tissues.inputs.size, tissues.inputs.tag = 512 * 1024, [f"{subject}/{t}" for t in ("gm", "wm", "csf")]
    wf.connect(anat, "out_file", tissues, "in_files")
    for i in range(5):
        wf.connect(anat, "out_file", _node(f"anat_report_{i}", 16 * 1024, f"{subject}/anat_report/{i}"), "in_files")
    for r in range(runs):
        previous = _node(f"bold_{r}_source", 4 * MIB, f"{subject}/bold/{r}")
        previous.inputs.in_files = str(raw / f"sub-{subject}_run-{r}_bold.bin")
        chain = [previous]
        for i in range(1, 8):
            node = _node(f"bold_{r}_{i:02d}", 4 * MIB, f"{subject}/bold/{r}/{i}")
            wf.connect(previous, "out_file", node, "in_files")
            previous = node
            chain.append(node)
        merged = Node(Merge(CONFOUNDS), name=f"bold_{r}_confounds_in")
        for c in range(CONFOUNDS):
            confound = _node(f"bold_{r}_confound_{c:02d}", 8 * 1024, f"{subject}/bold/{r}/confound/{c}")
            wf.connect(chain[4], "out_file", confound, "in_files")
            wf.connect(confound, "out_file", merged, f"in{c + 1}")
        table = _node(f"bold_{r}_confounds", 64 * 1024, f"{subject}/bold/{r}/confounds")
        wf.connect(merged, "out", table, "in_files")
        for i in range(5):
            wf.connect(previous, "out_file", _node(f"bold_{r}_report_{i}", 16 * 1024, f"{subject}/bold/{r}/report/{i}"), "in_files")
        sink = Node(DataSink(base_directory=str(derivatives), parameterization=False), name=f"bold_{r}_sink")
        wf.connect(previous, "out_file", sink, f"sub-{subject}.@bold{r}")
        wf.connect(table, "out_file", sink, f"sub-{subject}.@confounds{r}")
    for i in range(5):
        wf.connect(anat, "out_file", _node(f"subject_report_{i}", 16 * 1024, f"{subject}/report/{i}"), "in_files")
    anat_sink = Node(DataSink(base_directory=str(derivatives), parameterization=False), name="anat_sink")
    wf.connect(anat, "out_file", anat_sink, f"sub-{subject}.@anat")
    return wf


def make_raw(raw: Path, subjects: list[str], runs: int) -> None:
    raw.mkdir(parents=True, exist_ok=True)
    for subject in subjects:
        (raw / f"sub-{subject}_T1w.bin").write_bytes(hashlib.sha256(subject.encode()).digest() * (2 * MIB // 32))
        for r in range(runs):
            (raw / f"sub-{subject}_run-{r}_bold.bin").write_bytes(hashlib.sha256(f"{subject}{r}".encode()).digest() * (4 * MIB // 32))


def build(n_subjects: int, runs: int, raw: Path, work: Path, derivatives: Path):
    from nipype import Workflow

    subjects = [f"{i:02d}" for i in range(1, n_subjects + 1)]
    make_raw(raw, subjects, runs)
    top = Workflow(name="fmriprep_wf", base_dir=str(work))
    top.add_nodes([subject_workflow(s, runs, raw, derivatives) for s in subjects])
    top.config["execution"]["poll_sleep_duration"] = 0.05
    return top


def one_run(plugin: str, n_subjects: int, runs: int, root: Path) -> dict:
    """In the worker process: build, run, time; ``root`` is on the busy mount."""
    wf = build(n_subjects, runs, root / "raw", root / "work", root / "derivatives")
    args = {"n_procs": 2}
    if plugin == "SeaMultiProc":
        args["sea"] = {"tiers": [{"path": "/dev/shm"}], "sinks": ["DataSink"], "progress": "off"}
    start = time.perf_counter()
    graph = wf.run(plugin=plugin, plugin_args=args)
    return {"seconds": time.perf_counter() - start, "nodes": graph.number_of_nodes()}


def run_all(size: str) -> list[dict]:
    from benchmarks.slowfs import SlowFS

    n_subjects, runs = SIZES[size]
    records = []
    scratch = Path(tempfile.mkdtemp(prefix="sea-bench-fmriprep-", dir="/var/tmp"))
    try:
        with SlowFS(scratch / "backing", scratch / "mnt", **BUSY) as fs:
            for plugin in PLUGINS:
                root = fs.path / plugin
                root.mkdir()
                code = f"import json; from pathlib import Path; from benchmarks.fmriprep_shaped import one_run; print(json.dumps(one_run({plugin!r}, {n_subjects}, {runs}, Path({str(root)!r}))))"
                done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT)
                if done.returncode != 0:
                    raise RuntimeError(f"{plugin} failed:\n{done.stderr[-3000:]}")
                record = {"plugin": plugin, "subjects": n_subjects, "runs": runs, **json.loads(done.stdout.strip().splitlines()[-1])}
                backing = fs.backing / plugin
                record["bytes_home"], record["files_home"], _ = footprint(backing / "work", backing / "derivatives")
                record["derivatives"] = tree_digest(backing / "derivatives")
                records.append(record)
                print(f"{plugin:>13} {record['nodes']} nodes: {record['seconds']:.1f} s, {record['files_home']} files home", flush=True)
                shutil.rmtree(backing / "work", ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if len({r["derivatives"] for r in records}) != 1:
        raise RuntimeError("the derivatives differ between MultiProc and SeaMultiProc")
    return records


def render_markdown(size: str, records: list[dict], machine) -> str:
    by = {r["plugin"]: r for r in records}
    mp, sea = by["MultiProc"], by["SeaMultiProc"]
    return "\n".join(
        [
            f"# An fMRIPrep-shaped graph on the busy filesystem, {size}: {mp['subjects']} subjects x {mp['runs']} BOLD runs, {sea['nodes']} nodes",
            "",
            f"One run each, side by side, n_procs 2, on one slowfs mount ({BUSY['write_mbps']} MB/s writes, {BUSY['read_mbps']} MB/s reads, "
            f"{BUSY['meta_latency_ms']} ms per metadata operation); SeaMultiProc's tier /dev/shm, DataSinks staged. Machine: {machine.nproc} cores, "
            f"Python {machine.python}, nipype {machine.nipype}, commit {machine.repo_commit}, {machine.date}. Derivatives byte-identical.",
            "",
            "| plugin | nodes | seconds | ms/node | files on the shared FS | bytes on the shared FS |",
            "|---|--:|--:|--:|--:|--:|",
            *[
                f"| {r['plugin']} | {r['nodes']:,} | {r['seconds']:.1f} | {1000 * r['seconds'] / r['nodes']:.1f} | {r['files_home']:,} | {r['bytes_home'] / MIB:.0f} MiB |"
                for r in records
            ],
            "",
            f"SeaMultiProc is {mp['seconds'] / sea['seconds']:.2f}x faster and writes {mp['files_home'] / max(sea['files_home'], 1):.1f}x fewer files.",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fmriprep_shaped", description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="smoke", help="smoke: 1 subject, 1 run; part: 10 subjects; full: 20 subjects (6 runs each)")
    parser.add_argument("--out", default=str(REPO_ROOT / "benchmarks" / "results"), help="directory for fmriprep-shaped-<size>.md and .json")
    args = parser.parse_args(argv)
    machine = describe_machine()
    records = run_all(args.size)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"fmriprep-shaped-{args.size}.json").write_text(json.dumps({"machine": asdict(machine), "records": records}, indent=1) + "\n")
    (out / f"fmriprep-shaped-{args.size}.md").write_text(render_markdown(args.size, records, machine))
    print(f"results: {out / f'fmriprep-shaped-{args.size}.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
