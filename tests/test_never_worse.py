"""Never worse than the engine's own plugin (issue 33): what an adversarial pass found that MultiProc
handles and Sea did not. Real FIFOs, sparse files, a second real user (``useradd``), real kills."""

from __future__ import annotations

import logging
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from sea import SeaConfig, SeaConfigError, SeaError
from sea.report import RunReport
from sea.stager import sweep_temporaries

from conftest import sea_private_dirs

TESTS = Path(__file__).parent


def run_script(body: str, timeout: float = 120, **env) -> subprocess.CompletedProcess:
    """``body`` run by this interpreter in a process of its own (what a hang would hold), with the
    tests' helpers importable."""
    script = script_file(body)
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=timeout, env={**os.environ, **env})


def script_file(body: str) -> Path:
    """``body`` as a script in the test's directory (Nipype's Function reads its function's source
    from a file), the tests' helpers importable."""
    script = Path.cwd() / f"script-{time.monotonic_ns()}.py"
    script.write_text(f"import sys\nsys.path.insert(0, {str(TESTS)!r})\n" + textwrap.dedent(body))
    return script


RESULT_NODE = """
    from pathlib import Path
    from nipype import Function, Node, Workflow

    def make(kind):
        import os
        if kind == "fifo":
            os.mkfifo("pipe")
            with open("data.txt", "w") as fh:
                fh.write("data")
        elif kind == "sparse":
            with open("sparse.bin", "wb") as fh:
                fh.seek(256 * 2**20)
                fh.write(b"x")
        else:
            with open("image.nii", "wb") as fh:
                fh.write(b"i" * 2**20)
            os.link("image.nii", "linked.nii")
            os.mkdir("inputs")
            os.link("image.nii", "inputs/image.nii")
        return os.getcwd()

    root = Path(sys.argv[1] if len(sys.argv) > 1 else {root!r})
    wf = Workflow(name="special", base_dir=str(root / "work"))
    node = Node(Function(input_names=["kind"], output_names=["where"], function=make), name="make")
    node.inputs.kind = {kind!r}
    wf.add_nodes([node])
    wf.config["execution"]["poll_sleep_duration"] = 0.05
    args = {{"n_procs": 2}}
    if {plugin!r} == "SeaMultiProc":
        args["sea"] = {{"tiers": [{{"path": {tier!r}}}]}}
    wf.run(plugin={plugin!r}, plugin_args=args)
"""


@pytest.mark.parametrize("plugin", ["MultiProc", "SeaMultiProc"])
def test_a_named_pipe_in_a_directory_that_goes_home_does_not_hang_the_run(plugin, disk_dir, shm_dir):
    """A result node leaves a named pipe in its directory: the run ends (MultiProc's does in seconds;
    Sea's stager opened the pipe and waited forever), and the pipe is home as a pipe."""
    done = run_script(RESULT_NODE.format(root=str(disk_dir), kind="fifo", plugin=plugin, tier=str(shm_dir)), timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    home = disk_dir / "work" / "special" / "make"
    assert stat.S_ISFIFO(os.lstat(home / "pipe").st_mode) and (home / "data.txt").read_text() == "data"
    assert sea_private_dirs(shm_dir) == []


@pytest.mark.parametrize("plugin", ["MultiProc", "SeaMultiProc"])
def test_a_sparse_file_arrives_sparse(plugin, disk_dir, shm_dir):
    """A result node writes a 256 MiB file that is all hole but one byte: at home it takes the
    room MultiProc's takes (a few KiB), not 256 MiB."""
    done = run_script(RESULT_NODE.format(root=str(disk_dir), kind="sparse", plugin=plugin, tier=str(shm_dir)))
    assert done.returncode == 0, done.stderr[-3000:]
    copy = disk_dir / "work" / "special" / "make" / "sparse.bin"
    st = os.stat(copy)
    assert st.st_size == 256 * 2**20 + 1 and st.st_blocks * 512 <= 2**20, f"{st.st_blocks * 512} bytes on disk"
    with open(copy, "rb") as fh:
        fh.seek(256 * 2**20)
        assert fh.read() == b"x"


# ------------------------------------------------------------------ files Sea did not make
def test_the_sweep_removes_only_what_sea_made_and_never_fails_on_another_users_file(disk_dir, shm_dir, other_user):
    """A user's ``notes.sea-tmp-keep.txt`` (a name with Sea's mark, not one Sea makes) in the work
    directory and in a DataSink's destination survives a run; another user's file named exactly as
    Sea names its temporaries, in a shared sticky destination, neither stops the run nor is
    removed; a temporary of Sea's that a killed run left is removed."""
    from nipype_workflows import build_full, make_subjects, run

    subjects = make_subjects(disk_dir / "data", 1, 0.5)
    work, out = disk_dir / "work", disk_dir / "shared-out"
    out.mkdir()
    out.chmod(0o1777)  # a shared destination, sticky, as /tmp is
    (work / "study").mkdir(parents=True)
    mine = [work / "notes.sea-tmp-keep.txt", out / "notes.sea-tmp-keep.txt", work / "study" / ".notes.sea-tmp-keep"]
    for path in mine:
        path.write_text("the user's")
    theirs = out / ".group_mean.nii.sea-tmp-0a1b2c3d"
    theirs.write_text("another user's")
    os.chown(theirs, *other_user)
    left = work / "study" / ".smooth.nii.sea-tmp-deadbeef"  # what a killed run of Sea's leaves
    left.write_text("partial")
    run(build_full(disk_dir / "data", subjects, work, out), "SeaMultiProc", {"tiers": [{"path": str(shm_dir)}]})
    assert all(p.read_text() == "the user's" for p in mine)
    assert theirs.read_text() == "another user's" and not left.exists()
    assert sweep_temporaries(out) == 0


# ------------------------------------------------------------------ a killed run's workers
def test_the_workers_of_a_killed_run_die_with_it(disk_dir, shm_dir):
    """``kill -9`` of a SeaMultiProc run whose two nodes compute for a minute: its worker processes
    do not outlive it (MultiProc's leave with it)."""
    body = """
        from pathlib import Path
        from nipype import Function, Node, Workflow

        def slow(x):
            import time
            time.sleep(60)
            return x

        wf = Workflow(name="slow", base_dir={work!r})
        for i in range(2):
            node = Node(Function(input_names=["x"], output_names=["y"], function=slow), name=f"slow{{i}}")
            node.inputs.x = i
            wf.add_nodes([node])
        wf.run(plugin="SeaMultiProc", plugin_args={{"n_procs": 2, "sea": {{"tiers": [{{"path": {tier!r}}}]}}}})
    """.format(work=str(disk_dir / "work"), tier=str(shm_dir))
    proc = subprocess.Popen([sys.executable, str(script_file(body))], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(workers) < 2:
            time.sleep(0.2)
            workers = psutil.Process(proc.pid).children(recursive=True)
        assert len(workers) >= 2, "the run never started its workers"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        _, alive = psutil.wait_procs(workers, timeout=10)
        assert not alive, f"{len(alive)} worker(s) outlived the killed run"
    finally:
        proc.kill()
        for worker in workers:
            if worker.is_running():
                worker.kill()


# ------------------------------------------------------------------ one line, never a traceback
@pytest.mark.parametrize("what", ["sea-is-a-file", "journal-is-a-directory"])
def test_seas_place_in_the_home_taken_by_something_else_is_one_line(what, disk_dir, shm_dir):
    from nipype_workflows import build_full, make_subjects, run

    subjects = make_subjects(disk_dir / "data", 1, 0.5)
    work = disk_dir / "work"
    work.mkdir()
    if what == "sea-is-a-file":
        (work / ".sea").write_text("not Sea's")
    else:
        (work / ".sea" / "journal.jsonl").mkdir(parents=True)
    with pytest.raises(SeaError) as info:
        run(build_full(disk_dir / "data", subjects, work, disk_dir / "out"), "SeaMultiProc", {"tiers": [{"path": str(shm_dir)}]})
    assert "\n" not in str(info.value) and "move what is there away" in str(info.value), str(info.value)
    assert sea_private_dirs(shm_dir) == []


def test_a_config_file_nested_too_deeply_is_one_line(tmp_path):
    deep = tmp_path / "deep.yml"
    deep.write_text("[" * 5000 + "]" * 5000)
    with pytest.raises(SeaConfigError, match="nested too deeply"):
        SeaConfig.load(deep)


def test_a_file_that_is_not_a_sea_configuration_is_named_not_echoed(tmp_path):
    """A file of secrets given by mistake (``/etc/shadow``'s shape): the message says what it is not,
    and shows none of its contents."""
    secret = tmp_path / "shadow"
    secret.write_text("root:*:20228:0:99999:7:::\nalice:$6$salt$hash:20228:0:99999:7:::\n")
    with pytest.raises(SeaConfigError) as info:
        SeaConfig.load(secret)
    assert "is not a Sea configuration" in str(info.value) and "20228" not in str(info.value) and "alice" not in str(info.value), str(info.value)


def test_a_remove_rule_that_would_drop_the_declared_outputs_is_refused_unless_it_names_them(disk_dir, shm_dir):
    """``{pattern: "**", mode: remove}`` would let the run succeed with an empty sink: refused in one
    line before any node runs; a rule naming the destination removes them, as asked."""
    from nipype_workflows import build_full, make_subjects, run

    subjects = make_subjects(disk_dir / "data", 1, 0.5)
    out = disk_dir / "out"
    with pytest.raises(SeaConfigError, match="matches the declared outputs") as info:
        run(build_full(disk_dir / "data", subjects, disk_dir / "work", out), "SeaMultiProc",
            {"tiers": [{"path": str(shm_dir)}], "rules": [{"pattern": "**", "mode": "remove"}]})  # fmt: skip
    assert "\n" not in str(info.value) and not out.exists()
    run(build_full(disk_dir / "data", subjects, disk_dir / "work", out), "SeaMultiProc",
        {"tiers": [{"path": str(shm_dir)}], "rules": [{"pattern": f"{out}/**", "mode": "remove"}]})  # fmt: skip
    assert not any(p.is_file() for p in out.rglob("*")) if out.exists() else True


def test_a_discovered_tier_others_can_write_is_left_out_without_dropping_the_next(tmp_path, monkeypatch, caplog, disk_dir):
    """``$TMPDIR`` on /dev/shm's filesystem, writable by every user without the sticky bit: it is
    left out, saying why, and /dev/shm is used; when nothing is usable, one line says the run is
    home-only and why."""
    from sea.tiers import discover_tiers

    unsafe = Path(os.path.realpath("/dev/shm")) / f"sea-test-open-{os.getpid()}"
    unsafe.mkdir()
    try:
        unsafe.chmod(0o777)
        monkeypatch.setenv("TMPDIR", str(unsafe))
        monkeypatch.delenv("SLURM_TMPDIR", raising=False)
        with caplog.at_level(logging.INFO, logger="sea"):
            found = discover_tiers(disk_dir)
        assert [t.path for t in found] == ["/dev/shm"], found
        assert any("left out" in r.getMessage() and "not safe" in r.getMessage() for r in caplog.records)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="sea"):
            assert discover_tiers(Path("/dev/shm")) == []  # the home on /dev/shm itself: nothing left
        said = [r.getMessage() for r in caplog.records]
        assert len(said) == 1 and "home-only" in said[0], said
    finally:
        unsafe.rmdir()


def test_sigterm_ends_a_run_as_it_ends_multiprocs(disk_dir, shm_dir):
    """A batch system's SIGTERM: Sea commits what is under way, then the process ends on the signal,
    as under MultiProc, with no traceback."""
    body = """
        from nipype import Function, Node, Workflow

        def slow(x):
            import time
            time.sleep(60)
            return x

        wf = Workflow(name="slow", base_dir={work!r})
        node = Node(Function(input_names=["x"], output_names=["y"], function=slow), name="slow")
        node.inputs.x = 1
        wf.add_nodes([node])
        wf.config["execution"]["poll_sleep_duration"] = 0.05
        print("started", flush=True)
        wf.run(plugin="SeaMultiProc", plugin_args={{"n_procs": 1, "sea": {{"tiers": [{{"path": {tier!r}}}]}}}})
    """.format(work=str(disk_dir / "work"), tier=str(shm_dir))
    proc = subprocess.Popen([sys.executable, str(script_file(body))], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (disk_dir / "work" / ".sea" / "journal.jsonl").exists():
        time.sleep(0.1)
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM, (proc.returncode, err[-3000:])
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert RunReport.from_json(disk_dir / "work" / "sea-report.json").interrupted
    assert sea_private_dirs(shm_dir) == []


@pytest.mark.parametrize("plugin", ["MultiProc", "SeaMultiProc"])
def test_hard_links_in_a_directory_that_goes_home_stay_links(plugin, disk_dir, shm_dir):
    """A result node links a file under two more names (as a tool that links its inputs does): at
    home the three names are one file, as MultiProc leaves them, not three copies."""
    done = run_script(RESULT_NODE.format(root=str(disk_dir), kind="links", plugin=plugin, tier=str(shm_dir)))
    assert done.returncode == 0, done.stderr[-3000:]
    home = disk_dir / "work" / "special" / "make"
    inodes = {os.stat(home / name).st_ino for name in ("image.nii", "linked.nii", "inputs/image.nii")}
    assert len(inodes) == 1 and os.stat(home / "image.nii").st_nlink == 3


def test_recover_makes_a_node_path_linked_to_its_kept_copy_a_real_directory(disk_dir, shm_dir):
    """A MapNode's path in the home is a link to where it ran; its copy home failed, so the tier's
    directory was kept. ``sea recover`` copied through the link into the kept directory itself, then
    removed it: the link dangled and every rerun died. The node's path becomes its copy."""
    import json

    from sea.private import KEPT_FILE, OWNER_FILE
    from sea.recover import recover

    home = disk_dir / "work"
    kept = shm_dir / "sea-kept0123"
    node = kept / "wf" / "mapnode"
    (node / "mapflow" / "_mapnode0").mkdir(parents=True)
    (node / "result_mapnode.pklz").write_bytes(b"result")
    (node / "mapflow" / "_mapnode0" / "out.nii").write_bytes(b"image")
    kept.chmod(0o700)
    (kept / OWNER_FILE).write_text(f"1 host {home}")
    (kept / KEPT_FILE).write_text(json.dumps({"copies": [{"from": "wf/mapnode", "to": str(home / "wf" / "mapnode")}], "rule": []}))
    (home / "wf").mkdir(parents=True)
    (home / "wf" / "mapnode").symlink_to(node, target_is_directory=True)
    done = recover(kept)
    logical = home / "wf" / "mapnode"
    assert done.removed and not kept.exists()
    assert logical.is_dir() and not logical.is_symlink(), "the home's path still links where nothing is"
    assert (logical / "mapflow" / "_mapnode0" / "out.nii").read_bytes() == b"image" and (logical / "result_mapnode.pklz").read_bytes() == b"result"


def test_files_a_node_leaves_a_process_to_write_after_it_returned_are_reported(disk_dir, shm_dir):
    """A node starts a detached process that writes in its directory after the node returned: Sea
    evicts the directory with it (MultiProc keeps it), and says so in the log and the report."""
    from nipype import Function, Node, Workflow

    from nipype_workflows import run

    def detach(x):
        import subprocess
        import sys

        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5); open('late.txt', 'w').write('late' * 1000)"], start_new_session=True)
        return x

    def wait(x):
        import time

        time.sleep(2.0)
        return x

    wf = Workflow(name="late", base_dir=str(disk_dir / "work"))
    first = Node(Function(input_names=["x"], output_names=["y"], function=detach), name="detach")
    first.inputs.x = 1
    second = Node(Function(input_names=["x"], output_names=["y"], function=wait), name="wait")
    wf.connect(first, "y", second, "x")
    run(wf, "SeaMultiProc", {"tiers": [{"path": str(shm_dir)}]})
    report = RunReport.from_json(disk_dir / "work" / "sea-report.json")
    assert report.late_writes == ["late/detach"], report.to_text()
    assert "grew after their node returned" in report.to_text()


def test_a_directory_handed_on_as_a_plain_string_stays_until_its_readers_finished(tmp_path, shm_dir):
    """Pydra's own ``test_wf_shell_cmd_1``: a shell task prints its directory (``pwd``), a Python
    task hands it on as a plain string, a second shell task lists it. The directory is a reference
    all the same: it stays on its tier until the lister ran (it was evicted before, under ``sea``)."""
    pytest.importorskip("pydra.compose", reason="Pydra 1.0 needs Python >= 3.11")
    from pydra.compose import python, shell, workflow
    from pydra.engine.submitter import Submitter

    @python.define
    def StripAndListify(x: str) -> list[str]:
        return [x.strip()]

    @workflow.define
    def Listing(cmd1: str, cmd2: str) -> str:
        shelly_pwd = workflow.add(shell.define(cmd1)())
        listify = workflow.add(StripAndListify(x=shelly_pwd.stdout))
        shelly_ls = workflow.add(shell.define(cmd2)(append_args=listify.out))
        return shelly_ls.stdout

    for worker, options in (("cf", {}), ("sea", {"sea": {"tiers": [{"path": str(shm_dir)}]}})):
        with Submitter(worker=worker, cache_root=tmp_path / worker, **options) as sub:
            res = sub(Listing(cmd1="pwd", cmd2="ls"))
        assert not res.errored, res.errors
        assert "_result.pklz" in res.outputs.out and "_job.pklz" in res.outputs.out, (worker, res.outputs.out)
