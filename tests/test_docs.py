"""The documentation's examples run: every fenced block of docs/*.md is executed or, where it cannot
run here, checked as far as it can be (COVERAGE names the test that handles each block, and
test_every_doc_block_is_handled fails on a block no test handles); and the README's demo.

Site-specific values (/scratch/$USER, an account, 32 GB jobs) are replaced by what this machine has;
each test's docstring lists what it replaces and why.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from slurm_cluster import single_host_slurm

from sea.cli import main as sea_cli
from sea.journal import Journal
from sea.pack import pack_path
from sea.report import MemoryReport, RunReport, WorkerReport
from sea.sizes import parse_size

from conftest import tree_files

ROOT = Path(__file__).parents[1]
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^\n`]*)\n(?P<text>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)


@dataclass(frozen=True)
class Block:
    page: str  # docs/<page>
    lang: str  # the fence's language ("" if none)
    index: int  # among the page's blocks of that language
    text: str

    @property
    def id(self) -> str:
        return f"{self.page}-{self.index}" if self.lang == "python" else f"{self.page}-{self.lang}-{self.index}"


def fenced_blocks(path: Path) -> list[Block]:
    found: list[Block] = []
    for match in FENCE.finditer(path.read_text()):
        lang = (match["info"].split() or [""])[0]
        index = sum(b.lang == lang for b in found)
        text = re.sub(rf"^{match['indent']}", "", match["text"], flags=re.M)  # a fence indented in a list item
        found.append(Block(path.name, lang, index, text))
    return found


DOC_BLOCKS = [block for path in sorted((ROOT / "docs").glob("*.md")) for block in fenced_blocks(path)]

# Which test handles each block of docs/*.md: (test, page, language, regex the block starts with).
# Every block matches exactly one row, every row at least one block: a new block needs a row here.
COVERAGE = [
    ("test_docs_python_blocks_run", "*", "python", ""),
    ("test_docs_commands_run", "*", "bash", r"python -m |apt-get install "),
    ("test_configuration_blocks_pass_sea_check", "configuration.md", "yaml", ""),
    ("test_fmriprep_use_plugin_recipe_runs_a_workflow", "fmriprep.md", "yaml", r"plugin: SeaMultiProc\n"),
    ("test_fmriprep_use_plugin_recipe_runs_a_workflow", "fmriprep.md", "bash", r"fmriprep .* --use-plugin "),
    ("test_fmriprep_array_script_runs_one_participant_per_work_directory", "fmriprep.md", "bash", r"#!/bin/bash\n#SBATCH --job-name=fmriprep-sea"),
    ("test_slurm_batch_script_runs_on_slurm", "slurm.md", "bash", r"#!/bin/bash\n#SBATCH --job-name=sea-driver"),
    ("test_slurm_array_runs_a_subject_per_task_and_a_resubmitted_task_resumes", "slurm.md", "bash", r"#!/bin/bash\n#SBATCH --job-name=sea-subjects|# once, on the login node"),
    ("test_slurm_use_plugin_yaml_runs_on_slurm", "slurm.md", "yaml", r"plugin: SeaDask\n"),
    ("test_slurm_use_plugin_yaml_runs_on_slurm", "slurm.md", "bash", r"fmriprep .* --use-plugin "),
    ("test_report_listing_is_what_the_report_prints", "slurm.md", "text", r"\s*worker\s+nodes\s+local inputs"),
    ("test_memory_line_is_what_the_report_prints", "slurm.md", "text", r"\s*memory: peak"),
    ("test_console_session_prints_what_the_doc_shows", "performance.md", "console", r"\$ "),
    ("test_how_it_works_diagram_is_the_home_after_a_run", "how-it-works.md", "text", ""),
    ("test_progress_capture_is_what_a_terminal_shows", "quickstart.md", "text", r"\[Sea\] "),
    ("test_the_documentation_builds_without_a_warning", "index.md", "{toctree}", ""),
    # containers.md runs in a real Podman (tests/test_container.py, slow)
    ("test_container.py::test_derived_image_runs_the_pipeline_as_multiproc_does", "containers.md", "bash", r"# on the host, in a clone of this repository: Sea as one wheel|docker run --rm -v /dev/shm"),
    ("test_container.py::test_derived_image_runs_the_pipeline_as_multiproc_does", "containers.md", "dockerfile", ""),
    ("test_container.py::test_derived_image_runs_the_pipeline_as_multiproc_does", "containers.md", "yaml", ""),
    ("test_container.py::test_derived_image_runs_the_pipeline_as_multiproc_does", "containers.md", "text", r"\[Sea\] inside a container"),
    ("test_container.py::test_apptainer_recipe_installs_what_the_dockerfile_installs", "containers.md", "singularity", ""),
    ("test_container.py::test_apptainer_recipe_installs_what_the_dockerfile_installs", "containers.md", "bash", r"apptainer run "),
    ("test_container.py::test_without_rebuilding_sea_is_bound_into_the_engine_image", "containers.md", "bash", r"# on the host, in a clone of this repository: Sea \(no|docker run --rm -v ~/sea-in-container"),
]


def defined(test: str) -> bool:
    """A test of this module, or one of another named as ``test_x.py::test_name``."""
    import importlib

    module, _, name = test.rpartition("::")
    return callable(vars(importlib.import_module(Path(module).stem) if module else sys.modules[__name__]).get(name))


def rows_matching(block: Block) -> list[str]:
    return [
        test
        for test, page, lang, start in COVERAGE
        if fnmatch.fnmatch(block.page, page) and block.lang == lang and re.match(start, block.text)
    ]


def handled_by(test: str) -> list[Block]:
    return [block for block in DOC_BLOCKS if rows_matching(block) == [test]]


def one_block(test: str, lang: str) -> Block:
    (block,) = [b for b in handled_by(test) if b.lang == lang]
    return block


def test_every_doc_block_is_handled():
    """A block of a language or a kind no test handles fails here instead of going untested; so
    does a fence the parser missed (every ``` line must open or close a block it found)."""
    for path in sorted((ROOT / "docs").glob("*.md")):
        fences = [line for line in path.read_text().splitlines() if line.lstrip().startswith(("```", "~~~"))]
        assert len(fences) == 2 * len(fenced_blocks(path)), f"{path.name}: a fence the tests do not parse (```, ~~~ or one left open)"
    unhandled = [
        f"{b.id} ({b.lang or 'no language'}): {b.text.splitlines()[0][:60]!r} -> {rows_matching(b)}"
        for b in DOC_BLOCKS
        if len(rows_matching(b)) != 1
    ]
    assert not unhandled, "blocks handled by no test (or by two): add a row to COVERAGE and a test\n" + "\n".join(unhandled)
    for test, *rule in COVERAGE:
        assert defined(test), f"COVERAGE names {test}, which is not defined"
        assert any(rows_matching(b) == [test] for b in DOC_BLOCKS), f"no block left for {test} {rule}: remove the row"


# --------------------------------------------------------------------------------- python
@pytest.mark.parametrize("block", handled_by("test_docs_python_blocks_run"), ids=lambda b: b.id)
def test_docs_python_blocks_run(block, tmp_path):
    script = tmp_path / "example.py"  # Nipype's Function reads the source of its function from a file
    script.write_text(block.text)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, f"{block.id} failed:\n{result.stderr[-2000:]}"
    shutil.rmtree("/tmp/sea-quickstart", ignore_errors=True)


def test_readme_demo_command_prints_the_report(tmp_path):
    readme = (ROOT / "README.md").read_text()
    command = re.search(r"^pip install \. && (python -m example_workflows\.incrementation.*)$", readme, re.M).group(1)
    args = command.split()[1:]
    args[args.index("--root") + 1] = str(tmp_path / "demo")
    result = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    output = result.stdout + result.stderr
    assert output.count("Sea run succeeded") == 1 and "flushed home" in output, output[-3000:]  # the report, once
    assert "--plot" in output and "sea report " in result.stdout, "the end of a run says how to see the report again and plot it"


def test_ci_runs_exactly_the_readme_test_command():
    """CI's script is the README's second command and nothing else a fresh machine would lack: the
    suite installs the Debian packages it uses (tests/system_packages.py)."""
    readme = (ROOT / "README.md").read_text()
    (command,) = re.findall(r"^(pip install '\.\[test\]'.*)$", readme, re.M)
    script = (ROOT / ".ci" / "run").read_text().splitlines()
    steps = [line for line in script if line.strip() and not line.startswith(("#", "set ", "cd "))]
    assert steps == [command]


# --------------------------------------------------------------------------------- bash: the examples
# Flags appended to each documented command (argparse keeps the last value): the smallest data that
# still runs every node. A module missing here fails: add it with its flags.
SHRINK = {
    "example_workflows.incrementation": [],  # 4 chunks of 8 MiB, 3 iterations: 2 s as documented
    "example_workflows.fmri_preproc": ["--subjects", "1", "--volumes", "12", "--matrix", "16"],
    "example_workflows.dwi_mrtrix": ["--subjects", "1", "--matrix", "12", "--directions", "6"],
}
# Commands too long to run here (minutes to hours): their flags are parsed (--help after them: argparse
# checks each value it reads before it meets --help) but nothing runs. The smoke benchmark runs in
# tests/test_benchmark_smoke.py.
FLAGS_ONLY = {"benchmarks.run"}
APT_TOOLS = {"mrtrix3": "mrconvert"}  # `apt-get install PACKAGE` is checked as: its tool is on PATH
PLUGIN_FLAG = argparse.ArgumentParser(add_help=False)  # the examples' --plugin, to know what they print
PLUGIN_FLAG.add_argument("--plugin", default="SeaMultiProc")


@pytest.mark.parametrize("block", handled_by("test_docs_commands_run"), ids=lambda b: b.id)
def test_docs_commands_run(block, tmp_path):
    """Each line of the page's ```bash block, from the repository root (as the pages assume), in
    order: ``python -m example_workflows.X`` runs for real with ``--root`` moved into tmp_path and the
    SHRINK flags appended, and prints its summary (Sea's report line, or the plugin's timing line);
    ``apt-get install`` is not run: its tool must be installed, else the rest of the block is skipped
    (CI installs mrtrix3)."""
    for line in block.text.splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        if words[:2] == ["apt-get", "install"]:
            assert set(words[2:]) <= set(APT_TOOLS), f"{line!r}: add the package's tool to APT_TOOLS"
            missing = [package for package in words[2:] if shutil.which(APT_TOOLS[package]) is None]
            if missing:
                pytest.skip(f"{' '.join(missing)} not installed here, so not: {' '.join(block.text.splitlines()[1:])}")
            continue
        assert words[:2] == ["python", "-m"], f"{block.id}: {line!r} is not a command this test runs: teach it"
        module, args = words[2], words[3:]
        if module in FLAGS_ONLY:
            result = subprocess.run([sys.executable, "-m", module, *args, "--help"], capture_output=True, text=True, cwd=ROOT, timeout=120)
            assert result.returncode == 0 and "usage:" in result.stdout, f"{line}\n{result.stderr[-2000:]}"
            continue
        if "--root" in args:
            args[args.index("--root") + 1] = str(tmp_path / Path(args[args.index("--root") + 1]).name)
        assert module in SHRINK, f"{line!r}: add {module} to SHRINK (flags for small data) or FLAGS_ONLY"
        args += SHRINK[module]
        plugin = PLUGIN_FLAG.parse_known_args(args)[0].plugin
        result = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=ROOT, timeout=300)
        assert result.returncode == 0, f"{line}\n{result.stderr[-3000:]}"
        summary = r"^Sea run succeeded in " if plugin.startswith("Sea") else rf"^{plugin}: .* in [\d.]+ s"
        output = result.stdout + result.stderr  # Sea's report is logged (standard error), the example's summary printed
        assert re.search(summary, output, re.M), f"{line}: no {summary!r} in its output:\n{output[-3000:]}"


def normalized(line: str) -> str:
    """Digits (sizes, times) and column widths aside."""
    return re.sub(r"\d+(\.\d+)?", "0", " ".join(line.split()))


def assert_shows(expected: list[str], output: str, what: str) -> None:
    """``expected`` is in ``output`` line for line, a ``...`` line standing for any lines."""
    lines, at = [normalized(line) for line in output.splitlines()], 0
    for part in re.split(r"^\s*\.\.\.\s*$", "\n".join(expected), flags=re.M):
        want = [normalized(line) for line in part.strip("\n").splitlines()]
        found = next((i for i in range(at, len(lines) - len(want) + 1) if lines[i : i + len(want)] == want), None)
        assert found is not None, f"{what}: the doc shows\n{part}\nbut it printed\n{output[-3000:]}"
        at = found + len(want)


def test_console_session_prints_what_the_doc_shows(tmp_path):
    """performance.md's ``sea plan`` session, run as shown in a fresh directory (its /tmp/sea-demo
    made one of the test's own): ``python`` is this interpreter, ``sea`` is ``python -m sea.cli`` of this
    checkout. What the page shows after a command must be in its output, digits aside (sizes and
    times are measured). Tier discovery as on the machine the page shows (no $SLURM_TMPDIR, $TMPDIR or
    $SEA_CONFIG: /dev/shm); the bandwidth probe's cache in tmp_path, so it measures afresh."""
    block = one_block("test_console_session_prints_what_the_doc_shows", "console")
    env = {k: v for k, v in os.environ.items() if k not in ("SLURM_TMPDIR", "TMPDIR", "SEA_CONFIG")}
    demo = tmp_path / "sea-demo"  # the page's /tmp/sea-demo, the README's
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])), SEA_CACHE=str(tmp_path / "cache"), SEA_DEMO_ROOT=str(demo))
    commands = re.split(r"^\$ ", block.text, flags=re.M)[1:]
    assert len(commands) == 2, block.text
    for command in commands:
        line, *shown = command.splitlines()
        words = shlex.split(line.replace("/tmp/sea-demo", str(demo)), comments=True)
        program = {"python": [sys.executable], "sea": [sys.executable, "-m", "sea.cli"]}[words[0]]
        result = subprocess.run([*program, *words[1:]], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
        assert result.returncode == 0, f"{line}\n{result.stderr[-3000:]}"
        assert_shows(shown, result.stdout, line)


# --------------------------------------------------------------------------------- yaml: Sea configurations
@pytest.mark.parametrize("block", handled_by("test_configuration_blocks_pass_sea_check"), ids=lambda b: b.id)
def test_configuration_blocks_pass_sea_check(block, tmp_path, tmpfs_factory, monkeypatch, capsys):
    """``sea check FILE --home BASE_DIR`` on each example of the configuration reference: the YAML
    loads (``sea check FILE`` alone) and its tiers are real, writable and on another filesystem than
    the home. The file is the page's as is; ``${SLURM_TMPDIR}`` is set to a tmpfs of its own, as a
    job's is (under /dev/shm it would share the /dev/shm tier's filesystem, which Sea refuses)."""
    slurm_tmpdir = tmpfs_factory("16M")
    monkeypatch.setenv("SLURM_TMPDIR", str(slurm_tmpdir))
    for tier in yaml.safe_load(block.text).get("tiers") or []:
        if (path := Path(os.path.expandvars(tier["path"]))).is_relative_to(slurm_tmpdir):
            path.mkdir(parents=True, exist_ok=True)  # ${SLURM_TMPDIR}/sea: made by the job, as a site's Prolog would
    config = tmp_path / "sea.yml"
    config.write_text(block.text)
    assert sea_cli(["check", str(config)]) == 0, capsys.readouterr().err
    assert sea_cli(["check", str(config), "--home", str(tmp_path / "work")]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "configuration OK; tiers, fastest first:" in out, out
    if "${SLURM_TMPDIR}" in block.text:
        assert str(slurm_tmpdir) in out, out


def test_readme_configuration_passes_sea_check(tmp_path, tmpfs_factory, monkeypatch, capsys):
    """The README's configuration example, checked as those of docs/configuration.md are."""
    (text,) = re.findall(r"```yaml\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    monkeypatch.setenv("SLURM_TMPDIR", str(tmpfs_factory("16M")))
    (tmp_path / "sea.yml").write_text(text)
    assert sea_cli(["check", str(tmp_path / "sea.yml"), "--home", str(tmp_path / "work")]) == 0, capsys.readouterr().err
    assert os.environ["SLURM_TMPDIR"] in capsys.readouterr().out


# --------------------------------------------------------------------------------- fMRIPrep's --use-plugin
FMRIPREP = argparse.ArgumentParser(prog="fmriprep", add_help=False)  # the options the pages use, as fMRIPrep names them
FMRIPREP.add_argument("bids_dir")
FMRIPREP.add_argument("output_dir")
FMRIPREP.add_argument("analysis_level", choices=["participant"])
FMRIPREP.add_argument("-w", "--work-dir", required=True)
FMRIPREP.add_argument("--use-plugin", required=True)
FMRIPREP.add_argument("--participant-label", nargs="+")


def fmriprep_run(command: str, plugin_yaml: str, tmp_path: Path) -> Path:
    """What ``command`` (an fmriprep command line of the docs) does with Nipype, for an
    fMRIPrep-like workflow (example_workflows.fmri_preproc, with its DerivativesDataSink): the
    plugin file read as fMRIPrep reads ``--use-plugin`` (yaml.safe_load; ``plugin`` and
    ``plugin_args`` passed to ``workflow.run``; n_procs and memory_gb added only for MultiProc and
    LegacyMultiProc). The command's paths name the user's site (/data, /scratch/$USER): each becomes
    tmp_path/<its last part>. Returns the work directory (the home)."""
    from example_workflows.fmri_preproc import build_workflow, make_dataset

    words = shlex.split(command, comments=True)
    assert words[0] == "fmriprep", command
    opts = FMRIPREP.parse_args(words[1:])
    bids, derivatives, work, plugin_file = (
        tmp_path / Path(p).name for p in (opts.bids_dir, opts.output_dir, opts.work_dir, opts.use_plugin)
    )
    assert len({bids, derivatives, work, plugin_file}) == 4, command
    plugin_file.write_text(plugin_yaml)

    with open(plugin_file) as f:  # fmriprep/cli/parser.py
        plugin_settings = yaml.safe_load(f)
    plugin, plugin_args = plugin_settings["plugin"], plugin_settings.get("plugin_args", {})
    if plugin in ("MultiProc", "LegacyMultiProc"):  # fmriprep/config.py: nipype.get_plugin()
        plugin_args["n_procs"] = os.cpu_count()
    wf = build_workflow(bids, make_dataset(bids, 1, volumes=12, matrix=16), base_dir=work, out_dir=derivatives)
    wf.config["execution"]["poll_sleep_duration"] = 0.05
    wf.run(plugin=plugin, plugin_args=plugin_args)
    assert (derivatives / "sub-01" / "func" / "sub-01_task-rest_desc-preproc_bold.nii").is_file()
    return work


def test_fmriprep_use_plugin_recipe_runs_a_workflow(tmp_path, tmpfs_factory, monkeypatch):
    """fmriprep.md: fMRIPrep is not installed here, so its command line is parsed and what it does
    with ``--use-plugin`` is done to an fMRIPrep-like Nipype workflow (see fmriprep_run), with the
    page's plugin file as is (8 processes and 32 GB, more than this machine may have:
    ``raise_insufficient: false`` lets it run). ``${SLURM_TMPDIR}`` is a tmpfs of its own: every node
    runs there, and the DerivativesDataSink outputs (``sinks``) are staged and copied home."""
    slurm_tmpdir = tmpfs_factory("1G")  # room for 8 nodes of default_node_size (64 MiB) at once; only what is written uses memory
    monkeypatch.setenv("SLURM_TMPDIR", str(slurm_tmpdir))
    plugin_yaml = one_block("test_fmriprep_use_plugin_recipe_runs_a_workflow", "yaml").text
    command = one_block("test_fmriprep_use_plugin_recipe_runs_a_workflow", "bash").text
    assert yaml.safe_load(plugin_yaml)["plugin_args"]["n_procs"] == 8  # in the file: fMRIPrep adds none for SeaMultiProc
    report = RunReport.from_json(fmriprep_run(command, plugin_yaml, tmp_path) / "sea-report.json")
    assert report.success and report.nodes_run == report.nodes_total > 0, report.to_text()
    (tier,) = [t for t in report.tiers if not t.name.startswith("home:")]
    assert Path(tier.path) == slurm_tmpdir and tier.nodes_placed == report.nodes_run, report.to_text()
    assert report.files_flushed >= 5, report.to_text()  # the five derivatives, staged then copied home


def test_fmriprep_array_script_runs_one_participant_per_work_directory(tmp_path, tmpfs_factory, monkeypatch):
    """fmriprep.md's array script: its fmriprep line, for task 1 (sub-01, from subjects.txt), with the
    page's plugin file and ${SLURM_TMPDIR} a tmpfs of its own, as fmriprep_run does it (fMRIPrep is
    not installed; slurm.md's array runs on a real SLURM); its work directory is the subject's own."""
    script = one_block("test_fmriprep_array_script_runs_one_participant_per_work_directory", "bash").text
    assert "#SBATCH --array=" in script and '--signal=B:TERM@' in script and "\nexec fmriprep " in script
    line = next(line for line in script.splitlines() if line.startswith("exec fmriprep "))
    command = line.removeprefix("exec ").replace('"$subject"', "01").replace("sub-$subject", "sub-01").replace("$USER", "user")
    slurm_tmpdir = tmpfs_factory("1G")
    monkeypatch.setenv("SLURM_TMPDIR", str(slurm_tmpdir))
    plugin_yaml = one_block("test_fmriprep_use_plugin_recipe_runs_a_workflow", "yaml").text
    work = fmriprep_run(command, plugin_yaml, tmp_path)
    assert work == tmp_path / "sub-01"  # -w /scratch/$USER/work/sub-01: the subject's own
    report = RunReport.from_json(work / "sea-report.json")
    assert report.success and Path(next(t for t in report.tiers if not t.name.startswith("home:")).path) == slurm_tmpdir, report.to_text()


# --------------------------------------------------------------------------------- slurm.md on a real SLURM
SLURM_DIR = Path("/var/tmp/sea-slurm-docs")
SLURM_PORTS = {"SLURMCTLD_PORT": "6927", "SLURMD_PORT": "6928"}  # tests/test_slurm.py's cluster uses 6917 and 6918


@pytest.fixture(scope="module")
def slurm():
    """A single-host SLURM for this module (tests/slurm/start_slurm.sh, as tests/test_slurm.py starts
    its own, in another directory on other ports, so either may run first), stopped at its end;
    skipped where it cannot run. Yields what sbatch and the jobs need in their environment."""
    pytest.importorskip("dask_jobqueue")
    with single_host_slurm(SLURM_DIR, SLURM_PORTS) as env:
        yield env
    assert not SLURM_DIR.exists()


def wait_for_idle(env: dict, seconds: float = 30) -> None:
    """No job left (the worker jobs are cancelled when run() returns): the next test has the cores."""
    deadline = time.monotonic() + seconds
    while subprocess.run(["squeue", "-h"], capture_output=True, text=True, env=env, check=True).stdout.strip():
        assert time.monotonic() < deadline, "jobs left: " + subprocess.run(["squeue"], capture_output=True, text=True, env=env).stdout
        time.sleep(0.2)


def wait_for_job(job: str, env: dict, seconds: float) -> str:
    """The job's final state (COMPLETED, FAILED, ...; this cluster keeps no accounting for sacct, but
    scontrol shows a job for MinJobAge = 30 s after its end); cancelled once ``seconds`` have passed."""
    deadline = time.monotonic() + seconds
    while True:
        shown = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True, env=env, check=True).stdout
        state = re.search(r"JobState=(\w+)", shown)[1]
        if state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            return state
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job], env=env)
            return f"{state}, cancelled after {seconds} s"
        time.sleep(0.5)


def check_slurm_run(home: Path) -> RunReport:
    """One worker job ran every node in its own ${SLURM_TMPDIR} (the cluster's Prolog makes it)."""
    report = RunReport.from_json(home / "sea-report.json")
    print(report.to_text())
    assert report.success and report.nodes_run == report.nodes_total > 0 and len(report.workers) == 1, report.to_text()
    (tier,) = [t for t in report.tiers if not t.name.startswith("home:")]
    assert Path(tier.path).parent == SLURM_DIR / "jobtmp" and tier.nodes_placed == report.nodes_run, report.to_text()
    return report


# the sizes of a site's jobs, shrunk to one host of two cores: one worker job of one core
JOB_SIZES = [
    ('"jobs": 4,', '"jobs": 1,'),
    ('"cores": 8,', '"cores": 1,'),
    ('"memory": "32GB",', '"memory": "2GB",'),
    ('"--tmp=100G"', '"--tmp=200M"'),
]


def this_python(script: str) -> str:
    """A page's batch script with its ``source ~/venvs/...`` line replaced: this interpreter's
    directory first on PATH."""
    script, sources = re.subn(r"^source ~/venvs/.*$", f'export PATH="{Path(sys.executable).parent}:$PATH"', script, flags=re.M)
    assert sources == 1, script
    return script


def substituted(text: str, replacements: list[tuple[str, str]]) -> str:
    for old, new in replacements:
        assert text.count(old) == 1, f"{old!r} is not (or not once) in the page's block: update the test"
        text = text.replace(old, new)
    return text


@pytest.mark.timeout(300)
def test_slurm_batch_script_runs_on_slurm(slurm, tmp_path):
    """slurm.md's batch script, submitted with sbatch as the page says, on a real single-host SLURM.
    Replaced: the ``source ~/venvs/...`` line (this interpreter's directory first on PATH instead),
    SCRATCH_DIR (tmp_path, not /scratch/$USER), the data (2 chunks of 1 MiB, 2 iterations instead of
    32 x 256 MiB, 10) and the worker jobs' sizes (JOB_SIZES: one job of one core, the driver holding
    the host's other core). The account is kept: this cluster has no accounting, so any is accepted.
    The driver job runs the workflow and submits the worker job itself; run() returns once the
    outputs are home, and the worker job is cancelled."""
    block = one_block("test_slurm_batch_script_runs_on_slurm", "bash")
    script = substituted(this_python(block.text), [
        ("export SCRATCH_DIR=/scratch/$USER/sea-demo", f"export SCRATCH_DIR={tmp_path / 'scratch'}"),
        ("n_chunks=32, chunk_mib=256", "n_chunks=2, chunk_mib=1"),
        ("len(chunks), 10,", "len(chunks), 2,"),
        *JOB_SIZES,
    ])  # fmt: skip
    (tmp_path / "sea-driver.sh").write_text(script)
    env = {**os.environ, **slurm}
    submit = subprocess.run(["sbatch", "--parsable", "sea-driver.sh"], capture_output=True, text=True, cwd=tmp_path, env=env, check=True)
    job = submit.stdout.strip().split(";")[0]
    state = wait_for_job(job, env, 240)
    output = tmp_path / f"sea-driver-{job}.out"  # --output=%x-%j.out
    logs = "".join(f"--- {p.name}\n{p.read_text()[-3000:]}\n" for p in [output, *sorted((tmp_path / "dask-logs").glob("*"))] if p.is_file())
    assert state == "COMPLETED", f"the driver job is {state}\n{logs}"
    check_slurm_run(tmp_path / "scratch" / "work")
    assert sorted(p.name for p in (tmp_path / "scratch" / "out").rglob("*.nii")) == ["chunk000.nii", "chunk001.nii"], logs
    wait_for_idle(env)


@pytest.mark.timeout(600)
def test_slurm_array_runs_a_subject_per_task_and_a_resubmitted_task_resumes(slurm, tmp_path):
    """slurm.md's array: the data made as the page says, the script submitted with sbatch, one
    SeaMultiProc run per subject, each in its task's ${SLURM_TMPDIR} with its own -w. Task 1 is
    stopped by SIGTERM half way (as --signal does before the wall time), submitted again alone
    (``sbatch --array=1``) and resumes from its journal. The derivatives are
    MultiProc's, byte for byte. Replaced: the source line (this interpreter first on PATH), STUDY
    (tmp_path), the data's size (SHRINK), the array (2 subjects) and the tasks' sizes (one core)."""
    blocks = handled_by("test_slurm_array_runs_a_subject_per_task_and_a_resubmitted_task_resumes")
    (setup,) = [b for b in blocks if b.text.startswith("# once")]
    (script,) = [b for b in blocks if b.text.startswith("#!/bin/bash")]
    study = tmp_path / "study"
    shrink = ["--volumes", "12", "--matrix", "16"]
    make, submit = [line for line in setup.text.splitlines() if line and not line.startswith("#")]
    make_args = shlex.split(make)[3:]
    make_args[make_args.index("--root") + 1], make_args[make_args.index("--subjects") + 1] = str(study), "2"
    made = subprocess.run([sys.executable, "-m", "example_workflows.fmri_preproc", *make_args, *shrink], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert made.returncode == 0 and "2 subjects in" in made.stdout, made.stderr[-2000:]
    reference = subprocess.run([sys.executable, "-m", "example_workflows.fmri_preproc", "--root", str(tmp_path / "mp"), "--subjects", "2", *shrink, "--plugin", "MultiProc"],
                               capture_output=True, text=True, cwd=ROOT, timeout=300)  # fmt: skip
    assert reference.returncode == 0, reference.stderr[-2000:]
    text = substituted(this_python(script.text), [
        ("STUDY=/scratch/$USER/study", f"STUDY={study}"),
        ("--array=1-4", "--array=1-2"),
        ("--cpus-per-task=2", "--cpus-per-task=1"),
        ("--mem=8G", "--mem=1G"),
        ("--tmp=20G", "--tmp=200M"),
        ('--n-procs "$SLURM_CPUS_PER_TASK"', f'--n-procs "$SLURM_CPUS_PER_TASK" {" ".join(shrink)}'),
    ])  # fmt: skip
    assert submit == "sbatch sea-subjects.sh"
    (tmp_path / "sea-subjects.sh").write_text(text)
    env = {**os.environ, **slurm, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    first = subprocess.run(["sbatch", "--parsable", "sea-subjects.sh"], capture_output=True, text=True, cwd=tmp_path, env=env, check=True).stdout.strip().split(";")[0]
    journal = study / "work" / "sub-01" / ".sea" / "journal.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and (not journal.exists() or journal.read_text().count('"done"') < 3):
        time.sleep(0.2)
    subprocess.run(["scancel", "--signal=TERM", "--batch", f"{first}_1"], env=env, check=True)  # as --signal=B:TERM does
    states = [wait_for_job(f"{first}_{task}", env, 240) for task in (1, 2)]
    logs = "".join(f"--- {p.name}\n{p.read_text()[-2000:]}\n" for p in sorted(tmp_path.glob("sea-subjects-*.out")))
    assert states[1] == "COMPLETED" and states[0] != "COMPLETED", f"{states}\n{logs}"
    stopped = RunReport.from_json(study / "work" / "sub-01" / "sea-report.json")
    assert stopped.interrupted and 0 < stopped.nodes_run < stopped.nodes_total, stopped.to_text()
    again = subprocess.run(["sbatch", "--parsable", "--array=1", "sea-subjects.sh"], capture_output=True, text=True, cwd=tmp_path, env=env, check=True).stdout.strip().split(";")[0]
    assert wait_for_job(f"{again}_1", env, 240) == "COMPLETED", "".join(p.read_text()[-2000:] for p in sorted(tmp_path.glob("sea-subjects-*.out")))
    resumed = RunReport.from_json(study / "work" / "sub-01" / "sea-report.json")
    # the journal knew what the stopped run finished (reused, or evicted and cheaper to run again
    # than a checkpoint's copy: auto kept none of these small nodes)
    plan = resumed.rerun_plan
    assert resumed.success and plan.get("reused", 0) + plan.get("evicted", 0) >= stopped.nodes_run, resumed.to_text()
    for sub in ("sub-01", "sub-02"):
        report = RunReport.from_json(study / "work" / sub / "sea-report.json")
        first_tier = next(t for t in report.tiers if not t.name.startswith("home:"))  # then /dev/shm, found too
        assert Path(first_tier.path).parent == SLURM_DIR / "jobtmp" and first_tier.nodes_placed == report.nodes_run, report.to_text()  # the task's ${SLURM_TMPDIR}
    assert tree_files(study / "derivatives") == tree_files(tmp_path / "mp" / "derivatives")
    wait_for_idle(env)


@pytest.mark.timeout(300)
def test_slurm_use_plugin_yaml_runs_on_slurm(slurm, tmp_path, monkeypatch):
    """slurm.md's SeaDask plugin file, read as fMRIPrep reads ``--use-plugin`` and run with the
    page's fmriprep command line (see fmriprep_run: fMRIPrep is not installed), this test's process
    being the driver: dask-jobqueue submits the worker job to the real single-host SLURM. Replaced:
    the jobs' sizes (JOB_SIZES); ``${SLURM_TMPDIR}`` is each worker job's, made by the cluster."""
    for name, value in slurm.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)  # the worker jobs' slurm-<id>.out
    plugin_yaml = substituted(one_block("test_slurm_use_plugin_yaml_runs_on_slurm", "yaml").text, [
        ("jobs: 4", "jobs: 1"), ("cores: 8", "cores: 1"), ("memory: 32GB", "memory: 2GB"), ('"--tmp=100G"', '"--tmp=200M"'),
    ])  # fmt: skip
    command = one_block("test_slurm_use_plugin_yaml_runs_on_slurm", "bash").text
    try:
        report = check_slurm_run(fmriprep_run(command, plugin_yaml, tmp_path))
    finally:
        for log in sorted(tmp_path.glob("slurm-*.out")):
            print(f"--- {log.name}\n{log.read_text()[-3000:]}")
    assert report.files_flushed >= 5, report.to_text()  # the five derivatives, staged then copied home
    wait_for_idle(os.environ)


# --------------------------------------------------------------------------------- text: listings
def test_report_listing_is_what_the_report_prints():
    """slurm.md's worker table is what RunReport.to_text prints for the figures it shows."""
    block = one_block("test_report_listing_is_what_the_report_prints", "text")
    rows = re.findall(r"^ +(\S+) +(\d+) +([\d.]+)% +(\d+(?:\.\d)? \w+)$", block.text, re.M)
    assert len(rows) == len(block.text.splitlines()) - 1, block.text
    workers = [WorkerReport(name, int(nodes), 1000, round(float(rate) * 10), parse_size(received)) for name, nodes, rate, received in rows]
    printed = RunReport(workers=workers).to_text().splitlines()
    start = next(i for i, line in enumerate(printed) if line.split()[:1] == ["worker"])
    assert block.text.splitlines() == printed[start : start + len(rows) + 1], "\n".join(printed)


def test_memory_line_is_what_the_report_prints():
    """slurm.md's memory line is what MemoryReport.to_text prints for the figures it shows (the
    cgroup's path shortened to '...', as the page writes it)."""
    block = one_block("test_memory_line_is_what_the_report_prints", "text")
    found = re.match(
        r"^  memory: peak ([\d.]+ \w+) of the job's ([\d.]+ \w+) \((.+); headroom ([\d.]+ \w+)\), RAM tiers up to ([\d.]+ \w+) of it; "
        r"(\d+) nodes waited for memory; (\d+) directories placed past a RAM tier for want of memory$",
        block.text,
    )
    assert found, block.text
    peak, limit, source, headroom, ram = (found[i] if i == 3 else parse_size(found[i]) for i in range(1, 6))
    report = MemoryReport(limit, source, headroom, peak, 0, ram, int(found[6]), int(found[7]))
    assert report.to_text() == block.text.rstrip("\n")


# a progress line as Snapshot.line() writes it, after tqdm's "[Sea] " and bar
PROGRESS_LINE = re.compile(
    r"^\[Sea\] \S* *\d+/\d+\+? nodes( · ETA \w+)?( · to home: [\d.]+ \w?i?B \(\d+ files\)( at \d+ MB/s)?)? · elapsed \w+"
    r"( · /\S+ [\d.]+ \w?i?B of [\d.]+ \w?i?B)*( · running: [^·]+)?\s*$"
)


def test_progress_capture_is_what_a_terminal_shows(tmp_path):
    """quickstart.md's capture of the progress line: each of its lines has the form the demo run
    in a pseudo-terminal (``script``) redraws, and that run redraws it in place (carriage returns)."""
    block = one_block("test_progress_capture_is_what_a_terminal_shows", "text")
    for line in block.text.strip().splitlines():
        assert PROGRESS_LINE.match(line), f"the doc shows a line Sea does not write: {line!r}"
    typescript = tmp_path / "typescript"
    command = f"{sys.executable} -m example_workflows.incrementation --root {tmp_path / 'demo'} --chunks 3 --chunk-mib 8 --iterations 3"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "250", "TERM": "xterm"}
    done = subprocess.run(["script", "-qec", command, str(typescript)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]
    raw = typescript.read_bytes().decode(errors="replace")  # carriage returns as they are
    redraws = [r.strip() for r in re.findall(r"(\[Sea\] [^\r\n]* \d+/\d+\+? nodes · [^\r\n]*)", raw)]
    assert len(redraws) >= 2 and "\r[Sea] " in raw and all(PROGRESS_LINE.match(r) for r in redraws), redraws[:5]


def test_how_it_works_diagram_is_the_home_after_a_run(tmp_path, shm_dir):
    """how-it-works.md's diagram, for a workflow with a subject iterable, a MapNode and a DataSink
    run with SeaMultiProc: every node ran on the fast tier, the home keeps no node directory (a
    directory the journal records as a checkpoint aside) and no pack but the checkpoints the journal
    records (with checkpoints: none, none at all), the sink's outputs are home, and so are the Sea
    files the diagram names; the tier is empty again."""
    from nipype_workflows import build_full, make_subjects, run

    diagram = one_block("test_how_it_works_diagram_is_the_home_after_a_run", "text").text
    for checkpoints in ("auto", "none"):
        run(
            build_full(tmp_path / "data", make_subjects(tmp_path / "data", 1, 0.5), tmp_path / checkpoints, tmp_path / "out"),
            "SeaMultiProc",
            sea={"tiers": [{"path": str(shm_dir)}], "checkpoints": checkpoints},
        )
        home = tmp_path / checkpoints
        report = RunReport.from_json(home / "sea-report.json")
        assert report.success and report.tiers[0].nodes_placed >= report.nodes_run > 0, report.to_text()
        named = re.findall(r"(?<![\w/])(\.sea/\w+\.\w+|sea-report\.json)", diagram)
        assert len(named) == 4 and all((home / name).is_file() for name in named), (named, sorted(home.rglob("*")))
        assert "out/func/sub-01/" in diagram and any((tmp_path / "out" / "func" / "sub-01").iterdir())
        assert ".sea/checkpoints/" in diagram
        journal = Journal.read(home / ".sea" / "journal.jsonl")
        in_home = {str(p.relative_to(home)) for p in home.glob("study/**/*") if p.is_dir() and (p / "_report").is_dir() and "mapflow" not in p.parts}
        assert in_home == {key for key, record in journal.items() if record.checkpoint is not None}, "a node directory in the home that is not a checkpoint"
        packed = {key for key, record in journal.items() if record.pack is not None}
        packs = set((home / ".sea" / "checkpoints").iterdir()) if (home / ".sea" / "checkpoints").is_dir() else set()
        assert packs == {pack_path(home, key) for key in packed}, "a pack in the home the journal does not record"
        assert not [p for p in home.rglob("*") if p.is_symlink()], "a link left in the home"
        assert len(packed) == report.checkpoint_packs and (checkpoints == "auto" or not packed | in_home)
        assert list(shm_dir.iterdir()) == []


def test_the_documentation_builds_without_a_warning(tmp_path):
    """Sphinx with MyST, as tox's docs environment builds it; a warning (a broken link or
    cross-reference, a page outside the table of contents: index.md's toctree) fails."""
    pytest.importorskip("myst_parser")
    result = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(ROOT / "docs"), str(tmp_path / "html")],
                            capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    toctree = one_block("test_the_documentation_builds_without_a_warning", "{toctree}").text.split()
    assert all((tmp_path / "html" / f"{page}.html").exists() for page in toctree if not page.startswith(":")), toctree


# --------------------------------------------------------------------------------- install lines
def test_every_install_line_installs_this_clone_with_extras_it_has():
    """No package is published under the name sea-workflows yet: a line installing it from an index
    fails for everyone (issue 35). Every ``pip install`` in the README and the docs installs the
    clone (``.``) with extras setup.cfg defines, or the clone's wheel (containers.md: a wheel built
    with ``pip wheel`` from the clone, installed into a container image); README command 2 runs one
    of them for real."""
    import configparser

    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    extras = set(config["options.extras_require"])
    lines = 0
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"pip install (?:--target \S+ |-\S+ )*'?([^\s'`]+)'?", page.read_text()):
            lines += 1
            if re.fullmatch(r"(?:\S*/)?sea_workflows-\*\.whl", target):
                continue  # the clone's wheel
            named = re.fullmatch(r"\.(?:\[([\w,-]+)\])?", target)
            assert named, f"{page.name}: pip install {target}: install the clone, pip install '.[...]'"
            assert set(filter(None, (named.group(1) or "").split(","))) <= extras, f"{page.name}: {target}: extras are {sorted(extras)}"
    assert lines >= 5
