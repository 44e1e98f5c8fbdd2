"""Prefetch under Pydra (SeaWorker): the study's input images, on the "shared filesystem", are
copied to the tier ahead of the jobs that read them. The jobs read the copies, their checksums (the
names of their directories, Pydra's cache keys) are the ones cf gives them, the outputs are
byte-identical to cf's, and a rerun with or without prefetch finds the work done."""

from __future__ import annotations

import filecmp
from pathlib import Path

import pytest

pytest.importorskip("pydra.compose", reason="Pydra 1.0 needs Python >= 3.11")

import cloudpickle as cp  # noqa: E402
from fileformats.generic import File  # noqa: E402
from pydra.compose import python, workflow  # noqa: E402
from pydra.engine.submitter import Submitter  # noqa: E402

from sea.report import RunReport  # noqa: E402

from conftest import sea_private_dirs  # noqa: E402
from pydra_workflows import Study, make_images  # noqa: E402


def _outputs(outputs) -> list[Path]:
    return [Path(outputs.mean)] + [Path(f) for f in outputs.copies]


def _job_dirs(root: Path) -> set[str]:
    return {p.name for p in root.iterdir() if p.name.startswith(("python-", "shell-"))}


def _read_by(root: Path, task: str) -> list[str]:
    """The ``in_file`` each job of ``task`` ran with, from the job it saved in its directory."""
    found = []
    for saved in root.glob("python-*/_job.pklz"):
        with open(saved, "rb") as f:
            job = cp.load(f)
        if type(job.task).__name__ == task:
            found.append(str(job.task.in_file))
    return sorted(found)


def test_jobs_read_the_copies_with_cf_checksums_and_identical_outputs(tmp_path, shm_dir, disk_dir):
    images = make_images(disk_dir / "shared", 4, seed=41)
    with Submitter(worker="cf", cache_root=tmp_path / "cf", n_procs=2) as sub:
        theirs = sub(Study(in_files=images))
    sea = {"tiers": [{"path": str(shm_dir)}], "keep_intermediates": True}
    home = tmp_path / "home"
    with Submitter(worker="sea", cache_root=home, n_procs=2, sea={**sea, "prefetch": {"enabled": True, "lookahead": 2}}) as sub:
        ours = sub(Study(in_files=images))
    assert not theirs.errored and not ours.errored
    for mine, ref in zip(_outputs(ours.outputs), _outputs(theirs.outputs), strict=True):
        assert filecmp.cmp(mine, ref, shallow=False), f"{mine} differs from cf's {ref}"
    report = RunReport.from_json(home / "sea-report.json")
    print(report.to_text())
    assert report.prefetch_files == 4 and report.prefetch_hits == 4 and report.prefetch_misses == 0, report.to_text()
    read = _read_by(home, "Scale")  # keep_intermediates brought every job's directory home
    assert read == sorted(str(p) for p in images), read  # the copies, through their originals' paths (sea.view), as cf records them
    # the copies kept every job's checksum: the same job directories as under cf
    assert _job_dirs(home) == _job_dirs(tmp_path / "cf")
    assert sea_private_dirs(shm_dir) == [] and not list(shm_dir.iterdir()), "a copy was left on the tier"
    assert all(p.is_file() for p in images)

    for prefetch in (False, True):  # a rerun, with or without prefetch, finds the work done
        with Submitter(worker="sea", cache_root=home, n_procs=2, sea={**sea, "prefetch": prefetch}) as sub:
            again = sub(Study(in_files=images))
        assert not again.errored
        assert RunReport.from_json(home / "sea-report.json").nodes_run == 0, f"prefetch {prefetch}: the rerun executed jobs"


@python.define(outputs=["out"])
def PassOn(in_file: File) -> File:
    return in_file


@python.define(outputs=["out"])
def Size(in_file: File) -> int:
    import os

    return os.path.getsize(in_file)


@workflow.define(outputs=["handed", "size"])
def HandOn(in_file: File) -> tuple[File, int]:
    passed = workflow.add(PassOn(in_file=in_file), name="pass_on")
    size = workflow.add(Size(in_file=passed.out), name="size")
    return passed.out, size.out


def test_a_job_handing_on_the_file_it_read_hands_on_the_original(tmp_path, shm_dir, disk_dir):
    """A task returning its input ran on the copy: its saved result, which its consumer and the
    workflow's outputs are made of, names the original, which outlives the copy."""
    (image,) = make_images(disk_dir / "shared", 1, seed=43)
    home = tmp_path / "home"
    with Submitter(worker="sea", cache_root=home, n_procs=2, sea={"tiers": [{"path": str(shm_dir)}], "prefetch": True, "keep_intermediates": True}) as sub:
        result = sub(HandOn(in_file=image))
    assert not result.errored
    assert result.outputs.size == image.stat().st_size
    assert Path(result.outputs.handed).read_bytes() == image.read_bytes()
    report = RunReport.from_json(home / "sea-report.json")
    assert report.prefetch_hits == 2, report.to_text()  # pass_on read a copy, and so did size, handed the original
    (saved,) = [p for p in home.glob("python-*/_result.pklz") if _task_of(p.parent) == "PassOn"]
    with open(saved, "rb") as f:
        assert str(cp.load(f).outputs.out) == str(image), "the copy's path was handed on"


def _task_of(job_dir: Path) -> str:
    with open(job_dir / "_job.pklz", "rb") as f:
        return type(cp.load(f).task).__name__


@python.define(outputs=["out"])
def AppendTo(in_file: File) -> File:
    with open(in_file, "ab") as f:
        f.write(b"appended by the job")
    return in_file


@workflow.define(outputs=["size"])
def AppendAndMeasure(in_file: File) -> int:
    appended = workflow.add(AppendTo(in_file=in_file), name="append")
    return workflow.add(Size(in_file=appended.out), name="size").out


def _cf_and_sea(tmp_path, shm_dir, disk_dir, workflow, seed: int, then=None, beside_the_cache: bool = False) -> dict:
    """Per worker, cf then sea with prefetch: ``workflow`` on an image of its own (Pydra reuses a
    workflow constructed for the same inputs' hash); (errored, the image's bytes before, after, the
    names beside it). ``then(worker, sea, image)`` runs after each. ``beside_the_cache``: the
    ``cache_root`` a directory beside the image."""
    seen = {}
    for n, (worker, sea) in enumerate((("cf", {}), ("sea", {"sea": {"tiers": [{"path": str(shm_dir)}], "prefetch": True}}))):
        (image,) = make_images(disk_dir / worker, 1, seed=seed + n)
        before = image.read_bytes()
        cache_root = image.parent / "cache" if beside_the_cache else tmp_path / worker
        with Submitter(worker=worker, cache_root=cache_root, n_procs=2, **sea) as sub:
            result = sub(workflow(in_file=image))
        seen[worker] = (result.errored, before, image.read_bytes(), sorted(p.name for p in image.parent.iterdir()))
        if then is not None:
            then(worker, sea, image)
    return seen


def test_a_job_changing_its_input_in_place_changes_the_original_as_under_cf(tmp_path, shm_dir, disk_dir):
    """Pydra fails a job that changed a ``File`` input (its hash changed); the change itself is
    made in the original under cf, and so under sea, where the job changed a prefetched copy. A
    lone task so changed makes the Submitter raise, under both."""

    def lone(worker, sea, image):
        with pytest.raises(RuntimeError, match="hashes have changed during the execution"):
            with Submitter(worker=worker, cache_root=tmp_path / f"{worker}-lone", n_procs=2, **sea) as sub:
                sub(AppendTo(in_file=image))

    seen = _cf_and_sea(tmp_path, shm_dir, disk_dir, AppendAndMeasure, seed=44, then=lone)
    for worker in ("cf", "sea"):
        errored, before, after, _ = seen[worker]
        assert errored and after == before + b"appended by the job", worker
    assert RunReport.from_json(tmp_path / "sea" / "sea-report.json").prefetch_hits == 1


@python.define(outputs=["out"])
def ReplaceIt(in_file: File) -> File:
    import os

    with open(f"{in_file}.tmp", "wb") as f:
        f.write(b"replaced by the job")
    os.replace(f"{in_file}.tmp", in_file)  # an atomic save
    return in_file


@workflow.define(outputs=["size"])
def ReplaceAndMeasure(in_file: File) -> int:
    replaced = workflow.add(ReplaceIt(in_file=in_file), name="replace")
    return workflow.add(Size(in_file=replaced.out), name="size").out


def test_a_job_replacing_its_prefetched_input_replaces_the_original_as_under_cf(tmp_path, shm_dir, disk_dir):
    """The copy is seen at the original through an overlay of its directory: renaming over it
    replaces the original, and the run ends as under cf (Pydra fails the job for its changed hash;
    the file replaced, no temporary left)."""
    seen = _cf_and_sea(tmp_path, shm_dir, disk_dir, ReplaceAndMeasure, seed=50)
    assert seen["sea"][::2] == seen["cf"][::2] and seen["sea"][2] == seen["cf"][2] == b"replaced by the job"
    assert seen["sea"][3] == seen["cf"][3], "a temporary was left beside the input"
    report = RunReport.from_json(tmp_path / "sea" / "sea-report.json")
    assert report.busy_retries == 0 and report.prefetch_hits == 1


def test_a_job_replacing_its_prefetched_input_beside_its_cache_replaces_the_original_as_under_cf(tmp_path, shm_dir, disk_dir):
    """The input's directory holds the ``cache_root``: its overlay has the cache bound again over
    it (the jobs' directories and Pydra's lock files where Pydra looks for them), and the run ends
    as under cf; nothing is rerun."""
    seen = _cf_and_sea(tmp_path, shm_dir, disk_dir, ReplaceAndMeasure, seed=52, beside_the_cache=True)
    assert seen["sea"][::2] == seen["cf"][::2] and seen["sea"][2] == seen["cf"][2] == b"replaced by the job"
    assert seen["sea"][3] == seen["cf"][3] and "cache" in seen["cf"][3], "a temporary was left beside the input"
    report = RunReport.from_json(disk_dir / "sea" / "cache" / "sea-report.json")
    assert report.busy_retries == 0 and report.prefetch_hits == 1, report.to_text()
