"""The ``sea`` command, and the configuration reference it generates."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sea import SeaConfig
from sea.cli import config_reference

ROOT = Path(__file__).parents[1]
DOCS = ROOT / "docs"


def sea(*args: str) -> subprocess.CompletedProcess:
    """``sea ARGS`` run by its ``main`` in this process (an interpreter's start-up costs more than
    most commands; tests that need a process of its own start one), as the process it would be:
    its exit code, what it printed, and on stderr any warning logged meanwhile, as Python prints a
    warning no handler took."""
    from sea.cli import main

    out, err = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(err)
    handler.setLevel(logging.WARNING)
    logging.getLogger().addHandler(handler)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as stop:  # argparse's usage errors
                code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    finally:
        logging.getLogger().removeHandler(handler)
    return subprocess.CompletedProcess(["sea", *args], code, out.getvalue(), err.getvalue())


def test_configuration_doc_is_generated_from_the_dataclass():
    assert (DOCS / "configuration.md").read_text() == config_reference(), "run: sea config-docs > docs/configuration.md"
    for key in SeaConfig.keys():
        assert f"## `{key}`" in config_reference()


def test_check_with_home_lists_tiers(disk_dir, shm_dir):
    config = disk_dir / "sea.yml"
    config.write_text(f"tiers:\n  - path: {shm_dir}\n    capacity: 1GiB\n")
    result = sea("check", str(config), "--home", str(disk_dir / "work"))
    assert result.returncode == 0, result.stderr
    assert str(shm_dir) in result.stdout and "capacity 1.0 GiB" in result.stdout
    assert list(shm_dir.iterdir()) == [], "check must leave nothing behind"


def test_report_command(disk_dir):
    result = sea("report", str(disk_dir))
    assert result.returncode == 2 and "no report at" in result.stderr
    (disk_dir / "sea-report.json").write_text('{"nodes_total": 3, "tiers": [{"name": "x"}]')  # cut short
    assert "is not a Sea run report" in one_error_line(sea("report", str(disk_dir)))
    (disk_dir / "sea-report.json").write_text('{"nodes_total": 3, "tiers": [{"name": "x"}]}')  # not a tier row
    assert "is not a Sea run report" in one_error_line(sea("report", str(disk_dir)))


def test_a_report_with_a_field_of_another_kind_is_one_line(disk_dir):
    """A report edited by hand (or another program's JSON of the same name): each field of a real
    report replaced, one at a time, by a value of another kind. 92 of those 390 reports ended
    ``sea report`` in a traceback of Sea's code (the eighteenth adversarial pass); each shows, or is
    refused in one line."""
    import json

    from sea.report import RunReport

    RunReport(nodes_total=3, nodes_run=2, failed_nodes=["wf/a"], late_writes=["wf/b"]).to_json(disk_dir / "sea-report.json")
    real = json.loads((disk_dir / "sea-report.json").read_text())
    for field in real:
        for value in (None, "text", -1, [1, "x"], {"a": 1}, 1e308):
            (disk_dir / "sea-report.json").write_text(json.dumps({**real, field: value}))
            result = sea("report", str(disk_dir))
            if result.returncode != 0:
                assert "is not a Sea run report" in one_error_line(result), (field, value)


def test_every_run_keeps_its_report_and_sea_report_lists_them(disk_dir, shm_dir):
    """A rerun that does nothing no longer hides the run that did the work: each run's report is
    kept, ``sea report`` says how many and lists them, ``--run N`` shows one, ``--plot`` draws one."""
    from example_workflows.incrementation import build_workflow, make_chunks

    make_chunks(disk_dir / "data", 2, 1)
    for _ in range(2):
        wf = build_workflow(disk_dir / "data", 2, 2, disk_dir / "work", disk_dir / "out")
        wf.run(plugin="SeaMultiProc", plugin_args={"n_procs": 2, "sea": {"tiers": [{"path": str(shm_dir)}]}})
    work = str(disk_dir / "work")
    latest = sea("report", work)
    assert latest.returncode == 0 and "0 run" in latest.stdout.splitlines()[0] and "2 runs kept" in latest.stdout, latest.stdout
    listed = sea("report", work, "--list").stdout.splitlines()
    assert len(listed) == 2 and all("succeeded" in line for line in listed), listed
    assert "8 run" in listed[0] and "0 run" in listed[1], listed  # oldest first: 2 chains x (select, 2 steps, a sink) ran, then nothing
    first = sea("report", work, "--run", "1")
    assert first.returncode == 0 and first.stdout.startswith("Sea run succeeded") and ", 8 run," in first.stdout.splitlines()[0], first.stdout
    assert "--list` lists its 2 run(s)" in one_error_line(sea("report", work, "--run", "3"))
    png = disk_dir / "timeline.png"
    result = sea("report", work, "--run", "1", "--plot", str(png))
    assert result.returncode == 0, result.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    piped = subprocess.run(f"{sys.executable} -m sea.cli report {work} --json | head -1", shell=True, capture_output=True, text=True)
    assert piped.stdout == "{\n" and piped.stderr == "", piped.stderr  # no BrokenPipeError when the reader stops


def test_probe_says_what_is_wrong_in_one_line_and_when_it_reuses_figures(disk_dir, tmp_path):
    assert "is not a directory" in one_error_line(sea("probe", str(disk_dir / "nowhere")))
    assert "cannot write a test file there" in one_error_line(sea("probe", "/proc"))
    first = sea("probe", str(disk_dir))
    assert first.returncode == 0 and "MiB/s" in first.stdout and "measured earlier" not in first.stdout, first.stderr
    again = sea("probe", str(disk_dir))
    assert "measured earlier on this host; --fresh measures again" in again.stdout, again.stdout


def test_the_suite_keeps_its_probe_figures_out_of_the_users_cache(disk_dir, tmp_path):
    """``sea probe`` writes in ~/.cache/sea by default; the test session's own directory
    ($SEA_CACHE, set by conftest) keeps the user's untouched."""
    from sea.probe import cache_file

    assert not cache_file().is_relative_to(Path.home()), cache_file()
    env = {k: v for k, v in os.environ.items() if k not in ("SEA_CACHE", "XDG_CACHE_HOME")} | {"HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "sea.cli", "probe", str(disk_dir)], capture_output=True, text=True, env=env)
    assert done.returncode == 0 and (tmp_path / ".cache" / "sea" / "bandwidth.json").is_file(), done.stderr


def test_the_demo_says_its_name_and_each_flag_with_its_default():
    done = subprocess.run([sys.executable, "-m", "example_workflows.incrementation", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.startswith("usage: python -m example_workflows.incrementation"), done.stdout
    flags = [line.split()[0] for line in done.stdout.splitlines() if line.startswith("  --")]
    assert len(flags) >= 8, done.stdout
    for flag in flags:
        text = done.stdout.split(flag, 1)[1].split("\n  -", 1)[0]
        assert len(text.split()) > 2, f"{flag} has no help text"
    assert "(default: 4)" in done.stdout and "(default: sea-demo)" in done.stdout


def one_error_line(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("sea: error: ") and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_check_reads_a_use_plugin_file_as_fmriprep_does(disk_dir, shm_dir, monkeypatch):
    """docs/fmriprep.md's sea-plugin.yml: Sea's settings are under plugin_args.sea."""
    monkeypatch.setenv("SLURM_TMPDIR", str(shm_dir))
    (disk_dir / "sea-plugin.yml").write_text(
        "plugin: SeaMultiProc\nplugin_args:\n  n_procs: 8\n  memory_gb: 2\n  sea:\n    tiers:\n      - path: ${SLURM_TMPDIR}\n    sinks: [DataSink, DerivativesDataSink]\n"
    )
    result = sea("check", str(disk_dir / "sea-plugin.yml"), "--home", str(disk_dir / "work"))
    assert result.returncode == 0 and str(shm_dir) in result.stdout, result.stderr
    (disk_dir / "bad-plugin.yml").write_text("plugin: SeaMultiProc\nplugin_args:\n  sea:\n    tierz: []\n")
    assert "plugin_args.sea: unknown key 'tierz'" in one_error_line(sea("check", str(disk_dir / "bad-plugin.yml")))


@pytest.mark.parametrize(
    "plugin_file, said",
    [
        ("plugin: SeaMultiproc\n", "plugin 'SeaMultiproc' is not a Sea plugin (did you mean 'SeaMultiProc'?)"),
        ("plugin: MultiProc\nplugin_args: {sea: {}}\n", "plugin 'MultiProc' is not a Sea plugin (did you mean 'SeaMultiProc'?)"),
        ("plugin: Linear\n", "plugin 'Linear' is not a Sea plugin: with it, plugin_args.sea is ignored; Sea's are SeaDask, SeaMultiProc"),
        ("plugin: SeaMultiProc\nplugin_args: {n_proc: 8}\n", "plugin_args: unknown key 'n_proc' (did you mean 'n_procs'?)"),
        ("plugin: SeaMultiProc\nplugin_args: {n_procs: 0}\n", "plugin_args['n_procs'] must be a whole number of at least 1, not 0"),
        ("plugin: SeaMultiProc\nplugin_args: {memory_gb: 100000}\n", "plugin_args['memory_gb'] 100000 is more than the"),
        ("plugin: SeaDask\nplugin_args: {n_procs: 4}\n", "plugin_args: unknown key 'n_procs'"),
        ("plugin: [SeaMultiProc]\n", "plugin must be a plugin's name, such as SeaMultiProc, not ['SeaMultiProc']"),
    ],
    ids=["plugin-case", "multiproc", "not-sea", "n_proc", "n_procs-0", "memory_gb", "dask-n_procs", "plugin-list"],
)
def test_check_refuses_each_mistake_of_a_use_plugin_file_in_one_line(disk_dir, plugin_file, said):
    """``sea check`` of an fMRIPrep ``--use-plugin`` file checks all of it (issue 35): the plugin's
    name, MultiProc's arguments as SeaMultiProc checks them, ``memory_gb`` against this machine."""
    (disk_dir / "plugin.yml").write_text(plugin_file)
    assert said in one_error_line(sea("check", str(disk_dir / "plugin.yml")))


def test_check_says_every_problem_of_a_use_plugin_file(disk_dir):
    (disk_dir / "plugin.yml").write_text("plugin: SeaMultiProc\nplugin_args:\n  n_proc: 8\n  memory_gb: -1\n  sea: {tierz: []}\n")
    result = sea("check", str(disk_dir / "plugin.yml"))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 3 and all(line.startswith("sea: error: ") for line in lines), result.stderr
    assert "'n_proc'" in lines[0] and "memory_gb" in lines[1] and "tierz" in lines[2], lines
    # a memory_gb past the machine is said beside another key's problem too (it was said alone only)
    (disk_dir / "plugin.yml").write_text("plugin: SeaMultiProc\nplugin_args:\n  n_proc: 8\n  memory_gb: 100000\n")
    lines = sea("check", str(disk_dir / "plugin.yml")).stderr.strip().splitlines()
    assert len(lines) == 2 and "'n_proc'" in lines[0] and "memory_gb'] 100000 is more than the" in lines[1], lines


def test_check_without_home_still_finds_a_missing_tier(disk_dir):
    (disk_dir / "sea.yml").write_text(f"tiers:\n  - path: {disk_dir}/nowhere\n")
    assert "tiers[0]: path" in one_error_line(sea("check", str(disk_dir / "sea.yml"))) and "does not exist" in sea("check", str(disk_dir / "sea.yml")).stderr


def test_config_surprises_are_refused_or_said(disk_dir, shm_dir, monkeypatch):
    """A capacity without a unit (500 bytes is never meant), an empty file: one line each. A tier
    under ``~`` is the user's home directory; a capacity larger than its filesystem is said."""
    (disk_dir / "bare.yml").write_text(f"tiers:\n  - path: {shm_dir}\n    capacity: 500\n")
    assert "capacity 500 has no unit" in one_error_line(sea("check", str(disk_dir / "bare.yml")))
    (disk_dir / "empty.yml").write_text("")
    assert "is empty" in one_error_line(sea("check", str(disk_dir / "empty.yml")))
    monkeypatch.setenv("HOME", str(shm_dir))
    (shm_dir / "sea").mkdir()
    (disk_dir / "tilde.yml").write_text("tiers:\n  - path: ~/sea\n")
    result = sea("check", str(disk_dir / "tilde.yml"), "--home", str(disk_dir / "work"))
    assert result.returncode == 0 and f"{shm_dir}/sea" in result.stdout, result.stderr
    (disk_dir / "huge.yml").write_text(f"tiers:\n  - path: {shm_dir}\n    capacity: 900TiB\n")
    result = sea("check", str(disk_dir / "huge.yml"), "--home", str(disk_dir / "work"))
    assert result.returncode == 0 and "capacity 900TiB is more than the whole filesystem" in result.stderr, result.stderr


def test_discovery_says_what_it_chose_and_what_it_left_out(disk_dir, shm_dir, monkeypatch):
    """No tiers listed: $SLURM_TMPDIR, $TMPDIR, /dev/shm. One set to a directory that does not
    exist, or on the home's filesystem, is left out with a warning saying so, never silently."""
    monkeypatch.setenv("SLURM_TMPDIR", str(disk_dir / "job-1234"))  # the job's directory was never made
    monkeypatch.setenv("TMPDIR", str(disk_dir))  # on the shared filesystem, as the home is
    result = sea("check", "--home", str(disk_dir / "work"))
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if "tiers found" in line]
    assert "tiers found: /dev/shm; left out" in line and "$SLURM_TMPDIR" in line and "not a directory that exists" in line, line
    assert "$TMPDIR" in line and "on the home's filesystem" in line, line


@pytest.mark.parametrize("target", [":", ":getcwd", ".:x", "d.py:f", "bad.py:f", "ok.py:x", "ok.py:"])
def test_sea_plan_of_a_target_it_cannot_load_says_so_in_one_line(tmp_path, target):
    """The sixth adversarial pass: an empty module or function name, a relative name, a directory
    named like a file, a file that is not Python, a name that is not a function: each was a
    traceback of Sea's. Now one line, and exit status 2."""
    (tmp_path / "d.py").mkdir()
    (tmp_path / "bad.py").write_text("def f(:\n")
    (tmp_path / "ok.py").write_text("x = 1\n")
    done = subprocess.run([sys.executable, "-c", "import sys; from sea.cli import main; sys.exit(main())", "plan", target],
                          capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith("sea: error: "), done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="another user's directory: made as root")
def test_sea_recover_in_a_tier_root_skips_other_users_directories_and_names_a_damaged_record(tmp_path):
    """The sixth adversarial pass: another user's planted sea-* directory with a kept-record in the
    tier root stopped the victim's `sea recover <tier>` before its own; a damaged record of one's
    own was a traceback. Now another's is not theirs to recover, and a damaged one is one line."""
    from sea.private import KEPT_FILE

    planted = tmp_path / "sea-0planted"
    planted.mkdir()
    (planted / KEPT_FILE).write_text("{}")
    os.chown(planted, 65534, 65534)
    done = sea("recover", str(tmp_path))
    assert done.returncode == 2 and "holds nothing a Sea run kept" in done.stderr and "Traceback" not in done.stderr, done.stderr
    mine = tmp_path / "sea-mine"
    mine.mkdir(mode=0o700)
    (mine / KEPT_FILE).write_text('{"copies": [')
    done = sea("recover", str(tmp_path))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and "is damaged" in done.stderr, done.stderr
