"""Every bad input gives one line that says what is wrong and how to fix it, before any node runs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from sea import SeaConfig, SeaConfigError
from sea.tiers import StorageHierarchy

from conftest import build_tiers_as, sea_private_dirs
from nipype_workflows import build_full, make_subjects, run


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text, f"error is not one line: {text!r}"
    return text


@dataclass(frozen=True)
class Bad:
    """One malformed input. ``sea`` is the configuration: a dict, or the path of a file; ``yaml`` is
    the text of a config file (then ``sea`` is its path). In their strings ``{shm}``, ``{shm2}``,
    ``{disk}``, ``{home}``, ``{file}`` and ``{ro}`` stand for the test's places (see ``places``).
    ``plugin_args`` go to SeaMultiProc; ``n_procs`` among them also to Pydra's Submitter.
    ``fronts``: where the input can be given (the CLI takes a file; rules are checked against a
    workflow, plugin_args exist in an adapter only)."""

    name: str
    words: tuple[str, ...]
    sea: Any = None
    yaml: str | None = None
    plugin_args: dict = field(default_factory=dict)
    fronts: tuple[str, ...] = ("cli", "nipype", "pydra")


ADAPTERS = ("nipype", "pydra")
TIER = {"tiers": [{"path": "{shm}"}]}  # a good configuration, for the cases of a bad plugin_arg


def with_tier(**more) -> dict:
    return {**TIER, **more}


BAD = [
    # keys
    Bad("unknown-top-level-key", ("unknown key 'tierz'", "did you mean 'tiers'"), {"tierz": [{"path": "{shm}"}]}),
    Bad("unknown-tier-key", ("unknown key 'capcity'", "did you mean 'capacity'"), {"tiers": [{"path": "{shm}", "capcity": "1GiB"}]}),
    Bad("rule-with-wrong-keys", ("exactly the keys 'pattern' and 'mode'",), with_tier(rules=[{"pattern": "**/*.nii", "mod": "copy"}])),
    # types
    Bad("tiers-not-a-list", ("tiers must be a non-empty list",), {"tiers": "{shm}"}),
    Bad("tiers-empty", ("tiers must be a non-empty list",), {"tiers": []}),
    Bad("tier-not-a-mapping", ("tiers[0] must be a mapping",), {"tiers": [42]}),
    Bad("tier-path-missing", ("'path' is missing",), {"tiers": [{"capacity": "1GiB"}]}),
    Bad("tier-path-not-a-string", ("'path' is missing or not a string",), {"tiers": [{"path": 7}]}),
    Bad("tier-path-with-nul", ("contains a NUL character",), {"tiers": [{"path": "{shm}/a\0b"}]}),
    Bad("rules-not-a-list", ("rules must be a list",), with_tier(rules={"pattern": "**/*.nii", "mode": "copy"})),
    Bad("keep-intermediates-yes", ("keep_intermediates must be true or false", "'yes'"), with_tier(keep_intermediates="yes")),
    Bad("stager-threads-0", ("stager_threads must be a whole number from 1 to 64", "not 0"), with_tier(stager_threads=0)),
    Bad("stager-threads-65", ("stager_threads must be a whole number from 1 to 64", "not 65"), with_tier(stager_threads=65)),
    Bad("stager-threads-string", ("stager_threads must be a whole number", "not '2'"), with_tier(stager_threads="2")),
    Bad("stager-threads-float", ("stager_threads must be a whole number", "not 2.5"), with_tier(stager_threads=2.5)),
    Bad("report-empty", ("report must be a file name",), with_tier(report="")),
    Bad("report-not-a-string", ("report must be a file name", "not 42"), with_tier(report=42)),
    Bad("report-outside-the-home", ("report '../x.json' would be written outside the home",), with_tier(report="../x.json")),
    Bad("report-absolute", ("report '/tmp/sea-report.json' would be written outside the home",), with_tier(report="/tmp/sea-report.json")),
    Bad("sinks-not-a-list", ("sinks must be a list of interface class names",), with_tier(sinks="DataSink")),
    Bad("sinks-not-identifiers", ("sinks must be a list of interface class names",), with_tier(sinks=["Data Sink", 3])),
    Bad("default-node-size-lots", ("default_node_size", "'lots' is not a size"), with_tier(default_node_size="lots")),
    Bad("default-node-size-negative", ("default_node_size", "-1 is negative"), with_tier(default_node_size=-1)),
    Bad("sea-not-a-dict", ("path to a YAML file or a dict", "not list"), [{"path": "{shm}"}], fronts=ADAPTERS),
    # paths and variables
    Bad("tier-missing", ("does not exist", "create it or fix the path"), {"tiers": [{"path": "{disk}/no/such/dir"}]}),
    Bad("tier-is-a-file", ("is not a directory",), {"tiers": [{"path": "{file}"}]}),
    Bad("unset-variable", ("${SEA_TEST_SURELY_UNSET}", "is not set"), {"tiers": [{"path": "${SEA_TEST_SURELY_UNSET}/sea"}]}),
    Bad("stray-dollar", ("stray '$'", "$$"), {"tiers": [{"path": "{shm}/$5"}]}),
    Bad("config-file-missing", ("does not exist", "give the path of a YAML file"), "{disk}/missing.yml"),
    Bad("config-path-is-a-directory", ("is a directory", "give the path of a YAML file"), "{home}"),
    # sizes
    Bad("capacity-12XB", ("capacity '12XB' is not a size", "GiB"), {"tiers": [{"path": "{shm}", "capacity": "12XB"}]}),
    Bad("capacity-150%", ("'150%' is not a percentage between 0% and 100%",), {"tiers": [{"path": "{shm}", "capacity": "150%"}]}),
    Bad("capacity-0", ("capacity '0B' leaves no room", "give a size such as 4GiB"), {"tiers": [{"path": "{shm}", "capacity": "0B"}]}),
    Bad("capacity-1-byte", ("capacity '1B' leaves no room for a single node directory",), {"tiers": [{"path": "{shm}", "capacity": "1B"}]}),
    Bad("capacity-without-unit", ("capacity 500 has no unit (it would be 500 bytes)", "write 500GiB, 500GB or 80%"), {"tiers": [{"path": "{shm}", "capacity": 500}]}),
    Bad("capacity-string-without-unit", ("capacity '4.5' has no unit", "write 4.5GiB, 4.5GB or 80%"), {"tiers": [{"path": "{shm}", "capacity": "4.5"}]}),
    Bad("capacity-share-below-a-node", ("leaves no room for a single node directory",), {"tiers": [{"path": "{shm}", "capacity": "0.0000001%"}]}),
    Bad("capacity-negative", ("capacity '-1GiB' is not a size",), {"tiers": [{"path": "{shm}", "capacity": "-1GiB"}]}),
    Bad("capacity-overflow", ("is too large to be a size",), {"tiers": [{"path": "{shm}", "capacity": "9" * 400 + "GiB"}]}),
    Bad("capacity-share-of-no-bytes", ("leaves no room",), {"tiers": [{"path": "{shm}", "capacity": "0.000000000000001%"}]}),
    # rules
    Bad("rule-bad-mode", ("mode 'flush' is not one of copy, move, remove, keep",), with_tier(rules=[{"pattern": "**/*.nii", "mode": "flush"}])),
    Bad("rule-bad-regex", ("'re:([' is not a valid regular expression",), with_tier(rules=[{"pattern": "re:([", "mode": "copy"}])),
    Bad("rule-glob-matches-nothing", ("matches no path this workflow can produce",), with_tier(rules=[{"pattern": "nowhere/at/all/*.nii", "mode": "copy"}]), fronts=ADAPTERS),
    Bad("rule-regex-matches-nothing", ("matches no path",), with_tier(rules=[{"pattern": "re:^elsewhere/.*", "mode": "move"}]), fronts=ADAPTERS),
    # YAML files
    Bad("yaml-bad-indentation", ("malformed YAML in", "line 3", "fix the syntax"), "{yaml}", yaml="tiers:\n  - path: {shm}\n   capacity: 3\n"),
    Bad("yaml-tab", ("malformed YAML in", "line 2", "'\\t'"), "{yaml}", yaml="tiers:\n\t- path: {shm}\n"),
    Bad("yaml-unclosed-bracket", ("malformed YAML in", "fix the syntax"), "{yaml}", yaml="tiers: [{path: {shm}}\n"),
    Bad("yaml-top-level-list", ("the top level must be a mapping", "not a list"), "{yaml}", yaml="- just\n- a list\n"),
    Bad("yaml-empty", ("is empty", "give no file to use the tiers Sea finds"), "{yaml}", yaml="# nothing yet\n"),
    Bad("yaml-not-utf8", ("is not UTF-8 text",), "{yaml}", yaml="tiers: [{path: caf\udce9}]\n"),
    # tiers against the home
    Bad("tier-inside-the-home", ("is inside the home", "outside the work directory (Nipype's base_dir, Pydra's cache_root)"), {"tiers": [{"path": "{home}/inside"}]}),
    Bad("tier-on-the-home-filesystem", ("same filesystem as the home", "node-local storage"), {"tiers": [{"path": "{disk}"}]}),
    Bad("two-tiers-on-one-filesystem", ("same filesystem as tier", "list each filesystem once"), {"tiers": [{"path": "{shm}"}, {"path": "{shm2}"}]}),
    Bad("tier-read-only", ("is not writable by this user",), {"tiers": [{"path": "{ro}"}]}),
    Bad("tier-not-really-writable", ("cannot create Sea's directory in '/proc'", "choose a directory you can write to"), {"tiers": [{"path": "{shm}"}, {"path": "/proc"}]}),
    # the adapters' own arguments
    Bad("n-procs-0", ("n_procs", "must be a whole number of at least 1", "not 0"), TIER, plugin_args={"n_procs": 0}, fronts=ADAPTERS),
    Bad("n-procs-string", ("n_procs", "must be a whole number of at least 1", "not '4'"), TIER, plugin_args={"n_procs": "4"}, fronts=ADAPTERS),
    Bad("n-procs-float", ("n_procs", "must be a whole number of at least 1", "not 2.5"), TIER, plugin_args={"n_procs": 2.5}, fronts=ADAPTERS),
    Bad("plugin-args-unknown-key", ("unknown key 'n_proc'", "did you mean 'n_procs'", "SeaMultiProc takes"), TIER, plugin_args={"n_proc": 2}, fronts=("nipype",)),
    Bad("memory-gb-negative", ("plugin_args['memory_gb'] must be a number greater than 0", "not -4"), TIER, plugin_args={"memory_gb": -4}, fronts=("nipype",)),
    Bad("memory-gb-string", ("plugin_args['memory_gb'] must be a number greater than 0", "not '8GB'"), TIER, plugin_args={"memory_gb": "8GB"}, fronts=("nipype",)),
    Bad("raise-insufficient-string", ("plugin_args['raise_insufficient'] must be true or false",), TIER, plugin_args={"raise_insufficient": "no"}, fronts=("nipype",)),
    Bad("scheduler-unknown", ("plugin_args['scheduler'] 'fifo' is not one of tsort, mem_thread",), TIER, plugin_args={"scheduler": "fifo"}, fronts=("nipype",)),
    Bad("mp-context-unknown", ("plugin_args['mp_context'] 'forks' is not one of fork, spawn, forkserver", "did you mean 'fork'"), TIER, plugin_args={"mp_context": "forks"}, fronts=("nipype",)),
]


def cases_for(front: str) -> list:
    return [pytest.param(case, id=case.name) for case in BAD if front in case.fronts]


def test_the_catalogue():
    """At least 30 distinct malformed inputs, each refused by every front end that can be given it."""
    assert len({case.name for case in BAD}) == len(BAD) >= 30
    assert len(set(map(repr, ((c.sea, c.yaml, c.plugin_args) for c in BAD)))) == len(BAD), "two cases are the same input"
    assert all(len(cases_for(front)) >= 30 for front in ("cli", "nipype", "pydra")), {f: len(cases_for(f)) for f in ("cli", "nipype", "pydra")}


class Places:
    """The directories a case names, made on demand; ``{ro}`` is a tmpfs remounted read-only."""

    def __init__(self, disk_dir: Path, shm_dir: Path, tmpfs_factory):
        self.disk, self.shm, self.home = disk_dir, shm_dir, disk_dir / "work"
        (self.home / "inside").mkdir(parents=True)
        (shm_dir / "b").mkdir()
        (disk_dir / "file").write_text("not a directory")
        self._tmpfs_factory = tmpfs_factory
        self.tiers = [shm_dir, shm_dir / "b", disk_dir, self.home / "inside"]  # where a private dir could appear
        self.subs = {"{shm2}": str(shm_dir / "b"), "{shm}": str(shm_dir), "{disk}": str(disk_dir), "{home}": str(self.home), "{file}": str(disk_dir / "file")}

    def resolve(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: self.resolve(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.resolve(v) for v in value]
        if not isinstance(value, str):
            return value
        if "{ro}" in value and "{ro}" not in self.subs:
            ro = self._tmpfs_factory("1M")
            subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)  # the fixture unmounts it
            self.subs["{ro}"] = str(ro)
            self.tiers.append(ro)
        for token, path in self.subs.items():
            value = value.replace(token, path)
        return value

    def sea(self, case: Bad) -> Any:
        """What the front ends are given: the case's config, with a file written for its YAML text."""
        if case.yaml is not None:
            path = self.disk / f"{case.name}.yml"
            path.write_bytes(self.resolve(case.yaml).encode("utf-8", "surrogateescape"))
            self.subs["{yaml}"] = str(path)
        return self.resolve(case.sea)

    def config_file(self, case: Bad) -> str:
        """The case as a file for ``sea check``."""
        sea = self.sea(case)
        if isinstance(sea, str):
            return sea
        path = self.disk / f"{case.name}.yml"
        path.write_text(yaml.safe_dump(sea))
        return str(path)


@pytest.fixture
def places(disk_dir, shm_dir, tmpfs_factory):
    return Places(disk_dir, shm_dir, tmpfs_factory)


def assert_refused(message: str, case: Bad, places: Places) -> None:
    assert "\n" not in message and "Traceback" not in message, f"not one line: {message!r}"
    missing = [word for word in case.words if word not in message]
    assert not missing, f"{case.name}: {missing} not in {message!r}"
    assert sea_private_dirs(*places.tiers) == [], "a refused start left Sea's private directory on a tier"


@pytest.mark.parametrize("case", cases_for("cli"))
def test_bad_input_in_the_cli(places, case, capsys, caplog):
    """``sea check`` (its ``main``, in this process: the command itself is run once below). What
    a process of its own would print of a warning logged meanwhile (Python's last resort handler,
    to stderr) is counted among the lines."""
    from sea.cli import main

    with caplog.at_level("WARNING"):
        code = main(["check", places.config_file(case), "--home", str(places.home)])
    out, err = capsys.readouterr()
    err += "".join(f"{record.getMessage()}\n" for record in caplog.records)
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and err.startswith("sea: error: "), err
    assert_refused(err.rstrip("\n"), case, places)


def test_the_sea_check_command_refuses_bad_input_in_one_line(places):
    """The command a user types, in a process of its own (the cases above call its ``main``)."""
    case = cases_for("cli")[0].values[0]
    result = subprocess.run(
        [sys.executable, "-m", "sea.cli", "check", places.config_file(case), "--home", str(places.home)], capture_output=True, text=True, errors="replace"
    )
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("sea: error: "), result.stderr
    assert_refused(result.stderr.rstrip("\n"), case, places)


@pytest.mark.parametrize("case", cases_for("nipype"))
def test_bad_input_stops_a_nipype_workflow_before_any_node_runs(places, case):
    data, out = places.disk / "data", places.disk / "out"
    workflow = build_full(data, make_subjects(data, n_subjects=1, mib=0.1), places.home, out)
    with pytest.raises(SeaConfigError) as info:
        run(workflow, "SeaMultiProc", places.sea(case), **case.plugin_args)
    assert_refused(str(info.value), case, places)
    assert not out.exists() and not list(places.home.glob("study/**/result_*.pklz")), "a node ran"


@pytest.mark.parametrize("case", cases_for("pydra"))
def test_bad_input_stops_a_pydra_workflow_before_any_task_runs(places, case):
    pytest.importorskip("pydra.compose", reason="Pydra 1.0 needs Python >= 3.11")
    from pydra.engine.submitter import Submitter

    from pydra_workflows import Study, make_images

    images = make_images(places.disk / "data", 1, side=8, seed=100 + BAD.index(case))
    n_procs = case.plugin_args.get("n_procs", 1)
    with pytest.raises(SeaConfigError) as info:
        with Submitter(worker="sea", cache_root=places.home, n_procs=n_procs, sea=places.sea(case)) as sub:
            sub(Study(in_files=images))
    assert_refused(str(info.value), case, places)
    assert not list(places.home.glob("python-*")) + list(places.home.glob("shell-*")), "a task ran"


def test_bad_yaml_files(tmp_path):
    bad = tmp_path / "sea.yml"
    bad.write_text("tiers:\n  - path: /dev/shm\n   capacity: 3\n")
    with pytest.raises(SeaConfigError, match=r"malformed YAML in .*sea.yml line 3"):
        SeaConfig.load(str(bad))
    bad.write_text("- just\n- a list\n")
    with pytest.raises(SeaConfigError, match="top level must be a mapping"):
        SeaConfig.load(bad)
    with pytest.raises(SeaConfigError, match="does not exist"):
        SeaConfig.load(str(tmp_path / "missing.yml"))
    with pytest.raises(SeaConfigError, match="path to a YAML file or a dict"):
        SeaConfig.load(42)


def test_sea_config_environment_variable(tmp_path, monkeypatch):
    good = tmp_path / "sea.yml"
    good.write_text("stager_threads: 3\n")
    monkeypatch.setenv("SEA_CONFIG", str(good))
    assert SeaConfig.load(None).stager_threads == 3
    assert SeaConfig.load({"stager_threads": 5}).stager_threads == 5  # an explicit 'sea' key wins


def test_unwritable_tier_for_a_normal_user(disk_dir, shm_dir):
    """As root every directory is writable; check the unprivileged case in a child process."""
    shm_dir.chmod(0o711)
    locked = shm_dir / "locked"
    locked.mkdir(mode=0o555)
    hidden = shm_dir / "hidden"
    hidden.mkdir(mode=0o700)
    (hidden / "tier").mkdir()
    os.chown(disk_dir, 65534, 65534)
    first, second = build_tiers_as(65534, 65534, [locked, hidden / "tier"], disk_dir / "work")
    assert "is not writable by this user" in first
    assert "cannot access" in second and "Permission denied" in second


@pytest.fixture
def small_dataset(disk_dir):
    data = disk_dir / "data"
    return data, make_subjects(data, n_subjects=1, mib=0.5)


def test_a_pydra_rule_on_job_directories_is_accepted(disk_dir, shm_dir):
    """Pydra's job directories are named when they are made; a rule on their shape is checked
    against that shape: here a copy of every job's result home."""
    pytest.importorskip("pydra.compose", reason="Pydra 1.0 needs Python >= 3.11")
    from pydra.engine.submitter import Submitter

    from pydra_workflows import Study, make_images

    images = make_images(disk_dir / "data", 1, seed=12)
    sea = {"tiers": [{"path": str(shm_dir)}], "rules": [{"pattern": "python-*/_job.pklz", "mode": "copy"}]}
    with Submitter(worker="sea", cache_root=disk_dir / "work", n_procs=1, sea=sea) as sub:
        assert not sub(Study(in_files=images)).errored
    assert len(list((disk_dir / "work").glob("python-*/_job.pklz"))) == 3  # scale, smooth, mean
    assert sea_private_dirs(shm_dir) == []


def test_a_rule_copy_of_a_directory_auto_checkpoints_comes_home_as_a_file(disk_dir, shm_dir):
    """``auto`` keeps the slow ``prep`` jobs' directories as packs; a rule asking for one of their
    files home wins over that: the file is at its path (in a pack it was out of sight, and a pack
    the budget drops at the run's end took it away; CI saw it as a flaky count of job files)."""
    pytest.importorskip("pydra.compose", reason="Pydra 1.0 needs Python >= 3.11")
    from pydra.engine.submitter import Submitter

    from pydra_workflows import RerunStudy, make_images

    images = make_images(disk_dir / "data", 2, seed=13)
    sea = {"tiers": [{"path": str(shm_dir)}], "rules": [{"pattern": "python-*/_job.pklz", "mode": "copy"}]}
    with Submitter(worker="sea", cache_root=disk_dir / "work", n_procs=2, sea=sea) as sub:
        assert not sub(RerunStudy(in_files=images, seconds=1.0)).errored
    assert len(list((disk_dir / "work").glob("python-*/_job.pklz"))) == 6  # prep, smooth, threshold per subject
    assert sea_private_dirs(shm_dir) == []


def test_rule_that_may_match_at_run_time_only_warns(small_dataset, disk_dir, shm_dir, caplog):
    data, subjects = small_dataset
    sea = {"tiers": [{"path": str(shm_dir)}], "rules": [{"pattern": "study/**/*.nii", "mode": "copy"}]}
    run(build_full(data, subjects, disk_dir / "work", disk_dir / "out"), "SeaMultiProc", sea)
    assert (disk_dir / "out" / "group" / "group_mean.nii").is_file()


def test_workflow_without_base_dir_runs_with_a_temporary_home(small_dataset, disk_dir, shm_dir, caplog):
    """Not bad input: Nipype runs such a workflow (a temporary directory per node), and so does
    SeaMultiProc, with one temporary home, said once (issue 17; SeaDask and `sea plan` refuse it)."""
    import logging

    data, subjects = small_dataset
    wf = build_full(data, subjects, disk_dir / "work", disk_dir / "out")
    wf.base_dir = None
    with caplog.at_level(logging.WARNING, logger="sea"):
        run(wf, "SeaMultiProc", {"tiers": [{"path": str(shm_dir)}]})
    assert sum("no base_dir" in r.getMessage() for r in caplog.records) == 1
    assert list((disk_dir / "out").rglob("*.nii.gz")), "the sinks delivered nothing"


def test_good_adapter_arguments_pass():
    """What the checks of the adapters' own arguments must let through."""
    import numpy as np

    from nipype_sea.plugin import check_plugin_args

    every_key = {
        "n_procs": 2, "memory_gb": 0.5, "raise_insufficient": False, "n_gpu_procs": 0, "mp_context": "spawn",
        "scheduler": "mem_thread", "status_callback": print, "max_jobs": float("inf"), "maxtasksperchild": 1,
        "non_daemon": True, "sea": "sea.yml",
    }  # fmt: skip
    assert check_plugin_args(every_key) == every_key and check_plugin_args(None) == {}
    assert check_plugin_args({"n_procs": np.int64(2), "memory_gb": np.float64(3), "scheduler": None, "mp_context": None, "max_jobs": 4})
    with pytest.raises(SeaConfigError, match=r"plugin_args must be a dict such as \{'n_procs': 4"):
        check_plugin_args([("n_procs", 2)])
    pytest.importorskip("pydra.compose", reason="Pydra 1.0 needs Python >= 3.11")
    from pydra_sea import SeaWorker

    worker = SeaWorker(n_procs=3)
    try:
        assert worker.pool._max_workers == 3  # the pool SeaWorker makes once n_procs is checked
    finally:
        worker.close()


def test_random_configs_give_one_line_or_a_working_hierarchy(disk_dir, shm_dir, tmpfs_factory):
    """Random configurations, valid or not, through SeaConfig.load (as a dict, or as a YAML file)
    and StorageHierarchy.build: a SeaConfigError of one line that left nothing on any tier, or a
    valid configuration whose tiers were all made. Any other exception fails the test."""
    from unittest import mock

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    home, other, discovered = disk_dir / "work", tmpfs_factory("1M"), shm_dir / "discovered"
    for directory in (home / "inside", shm_dir / "b", discovered):
        directory.mkdir(parents=True)
    (disk_dir / "file").write_text("x")
    usable = [str(shm_dir), str(shm_dir / "b"), str(other), "${SLURM_TMPDIR}"]  # alone: b and "discovered" share shm_dir's filesystem
    unusable = [str(disk_dir), str(home / "inside"), str(disk_dir / "file"), "/no/such/dir", "relative/dir",
                "${SEA_TEST_SURELY_UNSET}/x", "cost$5", "", " ", "a\0b", "/proc"]  # fmt: skip
    roots = [shm_dir, shm_dir / "b", other, discovered, disk_dir, home / "inside", Path("/proc")]
    keys = st.sampled_from([*SeaConfig.keys(), "path", "capacity", "pattern", "mode", "tierz", "capcity"]) | st.text(max_size=6)
    paths = st.sampled_from(usable) | st.sampled_from(unusable)
    scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=10) | paths
    anything = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3), max_leaves=6)
    sizes = st.sampled_from(["1GiB", "50%", "100%", "64MiB", "12XB", "150%", "0", "-1", "0%", "1e3", "9" * 400, "lots", "1e-15%", 0, -1, float("inf"), float("nan"), 2.5, 10**30, True, None])
    numbers = st.sampled_from([0, 1, 64, 65, -1, 2.5, float("inf"), float("nan"), 10**30, True, "2", None, [2]])
    patterns = st.sampled_from(["**/*.nii", "re:.*", "re:([", "re:", "", "**", "re:(?P<x", 3, None])
    modes = st.sampled_from(["copy", "move", "remove", "keep", "flush", "Copy", None, 1])
    good = {  # a valid value for each key (two tiers on one filesystem excepted)
        "tiers": st.lists(st.sampled_from([{"path": str(shm_dir)}, {"path": str(other), "capacity": "50%"}, "${SLURM_TMPDIR}"]), min_size=1, max_size=2, unique_by=str),
        "rules": st.just([{"pattern": "**/*.nii", "mode": "copy"}, {"pattern": "re:.*/_report/.*", "mode": "keep"}]),
        "keep_intermediates": st.booleans(),
        "stager_threads": st.integers(1, 64),
        "report": st.just("sea-report.json"),
        "sinks": st.just(["DataSink", "DerivativesDataSink"]),
        "default_node_size": st.sampled_from(["64MiB", 0, 2**20, 1.5]),
    }
    bad = {  # values of the right shape, mostly wrong
        "tiers": st.lists(st.fixed_dictionaries({"path": paths}, optional={"capacity": sizes}) | paths, min_size=1, max_size=2),
        "rules": st.lists(st.fixed_dictionaries({"pattern": patterns, "mode": modes}), min_size=1, max_size=2),
        "keep_intermediates": st.sampled_from(["yes", 1, 0, None, "true"]),
        "stager_threads": numbers,
        "report": st.sampled_from(["", " ", "r\0", 42, None, ["r.json"]]),
        "sinks": st.lists(st.sampled_from(["DataSink", "Data Sink", "", "1x", 3]), max_size=3) | st.sampled_from(["DataSink", None]),
        "default_node_size": sizes,
        "tierz": st.just([]),
    }
    valid = st.fixed_dictionaries({}, optional=good)
    # a valid configuration with one key made bad (tiers most often): the other keys hide nothing
    one_bad_key = st.sampled_from(["tiers", "tiers", "tiers", *bad]).flatmap(lambda key: st.builds(lambda config, value: {**config, key: value}, valid, bad[key]))
    configs = st.one_of(valid, one_bad_key, one_bad_key, one_bad_key, one_bad_key, st.dictionaries(keys, anything, max_size=4) | anything)
    yaml_like = st.text(alphabet="tiers:path-[]{},'\"\t\n #&*!|>%$", max_size=40)
    outcomes = {"refused": 0, "accepted": 0}

    @settings(max_examples=200, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(config=configs, how=st.sampled_from(["dict", "dict", "yaml file", "yaml file", "raw text"]), text=yaml_like)
    def check(config, how, text):
        source: Any = config
        if how != "dict":
            source = disk_dir / "random.yml"
            source.write_text(yaml.safe_dump(config) if how == "yaml file" else text)
        try:
            load_and_build(source)
        finally:  # what a failing example left must not fail the next ones
            for leftover in sea_private_dirs(*roots):
                shutil.rmtree(leftover, ignore_errors=True)

    def load_and_build(source) -> None:
        try:
            loaded = SeaConfig.load(source)
            hierarchy = StorageHierarchy.build(loaded, home)
        except SeaConfigError as error:
            assert "\n" not in str(error), str(error)
            assert sea_private_dirs(*roots) == [], f"refused with {error}, but left a private dir"
            outcomes["refused"] += 1
            return
        try:  # accepted: it is valid, and every tier it names is one Sea can use, with its private dir
            assert 1 <= loaded.stager_threads <= 64 and isinstance(loaded.keep_intermediates, bool) and loaded.report.strip()
            assert all(s.isidentifier() for s in loaded.sinks) and loaded.default_node_size >= 0
            roots_used = [t.root for t in hierarchy.fast_tiers]
            assert set(roots_used) <= {p.resolve() for p in (shm_dir, shm_dir / "b", other, discovered)}, roots_used
            assert len({os.stat(r).st_dev for r in roots_used}) == len(roots_used) == len(loaded.tiers or [None])
            assert all(t.workdir.is_dir() and t.workdir.parent == t.root for t in hierarchy.fast_tiers)
        finally:
            hierarchy.close()
        assert sea_private_dirs(*roots) == []
        outcomes["accepted"] += 1

    with mock.patch.dict(os.environ, {"SLURM_TMPDIR": str(discovered)}), mock.patch("sea.tiers.DISCOVERY_ORDER", ("$SLURM_TMPDIR",)):
        check()
    print(f"random configurations: {outcomes}")
    assert outcomes["refused"] >= 50 and outcomes["accepted"] >= 20, outcomes


def test_a_workflow_with_no_nodes_is_one_line(disk_dir, shm_dir):
    """MultiProc fails on it in a networkx traceback; SeaMultiProc failed in one of its own (an
    engine not made yet): one line saying what to do."""
    from nipype import Workflow

    from sea.console import SeaError

    wf = Workflow(name="empty", base_dir=str(disk_dir / "work"))
    with pytest.raises(SeaError, match="the workflow has no nodes to run"):
        wf.run(plugin="SeaMultiProc", plugin_args={"n_procs": 2, "sea": {"tiers": [{"path": str(shm_dir)}]}})


NOT_UTF8_RUNS = """
import json, os, sys
from pathlib import Path
sys.path.insert(0, sys.argv[3])
from pydra.engine.submitter import Submitter
from nipype_workflows import build_full, make_subjects, run
from pydra_workflows import Study, make_images
from sea import SeaConfigError
from sea.report import RunReport
disk, shm = Path(sys.argv[1]), sys.argv[2]
data, out, home = disk / "data", disk / "out", disk / os.fsdecode(b"w\\xff\\xfex")
seen = {}
try:
    run(build_full(data, make_subjects(data, n_subjects=1, mib=0.1), home, out), "SeaMultiProc", {"tiers": [{"path": shm}]})
except SeaConfigError as e:
    seen["nipype"] = str(e)
seen["nipype_out"] = out.exists()
images = make_images(disk / "images", 1, side=8, seed=171)
for worker in ("cf", "sea"):
    sea = {"sea": {"tiers": [{"path": shm}]}} if worker == "sea" else {}
    with Submitter(worker=worker, cache_root=home / worker, n_procs=2, **sea) as sub:
        result = sub(Study(in_files=images))
    seen[worker] = None if result.errored else Path(result.outputs.mean).read_bytes().hex()
report = RunReport.from_json(home / "sea" / "sea-report.json")
seen["report"] = [report.success, report.paths_recorded]
print(json.dumps(seen))
"""


def test_a_work_directory_named_in_bytes_that_are_not_utf8_is_one_line_for_nipype_and_runs_under_pydra(disk_dir, shm_dir):
    """The fifteenth adversarial pass: a ``base_dir`` whose name holds bytes of another encoding
    (``\\xff\\xfe``) ended the run in a traceback from Sea's own code (its tier directory's owner
    file could not be written). MultiProc waits for good there (its workers do not find the results
    they wrote): SeaMultiProc refuses it in one line before any node runs. Pydra's ``cf`` runs
    there (the sixteenth pass: Sea refused it): so does ``sea``, its tasks at their tier paths (a
    view's mounts there made the mount table unreadable to Pydra), with ``cf``'s results. In a
    process of its own: what it logs names that path, which pytest-xdist cannot send as text."""
    pytest.importorskip("pydra.compose", reason="Pydra 1.0 needs Python >= 3.11")
    tests = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests.parent), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", NOT_UTF8_RUNS, str(disk_dir), str(shm_dir), str(tests)], capture_output=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr.decode(errors="backslashreplace")[-3000:]
    seen = json.loads(done.stdout.decode().splitlines()[-1])
    assert "not UTF-8" in seen.get("nipype", "") and "\n" not in seen["nipype"] and not seen["nipype_out"], seen
    assert seen["cf"] is not None and seen["sea"] == seen["cf"], "sea's results are not cf's"
    assert seen["report"][0] and "not UTF-8" in seen["report"][1], seen["report"]
    assert sea_private_dirs(shm_dir) == []
