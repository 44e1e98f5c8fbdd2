"""SeaDask on SLURM through dask-jobqueue (docs/slurm.md).

Without SLURM: the job script SeaDask asks dask-jobqueue for (one single-threaded worker process
per core, the site's directives kept), the one-line errors for bad ``cluster: slurm`` options, and
the options in docs/slurm.md (its batch script, its YAML, its table).

With a real single-host SLURM, started for the session by tests/slurm/start_slurm.sh (root; the
Debian packages are installed if missing) and stopped at its end: the incrementation example runs
through two SLURM jobs whose workers keep node directories in their own ``$SLURM_TMPDIR`` (a tmpfs
per job, made by the cluster's Prolog) and gives MultiProc's outputs byte for byte, also when one
of the two jobs is cancelled mid-run.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import MISSING, fields
from pathlib import Path

import pytest
import yaml

pytest.importorskip("dask_jobqueue")

from slurm_cluster import single_host_slurm  # noqa: E402

from example_workflows.incrementation.workflow import build_workflow, make_chunks  # noqa: E402
from nipype_sea.dask_plugin import check_dask_plugin_args  # noqa: E402
from sea.config import SeaConfig, SeaConfigError  # noqa: E402
from sea.dask.options import DaskOptions  # noqa: E402
from sea.report import RunReport  # noqa: E402

from conftest import tree_files  # noqa: E402
from nipype_workflows import run  # noqa: E402

ROOT = Path(__file__).parents[1]
DOC = ROOT / "docs" / "slurm.md"
SLURM_DIR = Path("/var/tmp/sea-slurm-pytest")
PORTS = {"SLURMCTLD_PORT": "6917", "SLURMD_PORT": "6918"}  # not the defaults: a cluster started by hand may use them
JOBQUEUE = {
    "cores": 1, "memory": "2GB", "walltime": "00:10:00", "queue": "debug", "interface": "lo",
    "local_directory": "$SLURM_TMPDIR", "job_extra_directives": ["--tmp=200M"],
}  # fmt: skip


# ---------------------------------------------------------------------------------- without SLURM
def test_job_script_has_one_single_threaded_worker_per_core():
    options = DaskOptions.load({"cluster": "slurm", "jobs": 3, "jobqueue": {
        "cores": 2, "memory": "4GB", "walltime": "01:00:00", "job_extra_directives": ["--tmp=20G"], "local_directory": "$SLURM_TMPDIR",
    }})  # fmt: skip
    assert options.workers_per_job == 2  # client() waits for jobs x 2 = 6 workers
    assert options.slurm_cluster_kwargs()["scheduler_options"] == {"dashboard_address": ":0"}
    with options.slurm_cluster() as cluster:  # a scheduler here; no job is submitted
        script = cluster.job_script()
    lines = script.splitlines()
    assert "#SBATCH --tmp=20G" in lines and "#SBATCH --cpus-per-task=2" in lines and "#SBATCH --mem=4G" in lines, script
    worker = next(line for line in lines if "distributed.cli.dask_worker" in line)
    assert "--nthreads 1 " in worker and "--nworkers 2 " in worker, worker
    assert "--local-directory $SLURM_TMPDIR" in worker, worker  # expanded by the job's shell, on the compute node


def test_fewer_processes_than_cores_are_still_single_threaded():
    """Two nodes at a time, each with two of the job's four cores for its tools."""
    options = DaskOptions.load({"cluster": "slurm", "jobqueue": {"cores": 4, "processes": 2, "memory": "8GB", "scheduler_options": {"port": 0}}})
    assert options.workers_per_job == 2
    assert options.slurm_cluster_kwargs()["scheduler_options"] == {"dashboard_address": ":0", "port": 0}
    with options.slurm_cluster() as cluster:
        worker = next(line for line in cluster.job_script().splitlines() if "dask_worker" in line)
    assert "--nthreads 1 " in worker and "--nworkers 2 " in worker, worker


@pytest.mark.parametrize(
    "jobqueue, message",
    [
        ({"memory": "4GB"}, "needs 'cores' and 'memory'"),
        ({"cores": 2}, "needs 'cores' and 'memory'"),
        ({"cores": 0, "memory": "4GB"}, "['cores'] must be a whole number"),
        ({"cores": "8", "memory": "4GB"}, "['cores'] must be a whole number"),
        ({"cores": 2, "processes": 4, "memory": "4GB"}, "['processes'] (worker processes per job"),
        ({"cores": 2, "memory": None}, "['memory'] must be the memory of one SLURM job"),
        ({"cores": 2, "memory": "4GB", "wall_time": "01:00:00"}, "unknown key 'wall_time'"),
        ({"cores": 2, "memory": "4GB", "dashboard_address": ":0"}, "unknown key 'dashboard_address'"),
        ({"cores": 2, "memory": "4GB", "scheduler_options": ":0"}, "['scheduler_options'] must be a dict"),
        ("cores=2", "must be a dict of SLURMCluster arguments"),
    ],
)
def test_bad_slurm_options_fail_in_one_line(jobqueue, message):
    with pytest.raises(SeaConfigError) as error:
        DaskOptions.load({"cluster": "slurm", "jobqueue": jobqueue})
    assert message in str(error.value) and "\n" not in str(error.value), str(error.value)


def check_plugin_args(plugin_args: dict) -> DaskOptions:
    """What SeaDask's constructor checks, and the job script the options give."""
    check_dask_plugin_args(plugin_args)
    SeaConfig.load(plugin_args["sea"])
    options = DaskOptions.load(plugin_args["dask"])
    with options.slurm_cluster() as cluster:
        script = cluster.job_script()
    assert "--nthreads 1 " in script and "--local-directory $SLURM_TMPDIR" in script, script
    return options


def test_docs_batch_script_and_yaml_give_valid_options():
    text = DOC.read_text()
    batch = re.search(r"```bash\n(#!/bin/bash\n#SBATCH.*?)```", text, re.S).group(1)
    driver = re.search(r"python - <<'EOF'\n(.*?)\nEOF\n", batch, re.S).group(1)
    call = next(n for n in ast.walk(ast.parse(driver)) if isinstance(n, ast.Call) and any(k.arg == "plugin_args" for k in n.keywords))
    options = check_plugin_args(ast.literal_eval(next(k.value for k in call.keywords if k.arg == "plugin_args")))
    assert options.cluster == "slurm" and options.workers_per_job == 8
    use_plugin = yaml.safe_load(next(b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "plugin: SeaDask" in b))
    assert use_plugin["plugin"] == "SeaDask"
    options = check_plugin_args(use_plugin["plugin_args"])
    assert options.jobqueue["walltime"] == "24:00:00" and options.jobs * options.workers_per_job == 32


def test_docs_options_table_lists_every_dask_option():
    rows = re.findall(r"^\| `(\w+)` \| `(.*?)` \| (.*?) \|$", DOC.read_text(), re.M)
    expected = [(f.name, repr(f.default if f.default is not MISSING else f.default_factory()), f.metadata["doc"]) for f in fields(DaskOptions)]
    assert rows == expected


# ---------------------------------------------------------------------------------- a real SLURM
def job_mounts(directory: Path) -> list[str]:
    targets = subprocess.run(["findmnt", "-rn", "-o", "TARGET"], capture_output=True, text=True).stdout.split()
    return [t for t in targets if t.startswith(f"{directory}/")]


def leftovers(directory: Path) -> list[str]:
    """Processes of that cluster still alive (zombies aside: PID 1 here reaps them late)."""
    ps = subprocess.run(["ps", "-eo", "stat=,pid=,args="], capture_output=True, text=True).stdout.splitlines()
    ours = re.compile(rf"slurmctld .*{directory}|slurmd .*{directory}|slurmstepd|distributed\.cli\.dask_worker .*--interface lo")
    return [line for line in ps if not line.startswith("Z") and ours.search(line)]


def wait_until(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


@pytest.fixture(scope="module")  # its environment (PYTHONPATH: this checkout) ends with the module
def slurm():
    """A single-host SLURM for this session (stopped at its end); skipped where it cannot run."""
    def stopped():
        assert wait_until(lambda: not leftovers(SLURM_DIR), 10), f"left running: {leftovers(SLURM_DIR)}"
        assert not SLURM_DIR.exists() and not job_mounts(SLURM_DIR)

    with single_host_slurm(SLURM_DIR, PORTS, stopped) as env, pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():  # sbatch, squeue, scancel; the workers import Sea from this checkout
            patch.setenv(name, value)
        yield SLURM_DIR


def squeue() -> list[str]:
    return subprocess.run(["squeue", "-h", "-o", "%i %T"], capture_output=True, text=True, check=True).stdout.split("\n")[:-1]


CHUNKS, ITERATIONS = 6, 6  # 6 x (select + 6 increments + sink) = 48 nodes, 1 MiB chunks


@pytest.fixture(scope="module")
def reference():
    """The input chunks and MultiProc's outputs, made once for the tests below."""
    root = Path(tempfile.mkdtemp(prefix="sea-slurm-ref-", dir="/var/tmp"))
    make_chunks(root / "data", CHUNKS, 1.0)
    run(build_workflow(root / "data", CHUNKS, ITERATIONS, root / "ref", root / "ref-out"), "MultiProc")
    yield root / "data", tree_files(root / "ref-out")
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def home():
    """The workflow's home and outputs: a directory on disk, the 'shared filesystem'."""
    root = Path(tempfile.mkdtemp(prefix="sea-slurm-test-", dir="/var/tmp"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def run_on_slurm(data: Path, home: Path) -> RunReport:
    wf = build_workflow(data, CHUNKS, ITERATIONS, home / "work", home / "out")
    wf.config["execution"]["poll_sleep_duration"] = 0.05
    try:
        wf.run(plugin="SeaDask", plugin_args={
            "sea": {"tiers": [{"path": "${SLURM_TMPDIR}"}]},  # loaded on each worker: its own job's directory
            "dask": {"cluster": "slurm", "jobs": 2, "timeout": 60, "jobqueue": JOBQUEUE},
        })  # fmt: skip
    finally:  # the jobs' output, slurm-<id>.out where they were submitted (the test's cwd): shown if it fails
        for log in sorted(Path.cwd().glob("slurm-*.out")):
            print(f"--- {log.name}\n{log.read_text()[-3000:]}")
    report = RunReport.from_json(home / "work" / "sea-report.json")
    print(report.to_text())
    return report


def assert_cluster_idle(slurm: Path) -> None:
    """The cluster is closed when run() returns: its jobs end, their Epilog removes each tmpfs."""
    assert wait_until(lambda: not squeue(), 15), f"jobs left: {squeue()}"
    assert wait_until(lambda: not job_mounts(slurm / "jobtmp"), 15), f"job tmpfs left mounted: {job_mounts(slurm / 'jobtmp')}"


@pytest.mark.slow  # SLURM by default: test_docs' array job; this one with --run-slow (README command 2's 12 minutes)
@pytest.mark.timeout(300)  # with the session's SLURM start (apt-get install if needed)
def test_incrementation_on_two_slurm_jobs_matches_multiproc(slurm, reference, home):
    data, expected = reference
    report = run_on_slurm(data, home)
    assert tree_files(home / "out") == expected
    assert report.success and report.nodes_run == report.nodes_total == CHUNKS * (ITERATIONS + 2), report.to_text()
    assert len(report.workers) == 2 and all(w.nodes_run > 0 for w in report.workers), report.to_text()
    tiers = [t for t in report.tiers if not t.name.startswith("home:")]
    job_dirs = {Path(t.path) for t in tiers if t.nodes_placed > 0}
    assert len(job_dirs) == 2, report.to_text()  # one per SLURM job
    assert all(d.parent == slurm / "jobtmp" and re.fullmatch(r"job_\d+", d.name) for d in job_dirs), job_dirs
    assert sum(t.nodes_placed for t in tiers) == report.nodes_run, "every node ran on its job's SLURM_TMPDIR"
    assert_cluster_idle(slurm)
    assert not any(d.exists() for d in job_dirs)


def started_in(log: Path) -> int:
    try:
        return log.read_text().count("[Node] Setting-up")
    except FileNotFoundError:
        return 0


# --run-slow (42 s on a slow day): a worker lost mid-run is tested by default on Dask's own cluster
# (test_dask, test_pydra_dask), through the same code
@pytest.mark.slow
@pytest.mark.timeout(300)  # with the session's SLURM start (apt-get install if needed)
def test_a_worker_job_cancelled_mid_run_loses_nothing(slurm, reference, home, tmp_path):
    """scancel one of the two worker jobs once a few nodes ran (its tier goes with it): the run
    finishes on the other job, the lost nodes run again there (counted), the outputs are MultiProc's."""
    data, expected = reference
    cancelled: list[str] = []

    def cancel_one_job_when_busy() -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not cancelled:
            running = [line.split()[0] for line in squeue() if line.endswith("RUNNING")]
            # a job that ran nodes (its output, slurm-<id>.out: a line per node it starts): cancelling
            # one that has run nothing yet (under load the other may take every node) would lose nothing
            busy = [job for job in running if started_in(tmp_path / f"slurm-{job}.out") >= 4]
            if len(running) == 2 and busy:
                subprocess.run(["scancel", busy[0]], check=True)
                cancelled.append(busy[0])
            time.sleep(0.05)

    canceller = threading.Thread(target=cancel_one_job_when_busy)
    canceller.start()
    try:
        report = run_on_slurm(data, home)
    finally:
        cancelled.append("stop")  # the canceller stops if the run ended first
        canceller.join()
    assert cancelled[0] != "stop", "the run ended before a worker job could be cancelled"
    assert tree_files(home / "out") == expected
    assert report.success and report.nodes_recomputed >= 1, report.to_text()
    assert len(report.workers) == 2 and all(w.nodes_run > 0 for w in report.workers), report.to_text()
    assert_cluster_idle(slurm)
