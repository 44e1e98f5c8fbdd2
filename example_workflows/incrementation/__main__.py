"""``python -m example_workflows.incrementation``: make the data, run the pipeline, print the report."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from .workflow import build_workflow, make_chunks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m example_workflows.incrementation", description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--root", default="sea-demo", help="directory for data/, work/ and out/ (the 'shared filesystem')")
    parser.add_argument("--chunks", type=int, default=4, help="input images (one chain of nodes each)")
    parser.add_argument("--chunk-mib", type=float, default=8, help="size of each input image, MiB")
    parser.add_argument("--iterations", type=int, default=3, help="increment steps per chain (each a node writing a new image)")
    parser.add_argument("--plugin", default="SeaMultiProc", help="SeaMultiProc, MultiProc, Linear, ... (Nipype); with --pydra: sea, cf, debug")
    parser.add_argument("--pydra", action="store_true", help="run the Pydra version (Pydra 1.0, Python >= 3.11)")
    parser.add_argument("--n-procs", type=int, default=2, help="nodes run at once")
    parser.add_argument("--sea", default=None, help="Sea config: a YAML file (default: $SEA_CONFIG, else discovered tiers)")
    parser.add_argument("--dask-address", default=None, help="with --plugin SeaDask: a running Dask scheduler (default: a local cluster of --n-procs workers)")
    args = parser.parse_args(argv)

    root = Path(args.root).resolve()
    missing = [i for i in range(args.chunks) if not (root / "data" / f"chunk{i:03d}.nii").exists()]
    if missing:  # a few GiB take a while: say what is going on
        print(f"making {len(missing)} input image(s) of {args.chunk_mib:g} MiB in {root / 'data'} (once; a later run reuses them) ...", flush=True)
    chunks = make_chunks(root / "data", args.chunks, args.chunk_mib)
    if args.pydra:
        return run_pydra(args, root, chunks)
    wf = build_workflow(root / "data", args.chunks, args.iterations, root / "work", root / "out")
    wf.config["execution"]["poll_sleep_duration"] = 0.05
    plugin_args = {"n_procs": args.n_procs}
    if args.plugin == "SeaDask":
        plugin_args = {"dask": {"address": args.dask_address} if args.dask_address else {"cluster": "local", "n_workers": args.n_procs}}
    if args.sea:
        plugin_args["sea"] = args.sea
    start = time.monotonic()
    wf.run(plugin=args.plugin, plugin_args=plugin_args)
    print(f"{args.plugin}: {args.chunks} chunks x {args.iterations} iterations in {time.monotonic() - start:.1f} s; outputs in {root / 'out'}")
    if args.plugin.startswith("Sea"):  # Sea logged its report above
        print(f"the report again: sea report {root / 'work'}")
    return 0


def run_pydra(args: argparse.Namespace, root: Path, chunks: list[Path]) -> int:
    from pydra.engine.submitter import Submitter

    from .pydra_workflow import Incrementation

    worker = "sea" if args.plugin == "SeaMultiProc" else args.plugin
    options = {"sea": args.sea} if worker == "sea" and args.sea else {}
    start = time.monotonic()
    with Submitter(worker=worker, cache_root=root / "pydra-cache", n_procs=args.n_procs, **options) as submitter:
        result = submitter(Incrementation(in_files=chunks, iterations=args.iterations))
    if result.errored:
        print(f"the workflow failed; see {root / 'pydra-cache'}")
        return 1
    print(f"Pydra {worker}: {args.chunks} chunks x {args.iterations} iterations in {time.monotonic() - start:.1f} s; outputs:")
    for path in result.outputs.out_files:
        print(f"  {path}")
    if worker == "sea":  # Sea logged its report above
        print(f"the report again: sea report {root / 'pydra-cache'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
