"""Real Pydra workflows on real NIfTI files, for the SeaWorker tests (needs Pydra 1.0, Python >= 3.11)."""

from __future__ import annotations

import os
from pathlib import Path

import nibabel as nib
import numpy as np
from fileformats.generic import Directory, File
from pydra.compose import python, shell, workflow


def make_images(directory: Path, n: int, side: int = 24, seed: int = 0) -> list[Path]:
    """``n`` 4D images. Tests in one process give each dataset its own ``seed``: Pydra 1.0a12 reuses
    a nested workflow constructed for equal file contents at another path, which may be gone."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(n):
        path = directory / f"sub-{i:02d}.nii"
        nib.save(nib.Nifti1Image(rng.standard_normal((side, side, side, 4)).astype(np.float32), np.eye(4)), path)
        paths.append(path)
    return paths


@python.define(outputs=["out"])
def Scale(in_file: File, factor: float) -> File:
    img = nib.load(in_file)
    out = os.path.abspath("scaled.nii")  # in the job's directory: where it really runs
    nib.save(nib.Nifti1Image(np.asarray(img.dataobj) * np.float32(factor), img.affine), out)
    return File(out)


@python.define(outputs=["out"])
def Smooth(in_file: File) -> File:
    from scipy.ndimage import uniform_filter

    img = nib.load(in_file)
    out = os.path.abspath("smooth.nii")
    nib.save(nib.Nifti1Image(uniform_filter(np.asarray(img.dataobj), size=(3, 3, 3, 1)).astype(np.float32), img.affine), out)
    return File(out)


@python.define(outputs=["out"])
def Mean(in_files: list[File]) -> File:
    data = np.mean([np.asarray(nib.load(f).dataobj) for f in in_files], axis=0)
    out = os.path.abspath("group_mean.nii")
    nib.save(nib.Nifti1Image(data.astype(np.float32), np.eye(4)), out)
    return File(out)


Copy = shell.define("cp <in_file:generic/file> <out|out_file:generic/file>")


@workflow.define(outputs=["smoothed", "copied"])
def Subject(in_file: File) -> tuple[File, File]:
    """One subject: scale, smooth, and a copy by ``cp`` (a shell task running a real executable)."""
    scale = workflow.add(Scale(in_file=in_file, factor=2.0), name="scale")
    smooth = workflow.add(Smooth(in_file=scale.out), name="smooth")
    copy = workflow.add(Copy(in_file=smooth.out), name="copy")
    return smooth.out, copy.out_file


@workflow.define(outputs=["mean", "copies"])
def Study(in_files: list[File]) -> tuple[File, list[File]]:
    """The nested per-subject workflow split over subjects and combined (map/reduce), then a group mean."""
    subject = workflow.add(Subject().split(in_file=in_files).combine("in_file"), name="subject")
    mean = workflow.add(Mean(in_files=subject.smoothed), name="mean")
    return mean.out, subject.copied


@python.define(outputs=["out"])
def WriteBig(mib: int) -> File:
    out = os.path.abspath("big.bin")
    with open(out, "wb") as f:
        for i in range(mib):
            f.write(bytes([i % 251]) * 2**20)
    return File(out)


@python.define(outputs=["out"])
def Checksum(in_file: File) -> str:
    import hashlib

    return hashlib.sha256(open(in_file, "rb").read()).hexdigest()


@workflow.define(outputs=["big", "digest"])
def Big(mib: int) -> tuple[File, str]:
    """A 40 MiB file where the tier has 32 MiB: the job runs out of space and must run elsewhere."""
    write = workflow.add(WriteBig(mib=mib), name="write")
    digest = workflow.add(Checksum(in_file=write.out), name="digest")
    return write.out, digest.out


@python.define(outputs=["out"])
def Explode(in_file: File) -> File:
    raise RuntimeError(f"this task fails on purpose ({os.path.basename(in_file)})")


@workflow.define(outputs=["scaled", "exploded"])
def HalfBroken(in_file: File) -> tuple[File, File]:
    """Two independent branches, one of which fails: the other's output must still come home."""
    scale = workflow.add(Scale(in_file=in_file, factor=3.0), name="scale")
    boom = workflow.add(Explode(in_file=in_file), name="boom")
    return scale.out, boom.out


@python.define(outputs=["out"])
def Prep(in_file: File, seconds: float) -> File:
    """The expensive step of the rerun study: it takes ``seconds`` (a stand-in for a registration)."""
    import time

    time.sleep(seconds)
    img = nib.load(in_file)
    out = os.path.abspath("prep.nii")
    nib.save(nib.Nifti1Image(np.asarray(img.dataobj) * np.float32(2) + np.float32(1), img.affine), out)
    return File(out)


@python.define(outputs=["out"])
def Threshold(in_file: File, threshold: float) -> File:
    """The last step of the rerun study, with a parameter to change."""
    data = np.asarray(nib.load(in_file).dataobj)
    out = os.path.abspath("above.nii")
    nib.save(nib.Nifti1Image((data > threshold).astype(np.float32), np.eye(4)), out)
    return File(out)


@workflow.define(outputs=["out"])
def RerunSubject(in_file: File, threshold: float, seconds: float) -> File:
    prep = workflow.add(Prep(in_file=in_file, seconds=seconds), name="prep")
    smooth = workflow.add(Smooth(in_file=prep.out), name="smooth")
    last = workflow.add(Threshold(in_file=smooth.out, threshold=threshold), name="threshold")
    return last.out


@workflow.define(outputs=["outs"])
def RerunStudy(in_files: list[File], threshold: float = 0.5, seconds: float = 0.8) -> list[File]:
    """Per subject (a nested workflow, split and combined): an expensive step, a cheap one, a last step."""
    subject = workflow.add(RerunSubject(threshold=threshold, seconds=seconds).split(in_file=in_files).combine("in_file"), name="subject")
    return subject.out


@python.define(outputs=["out"])
def SleepStep(i: int, seconds: float) -> int:
    import time

    time.sleep(seconds)
    return i + 1


@workflow.define(outputs=["out"])
def SleepFan(values: list[int], seconds: float) -> list[int]:
    """One node split over ``values``: jobs of ``seconds`` each (the fan-out of the ETA test)."""
    return workflow.add(SleepStep(seconds=seconds).split(i=values).combine("i"), name="work").out


@workflow.define(outputs=["out"])
def SleepChain(values: list[int], seconds: float) -> list[int]:
    """Three nodes in a chain over a split (``values`` far enough apart that no two jobs share a checksum)."""
    previous = workflow.add(SleepStep(seconds=seconds).split(i=values), name="step_1")
    for k in (2, 3):
        previous = workflow.add(SleepStep(i=previous.out, seconds=seconds), name=f"step_{k}")
    return previous.out


# a workflow output naming a file in another task's directory (the seventeenth adversarial pass)
@python.define(outputs=["out"])
def MakeDir(n: int) -> Directory:
    made = Path(os.path.abspath("made"))
    made.mkdir()
    (made / "a.dat").write_bytes(b"x" * n)
    return Directory(made)


@python.define(outputs=["out"])
def Pick(made: Directory) -> File:
    return File(Path(made) / "a.dat")


@python.define(outputs=["out"])
def Identity(in_file: File) -> File:
    return in_file


@workflow.define(outputs=["picked"])
def HandedOn(n: int) -> File:
    return workflow.add(Identity(in_file=workflow.add(Pick(made=workflow.add(MakeDir(n=n)).out)).out)).out


@workflow.define(outputs=["made", "picked"])
def MadeAndPicked(n: int) -> tuple[Directory, File]:
    made = workflow.add(MakeDir(n=n))
    return made.out, workflow.add(Pick(made=made.out)).out


# links a task makes to its producer's file (the eighteenth adversarial pass)
@python.define(outputs=["out"])
def MakeFile(n: int) -> File:
    made = Path(os.path.abspath("a.dat"))
    made.write_bytes(b"x" * n)
    return File(made)


@python.define(outputs=["absolute", "relative"])
def LinkTo(in_file: File, tag: str) -> tuple[File, File]:
    os.symlink(str(in_file), "abs_link.dat")
    os.symlink(os.path.relpath(str(in_file)), "rel_link.dat")
    return File(os.path.abspath("abs_link.dat")), File(os.path.abspath("rel_link.dat"))


@python.define(outputs=["out"])
def Size(a: File, b: File) -> int:
    return os.path.getsize(a) + os.path.getsize(b)


@workflow.define(outputs=["read_abs", "read_rel", "size", "last_abs", "last_rel"])
def Linked(n: int) -> tuple[File, File, int, File, File]:
    made = workflow.add(MakeFile(n=n))
    read = workflow.add(LinkTo(in_file=made.out, tag="read"), name="read")  # another task reads its links
    last = workflow.add(LinkTo(in_file=made.out, tag="last"), name="last")  # nothing does
    size = workflow.add(Size(a=read.absolute, b=read.relative))
    return read.absolute, read.relative, size.out, last.absolute, last.relative
