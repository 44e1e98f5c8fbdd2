"""pydra_sea, first step: the worker is found by name and runs workflows as Pydra's cf worker does.

Placement on the tiers, staging and eviction through the core are not in this step (issue 5).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("pydra.compose", reason="Pydra 1.0 needs Python >= 3.11")

from pydra.compose import python, workflow  # noqa: E402
from pydra.engine.submitter import Submitter  # noqa: E402

from pydra_sea import SeaWorker  # noqa: E402
from sea import SeaConfigError  # noqa: E402


@python.define
def Add(a: int, b: int) -> int:
    return a + b


@workflow.define
def Chain(x: int) -> int:
    first = workflow.add(Add(a=x, b=1), name="first")
    second = workflow.add(Add(a=first.out, b=2), name="second")
    return second.out


def test_found_by_name_in_a_fresh_interpreter(tmp_path):
    """Installed, ``worker="sea"`` works with no import of ours: Pydra finds pydra.workers.sea."""
    code = textwrap.dedent(
        f"""
        from pydra.engine.submitter import Submitter
        from pydra.workers.base import Worker
        sub = Submitter(worker="sea", cache_root={str(tmp_path)!r}, n_procs=1, sea={{"keep_intermediates": True}})
        print(type(sub.worker).__module__, Worker.plugin("sea").plugin_name(), sub.worker.sea.keep_intermediates)
        sub.close()
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["pydra_sea.worker", "sea", "True"]


@pytest.mark.parametrize("how", ["name", "instance"])
def test_runs_a_workflow_like_cf(tmp_path, how):
    worker = "sea" if how == "name" else SeaWorker(n_procs=2, sea={"tiers": [{"path": "/dev/shm"}]})
    kwargs = {"n_procs": 2, "sea": {"tiers": [{"path": "/dev/shm"}]}} if how == "name" else {}
    with Submitter(worker=worker, cache_root=tmp_path / "sea", **kwargs) as sub:
        ours = sub(Chain(x=3))
    with Submitter(worker="cf", cache_root=tmp_path / "cf", n_procs=2) as sub:
        theirs = sub(Chain(x=3))
    assert not ours.errored and ours.outputs.out == theirs.outputs.out == 6


def test_a_bad_config_fails_in_the_submitter_before_any_task(tmp_path):
    with pytest.raises(SeaConfigError) as error:
        Submitter(worker="sea", cache_root=tmp_path, sea={"tiers": "/dev/shm"})
    assert "\n" not in str(error.value)
    assert not any(tmp_path.iterdir()), "a task ran or wrote something"


def test_a_tier_that_does_not_exist_fails_before_any_task(tmp_path):
    with Submitter(worker="sea", cache_root=tmp_path / "home", sea={"tiers": [{"path": str(tmp_path / "nowhere")}]}) as sub:
        with pytest.raises(SeaConfigError, match="does not exist") as error:
            sub(Chain(x=3))
    assert "\n" not in str(error.value)
    assert not [p for p in (tmp_path / "home").iterdir() if p.name.startswith("python-")], "a task ran"


def test_the_tiers_private_directories_live_for_the_run(tmp_path, shm_dir):
    with Submitter(worker="sea", cache_root=tmp_path / "home", n_procs=2, sea={"tiers": [{"path": str(shm_dir)}]}) as sub:
        assert sub(Chain(x=3)).outputs.out == 6
        assert len(list(shm_dir.glob("sea-*"))) == 1, "the run's private directory on the tier"
    assert not list(shm_dir.glob("sea-*")), "left behind after the Submitter closed"
