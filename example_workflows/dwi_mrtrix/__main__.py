"""``python -m example_workflows.dwi_mrtrix``: simulate the DWI dataset, run the MRtrix3 pipeline, print Sea's report."""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from .data import make_dataset
from .workflow import TOOLS, build_workflow


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m example_workflows.dwi_mrtrix", description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--root", default="sea-dwi", help="directory for bids/, work/ and out/ (the 'shared filesystem')")
    parser.add_argument("--subjects", type=int, default=2, help="synthetic subjects to make and process")
    parser.add_argument("--matrix", type=int, default=24, help="voxels along each axis")
    parser.add_argument("--directions", type=int, default=12, help="directions per shell (two shells)")
    parser.add_argument("--plugin", default="SeaMultiProc", help="SeaMultiProc, MultiProc, Linear, ...")
    parser.add_argument("--n-procs", type=int, default=2, help="nodes run at once")
    parser.add_argument("--tier", default=None, help="a node-local directory for Sea (default: discovered)")
    args = parser.parse_args(argv)
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        parser.error(f"MRtrix3 is not installed ({', '.join(missing)} not found): apt-get install mrtrix3")

    root = Path(args.root).resolve()
    subjects = make_dataset(root / "bids", args.subjects, args.matrix, args.directions)
    wf = build_workflow(root / "bids", subjects, root / "work", root / "out")
    wf.config["execution"]["poll_sleep_duration"] = 0.05
    plugin_args = {"n_procs": args.n_procs}
    if args.plugin.startswith("Sea") and args.tier:
        plugin_args["sea"] = {"tiers": [{"path": args.tier}]}
    start = time.monotonic()
    wf.run(plugin=args.plugin, plugin_args=plugin_args)
    print(f"{args.plugin}: {len(subjects)} subjects in {time.monotonic() - start:.1f} s; outputs in {root / 'out'}")
    if args.plugin.startswith("Sea"):  # Sea logged its report above
        print(f"the report again: sea report {root / 'work'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
