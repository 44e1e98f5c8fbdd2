"""Nipype's own engine and plugin tests, run from the installed package with MultiProc and Linear
swapped for SeaMultiProc, beside a baseline run; prints the tests that fail only under Sea.

    python tests/peer/nipype_suite.py [--smoke] [--keep DIR] [-- pytest args]

The tests ship in Nipype's wheel. They are copied to a temporary directory at run time (relative
imports that reach outside their package made absolute: the copy is not inside ``nipype``), with
``nipype_conftest.py`` as their conftest, and run three times by pytest: as they are, with Linear
and MultiProc swapped for MultiProc (the baseline: Linear runs nodes in the test's own process, and
some tests read what the nodes did there), and swapped for SeaMultiProc. A test that fails only
under Sea is either in :data:`BY_DESIGN`, and passes in a run of its own under the configuration
given there, or makes the exit status 1. ``--smoke`` (CI) runs three of the files under Sea only,
where any failure counts.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

SUITES = ["nipype.pipeline.engine.tests", "nipype.pipeline.plugins.tests"]
COPY = "nipype_peer"  # the copies' top package: their module paths keep Nipype's shape (graph labels read them)
# A quick subset for CI (the full run is marked slow): tests that run workflows through the plugins
# the swap replaces and pass under MultiProc (not test_join.py: its tests read globals the nodes set
# in Linear's process, fail under MultiProc, and one, test_itersource_two_join_nodes, once kept
# MultiProc spinning until its timeout)
SMOKE = [f"{COPY}/pipeline/{path}" for path in ("plugins/tests/test_multiproc.py", "plugins/tests/test_linear.py", "engine/tests/test_engine.py")]
# Tests that assert something Sea changes by design: test (module::function) -> (why, the Sea
# configuration under which they pass, checked by a run of their own). Also in docs/reliability.md.
KEPT = {"checkpoints": "all"}
INTERMEDIATES = "reads an intermediate node's directory after the run: Sea evicts it (checkpoints: all keeps it)"
BY_DESIGN: dict[str, tuple[str, dict]] = {
    "test_workflows::test_outputs_removal_wf": (INTERMEDIATES, KEPT),
    "test_utils::test_provenance": (INTERMEDIATES + "; write_workflow_prov reads every node's result", KEPT),
    "test_nodes::test_node_hash": ("a plugin of its own then finds an intermediate node's directory cached: Sea evicted it", KEPT),
}
HERE = Path(__file__).resolve().parent


def absolute_imports(source: str, package: str) -> str:
    """``from ..x import y`` in a module of ``package`` (level 2 or more) -> ``from <parent>.x import y``."""

    def absolute(match: re.Match) -> str:
        level, rest = len(match.group(2)), match.group(3)
        if level < 2:
            return match.group(0)
        base = package.split(".")[: len(package.split(".")) - level + 1]
        return f"{match.group(1)}from {'.'.join(base)}{'.' + rest if rest else ''} import"

    return re.sub(r"(?m)^(\s*)from (\.+)([\w.]*) import", absolute, source)


def copy_suite(dest: Path) -> None:
    for package in SUITES:
        source = Path(importlib.util.find_spec(package).submodule_search_locations[0])
        copy = dest.joinpath(COPY, *package.split(".")[1:])
        copy.mkdir(parents=True)
        for parent in [copy, *copy.relative_to(dest).parents][:-1]:
            (dest / parent).joinpath("__init__.py").touch()
        for path in source.glob("*.py"):
            (copy / path.name).write_text(absolute_imports(path.read_text(), package))
    shutil.copy(HERE / "nipype_conftest.py", dest / "conftest.py")
    (dest / "pytest.ini").write_text("[pytest]\njunit_family = xunit2\n")


def outcomes(junit: Path) -> dict[str, str]:
    """test id (module::name[params]) -> passed, failed or skipped."""
    result = {}
    for case in ET.parse(junit).iter("testcase"):
        test_id = f"{case.get('classname').rsplit('.', 1)[-1]}::{case.get('name')}"
        kinds = {child.tag for child in case}
        result[test_id] = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
    return result


def by_design(test_id: str) -> tuple[str, dict] | None:
    return BY_DESIGN.get(test_id.split("[")[0])


def run(dest: Path, paths: list[str], plugin: str, extra: list[str], config: dict | None = None, select: str = "", timeout: int = 300) -> dict[str, str]:
    """Run ``paths`` with Linear and MultiProc swapped for ``plugin`` ("" runs them as they are),
    with Sea's ``config`` added, only the tests ``select`` (a ``-k`` expression) names if given."""
    junit = dest / f"{plugin or 'as-is'}{'-' + str(abs(hash(select))) if select else ''}.xml"
    env = {**os.environ, "SEA_PEER": plugin, "SEA_PEER_CONFIG": json.dumps(config or {}), "PYTHONHASHSEED": "0"}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout", str(timeout), f"--junitxml={junit}", *paths, *(["-k", select] if select else []), *extra]
    print(f"== {plugin or 'as they are'}{' ' + json.dumps(config) if config else ''}: {' '.join(command[3:])}", flush=True)
    subprocess.run(command, cwd=dest, env=env, stdout=subprocess.DEVNULL if not extra else None)
    return outcomes(junit)


def counts(results: dict[str, str]) -> str:
    return f"{len(results)} tests: " + ", ".join(f"{sum(1 for v in results.values() if v == kind)} {kind}" for kind in ("passed", "failed", "skipped"))


def arguments(doc: str) -> argparse.ArgumentParser:
    """The options both peer-suite runners take."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="build the suite's tree here and keep it (default: a temporary directory)")
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (its output is then shown)")
    return parser


def workdir(keep: Path | None, prefix: str) -> Path:
    if keep is None:
        return Path(tempfile.mkdtemp(prefix=prefix))
    shutil.rmtree(keep, ignore_errors=True)
    return keep


def verdict(sea_only: list[str], unexplained: list[str], dest: Path, keep: Path | None) -> int:
    """The last line, the tree removed unless kept; exit status 1 on an unexplained Sea-only failure."""
    print(f"Sea-only failures: {len(sea_only)}, by design: {len(sea_only) - len(unexplained)}, unexplained: {len(unexplained)}")
    if keep is None:
        shutil.rmtree(dest, ignore_errors=True)
    return 1 if unexplained else 0


def main(argv=None) -> int:
    parser = arguments(__doc__)
    parser.add_argument("--smoke", action="store_true", help="only " + ", ".join(SMOKE) + ", under Sea only")
    args = parser.parse_args(argv)
    dest = workdir(args.keep, "sea-peer-nipype-")
    copy_suite(dest)
    paths = SMOKE if args.smoke else [COPY]
    # The smoke's tests all pass under MultiProc but one, which MultiProc spins on until its timeout in
    # most runs (test_parameterize_dirs_false: two nodes in one directory at once; the smoke's CI time
    # went from 22 to 53 s with it) and Sea passes: the smoke runs no baseline and counts every test
    # Sea fails (the full run compares with MultiProc's). Each test gets 30 s (they take at most 4).
    plugins = ("SeaMultiProc",) if args.smoke else ("", "MultiProc", "SeaMultiProc")
    timeout = 30 if args.smoke else 300
    results = {plugin: run(dest, paths, plugin, args.pytest_args, timeout=timeout) for plugin in plugins}
    sea, multiproc = results["SeaMultiProc"], results.get("MultiProc", {})
    sea_only = sorted(t for t, outcome in sea.items() if outcome == "failed" and multiproc.get(t) != "failed")
    # a by-design failure must pass under the configuration that gives back what the test reads
    rechecked: dict[str, str] = {}
    for config in {json.dumps(design[1]) for t in sea_only if (design := by_design(t))}:
        tests = [t for t in sea_only if (design := by_design(t)) and json.dumps(design[1]) == config]
        names = sorted({t.split("::", 1)[1].split("[")[0] for t in tests})
        found = run(dest, paths, "SeaMultiProc", args.pytest_args, json.loads(config), select=" or ".join(names))
        rechecked |= {t: found.get(t, "missing") for t in tests}
    print()
    for label, plugin in (("as they are (Linear, MultiProc)", ""), ("Linear and MultiProc -> MultiProc", "MultiProc"), ("Linear and MultiProc -> SeaMultiProc", "SeaMultiProc")):
        if plugin in results:
            print(f"{label}: {counts(results[plugin])}")
    unexplained = []
    for test_id in sea_only:
        design = by_design(test_id)
        if design is not None and rechecked.get(test_id) == "passed":
            print(f"by design: {test_id}: {design[0]}; passes with {json.dumps(design[1])}")
        else:
            unexplained.append(test_id)
            print(f"FAILED ONLY UNDER SEA: {test_id}" + (f" (by design, but failed with {json.dumps(design[1])} too)" if design else ""))
    return verdict(sea_only, unexplained, dest, args.keep)


if __name__ == "__main__":
    sys.exit(main())
