"""RAM tiers are the job's memory: workflows run inside a real memory cgroup, as SLURM confines a job.

Only the child process that runs the workflow enters the cgroup (benchmarks.cgroup), never the test
runner. The home is a FUSE mount (another filesystem than both tiers, as a shared filesystem is);
tiers are /dev/shm (RAM: its pages count against the cgroup) then a directory on the local disk.

- The issue's incrementation case (8 x 64 MiB chunks x 3 iterations, n_procs 2) in a 450 MiB cgroup:
  before Sea counted tmpfs bytes as memory, SeaMultiProc lost a worker to the OOM killer and failed
  (BrokenProcessPool). It must complete, byte-identical to MultiProc outside the cgroup, with no OOM
  kill, and its report must give the memory peak against the limit.
- Nodes that declare less memory than they use (mem_gb 0.01, using 150 MiB each): the OOM killer
  does kill a worker (the cgroup's own counter shows it); the node runs again, one at a time from
  then on, and the run completes byte-identical. The same chains under Pydra's SeaWorker, where Pydra's
  own cf worker fails the run (its broken pool fails every job that was in it).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.cgroup import MemoryCgroup, writable_memory_cgroup
from example_workflows.incrementation import make_chunks
from sea.memory import job_memory_limit
from sea.report import RunReport

from conftest import tree_files
from slowfs_fixtures import slowfs_scratch

needs_cgroup = pytest.mark.skipif(writable_memory_cgroup() is not None, reason=writable_memory_cgroup() or "")

MiB = 2**20
REPO = Path(__file__).resolve().parents[1]

# A Function node's function that holds MIB MiB while it copies its input on (plus one byte).
HUNGRY_FUNCTION = r"""
def hungry(in_file, mib):
    import os
    import time
    import numpy as np
    held = np.ones(int(mib * 2**20) // 8)  # every page touched: resident
    time.sleep(0.5)  # held a while: two nodes started together surely overlap
    data = open(in_file, "rb").read()
    out = os.path.abspath("out.bin")
    with open(out, "wb") as fh:
        fh.write(data + bytes([int(held[0])]))
    return out
"""

# A chain of two such nodes per input, declaring 0.01 GB each.
HUNGRY = r"""
import sys
from nipype import Function, Node, Workflow
from nipype.interfaces.io import DataSink

""" + HUNGRY_FUNCTION + r"""
base, out, plugin, sea, inputs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
wf = Workflow(name="hungry", base_dir=base)
sink = Node(DataSink(base_directory=out, parameterization=False), name="sink")
for i, path in enumerate(inputs):
    previous = None
    for step in range(2):
        node = Node(Function(input_names=["in_file", "mib"], output_names=["out_file"], function=hungry), name=f"hungry{i}_{step}", mem_gb=0.01)
        node.inputs.mib = 150
        if previous is None:
            node.inputs.in_file = path
        else:
            wf.connect(previous, "out_file", node, "in_file")
        previous = node
    wf.connect(previous, "out_file", sink, f"chain{i}")
wf.config["execution"]["poll_sleep_duration"] = 0.05
args = {"n_procs": 2} if plugin == "MultiProc" else {"n_procs": 2, "sea": sea}
wf.run(plugin=plugin, plugin_args=args)
"""

# One node of one kind per input ("Function:hungry", each in a workflow of its own), declaring 0.01 GB.
HUNGRY_ONE_KIND = r"""
import sys
from nipype import Function, Node, Workflow
from nipype.interfaces.io import DataSink

""" + HUNGRY_FUNCTION + r"""
base, out, plugin, sea, mib, inputs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6:]
wf = Workflow(name="hungry", base_dir=base)
sink = Node(DataSink(base_directory=out, parameterization=False), name="sink")
for i, path in enumerate(inputs):
    chain = Workflow(name=f"chain{i}")
    node = Node(Function(input_names=["in_file", "mib"], output_names=["out_file"], function=hungry), name="hungry", mem_gb=0.01)
    node.inputs.in_file, node.inputs.mib = path, mib
    chain.add_nodes([node])
    wf.connect(chain, "hungry.out_file", sink, f"chain{i}")
wf.config["execution"]["poll_sleep_duration"] = 0.05
wf.run(plugin=plugin, plugin_args={"n_procs": 2} if plugin == "MultiProc" else {"n_procs": 2, "sea": sea})
"""

# The same chains under Pydra: one nested workflow per input, split over them; prints each output's digest.
HUNGRY_PYDRA = r"""
import hashlib
import sys
from fileformats.generic import File
from pydra.compose import python, workflow
from pydra.engine.submitter import Submitter
""" + HUNGRY_FUNCTION + r"""
@python.define(outputs=["out"])
def Hungry(in_file: File, mib: int) -> File:
    return File(hungry(str(in_file), mib))

@workflow.define(outputs=["out"])
def Chain(in_file: File, mib: int) -> File:
    first = workflow.add(Hungry(in_file=in_file, mib=mib), name="first")
    second = workflow.add(Hungry(in_file=first.out, mib=mib), name="second")
    return second.out

@workflow.define(outputs=["outs"])
def Chains(in_files: list[File], mib: int) -> list[File]:
    chain = workflow.add(Chain(mib=mib).split(in_file=in_files).combine("in_file"), name="chain")
    return chain.out

cache, worker, sea, mib, inputs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5:]
with Submitter(worker=worker, cache_root=cache, n_procs=2, **({"sea": sea} if worker == "sea" else {})) as sub:
    result = sub(Chains(in_files=inputs, mib=mib))
if result.errored:
    sys.exit(f"errored: {result.errors}")
for path in result.outputs.outs:
    print(hashlib.sha256(open(path, "rb").read()).hexdigest())
"""


@pytest.fixture
def shared(tmp_path):
    """(home's filesystem root, a local-disk tier, the Sea config naming /dev/shm then it)."""
    with slowfs_scratch() as fs:
        local = fs.path.parent / "local"
        local.mkdir()
        config = tmp_path / "sea.yml"
        config.write_text(f"tiers:\n  - path: /dev/shm\n  - path: {local}\nprogress: off\n")
        yield fs.path, config


def three_inputs(root: Path) -> list[str]:
    """Three 1 MiB input files on the shared filesystem."""
    (root / "data").mkdir(exist_ok=True)
    for i in range(3):
        (root / "data" / f"in{i}.bin").write_bytes(bytes([i]) * MiB)
    return [str(root / "data" / f"in{i}.bin") for i in range(3)]


def hungry_outputs(inputs: list[str], steps: int) -> dict[str, bytes]:
    """What MultiProc's run of HUNGRY (2 steps) or HUNGRY_ONE_KIND (1) leaves in its sink: each
    input with a byte of 1 added per step (the functions are pure; ``tree_files`` layout)."""
    return {f"chain{i}/out.bin": Path(path).read_bytes() + b"\x01" * steps for i, path in enumerate(inputs)}


def run_in_cgroup(limit: int, cmd: list[str], timeout: float = 240) -> tuple[subprocess.CompletedProcess, int]:
    with MemoryCgroup(limit) as cgroup:
        done = subprocess.run(cmd, preexec_fn=cgroup.enter, cwd=REPO, capture_output=True, text=True, timeout=timeout)
        return done, cgroup.oom_kills()


@needs_cgroup
def test_the_cgroup_limit_is_what_sea_reads():
    code = "from sea.memory import job_memory_limit; l = job_memory_limit(); print(l.bytes, l.source)"
    done, _ = run_in_cgroup(300 * MiB, [sys.executable, "-c", code], timeout=60)
    limit, source = done.stdout.split(" ", 1)
    assert int(limit) == 300 * MiB, done.stdout + done.stderr
    assert "cgroup" in source
    assert job_memory_limit().bytes != 300 * MiB  # the test runner is not in it


@needs_cgroup
def test_incrementation_completes_in_a_memory_cgroup(shared, tmp_path):
    root, config = shared
    make_chunks(tmp_path / "data", 4, 64)  # once, on the local disk: both runs read them there
    for where in (root, tmp_path / "ref"):
        where.mkdir(exist_ok=True)
        (where / "data").symlink_to(tmp_path / "data")
    incrementation = [sys.executable, "-m", "example_workflows.incrementation", "--chunks", "4", "--chunk-mib", "64", "--iterations", "3"]  # 4 chains of 3 steps: two at once do not fit
    reference = subprocess.run([*incrementation, "--root", str(tmp_path / "ref"), "--plugin", "MultiProc"], cwd=REPO, capture_output=True, text=True)
    assert reference.returncode == 0, reference.stderr[-3000:]

    done, oom_kills = run_in_cgroup(450 * MiB, [*incrementation, "--root", str(root), "--sea", str(config)])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert oom_kills == 0
    assert tree_files(root / "out") == tree_files(tmp_path / "ref" / "out")
    report = RunReport.from_json(root / "work" / "sea-report.json")
    memory = report.memory
    assert memory is not None and memory.limit_bytes == 450 * MiB and "cgroup" in memory.source
    assert 0 < memory.peak_charged_bytes <= 450 * MiB
    assert memory.nodes_held + memory.spills > 0  # it did have to hold back: 2 x (64 MiB on tmpfs + ~190 MiB of node) do not fit
    assert "memory: peak" in done.stderr and "of the job's 450.0 MiB" in done.stderr
    assert json.loads((root / "work" / "sea-report.json").read_text())["memory"]["limit_bytes"] == 450 * MiB


@needs_cgroup
def test_a_worker_lost_to_the_oom_killer_reruns_its_node(shared, tmp_path):
    root, config = shared
    inputs = three_inputs(root)
    script = tmp_path / "hungry.py"
    script.write_text(HUNGRY)

    done, oom_kills = run_in_cgroup(330 * MiB, [sys.executable, str(script), str(root / "work"), str(root / "out"), "SeaMultiProc", str(config), *inputs])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert oom_kills >= 1  # the situation is real: the kernel did kill a worker
    assert tree_files(root / "out") == hungry_outputs(inputs, steps=2)
    report = RunReport.from_json(root / "work" / "sea-report.json")
    assert report.lost_worker_retries >= 1 and report.nodes_failed == 0
    assert report.memory.oom_kills == oom_kills
    assert "lost its worker process" in done.stderr


@needs_cgroup
def test_memory_a_node_was_measured_to_hold_is_reserved_for_its_kind_in_the_next_run(shared, tmp_path):
    """Nodes declaring 0.01 GB hold 150 MiB. The first run starts two at once (and mostly loses a
    worker to the OOM killer, and runs its node again); Sea measures what each node held in its
    process and keeps it per kind in the history. The next run (a changed input: every node runs
    again) reserves that for each node, so the second waits for the first instead of starting
    beside it: no OOM kill. Without the measure the second run is the first again (no node waits)."""
    root, config = shared
    inputs = three_inputs(root)
    script = tmp_path / "hungry_one_kind.py"
    script.write_text(HUNGRY_ONE_KIND)

    runs = []
    for mib in (150, 151):  # the second run: a changed input, so every node runs again
        done, oom_kills = run_in_cgroup(330 * MiB, [sys.executable, str(script), str(root / "work"), str(root / "out"), "SeaMultiProc", str(config), str(mib), *inputs])
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert tree_files(root / "out") == hungry_outputs(inputs, steps=1)
        runs.append((done, oom_kills, RunReport.from_json(root / "work" / "sea-report.json")))
    (first, _, _), (second, second_kills, report) = runs
    assert "more than the 10.2 MiB it declares" in first.stderr, first.stderr[-3000:]
    learned = json.loads((root / "work" / ".sea" / "history.json").read_text())["memory"]
    assert learned["Function:hungry"] >= 150 * MiB
    assert second_kills == 0 and report.lost_worker_retries == 0, second.stderr[-3000:]
    assert report.nodes_run == 4 and report.memory.nodes_held >= 1  # the 3 nodes and the sink ran; one waited for memory


@pytest.mark.slow  # a worker lost to the OOM killer under SeaMultiProc runs by default (above), Pydra's killed worker in test_pydra_dask; this one with --run-slow (README command 2's 12 minutes)
@needs_cgroup
def test_a_pydra_worker_lost_to_the_oom_killer_reruns_its_job(shared, tmp_path):
    """Pydra's cf loses the whole run there (its broken pool fails every job in it); SeaWorker replaces
    the pool once its processes are gone, runs the jobs that were in it again, one at a time. A
    Pydra task declares no memory: the next run holds jobs back by what they were measured to hold."""
    root, config = shared
    inputs = three_inputs(root)
    script = tmp_path / "hungry_pydra.py"
    script.write_text(HUNGRY_PYDRA)
    expected = [hashlib.sha256(content).hexdigest() for content in hungry_outputs(inputs, steps=2).values()]  # cf's

    done, oom_kills = run_in_cgroup(330 * MiB, [sys.executable, str(script), str(root / "work"), "sea", str(config), "150", *inputs])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert oom_kills >= 1  # the situation is real: the kernel did kill a worker
    assert done.stdout.split() == expected
    report = RunReport.from_json(root / "work" / "sea-report.json")
    assert report.lost_worker_retries >= 1 and report.nodes_failed == 0
    assert report.memory.oom_kills == oom_kills
    assert "lost its worker process" in done.stderr

    # the next run (every job runs again): the memory its jobs were measured to hold is reserved,
    # so the second job of a kind waits for the first instead of starting beside it
    again, oom_kills = run_in_cgroup(330 * MiB, [sys.executable, str(script), str(root / "work"), "sea", str(config), "151", *inputs])
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert again.stdout.split() == expected
    report = RunReport.from_json(root / "work" / "sea-report.json")
    assert oom_kills == 0 and report.lost_worker_retries == 0, again.stderr[-3000:]
    assert report.nodes_run == 6 and report.memory.nodes_held >= 1


def test_a_jobs_peak_is_its_own_and_its_largest_childs(tmp_path):
    """JobPeak, in a process of its own as a worker is: what the job itself held (not what the
    process held before it), and what a command-line child held; the history keeps it per kind."""
    code = r"""
import subprocess, sys
from sea.memory import JobPeak
before = b"x" * (300 * 2**20)  # held (every page written), then freed, before the job: not the job's
del before
with JobPeak() as own:
    held = b"y" * (100 * 2**20)
del held
with JobPeak() as child:
    subprocess.run([sys.executable, "-c", "b = b'z' * (200 * 2**20)"], check=True)
print(own.bytes, child.bytes)
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    own, child = (int(v) for v in done.stdout.split())
    assert 100 * MiB <= own < 300 * MiB
    assert child >= 200 * MiB

    from sea.estimate import SizeEstimator

    history = SizeEstimator(default=1)
    assert history.learn_memory("Function:hungry", own) and not history.learn_memory("Function:hungry", own - 1)
    history.save(tmp_path / "history.json")
    assert SizeEstimator.load(tmp_path / "history.json", 1).memory == {"Function:hungry": own}


def test_cgroup_v2_and_hybrid_layouts_are_read(tmp_path):
    """Sites run cgroup v2 (this machine has v1): the same reader, given a /proc and a cgroup tree as
    a v2 host lays them out, finds the tightest memory.max over the group and its parents, reads the
    charge from that group's memory.stat, and ignores a v2 mount without the memory controller
    (a hybrid host, as this one)."""
    proc, tree = tmp_path / "proc", tmp_path / "cgroup"
    job = tree / "system.slice" / "slurmstepd.scope" / "job_42"
    step = job / "step_0" / "user" / "task_0"
    step.mkdir(parents=True)
    (tree / "system.slice" / "memory.max").write_text("max\n")
    (job / "memory.max").write_text(f"{450 * MiB}\n")
    (job / "step_0" / "memory.max").write_text(f"{900 * MiB}\n")
    (step / "memory.max").write_text("max\n")
    (job / "memory.stat").write_text(f"anon {100 * MiB}\nfile {500 * MiB}\nshmem {64 * MiB}\nfile_dirty {MiB}\nfile_writeback 0\n")
    (job / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    proc.mkdir()
    (proc / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0\n")
    (proc / "mountinfo").write_text(f"30 23 0:26 / {tree} rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n")

    from sea.memory import MemoryBudget, cgroup_limit

    limit = cgroup_limit(proc)
    assert limit is not None and limit.bytes == 450 * MiB and limit.group == job and limit.v2
    assert limit.oom_kills() == 1
    assert limit.charge_reader()() == 165 * MiB  # anon + shmem + dirty: clean page cache is reclaimable
    budget = MemoryBudget(limit, headroom=32 * MiB)
    assert budget.free(ram_used=0, ram_reserved=0) == (450 - 32 - 165) * MiB

    # a hybrid host: v1 memory controller, a v2 mount without it (no memory.max there)
    v1 = tmp_path / "v1"
    (v1 / "slurm" / "uid_0" / "job_7").mkdir(parents=True)
    (v1 / "slurm" / "uid_0" / "job_7" / "memory.limit_in_bytes").write_text(f"{300 * MiB}\n")
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (proc / "cgroup").write_text("4:memory:/slurm/uid_0/job_7\n0::/user.slice\n")
    (proc / "mountinfo").write_text(
        f"35 31 0:32 / {v1} rw,relatime - cgroup cgroup rw,memory\n41 31 0:38 / {tree} rw,relatime - cgroup2 cgroup2 rw\n"
    )
    limit = cgroup_limit(proc)
    assert limit is not None and limit.bytes == 300 * MiB and not limit.v2
