"""What Pydra's own worker-parametrised tests expect of a worker, on workflows of our own: each a
cause found by running Pydra 1.0's suite with ``"sea"`` beside ``"cf"`` (docs/reliability.md, row 10)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytest.importorskip("pydra.compose", reason="Pydra 1.0 needs Python >= 3.11")

from pydra.compose import python, workflow  # noqa: E402
from pydra.engine.submitter import Submitter  # noqa: E402

from conftest import sea_private_dirs  # noqa: E402


@python.define
def Add2(x: int) -> int:
    import time

    if x == 1:  # one state's other branch is slow (as in Pydra's own tests): its add2y waits for mult
        time.sleep(1)
    return x + 2


@python.define
def Multiply(x: int, y: int) -> int:
    return x * y


@python.define
def Add2At12Slowly(x: int) -> int:
    import time

    if x == 12:  # as Pydra's own Add2 (its tests' utils): one state lags behind the others
        time.sleep(1)
    return x + 2


@python.define
def SlowAdd2(x: int) -> int:
    import time

    time.sleep(1.5)
    return x + 2


@workflow.define
def Shared(x: int, y: int) -> int:
    """Split over x: every state's nested workflow has an ``add2y`` job with the same checksum."""
    add2x = workflow.add(Add2(x=x), name="add2x")
    add2y = workflow.add(Add2(x=y), name="add2y")
    mult = workflow.add(Multiply(x=add2x.out, y=add2y.out), name="mult")
    return mult.out


def run(worker: str, task, cache_root: Path, shm: Path, **kwargs):
    options = {"sea": {"tiers": [{"path": str(shm)}]}} if worker == "sea" else {}
    with Submitter(worker=worker, cache_root=cache_root, n_procs=2, **options, **kwargs) as submitter:
        result = submitter(task)
    assert not result.errored, result.errors
    return result


@pytest.mark.parametrize("repeat", range(3))
def test_jobs_with_one_checksum_in_several_states(tmp_path, shm_dir, repeat):
    """The same task and inputs in several nested workflows (a split workflow): cf runs them in one
    directory, one after the other; Sea ran the first on a tier and refused the others (ValueError:
    two nodes share the directory), then evicted the first when another state's consumers were
    registered, before its own consumer (behind a slow branch) had read it."""
    outputs = {worker: run(worker, Shared(y=11).split("x", x=[1, 2, 3]), tmp_path / worker, shm_dir).outputs.out for worker in ("cf", "sea")}
    assert outputs["sea"] == outputs["cf"] == [39, 52, 65]
    assert sea_private_dirs(shm_dir) == []


def test_readonly_caches_are_read(tmp_path, shm_dir):
    """A second Submitter given the first's cache as ``readonly_caches`` reuses what is there, as
    under cf: the job whose result the first run kept (the workflow's result) is not run again."""

    @workflow.define
    def Slow(x: int) -> int:
        mult = workflow.add(Multiply(x=x, y=3), name="mult")
        add2 = workflow.add(SlowAdd2(x=mult.out), name="add2")
        return add2.out

    run("sea", Slow(x=2), tmp_path / "first", shm_dir)
    start = time.monotonic()
    result = run("sea", Slow(x=2), tmp_path / "second", shm_dir, readonly_caches=[tmp_path / "first"])
    assert result.outputs.out == 8
    assert time.monotonic() - start < 1.5, "the slow job ran again"
    second = [p.name for p in (tmp_path / "second").iterdir() if p.name.startswith("python-")]
    first = {p.name for p in (tmp_path / "first").iterdir() if p.name.startswith("python-")}
    assert not set(second) & first, "a job found in the read-only cache was copied into the second"
    assert sea_private_dirs(shm_dir) == []


@pytest.mark.timeout(120)
def test_a_job_with_the_checksum_of_another_nodes_job(tmp_path, shm_dir):
    """Within one workflow, Pydra submits no job whose checksum another job has and waits for its
    result in cache_root: here add2_2nd(24) has add2_1st(24)'s checksum (2 * 12 + 2 = 22 + 2). Sea
    ran add2_1st(24) on a tier, evicted it, and Pydra waited forever (Pydra's test_wf_3sernd_ndst_1)."""

    @workflow.define
    def Serial(x: list[int], y: list[int]) -> list[int]:
        mult = workflow.add(Multiply().split(["x", "y"], x=x, y=y), name="mult")
        add2_1st = workflow.add(Add2At12Slowly(x=mult.out), name="add2_1st")
        add2_2nd = workflow.add(Add2At12Slowly(x=add2_1st.out), name="add2_2nd")
        return add2_2nd.out

    outputs = {worker: run(worker, Serial(x=[1, 2], y=[11, 12]), tmp_path / worker, shm_dir).outputs.out for worker in ("cf", "sea")}
    assert outputs["sea"] == outputs["cf"] == [15, 16, 26, 28]
    assert sea_private_dirs(shm_dir) == []
