"""Pydra's own worker-parametrised tests, with ``"sea"`` beside ``"cf"``, from a checkout of Pydra's
repository (its tests are not in its wheel or sdist); prints the tests that fail only under Sea.

    python tests/peer/pydra_suite.py PYDRA_CHECKOUT [--keep DIR] [-- pytest args]

Run by hand (not in CI): PYDRA_CHECKOUT is Pydra's repository at the commit closest to the
installed release. The installed ``pydra`` package is copied to a temporary directory with the
checkout's test directories and conftest files added (the tests then import the installed release,
and Sea's ``pydra/workers/sea.py``, never the checkout's code), the ``worker`` fixture's parameters
are read from ``$PEER_WORKERS``, and :data:`FILES` run once with ``cf`` and once with ``sea``
(``--only-worker`` for the tests that take ``any_worker``). Exit status 1 when a test fails only
under Sea and is not in :data:`BY_DESIGN`.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from nipype_suite import arguments, outcomes, verdict, workdir  # noqa: E402

FILES = [
    "pydra/compose/tests/test_workflow_run.py",
    "pydra/compose/shell/tests/test_shell_run.py",
    "pydra/engine/tests/test_task_state.py",
    "pydra/workers/tests/test_worker.py",
    "pydra/engine/tests/test_cache_dirs.py",
    "pydra/environments/tests/test_environments.py",
    "pydra/engine/tests/test_job.py",
]
BY_DESIGN = {
    **{
        f"test_workflow_run::{name}": "a task's directory that no consumer reads any more stays within the checkpoint budget, not in "
        "cache_root (the test counts the directories there); they are all there with checkpoints: all"
        for name in (
            "test_wf_nostate_cachelocations_recompute",
            "test_wf_nostate_cachelocations_wftaskrerun_propagateTrue",
            "test_wf_nostate_cachelocations_wftaskrerun_propagateFalse",
            "test_wf_nostate_nodecachelocations",
            "test_wf_nostate_nodecachelocations_upd",
        )
    },
}
FIXTURE = '@pytest.fixture(scope="session", params=["debug", "cf"])'


def overlay(checkout: Path, dest: Path) -> None:
    installed = Path(importlib.util.find_spec("pydra.engine").submodule_search_locations[0]).parent
    shutil.copytree(installed, dest / "pydra", ignore=shutil.ignore_patterns("__pycache__"))
    for path in (checkout / "pydra").rglob("*"):
        inside_tests = "tests" in path.relative_to(checkout).parts
        if path.is_file() and (inside_tests or path.name == "conftest.py"):
            target = dest / path.relative_to(checkout)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, target)
    conftest = dest / "pydra" / "conftest.py"
    text = conftest.read_text()
    if FIXTURE not in text:
        raise SystemExit(f"{conftest}: the worker fixture changed; update FIXTURE in {__file__}")
    conftest.write_text(text.replace(FIXTURE, '@pytest.fixture(scope="session", params=os.environ["PEER_WORKERS"].split(","))'))


def run(dest: Path, worker: str, extra: list[str]) -> dict[str, str]:
    junit = dest / f"{worker}.xml"
    # the overlay first (its pydra), then what the caller's PYTHONPATH gives (a checkout of Sea)
    env = {**os.environ, "PEER_WORKERS": worker, "PYTHONPATH": os.pathsep.join(p for p in (str(dest), os.environ.get("PYTHONPATH", "")) if p)}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout", "120", "--only-worker", worker, f"--junitxml={junit}", *FILES, *extra]
    print(f"== {worker}: {' '.join(command[3:])}", flush=True)
    subprocess.run(command, cwd=dest, env=env, stdout=subprocess.DEVNULL if not extra else None)
    def neutral(test_id: str) -> str:  # the same id under either worker
        for before, after in ((f"[{worker}]", "[WORKER]"), (f"[{worker}-", "[WORKER-"), (f"-{worker}]", "-WORKER]"), (f"-{worker}-", "-WORKER-")):
            test_id = test_id.replace(before, after)
        return test_id

    return {neutral(test_id): outcome for test_id, outcome in outcomes(junit).items()}


def main(argv=None) -> int:
    parser = arguments(__doc__)
    parser.add_argument("checkout", type=Path, help="Pydra's repository at the commit closest to the installed release")
    args = parser.parse_args(argv)
    dest = workdir(args.keep, "sea-peer-pydra-")
    overlay(args.checkout.resolve(), dest)
    cf, sea = run(dest, "cf", args.pytest_args), run(dest, "sea", args.pytest_args)
    for worker, results in (("cf", cf), ("sea", sea)):
        parametrised = {t: o for t, o in results.items() if "WORKER" in t}
        print(f"{worker}: {len(results)} tests, of which {len(parametrised)} run by the worker: " + ", ".join(f"{sum(1 for o in parametrised.values() if o == kind)} {kind}" for kind in ("passed", "failed", "skipped")))
    sea_only = sorted(t for t, outcome in sea.items() if outcome == "failed" and cf.get(t) != "failed")
    unexplained = [t for t in sea_only if t.split("[")[0] not in BY_DESIGN]
    for test_id in sea_only:
        reason = BY_DESIGN.get(test_id.split("[")[0])
        print(f"by design: {test_id}: {reason}" if reason else f"FAILED ONLY UNDER SEA: {test_id}")
    return verdict(sea_only, unexplained, dest, args.keep)


if __name__ == "__main__":
    sys.exit(main())
