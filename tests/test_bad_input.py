"""Every bad input gives one line that says what is wrong and how to fix it, before any node runs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sea import SeaConfig, SeaConfigError
from sea.tiers import StorageHierarchy

from conftest import sea_private_dirs
from nipype_workflows import build_full, make_subjects, run


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text, f"error is not one line: {text!r}"
    return text


# (config dict, words the message must contain)
BAD_DICTS = [
    ({"tierz": []}, ["unknown key 'tierz'", "did you mean 'tiers'"]),
    ({"tiers": "/dev/shm"}, ["tiers must be a non-empty list"]),
    ({"tiers": []}, ["non-empty list"]),
    ({"tiers": [{"capacity": "1GiB"}]}, ["'path' is missing"]),
    ({"tiers": [{"path": "/dev/shm", "size": "1GiB"}]}, ["unknown key 'size'"]),
    ({"tiers": [{"path": "/dev/shm", "capacity": "12XB"}]}, ["'12XB' is not a size", "GiB"]),
    ({"tiers": [{"path": "/dev/shm", "capacity": "150%"}]}, ["between 0% and 100%"]),
    ({"tiers": [{"path": "${SEA_TEST_SURELY_UNSET}/sea"}]}, ["SEA_TEST_SURELY_UNSET", "is not set"]),
    ({"tiers": [42]}, ["must be a mapping"]),
    ({"rules": [{"pattern": "**/*.nii", "mode": "flush"}]}, ["mode 'flush' is not one of copy, move, remove, keep"]),
    ({"rules": [{"pattern": "**/*.nii"}]}, ["exactly the keys 'pattern' and 'mode'"]),
    ({"rules": [{"pattern": "re:([", "mode": "copy"}]}, ["not a valid regular expression"]),
    ({"rules": {"pattern": "x", "mode": "copy"}}, ["rules must be a list"]),
    ({"keep_intermediates": "yes"}, ["keep_intermediates must be true or false"]),
    ({"stager_threads": 0}, ["stager_threads must be a whole number from 1 to 64"]),
    ({"stager_threads": "2"}, ["stager_threads must be a whole number"]),
    ({"report": ""}, ["report must be a file name"]),
    ({"sinks": "DataSink"}, ["sinks must be a list of interface class names"]),
    ({"default_node_size": "lots"}, ["default_node_size", "is not a size"]),
]


@pytest.mark.parametrize("config, words", BAD_DICTS, ids=[str(i) for i in range(len(BAD_DICTS))])
def test_bad_config_dicts(config, words):
    with pytest.raises(SeaConfigError) as info:
        SeaConfig.load(config)
    message = one_line(info.value)
    for word in words:
        assert word in message


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


def tier_error(tiers, home) -> str:
    with pytest.raises(SeaConfigError) as info:
        StorageHierarchy.build(SeaConfig.load({"tiers": tiers}), home)
    return one_line(info.value)


def test_bad_tiers_against_the_home(disk_dir, shm_dir, tmpfs_factory):
    home = disk_dir / "work"
    assert "does not exist" in tier_error([{"path": "/no/such/dir"}], home)
    afile = disk_dir / "file"
    afile.write_text("x")
    assert "is not a directory" in tier_error([{"path": str(afile)}], home)
    home.mkdir()
    (home / "inside").mkdir()
    assert "inside the home" in tier_error([{"path": str(home / "inside")}], home)
    assert "same filesystem as the home" in tier_error([{"path": str(disk_dir)}], home)
    other = shm_dir / "b"
    other.mkdir()
    assert "same filesystem as tier" in tier_error([{"path": str(shm_dir)}, {"path": str(other)}], home)
    ro = tmpfs_factory("1M")
    subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)
    try:
        message = tier_error([{"path": str(ro)}], home)
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(ro)], check=True)
    assert "not writable" in message
    full = tmpfs_factory("1M")
    assert "leaves no room" in tier_error([{"path": str(full), "capacity": "0"}], home)


def test_unwritable_tier_for_a_normal_user(disk_dir, shm_dir):
    """As root every directory is writable; check the unprivileged case in a child process."""
    shm_dir.chmod(0o711)
    locked = shm_dir / "locked"
    locked.mkdir(mode=0o555)
    hidden = shm_dir / "hidden"
    hidden.mkdir(mode=0o700)
    (hidden / "tier").mkdir()
    os.chown(disk_dir, 65534, 65534)
    code = (
        "import os, sys\nfrom sea import SeaConfig, SeaConfigError\nfrom sea.tiers import StorageHierarchy\n"
        "os.setgid(65534); os.setuid(65534)\n"
        f"for tier in ({str(locked)!r}, {str(hidden / 'tier')!r}):\n"
        f"    try:\n        StorageHierarchy.build(SeaConfig.load({{'tiers': [{{'path': tier}}]}}), {str(disk_dir / 'work')!r})\n"
        "    except SeaConfigError as e:\n        print(e)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert result.returncode == 0, result.stderr
    first, second = result.stdout.splitlines()
    assert "is not writable by this user" in first
    assert "cannot access" in second and "Permission denied" in second


@pytest.fixture
def small_dataset(disk_dir):
    data = disk_dir / "data"
    return data, make_subjects(data, n_subjects=1, mib=0.5)


# bad configurations a run must refuse before its first node or task, in both adapters
BAD_RUNS = [
    ({"tiers": [{"path": "/no/such/dir"}]}, ["does not exist"]),
    (
        {"tiers": [{"path": "/dev/shm"}], "rules": [{"pattern": "nowhere/at/all/*.nii", "mode": "copy"}]},
        ["matches no path this workflow can produce"],
    ),
    ({"tiers": [{"path": "/dev/shm"}], "rules": [{"pattern": "re:^elsewhere/.*", "mode": "move"}]}, ["matches no path"]),
    ({"tierz": 1}, ["unknown key"]),
    ({"tiers": [{"path": "/dev/shm", "capacity": "12XB"}]}, ["'12XB' is not a size"]),
]


def on_test_tier(sea: dict, shm_dir) -> dict:
    """``/dev/shm`` in a case stands for the test's own directory there."""
    tiers = [{**t, "path": str(shm_dir)} if isinstance(t, dict) and t.get("path") == "/dev/shm" else t for t in sea.get("tiers", [])]
    return {**sea, "tiers": tiers} if "tiers" in sea else sea


@pytest.mark.parametrize("sea, words", BAD_RUNS)
def test_bad_input_stops_the_workflow_before_any_node_runs(small_dataset, disk_dir, shm_dir, sea, words):
    data, subjects = small_dataset
    home, out = disk_dir / "work", disk_dir / "out"
    with pytest.raises(SeaConfigError) as info:
        run(build_full(data, subjects, home, out), "SeaMultiProc", on_test_tier(sea, shm_dir))
    message = one_line(info.value)
    assert all(w in message for w in words)
    assert not out.exists()
    assert not list(home.glob("study/**/result_*.pklz")) if home.exists() else True
    assert sea_private_dirs(shm_dir) == [], "a refused start left Sea's private directory on the tier"


@pytest.mark.parametrize("sea, words", BAD_RUNS)
def test_bad_input_stops_a_pydra_workflow_before_any_task_runs(disk_dir, shm_dir, sea, words):
    pytest.importorskip("pydra.compose", reason="Pydra 1.0 needs Python >= 3.11")
    from pydra.engine.submitter import Submitter

    from pydra_workflows import Study, make_images

    images = make_images(disk_dir / "data", 1, seed=11)
    home = disk_dir / "work"
    with pytest.raises(SeaConfigError) as info:
        with Submitter(worker="sea", cache_root=home, n_procs=1, sea=on_test_tier(sea, shm_dir)) as sub:
            sub(Study(in_files=images))
    message = one_line(info.value)
    assert all(w in message for w in words)
    assert not list(home.glob("python-*")) + list(home.glob("shell-*")) if home.exists() else True, "a task ran"
    assert sea_private_dirs(shm_dir) == [], "a refused start left Sea's private directory on the tier"


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


def test_rule_that_may_match_at_run_time_only_warns(small_dataset, disk_dir, shm_dir, caplog):
    data, subjects = small_dataset
    sea = {"tiers": [{"path": str(shm_dir)}], "rules": [{"pattern": "study/**/*.nii", "mode": "copy"}]}
    run(build_full(data, subjects, disk_dir / "work", disk_dir / "out"), "SeaMultiProc", sea)
    assert (disk_dir / "out" / "group" / "group_mean.nii").is_file()


def test_workflow_without_base_dir(small_dataset, disk_dir, shm_dir):
    data, subjects = small_dataset
    wf = build_full(data, subjects, disk_dir / "work", disk_dir / "out")
    wf.base_dir = None
    with pytest.raises(SeaConfigError, match="no base_dir"):
        run(wf, "SeaMultiProc", {"tiers": [{"path": str(shm_dir)}]})


def test_cli_prints_one_line_without_traceback(tmp_path):
    bad = tmp_path / "sea.yml"
    bad.write_text("tiers: [{path: /dev/shm, capacity: 12XB}]\n")
    result = subprocess.run([sys.executable, "-m", "sea.cli", "check", str(bad)], capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "capacity '12XB' is not a size" in result.stderr
