"""Reruns under Pydra cost what they cost under cf (issue 15): a changed parameter re-executes what
cf re-executes, plus (``auto``) only cheap evicted producers, or (``none``) every evicted producer;
an existing cf cache is reused and left alone. Jobs are compared by their checksums (their
directory names, the same under both workers)."""

from __future__ import annotations

import filecmp
import os
import shutil
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(sys.version_info < (3, 11), reason="Pydra 1.0 needs Python >= 3.11")

JOBS = ("python-", "shell-")


def job_dirs(cache: Path) -> set[str]:
    return {p.name for p in cache.iterdir() if p.name.startswith(JOBS) and (p / "_result.pklz").is_file()} if cache.exists() else set()


def files_under(directory: Path) -> set[str]:
    return {str(Path(d, f).relative_to(directory)) for d, _, files in os.walk(directory) for f in files}


# The study's outputs (a few KiB per subject) are smaller than one expensive step's directory: the
# default budget (as many bytes as the outputs) holds one subject's, this one both (see the last test)
BUDGET = "300%"


def run(worker: str, cache: Path, images, tier: Path | None = None, checkpoints: str | None = None, budget: str = BUDGET, **inputs):
    """One run; (its outputs, the jobs it executed)."""
    from pydra.engine.submitter import Submitter

    from pydra_workflows import RerunStudy

    before = job_dirs(cache)
    kwargs = {"sea": {"tiers": [{"path": str(tier)}], "checkpoints": checkpoints, "checkpoint_budget": budget}} if worker == "sea" else {}
    with Submitter(worker=worker, cache_root=cache, n_procs=2, **kwargs) as submitter:
        result = submitter(RerunStudy(in_files=images, **inputs))
        ran = set(submitter.worker.last_run.keys) if worker == "sea" else job_dirs(cache) - before
    assert not result.errored, result
    return [Path(p) for p in result.outputs.outs], ran



def kinds(cache: Path) -> dict[str, str]:
    """Job checksum -> its task's class, from the job's saved pickle (what ran in each directory)."""
    import cloudpickle as cp

    found = {}
    for path in cache.glob("python-*/_job.pklz"):
        with open(path, "rb") as f:
            found[path.parent.name] = type(cp.load(f).task).__name__
    return found


@pytest.fixture
def images(tmp_path):
    from pydra_workflows import make_images

    return make_images(tmp_path / "data", 2, side=16, seed=15)


@pytest.mark.parametrize("mode", [pytest.param("none", marks=pytest.mark.slow), "auto", pytest.param("all", marks=pytest.mark.slow)])
def test_a_changed_parameter_reruns_what_cf_reruns(tmp_path, shm_dir, images, mode):
    """With each checkpoint mode (``auto``, the default, by default; the others with --run-slow)."""
    cf_cache = tmp_path / "cf"
    reference_first, _ = run("cf", cf_cache, images)
    reference, theirs = run("cf", cf_cache, images, threshold=0.25)
    assert len(theirs) == 2, f"cf should rerun the last step of each subject, ran {sorted(theirs)}"
    names = kinds(cf_cache)
    figures = {"cf": len(theirs)}
    cache = tmp_path / mode
    run("sea", cache, images, shm_dir, mode)
    outputs, ours = run("sea", cache, images, shm_dir, mode, threshold=0.25)
    for mine, ref in zip(outputs, reference, strict=True):
        assert filecmp.cmp(mine, ref, shallow=False), f"{mode}: {mine} differs from cf's"
    figures[mode] = len(ours)
    preps = {k for k in ours if names.get(k) == "Prep"}
    assert theirs <= ours, f"{mode}: did not rerun what cf reran"
    if mode == "all":
        assert ours == theirs, f"all: ran {sorted(ours - theirs)} beside what cf ran"
    elif mode == "auto":
        assert not preps, "auto recomputed the expensive step"
    else:
        assert len(preps) == 2, "none: the expensive step's directory was evicted, so it runs again"
    assert not list(shm_dir.iterdir())
    print(f"\nlast step changed: jobs executed {figures}")


def test_an_existing_cf_cache_is_reused_and_left_alone(tmp_path, shm_dir, images):
    cache = tmp_path / "cache"
    run("cf", cache, images)
    reference, _ = run("cf", tmp_path / "cf-changed", images, threshold=0.25)
    before = files_under(cache)
    saved = tmp_path / "saved"
    shutil.copytree(cache, saved, symlinks=True)
    for mode in ("none", "auto", "all"):
        shutil.rmtree(cache)
        shutil.copytree(saved, cache, symlinks=True)
        _, ran = run("sea", cache, images, shm_dir, mode)
        assert ran == set(), f"{mode}: a rerun of cf's finished workflow ran {sorted(ran)}"
        outputs, ran = run("sea", cache, images, shm_dir, mode, threshold=0.25)
        assert len(ran) == 2 and all(kinds(cache)[k] == "Threshold" for k in ran), f"{mode}: ran {sorted(ran)}"
        for mine, ref in zip(outputs, reference, strict=True):
            assert filecmp.cmp(mine, ref, shallow=False)
        missing = before - files_under(cache)
        assert not missing, f"{mode}: removed {sorted(missing)[:5]} from cf's cache"


def test_the_default_budget_keeps_what_fits_and_reruns_the_rest(tmp_path, shm_dir, images):
    """With the default budget (as many bytes as the outputs) only one subject's expensive step fits
    in the home: the rerun after the change unpacks that one and recomputes the other, with cf's
    outputs; the packs never held more than the outputs' bytes."""
    from sea.report import RunReport

    reference, _ = run("cf", tmp_path / "cf", images, threshold=0.25)
    cache = tmp_path / "sea"
    run("sea", cache, images, shm_dir, "auto", budget="100%")
    first = RunReport.from_json(cache / "sea-report.json")
    assert first.checkpoint_packs == 1 and first.checkpoints_over_budget + first.checkpoints_dropped >= 1, first.to_text()
    assert 0 < first.checkpoint_held_bytes <= first.checkpoint_budget_bytes <= first.delivered_bytes, first.to_text()
    outputs, _ = run("sea", cache, images, shm_dir, "auto", budget="100%", threshold=0.25)
    for mine, ref in zip(outputs, reference, strict=True):
        assert filecmp.cmp(mine, ref, shallow=False)
    assert RunReport.from_json(cache / "sea-report.json").checkpoints_restored == 1
