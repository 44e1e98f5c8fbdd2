"""Real Nipype workflows for the tests: every kind of node Sea must handle, on real NIfTI files."""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
from nipype import Function, IdentityInterface, JoinNode, MapNode, Node, Workflow
from nipype.interfaces.base import CommandLine, CommandLineInputSpec, File, TraitedSpec
from nipype.interfaces.io import DataSink


def make_subjects(data_dir: Path, n_subjects: int = 3, mib: float = 4.0) -> list[str]:
    """One 4D float32 NIfTI image per subject, BIDS-like names, deterministic content."""
    data_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(42)
    side = 32
    frames = max(1, int(mib * 2**20 / (4 * side**3)))
    subjects = []
    for i in range(n_subjects):
        sub = f"{i + 1:02d}"
        path = data_dir / f"sub-{sub}_bold.nii.gz"
        data = rng.standard_normal((side, side, side, frames), dtype=np.float32)
        nib.save(nib.Nifti1Image(data, np.eye(4)), str(path))
        subjects.append(sub)
    return subjects


def select(data_dir, subject):
    import os

    return os.path.join(data_dir, f"sub-{subject}_bold.nii.gz")


def smooth(in_file):
    """A 3-point moving average along x, written as an uncompressed NIfTI."""
    import os

    import nibabel as nib
    import numpy as np

    img = nib.load(in_file)
    data = np.asanyarray(img.dataobj).astype(np.float32)
    out = (np.roll(data, 1, axis=0) + data + np.roll(data, -1, axis=0)) / np.float32(3)
    out_file = os.path.abspath("smoothed.nii")
    nib.save(nib.Nifti1Image(out, img.affine), out_file)
    return out_file


def scale(in_file, factor):
    import os

    import nibabel as nib
    import numpy as np

    img = nib.load(in_file)
    out_file = os.path.abspath(f"scaled_{factor}.nii")
    nib.save(nib.Nifti1Image(np.asanyarray(img.dataobj) * np.float32(factor), img.affine), out_file)
    return out_file


def mean_image(in_files):
    """JoinNode body: the voxelwise mean of every subject's first scaled image."""
    import os

    import nibabel as nib
    import numpy as np

    first = [f[0] if isinstance(f, list) else f for f in in_files]
    stack = [np.asanyarray(nib.load(f).dataobj) for f in first]
    out_file = os.path.abspath("group_mean.nii")
    nib.save(nib.Nifti1Image(np.mean(stack, axis=0).astype(np.float32), nib.load(first[0]).affine), out_file)
    return out_file


def explode(in_file):
    raise RuntimeError(f"this node fails on purpose ({in_file})")


def explode_if(in_file, flag):
    """Fails while the file ``flag`` exists (a bug the user then fixes), else hands ``in_file`` on."""
    import os

    if os.path.exists(flag):
        raise RuntimeError(f"this node fails while {flag} exists")
    return in_file


def write_big(in_file, mib):
    """Writes ``mib`` MiB: too much for a small tier, to provoke 'No space left on device'."""
    import os

    out_file = os.path.abspath("big.bin")
    with open(out_file, "wb") as fh:
        for _ in range(int(mib)):
            fh.write(b"\1" * 2**20)
    return out_file


class GzipInputSpec(CommandLineInputSpec):
    in_file = File(exists=True, mandatory=True, argstr="-n -c %s", position=0)
    out_file = File("image.nii.gz", usedefault=True, argstr="> %s", position=1)


class GzipOutputSpec(TraitedSpec):
    out_file = File(exists=True)


class Gzip(CommandLine):
    """A real executable (gzip) through Nipype's CommandLine interface."""

    _cmd = "gzip"
    input_spec = GzipInputSpec
    output_spec = GzipOutputSpec

    def _list_outputs(self):
        import os

        return {"out_file": os.path.abspath(self.inputs.out_file)}


def fn(name, function, inputs, outputs, **kw):
    return Node(Function(input_names=inputs, output_names=outputs, function=function), name=name, **kw)


def build_full(data_dir: Path, subjects: list[str], base_dir: Path, out_dir: Path, fail: bool = False, big_mib: int = 0) -> Workflow:
    """iterables -> nested workflow (Function + CommandLine) -> MapNode -> JoinNode -> DataSink."""
    wf = Workflow(name="study", base_dir=str(base_dir))
    subs = Node(IdentityInterface(fields=["subject"]), name="subjects")
    subs.iterables = ("subject", subjects)
    grab = fn("select", select, ["data_dir", "subject"], ["in_file"])
    grab.inputs.data_dir = str(data_dir)

    preproc = Workflow(name="preproc")
    sm = fn("smooth", smooth, ["in_file"], ["out_file"])
    gz = Node(Gzip(), name="gzip")
    preproc.connect(sm, "out_file", gz, "in_file")

    sc = MapNode(Function(input_names=["in_file", "factor"], output_names=["out_file"], function=scale), iterfield=["factor"], name="scale")
    sc.inputs.factor = [2, 3]
    join = JoinNode(
        Function(input_names=["in_files"], output_names=["out_file"], function=mean_image),
        joinsource="subjects",
        joinfield=["in_files"],
        name="group_mean",
    )
    sink = Node(DataSink(base_directory=str(out_dir)), name="sink")
    sink.inputs.substitutions = [("smoothed", "desc-smooth_bold")]
    sink.inputs.regexp_substitutions = [(r"_subject_(\d+)", r"sub-\1")]
    group_sink = Node(DataSink(base_directory=str(out_dir), container="group"), name="group_sink")

    wf.connect(subs, "subject", grab, "subject")
    wf.connect(grab, "in_file", preproc, "smooth.in_file")
    wf.connect(preproc, "smooth.out_file", sc, "in_file")
    wf.connect(preproc, "smooth.out_file", sink, "func.@smoothed")
    wf.connect(preproc, "gzip.out_file", sink, "func.@gz")
    wf.connect(sc, "out_file", sink, "func.@scaled")
    wf.connect(sc, "out_file", join, "in_files")
    wf.connect(join, "out_file", group_sink, "@mean")
    if fail:
        wf.config["execution"]["crashdump_dir"] = str(base_dir)  # not the current directory (a user's clone)
        bad = fn("explode", explode, ["in_file"], ["out_file"])
        wf.connect(join, "out_file", bad, "in_file")
    if big_mib:
        big = fn("write_big", write_big, ["in_file", "mib"], ["out_file"])
        big.inputs.mib = big_mib
        wf.connect(join, "out_file", big, "in_file")
        wf.connect(big, "out_file", group_sink, "@big")
    return wf


def run(wf: Workflow, plugin: str, sea: dict | str | None = None, **plugin_args):
    wf.config["execution"]["poll_sleep_duration"] = 0.05
    args = {"n_procs": 2, **plugin_args}
    if sea is not None:
        args["sea"] = sea
    return wf.run(plugin=plugin, plugin_args=args)
