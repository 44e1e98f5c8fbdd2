"""A study to rerun: a user's second week (a parameter changed, a subject added, an input replaced,
a run killed), under MultiProc and under SeaMultiProc, from identical starting states.

Per subject: a grabber, an expensive step (``prep``: it computes for a while, as a registration
would), a cheap smoothing with a width, a ``gzip`` CommandLine node, a MapNode, a last step with a
threshold (``stats``), a DataSink; across subjects a JoinNode and a group DataSink. Which nodes each
run executes is recorded by MultiProc's ``status_callback`` (a node sent to a worker process), in
the file ``$SEA_TEST_STARTED`` names, so a run in another process (to kill it) is counted too.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import nibabel as nib
import numpy as np
from nipype import Function, IdentityInterface, JoinNode, MapNode, Node, Workflow
from nipype.interfaces.io import DataSink

from nipype_workflows import Gzip, mean_image, scale, select

NAME = "rerunstudy"  # the workflow's name: node keys start with it
STARTED = "SEA_TEST_STARTED"  # the file the status callback appends each started node to
HOLD = "SEA_TEST_HOLD"  # while the file it names exists, the last step waits (to kill a run there)


def make_data(data_dir: Path, subjects: list[str], mib: float = 1.0, seed: int = 7) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    frames = max(1, int(mib * 2**20 / (4 * 16**3)))
    for sub in subjects:
        data = rng.standard_normal((16, 16, 16, frames), dtype=np.float32)
        nib.save(nib.Nifti1Image(data, np.eye(4)), str(data_dir / f"sub-{sub}_bold.nii.gz"))


def prep(in_file, level, seconds):
    """The expensive step: it takes ``seconds`` (a stand-in for a registration), then writes."""
    import os
    import time

    import nibabel as nib
    import numpy as np

    time.sleep(seconds)
    img = nib.load(in_file)
    out = np.asanyarray(img.dataobj).astype(np.float32) * np.float32(level) + np.float32(1)
    out_file = os.path.abspath("prep.nii")
    nib.save(nib.Nifti1Image(out, img.affine), out_file)
    return out_file


def smooth_width(in_file, width):
    import os

    import nibabel as nib
    import numpy as np

    img = nib.load(in_file)
    data = np.asanyarray(img.dataobj).astype(np.float32)
    out = sum(np.roll(data, shift, axis=0) for shift in range(-(width // 2), width // 2 + 1)) / np.float32(width)
    out_file = os.path.abspath("smoothed.nii")
    nib.save(nib.Nifti1Image(out.astype(np.float32), img.affine), out_file)
    return out_file


def stats(in_file, threshold):
    """The last step: the mean of the voxels above ``threshold``, as text."""
    import os
    import time

    import nibabel as nib
    import numpy as np

    while os.path.exists(os.environ.get("SEA_TEST_HOLD", "/nonexistent")):
        time.sleep(0.02)  # held: the test kills the run here
    data = np.asanyarray(nib.load(in_file).dataobj)
    out_file = os.path.abspath("stats.txt")
    np.savetxt(out_file, [float(data[data > threshold].mean())])
    return out_file


def _fn(name, function, inputs, outputs):
    return Node(Function(input_names=inputs, output_names=outputs, function=function), name=name)


def build(root: Path, subjects: list[str], prep_seconds: float = 0.8, level: float = 2.0, width: int = 3, threshold: float = 0.5) -> Workflow:
    """The study, its home ``root/work``, its outputs in ``root/out``, its data in ``root/data``."""
    wf = Workflow(name=NAME, base_dir=str(root / "work"))
    wf.config["execution"]["poll_sleep_duration"] = 0.05
    subs = Node(IdentityInterface(fields=["subject"]), name="subjects")
    subs.iterables = ("subject", subjects)
    grab = _fn("select", select, ["data_dir", "subject"], ["in_file"])
    grab.inputs.data_dir = str(root / "data")
    expensive = _fn("prep", prep, ["in_file", "level", "seconds"], ["out_file"])
    expensive.inputs.level, expensive.inputs.seconds = level, prep_seconds
    sm = _fn("smooth", smooth_width, ["in_file", "width"], ["out_file"])
    sm.inputs.width = width
    gz = Node(Gzip(), name="gzip")
    sc = MapNode(Function(input_names=["in_file", "factor"], output_names=["out_file"], function=scale), iterfield=["factor"], name="scale")
    sc.inputs.factor = [2, 3]
    last = _fn("stats", stats, ["in_file", "threshold"], ["out_file"])
    last.inputs.threshold = threshold
    join = JoinNode(
        Function(input_names=["in_files"], output_names=["out_file"], function=mean_image), joinsource="subjects", joinfield=["in_files"], name="group_mean"
    )
    sink = Node(DataSink(base_directory=str(root / "out")), name="sink")
    sink.inputs.regexp_substitutions = [(r"_subject_(\d+)", r"sub-\1")]
    group_sink = Node(DataSink(base_directory=str(root / "out"), container="group"), name="group_sink")
    wf.connect(subs, "subject", grab, "subject")
    wf.connect(grab, "in_file", expensive, "in_file")
    wf.connect(expensive, "out_file", sm, "in_file")
    wf.connect(sm, "out_file", gz, "in_file")
    wf.connect(sm, "out_file", sc, "in_file")
    wf.connect(sm, "out_file", last, "in_file")
    wf.connect(gz, "out_file", sink, "func.@gz")
    wf.connect(sc, "out_file", sink, "func.@scaled")
    wf.connect(last, "out_file", sink, "func.@stats")
    wf.connect(sc, "out_file", join, "in_files")
    wf.connect(join, "out_file", group_sink, "@mean")
    return wf


def record_start(node, status) -> None:
    """MultiProc's status callback: append each node sent to a worker to ``$SEA_TEST_STARTED``."""
    if status == "start" and os.environ.get(STARTED):
        directory = node.output_dir()
        with open(os.environ[STARTED], "a") as fh:
            fh.write(directory[directory.index(f"/{NAME}/") + 1 :] + "\n")


def run(
    root: Path, plugin: str, checkpoints: str | None = None, tier: Path | None = None, subjects: list[str] | None = None, n_procs: int = 2, **changes
) -> set[str]:
    """Run the study once; the node directories (keys) it executed."""
    started = root / "started.txt"
    started.unlink(missing_ok=True)
    os.environ[STARTED] = str(started)
    args = {"n_procs": n_procs, "status_callback": record_start}
    if plugin == "SeaMultiProc":
        args["sea"] = {"tiers": [{"path": str(tier)}], "checkpoints": checkpoints}
    try:
        build(root, subjects or ["01", "02"], **changes).run(plugin=plugin, plugin_args=args)
    finally:
        del os.environ[STARTED]
    return set(started.read_text().split()) if started.exists() else set()


def nodes(keys: set[str]) -> set[str]:
    """Execution nodes, a MapNode's sub-nodes folded into it."""
    return {key.split("/mapflow/")[0] for key in keys}


def is_sink(key: str) -> bool:
    return key.endswith("sink")


def snapshot(root: Path, saved: Path) -> None:
    """Everything of the study (data, home, outputs), timestamps kept, at another path."""
    shutil.rmtree(saved, ignore_errors=True)
    shutil.copytree(root, saved, symlinks=True)


def restore(saved: Path, root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(saved, root, symlinks=True)


def files_under(directory: Path) -> set[str]:
    return {str(Path(d, f).relative_to(directory)) for d, _, files in os.walk(directory) for f in files}


def main() -> None:
    """``python rerun_workflows.py ROOT PLUGIN CHECKPOINTS TIER SUBJECTS N_PROCS``: one run, in its
    own process (the kill tests)."""
    root, plugin, checkpoints, tier, subjects, n_procs = sys.argv[1:7]
    run(Path(root), plugin, checkpoints if checkpoints != "-" else None, Path(tier), subjects.split(","), int(n_procs))


if __name__ == "__main__":
    main()
