"""``python -m example_workflows.incrementation``: make the data, run the pipeline, print the report."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from .workflow import build_workflow, make_chunks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", default="sea-demo", help="directory for data/, work/ and out/ (the 'shared filesystem')")
    parser.add_argument("--chunks", type=int, default=4)
    parser.add_argument("--chunk-mib", type=float, default=8)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--plugin", default="SeaMultiProc", help="SeaMultiProc, MultiProc, Linear, ...")
    parser.add_argument("--n-procs", type=int, default=2)
    parser.add_argument("--sea", default=None, help="Sea config: a YAML file (default: $SEA_CONFIG, else discovered tiers)")
    args = parser.parse_args(argv)

    root = Path(args.root).resolve()
    make_chunks(root / "data", args.chunks, args.chunk_mib)
    wf = build_workflow(root / "data", args.chunks, args.iterations, root / "work", root / "out")
    wf.config["execution"]["poll_sleep_duration"] = 0.05
    plugin_args = {"n_procs": args.n_procs}
    if args.sea:
        plugin_args["sea"] = args.sea
    start = time.monotonic()
    wf.run(plugin=args.plugin, plugin_args=plugin_args)
    print(f"{args.plugin}: {args.chunks} chunks x {args.iterations} iterations in {time.monotonic() - start:.1f} s; outputs in {root / 'out'}")
    if args.plugin.startswith("Sea"):
        from sea.report import RunReport

        print(RunReport.from_json(root / "work" / "sea-report.json").to_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
