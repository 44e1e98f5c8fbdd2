"""``python -m example_workflows.fmri_preproc``: make the BIDS dataset, run the pipeline, print Sea's report."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from .data import make_dataset

SINKS = ["DataSink", "DerivativesDataSink"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m example_workflows.fmri_preproc", description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--root", default="sea-fmri", help="directory for bids/, work/ and derivatives/ (the 'shared filesystem')")
    parser.add_argument("--subjects", type=int, default=2, help="synthetic subjects to make and process")
    parser.add_argument("--volumes", type=int, default=40, help="time points per run")
    parser.add_argument("--matrix", type=int, default=32, help="voxels along each axis")
    parser.add_argument("--plugin", default="SeaMultiProc", help="SeaMultiProc, MultiProc, Linear, ... (Nipype); with --pydra: sea, cf, debug")
    parser.add_argument("--pydra", action="store_true", help="run the Pydra version (Pydra 1.0, Python >= 3.11)")
    parser.add_argument("--n-procs", type=int, default=2, help="nodes run at once")
    parser.add_argument("--tier", default=None, help="a node-local directory for Sea (default: discovered: $SLURM_TMPDIR, $TMPDIR, /dev/shm)")
    parser.add_argument("--participant-label", nargs="+", metavar="LABEL", help="process only these subjects of the dataset made before (one SLURM array task each, as fMRIPrep's option)")
    parser.add_argument("-w", "--work-dir", help="the work directory, base_dir (fMRIPrep's -w; default ROOT/work)")
    parser.add_argument("--data-only", action="store_true", help="make the dataset and stop (before array tasks read it)")
    args = parser.parse_args(argv)

    root = Path(args.root).resolve()
    bids = root / "bids"
    if args.participant_label:  # made before: tasks side by side must not write it at once
        subjects = [label.removeprefix("sub-") for label in args.participant_label]
        missing = [s for s in subjects if not (bids / f"sub-{s}").is_dir()]
        if missing:
            parser.error(f"no sub-{missing[0]} in {bids}: make the dataset first (--subjects N --data-only)")
    else:
        subjects = make_dataset(bids, args.subjects, args.volumes, args.matrix)
    if args.data_only:
        print(f"{len(subjects)} subjects in {bids}")
        return 0
    work = Path(args.work_dir).resolve() if args.work_dir else root / ("pydra-cache" if args.pydra else "work")
    sea = {"sinks": SINKS, **({"tiers": [{"path": args.tier}]} if args.tier else {})}
    start = time.monotonic()
    if args.pydra:
        from pydra.engine.submitter import Submitter

        from .pydra_workflow import Study

        worker = "sea" if args.plugin == "SeaMultiProc" else args.plugin
        options = {"sea": sea} if worker == "sea" else {}
        with Submitter(worker=worker, cache_root=work, n_procs=args.n_procs, **options) as submitter:
            result = submitter(Study(bids_dir=str(bids), subjects=subjects))
        if result.errored:
            print(f"the workflow failed; see {work}")
            return 1
        print(f"Pydra {worker}: {len(subjects)} subjects in {time.monotonic() - start:.1f} s; connectivity matrices:")
        for path in result.outputs.connectivity:
            print(f"  {path}")
        report = work / "sea-report.json" if worker == "sea" else None
    else:
        from .nipype_workflow import build_workflow

        wf = build_workflow(bids, subjects, work, root / "derivatives")
        wf.config["execution"]["poll_sleep_duration"] = 0.05
        plugin_args = {"n_procs": args.n_procs, **({"sea": sea} if args.plugin.startswith("Sea") else {})}
        wf.run(plugin=args.plugin, plugin_args=plugin_args)
        print(f"{args.plugin}: {len(subjects)} subjects in {time.monotonic() - start:.1f} s; derivatives in {root / 'derivatives'}")
        report = work / "sea-report.json" if args.plugin.startswith("Sea") else None
    if report is not None:  # Sea logged its report above
        print(f"the report again: sea report {report.parent}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
