"""Never worse than the engine's own plugin (issue 33): what an adversarial pass found that MultiProc
handles and Sea did not. Real FIFOs, sparse files, a second real user (``useradd``), real kills."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
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
from sea.stager import TMP_MARK, sweep_temporaries

from conftest import sea_private_dirs, tree_files

TESTS = Path(__file__).parent


@pytest.fixture
def slow_fs():
    """``slow_fs(write_mbps=...)``: a throttled FUSE mount (``slowfs_fixtures``), imported here, not
    at the module's top: the scripts this module's tests run import its helpers, where the
    repository's ``benchmarks`` is not importable."""
    from slowfs_fixtures import slowfs_scratch

    with contextlib.ExitStack() as stack:
        yield lambda **settings: stack.enter_context(slowfs_scratch(**settings))


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


def test_a_discovered_tier_another_user_filled_is_left_out_and_the_run_goes_on(tmp_path, monkeypatch, caplog, disk_dir, other_user):
    """A ``$TMPDIR`` (``/tmp`` on a shared node) that another user filled, of files or of bytes:
    Sea could not make its directory there and the run failed before any node, where MultiProc
    runs (the seventeenth adversarial pass). A tier found, not asked for, is left out, saying why,
    and the next is used."""
    from sea.tiers import StorageHierarchy

    from conftest import mounted_tmpfs

    uid, gid = other_user
    for options in ("nr_inodes=64", ""):
        with mounted_tmpfs("1M", options=options) as full:
            full.chmod(0o1777)
            os.chown(full, 0, 0)
            theirs = full / "theirs"
            theirs.mkdir()
            os.chown(theirs, uid, gid)
            with contextlib.suppress(OSError):  # their files, until it is full
                for i in range(100_000):
                    (theirs / f"f{i}").write_bytes(b"x" * (0 if options else 65536))
            monkeypatch.setenv("TMPDIR", str(full))
            monkeypatch.delenv("SLURM_TMPDIR", raising=False)
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="sea"):
                hierarchy = StorageHierarchy.build(SeaConfig.load({}), disk_dir)
            try:
                assert [str(t.root) for t in hierarchy.fast_tiers] == [os.path.realpath("/dev/shm")], hierarchy.fast_tiers
                (line,) = [r.getMessage() for r in caplog.records if str(full) in r.getMessage()]
                assert "cannot create Sea's directory" in line and "skipped" in line, line
            finally:
                hierarchy.close()


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


@pytest.mark.parametrize("hangup", ["handled", pytest.param("ignored", marks=pytest.mark.slow)])  # nohup's: with --run-slow
def test_a_hangup_during_the_last_flush_commits_the_outputs_first(hangup, shm_dir, slow_fs):
    """The nineteenth adversarial pass: the terminal the run was started from closing (SIGHUP) as
    the declared outputs went home: Sea's process died on the spot, leaving them half-written under
    temporary names and the tier full; MultiProc's sink had written them already. SIGHUP now stops
    a run as SIGTERM does: what is under way is committed, then the process ends on the signal. A
    run started ignoring it (``nohup``) goes on ignoring it."""
    fs = slow_fs(write_mbps=16)
    home, out = fs.path / "work", fs.path / "out"
    body = """
        import signal
        from nipype import Function, Node, Workflow
        from nipype.interfaces.io import DataSink

        if {ignored}:
            signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup starts it

        def big(n):
            import os
            with open("big.dat", "wb") as f:
                f.write(b"x" * n)
            return os.path.abspath("big.dat")

        wf = Workflow(name="w", base_dir={home!r})
        node = Node(Function(input_names=["n"], output_names=["out"], function=big), name="big")
        node.inputs.n = 16 * 2**20  # 1 s to the slow home
        sink = Node(DataSink(base_directory={out!r}), name="sink")
        wf.connect(node, "out", sink, "res")
        wf.run(plugin="SeaMultiProc", plugin_args={{"n_procs": 1, "sea": {{"tiers": [{{"path": {tier!r}}}]}}}})
    """.format(home=str(home), out=str(out), tier=str(shm_dir), ignored=hangup == "ignored")
    proc = subprocess.Popen([sys.executable, str(script_file(body))], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (out.is_dir() and any(TMP_MARK in p.name for p in out.rglob("*"))):
        time.sleep(0.01)  # the output is on its way home
    os.killpg(proc.pid, signal.SIGHUP)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == (-signal.SIGHUP if hangup == "handled" else 0), (proc.returncode, err[-3000:])
    assert "Traceback" not in err, err[-3000:]
    assert tree_files(out) == {"res/big.dat": b"x" * 16 * 2**20}
    assert [p for p in out.rglob("*") if TMP_MARK in p.name] == []
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


def test_a_recovery_that_fails_half_way_leaves_no_half_node_directory(disk_dir, shm_dir, tmpfs_factory):
    """``sea recover`` into a home that fills up again after the first file: the node's path in the
    home stays absent (a half directory with the node's result file in it is a node the engine takes
    as done), nothing of the attempt is left beside it, the kept copy stays; the next recovery,
    with room, puts the whole directory in place."""
    import json

    from sea import SeaError
    from sea.private import KEPT_FILE, OWNER_FILE
    from sea.recover import recover

    home = tmpfs_factory("1M") / "work"
    kept = shm_dir / "sea-kept4567"
    node = kept / "wf" / "node"
    node.mkdir(parents=True)
    (node / "result_node.pklz").write_bytes(b"result")
    (node / "zz-image.nii").write_bytes(b"i" * 2**21)  # 2 MiB: no room for it
    kept.chmod(0o700)
    (kept / OWNER_FILE).write_text(f"1 host {home}")
    (kept / KEPT_FILE).write_text(json.dumps({"copies": [{"from": "wf/node", "to": str(home / "wf" / "node")}], "rule": []}))
    with pytest.raises((OSError, SeaError)):
        recover(kept)
    assert not os.path.lexists(home / "wf" / "node"), "half the node's directory is at its path"
    assert os.listdir(home / "wf") == [], "the attempt left files in the home"
    assert (node / "zz-image.nii").stat().st_size == 2**21, "the kept copy was touched"
    (node / "zz-image.nii").write_bytes(b"i" * 2**19)  # the user made room (here: a smaller file)
    assert recover(kept).removed
    assert sorted(os.listdir(home / "wf" / "node")) == ["result_node.pklz", "zz-image.nii"]


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


def _make_a_file(n):
    import os

    path = os.path.abspath("a.dat")
    with open(path, "wb") as f:
        f.write(b"x" * n)
    return path


def test_a_datasink_with_a_relative_base_directory_delivers_into_its_own_directory_as_under_multiproc(tmp_path, shm_dir, monkeypatch):
    """Nipype's DataSink resolves a relative ``base_directory`` in its own node directory, where it
    runs. Sea resolved it in the directory the run was started from, and delivered there, over a
    file of the user's (the seventeenth adversarial pass)."""
    from nipype import Function, Node, Workflow
    from nipype.interfaces.io import DataSink

    from nipype_workflows import run

    started_in = tmp_path / "started-in"
    (started_in / "derivatives" / "res").mkdir(parents=True)
    (started_in / "derivatives" / "res" / "a.dat").write_text("the user's own file")
    monkeypatch.chdir(started_in)
    delivered = {}
    for plugin in ("MultiProc", "SeaMultiProc"):
        wf = Workflow(name="w", base_dir=str(tmp_path / plugin))
        make = Node(Function(input_names=["n"], output_names=["out"], function=_make_a_file), name="make")
        make.inputs.n = 1000
        sink = Node(DataSink(base_directory="derivatives"), name="sink")
        wf.connect(make, "out", sink, "res")
        run(wf, plugin, {"tiers": [{"path": str(shm_dir)}]} if plugin == "SeaMultiProc" else None)
        delivered[plugin] = tree_files(tmp_path / plugin / "w" / "sink" / "derivatives")
    assert delivered["SeaMultiProc"] == delivered["MultiProc"] == {"res/a.dat": b"x" * 1000}
    assert tree_files(started_in) == {"derivatives/res/a.dat": b"the user's own file"}


def _repeat(v):
    return v * 2


@pytest.mark.parametrize("values", [["", " "], ["a", "a"]])
def test_iterable_values_nipype_names_alike_are_said_before_the_run(values, tmp_path, shm_dir, caplog):
    """The eighteenth adversarial pass (D): iterable values Nipype gives one directory name (``''``,
    ``' '`` and ``'{}'`` are all ``_v_``): MultiProc runs each node there in turn and keeps the
    last one's results, Sea the first's. The collision is Nipype's; Sea says it before any node
    runs. A value repeated is the same node twice: nothing to say."""
    from nipype import Function, IdentityInterface, Node, Workflow

    from nipype_workflows import run

    wf = Workflow(name="w", base_dir=str(tmp_path))
    src = Node(IdentityInterface(fields=["v"]), name="src")
    src.iterables = ("v", values)
    twice = Node(Function(input_names=["v"], output_names=["out"], function=_repeat), name="twice")
    wf.connect(src, "v", twice, "v")
    caplog.set_level(logging.WARNING, logger="sea")
    run(wf, "SeaMultiProc", {"tiers": [{"path": str(shm_dir)}]})
    said = [r.getMessage() for r in caplog.records if "share the directory" in r.getMessage()]
    if values[0] == values[1]:
        assert said == []
    else:
        assert len(said) == 1 and "w/_v_/twice" in said[0] and "MultiProc runs each there" in said[0], said


def _copy_of(f):
    import os
    import shutil

    return shutil.copy(f, os.path.abspath("copy.dat"))


def test_a_result_directory_removed_by_hand_is_made_again_by_the_rerun(tmp_path, shm_dir):
    """The nineteenth adversarial pass: the directory of a node nothing reads (what the workflow
    made), removed from the home by hand: MultiProc's rerun makes it again; Sea's skipped it (its
    journal said done, and no consumer needed it) and it stayed missing, on every rerun."""
    from nipype import Function, Node, Workflow

    from nipype_workflows import run

    made = {}
    for plugin in ("MultiProc", "SeaMultiProc"):
        def build(plugin=plugin):
            wf = Workflow(name="w", base_dir=str(tmp_path / plugin))
            make = Node(Function(input_names=["n"], output_names=["out"], function=_make_a_file), name="make")
            make.inputs.n = 1000
            last = Node(Function(input_names=["f"], output_names=["out"], function=_copy_of), name="last")
            wf.connect(make, "out", last, "f")
            return wf

        sea = {"tiers": [{"path": str(shm_dir)}]} if plugin == "SeaMultiProc" else None
        run(build(), plugin, sea)
        shutil.rmtree(tmp_path / plugin / "w" / "last")
        run(build(), plugin, sea)
        made[plugin] = (tmp_path / plugin / "w" / "last" / "copy.dat").read_bytes()
    assert made == {"MultiProc": b"x" * 1000, "SeaMultiProc": b"x" * 1000}


def _with_setting(x):
    import os

    with open(os.environ["SEA_TEST_SETTING"]) as f:
        setting = f.read()
    out = os.path.abspath("o.txt")
    with open(out, "w") as f:
        f.write(f"{x}-{setting}")
    return out


def test_a_node_with_overwrite_runs_again_on_every_rerun(tmp_path, shm_dir, monkeypatch):
    """The nineteenth adversarial pass: ``Node(..., overwrite=True)`` runs on every run under
    MultiProc (here it reads a setting no input names, changed between the runs). Sea's journal took
    it, and its sink, as done: both kept the first run's results."""
    from nipype import Function, Node, Workflow
    from nipype.interfaces.io import DataSink

    from nipype_workflows import run

    setting = tmp_path / "setting.txt"
    monkeypatch.setenv("SEA_TEST_SETTING", str(setting))
    seen = {}
    for plugin in ("MultiProc", "SeaMultiProc"):
        root = tmp_path / plugin
        for value in ("one", "two"):
            setting.write_text(value)
            wf = Workflow(name="w", base_dir=str(root))
            start = Node(Function(input_names=["v"], output_names=["out"], function=_repeat), name="start")
            start.inputs.v = 1
            mid = Node(Function(input_names=["x"], output_names=["out"], function=_with_setting), name="mid", overwrite=True)
            last = Node(Function(input_names=["x"], output_names=["out"], function=_with_setting), name="last", overwrite=True)
            sink = Node(DataSink(base_directory=str(root / "out")), name="sink")
            wf.connect([(start, mid, [("out", "x")]), (start, last, [("out", "x")]), (mid, sink, [("out", "mid")])])
            run(wf, plugin, {"tiers": [{"path": str(shm_dir)}]} if plugin == "SeaMultiProc" else None)
            seen[plugin, value] = ((root / "out" / "mid" / "o.txt").read_text(), (root / "w" / "last" / "o.txt").read_text())
    assert seen == {(p, v): ("2-" + v, "2-" + v) for p in ("MultiProc", "SeaMultiProc") for v in ("one", "two")}, seen


def _first_bytes(files):
    import os

    out = os.path.abspath("joined.dat")
    with open(out, "wb") as f:
        for name in [files] if isinstance(files, str) else files:  # a grabber's one file is no list
            with open(name, "rb") as g:
                f.write(g.read()[:4] + b"|")
    return out


@pytest.mark.parametrize("grabber", ["DataGrabber", pytest.param("SelectFiles", marks=pytest.mark.slow)])  # the same signature: with --run-slow
def test_a_file_a_grabber_finds_since_the_last_run_reaches_its_consumers(grabber, tmp_path, shm_dir):
    """The twentieth adversarial pass: a grabber's pattern (``run*.dat``) matches a file added
    since the last run. MultiProc runs grabbers on every run, and its consumers read the new file;
    Sea's journal took them all as done (it knew only the files the grabber named before), and the
    outputs stayed as they were. Now what the grabber would find is part of its signature."""
    from nipype import Function, Node, Workflow
    from nipype.interfaces.io import DataGrabber, DataSink, SelectFiles

    from nipype_workflows import run

    data = tmp_path / "data"
    data.mkdir()
    seen = {}
    for plugin in ("MultiProc", "SeaMultiProc"):
        for name in ("run1.dat", "run2.dat", "run3.dat"):
            (data / name).unlink(missing_ok=True)
        for added in ("run1.dat", "run2.dat"):
            (data / added).write_bytes(added.encode())
            wf = Workflow(name="w", base_dir=str(tmp_path / plugin))
            if grabber == "DataGrabber":
                grab = Node(DataGrabber(outfields=["f"], sort_filelist=True, base_directory=str(data), template="run*.dat"), name="grab")
                grab.inputs.template_args = {"f": [[]]}
            else:
                grab = Node(SelectFiles({"f": "run*.dat"}, base_directory=str(data), sort_filelist=True, force_lists=True), name="grab")
            joined = Node(Function(input_names=["files"], output_names=["out"], function=_first_bytes), name="joined")
            sink = Node(DataSink(base_directory=str(tmp_path / plugin / "out")), name="sink")
            wf.connect([(grab, joined, [("f", "files")]), (joined, sink, [("out", "joined")])])
            run(wf, plugin, {"tiers": [{"path": str(shm_dir)}]} if plugin == "SeaMultiProc" else None)
            seen[plugin, added] = (tmp_path / plugin / "out" / "joined" / "joined.dat").read_bytes()
    assert seen["SeaMultiProc", "run2.dat"] == seen["MultiProc", "run2.dat"] == b"run1|run2|", seen


def _link_to(f):
    import os

    os.symlink(f, "abs_link.dat")
    os.symlink(os.path.relpath(f), "rel_link.dat")
    return [os.path.abspath("abs_link.dat"), os.path.abspath("rel_link.dat")]


def _first(items):
    return items[0]


def _links(directory: Path, root: Path) -> dict[str, tuple[str, bytes]]:
    """The symbolic links in ``directory``: where each points (an absolute target relative to ``root``) and what it reads."""
    return {
        link.name: (os.readlink(link).replace(str(root), "ROOT"), link.read_bytes() if link.exists() else b"DANGLING")
        for link in sorted(directory.iterdir()) if link.is_symlink()
    }  # fmt: skip


def test_links_a_node_makes_into_its_producers_directory_are_delivered_and_resolve_at_home(tmp_path, shm_dir):
    """The eighteenth adversarial pass: a node links to its producer's file (``ln -s``, absolute
    and relative). Its producer's directory was evicted as soon as the node finished: a DataSink of
    the links delivered nothing and the run succeeded (with ``checkpoints: all``, the relative one
    was still missing), and a link node that gives the workflow its result (here: links to the
    links of the first) left links dangling in the home. A link into another node's directory that an output names now names a file of it as
    the output would: it stays while the link's readers run, and goes home with a directory that
    goes home; so does the directory a link it points to points into (a chain)."""
    from nipype import Function, Node, Workflow
    from nipype.interfaces.io import DataSink

    from nipype_workflows import run

    seen = {}
    for plugin, checkpoints in (("MultiProc", None), ("SeaMultiProc", "auto"), ("SeaMultiProc", "all")):
        root = tmp_path / f"{plugin}-{checkpoints}"
        wf = Workflow(name="w", base_dir=str(root))
        make = Node(Function(input_names=["n"], output_names=["out"], function=_make_a_file), name="make")
        make.inputs.n = 1000
        linked = Node(Function(input_names=["f"], output_names=["out"], function=_link_to), name="linked")
        chained = Node(Function(input_names=["f"], output_names=["out"], function=_link_to), name="chained")  # to a link of linked's; nothing reads it
        sink = Node(DataSink(base_directory=str(root / "out")), name="sink")
        wf.connect([(make, linked, [("out", "f")]), (linked, sink, [("out", "links")])])
        wf.connect(linked, ("out", _first), chained, "f")
        run(wf, plugin, {"tiers": [{"path": str(shm_dir)}], "checkpoints": checkpoints} if checkpoints else None)
        seen[plugin, checkpoints] = (tree_files(root / "out"), _links(root / "w" / "linked", root), _links(root / "w" / "chained", root))
    expected = (
        {"links/abs_link.dat": b"x" * 1000, "links/rel_link.dat": b"x" * 1000},
        {"abs_link.dat": ("ROOT/w/make/a.dat", b"x" * 1000), "rel_link.dat": ("../make/a.dat", b"x" * 1000)},
        {"abs_link.dat": ("ROOT/w/linked/abs_link.dat", b"x" * 1000), "rel_link.dat": ("../linked/abs_link.dat", b"x" * 1000)},
    )
    assert seen == dict.fromkeys(seen, expected), seen


@pytest.mark.parametrize("variant", ["handed-on", "inside-a-directory-output-too"])
def test_a_workflow_output_naming_a_file_in_another_tasks_directory_is_delivered_and_rerun(tmp_path, shm_dir, variant):
    """The seventeenth adversarial pass: the workflow's output is a file its last task got from
    another's directory (a task returning its input file; or a file inside a directory the first
    task outputs, which is the workflow's output too). Only the last task's directory went home: the
    other's was evicted, Pydra's copy of the workflow's outputs failed, and every rerun the same. Now
    that directory goes home with it: the run and its rerun give ``cf``'s bytes."""
    pytest.importorskip("pydra.compose", reason="Pydra 1.0 needs Python >= 3.11")
    from pydra.engine.submitter import Submitter

    from pydra_workflows import HandedOn, MadeAndPicked

    seen = {}
    for worker, options in (("cf", {}), ("sea", {"sea": {"tiers": [{"path": str(shm_dir)}]}})):
        for attempt in ("run", "rerun"):
            with Submitter(worker=worker, cache_root=tmp_path / worker, n_procs=2, **options) as sub:
                res = sub((HandedOn if variant == "handed-on" else MadeAndPicked)(n=1000))
            assert not res.errored, (worker, attempt, res.errors)
            seen[worker, attempt] = Path(res.outputs.picked).read_bytes()
    assert seen["sea", "run"] == seen["sea", "rerun"] == seen["cf", "run"] == b"x" * 1000


MRTRIX = pytest.mark.skipif(shutil.which("mrconvert") is None, reason="MRtrix3 is not installed (apt-get install mrtrix3: the suite installs it itself when run as root on Debian)")


def _passes_on(in_file):
    return in_file


def test_a_result_naming_its_producers_file_while_the_producers_copy_is_on_its_way_is_copied_once(shm_dir, slow_fs):
    """A result node whose output names its producer's file sends the producer's directory home
    with its own. With ``checkpoints: all`` that directory's copy is on its way already (a slow
    home): it was submitted a second time, into the same temporary directory, and the run ended in
    a flush error (its second commit found nothing to put in place)."""
    from nipype import Function, Node, Workflow

    from nipype_workflows import run

    home = slow_fs(write_mbps=4).path / "work"
    wf = Workflow(name="w", base_dir=str(home))
    make = Node(Function(input_names=["n"], output_names=["out"], function=_make_a_file), name="make")
    make.inputs.n = 2 * 2**20  # half a second's copy
    last = Node(Function(input_names=["in_file"], output_names=["out"], function=_passes_on), name="last")
    wf.connect(make, "out", last, "in_file")
    run(wf, "SeaMultiProc", {"tiers": [{"path": str(shm_dir)}], "checkpoints": "all"})
    assert (home / "w" / "make" / "a.dat").read_bytes() == b"x" * 2 * 2**20
    report = RunReport.from_json(home / "sea-report.json")
    assert report.bytes_flushed < 3 * 2**20, report.to_text()  # once


@pytest.mark.parametrize("logical_paths", [True, False])
def test_links_a_pydra_task_makes_into_its_producers_directory_are_read_delivered_and_rerun(tmp_path, shm_dir, logical_paths):
    """The eighteenth adversarial pass: a task returns links (absolute, relative) to its producer's
    file. Under ``sea`` the task's consumer failed (Pydra hashed the link, which named the producer
    in the home, where nothing was), and every rerun. Now the run and its rerun read ``cf``'s bytes,
    and the links of the task nothing reads come home resolving, as ``cf``'s. (Those of the task
    another reads stay on its tier, as its directory does: the workflow's copy of them is a file
    with their bytes, where ``cf`` hard-links the link.) Without a view (``logical_paths: false``)
    a task links to its producer's tier path: the link comes home pointing at the home's."""
    pytest.importorskip("pydra.compose", reason="Pydra 1.0 needs Python >= 3.11")
    from pydra.engine.submitter import Submitter

    from pydra_workflows import Linked

    seen = {}
    sea = {"tiers": [{"path": str(shm_dir)}], "logical_paths": logical_paths}
    for worker, options, attempts in (("cf", {}, ("run",)), ("sea", {"sea": sea}, ("run", "rerun"))):
        for attempt in attempts:
            with Submitter(worker=worker, cache_root=tmp_path / worker, n_procs=2, **options) as sub:
                res = sub(Linked(n=1000))
            assert not res.errored, (worker, attempt, res.errors)
            out = res.outputs
            seen[worker, attempt] = (
                [Path(f).read_bytes() for f in (out.read_abs, out.read_rel, out.last_abs, out.last_rel)],
                out.size,
                [(os.readlink(f).replace(str(tmp_path / worker), "CACHE"), Path(f).read_bytes()) for f in (out.last_abs, out.last_rel)],
            )
    assert seen["sea", "run"] == seen["sea", "rerun"] == seen["cf", "run"], seen
    assert seen["cf", "run"][1] == 2000 and seen["cf", "run"][2][0][0].startswith("CACHE/"), seen


def _in_a_child(function, where: Path) -> str:
    """What ``function()`` returns, run in a forked process (a worker's, or a user's once it drops
    root); its traceback, if it raised, fails the test."""
    report = where / f"child-{time.monotonic_ns()}.txt"
    pid = os.fork()
    if pid == 0:
        try:
            report.write_text(function())
        except BaseException:
            report.write_text("Traceback\n" + __import__("traceback").format_exc())
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert report.exists(), "the child wrote nothing"
    told = report.read_text()
    assert not told.startswith("Traceback"), told
    return told


def _history(mif: Path) -> list[str]:
    """The ``command_history`` lines of an MRtrix3 ``.mif`` header: the command lines that made it."""
    header = mif.read_bytes().split(b"\nEND\n")[0].decode()
    return [line for line in header.splitlines() if line.startswith("command_history:")]


@MRTRIX
def test_programs_record_the_homes_paths_as_under_multiproc(disk_dir, shm_dir):
    """MRtrix3 records each command line in the ``.mif`` it writes (Nipype's ``MRConvert``, two in a
    row): under SeaMultiProc it records the paths MultiProc would give it, the work directory's, not
    the tier's (``logical_paths``, on by default), and the outputs are byte-identical. With
    ``logical_paths: false`` the tier path shows: the comparison can fail."""
    import nibabel as nib
    import numpy as np
    from nipype import Node, Workflow
    from nipype.interfaces.io import DataSink
    from nipype.interfaces.mrtrix3 import MRConvert

    source = disk_dir / "in.nii"
    nib.Nifti1Image(np.arange(64, dtype=np.float32).reshape(4, 4, 4), np.eye(4)).to_filename(source)
    made = {}
    for tag, plugin, sea in (("mp", "MultiProc", None), ("sea", "SeaMultiProc", {}), ("tier", "SeaMultiProc", {"logical_paths": False})):
        wf = Workflow(name="mif", base_dir=str(disk_dir / "work"))  # the same path each time: it is recorded
        first = Node(MRConvert(in_file=str(source), out_file="a.mif"), name="first")
        second = Node(MRConvert(out_file="b.mif", args="-datatype float64"), name="second")
        sink = Node(DataSink(base_directory=str(disk_dir / f"out-{tag}")), name="sink")
        wf.connect([(first, second, [("out_file", "in_file")]), (first, sink, [("out_file", "@a")]), (second, sink, [("out_file", "@b")])])
        wf.config["execution"]["poll_sleep_duration"] = 0.05
        args = {"n_procs": 2} if sea is None else {"n_procs": 2, "sea": {"tiers": [{"path": str(shm_dir)}], **sea}}
        wf.run(plugin=plugin, plugin_args=args)
        made[tag] = {name: (disk_dir / f"out-{tag}" / name).read_bytes() for name in ("a.mif", "b.mif")}
        (disk_dir / "work").rename(disk_dir / f"work-{tag}")
    assert made["sea"] == made["mp"]
    assert f"{disk_dir}/work/mif/first/a.mif" in _history(disk_dir / "out-sea" / "b.mif")[-1]
    assert str(shm_dir) in _history(disk_dir / "out-tier" / "b.mif")[-1]  # the tier's path, gone since
    report = RunReport.from_json(disk_dir / "work-sea" / "sea-report.json")
    assert report.success and report.nodes_run == 3 and not report.paths_recorded, report.to_text()
    assert sorted(p.name for p in (disk_dir / "work-sea" / "mif").iterdir()) == sorted(p.name for p in (disk_dir / "work-tier" / "mif").iterdir())  # nothing more in the home
    assert sea_private_dirs(shm_dir) == []


@MRTRIX
def test_pydra_tasks_record_the_homes_paths_as_under_cf(disk_dir, shm_dir):
    """The same under the ``sea`` worker with ``pydra-tasks-mrtrix3``: a job's ``.mif`` records its
    producer's path in the cache as ``cf`` does, and a shell task's ``pwd`` prints its directory in
    the cache, not on the tier."""
    pytest.importorskip("pydra.compose", reason="Pydra 1.0 needs Python >= 3.11")
    from fileformats.medimage import DicomDir
    from pydra.compose import shell, workflow
    from pydra.engine.submitter import Submitter
    from pydra.tasks.dcm2niix import Dcm2Niix
    from pydra.tasks.mrtrix3.v3_1 import MrConvert, MrMath

    from dicom_series import write_series

    Pwd = shell.define("pwd")
    globals()["DicomDir"] = DicomDir  # Pydra reads the annotation (a string here: __future__.annotations) in the module

    @workflow.define(outputs=["mean", "wd"])
    def Convert(in_dir: DicomDir):
        dcm = workflow.add(Dcm2Niix(in_dir=in_dir, compress="y", out_dir=Path("."), filename="sub01"), name="dcm2niix")
        conv = workflow.add(MrConvert(in_file=dcm.out_file, out_file="converted.mif", datatype="float32"), name="mrconvert")
        mean = workflow.add(MrMath(in_file=conv.out_file, operation="mean", axis=2, out_file="mean.mif"), name="mrmath")
        return mean.out_file, workflow.add(Pwd(), name="pwd").stdout

    series = DicomDir(write_series(disk_dir / "dicom"))
    made = {}
    for worker, options in (("cf", {}), ("sea", {"sea": {"tiers": [{"path": str(shm_dir)}]}})):
        with Submitter(worker=worker, cache_root=disk_dir / "cache", n_procs=2, **options) as submitter:
            result = submitter(Convert(in_dir=series))
        assert not result.errored, result.errors
        made[worker] = (Path(result.outputs.mean.fspath).read_bytes(), result.outputs.wd.strip())
        (disk_dir / "cache").rename(disk_dir / f"cache-{worker}")
    assert made["sea"] == made["cf"]
    assert made["sea"][1].startswith(f"{disk_dir}/cache/")
    assert f"{disk_dir}/cache/" in _history(Path(disk_dir / "cache-sea").glob("*/mean.mif").__next__())[-1]
    assert sea_private_dirs(shm_dir) == []


@MRTRIX
def test_an_unprivileged_user_gets_the_view_and_nothing_of_it_stays(disk_dir, shm_dir, other_user):
    """As a user without privileges (``useradd``), in a process of their own: :func:`sea.view.enter`
    makes a user and mount namespace; a program run in the view sees the node's directory at its
    path in the home (``getcwd``, what MRtrix3 records), writes into the tier, reads its producer
    through the home's path; afterwards the home holds nothing new and nothing stays mounted."""
    from sea.view import View

    uid, gid = other_user
    home, tier = disk_dir / "home", shm_dir / "sea-x"
    (tier / "wf" / "producer").mkdir(parents=True)
    (tier / "wf" / "node").mkdir(parents=True)
    (home / "wf").mkdir(parents=True)
    import nibabel as nib
    import numpy as np

    nib.Nifti1Image(np.ones((2, 2, 2), dtype=np.float32), np.eye(4)).to_filename(tier / "wf" / "producer" / "in.nii")
    for path in (disk_dir, home, home / "wf", shm_dir, *tier.rglob("*"), tier):
        os.chown(path, uid, gid)
    view = View(home, home / "wf" / "node", tier / "wf" / "node", (tier,), tier / ".views")
    def user_process() -> str:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
        refused = __import__("sea.view", fromlist=["enter"]).enter()
        with view.mounted():
            os.chdir(view.logical)
            made = subprocess.run(["mrconvert", "-quiet", view.to_logical(str(tier / "wf" / "producer" / "in.nii")), "out.mif"], capture_output=True, text=True, env={**os.environ, "HOME": str(disk_dir)})
            lines = [str(refused), os.getcwd(), str(made.returncode), made.stderr.strip().replace("\n", " "), *(_history(Path("out.mif")) if made.returncode == 0 else [])]
            os.chdir("/")
        left_mounted = str(home) in Path("/proc/self/mountinfo").read_text()  # in the namespace its next node starts from
        with view.mounted():  # its next node: the scratch it keeps for it is used again
            again = os.path.isdir(view.logical) and os.path.samefile(view.logical, view.physical)
        return "\n".join([f"{left_mounted} {again}", *lines])

    told = _in_a_child(user_process, disk_dir)
    after, refused, cwd, code, stderr, *history = told.split("\n", 5)
    assert after == "False True", "a mount of the view stayed in the process's namespace, or its next view failed"
    history = history[0] if history else ""
    assert (refused, code) == ("None", "0"), stderr
    assert cwd == str(home / "wf" / "node")
    assert history == f"command_history: mrconvert -quiet {home}/wf/producer/in.nii out.mif  (version={history.split('version=')[1]}"
    assert (tier / "wf" / "node" / "out.mif").is_file()
    assert [p.name for p in (home / "wf").iterdir()] == []  # nothing made in the home
    scratch = list((tier / ".views").iterdir()) if (tier / ".views").exists() else []
    assert len(scratch) <= 1 and all(not any(p.iterdir()) for p in scratch), scratch  # the process's own, empty, for its next node
    assert str(home) not in Path("/proc/self/mountinfo").read_text()


def test_a_worker_keeps_its_directory_and_a_pool_a_node_started_sees_the_next_nodes_view(disk_dir, shm_dir):
    """Each node's mounts are made in a copy of its worker's namespace (sea.view). Leaving it must
    put the worker back in the directory it was in (Nipype's workers start in the user's: a
    relative path, an import from there), and a thread pool a node started and left running
    (joblib's, a module's) must see the next node's view: the worker stays then in one namespace,
    as before, and writes through the pool land in the next node's directory on the tier."""
    from sea.view import View

    home, tier = disk_dir / "home", shm_dir / "sea-x"
    for node in ("one", "two"):
        (tier / "wf" / node).mkdir(parents=True)
    (home / "wf").mkdir(parents=True)
    def worker_process() -> str:
        import concurrent.futures

        from sea import view as sea_view

        os.chdir(disk_dir)
        assert sea_view.enter() is None
        with View(home, home / "wf" / "one", tier / "wf" / "one", (tier,), tier / ".views").mounted():
            pool = concurrent.futures.ThreadPoolExecutor(1)
            pool.submit(lambda: None).result()  # started by the first node, left running
        after_one = os.getcwd()
        with View(home, home / "wf" / "two", tier / "wf" / "two", (tier,), tier / ".views").mounted():
            pool.submit(lambda: (home / "wf" / "two" / "out.txt").write_text("from the pool")).result()
        return f"{after_one}\n{os.getcwd()}"

    told = _in_a_child(worker_process, disk_dir)
    assert told.split("\n") == [str(disk_dir), str(disk_dir)], "the worker's directory was not put back"
    assert (tier / "wf" / "two" / "out.txt").read_text() == "from the pool"
    assert list((home / "wf").iterdir()) == []


def test_where_namespaces_are_not_allowed_nodes_run_at_their_tier_paths_and_the_report_says_why(disk_dir, shm_dir, other_user):
    """A process that may not make a user namespace (here: one with a second thread, which the
    kernel refuses as a seccomp profile or ``user.max_user_namespaces=0`` would) gets the reason
    from :func:`sea.view.enter` instead of an error; the engine says it once and writes it in the
    report."""
    uid, gid = other_user
    report = disk_dir / "child.txt"
    os.chown(disk_dir, uid, gid)
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            import threading

            threading.Thread(target=time.sleep, args=(5,), daemon=True).start()
            report.write_text(str(__import__("sea.view", fromlist=["enter"]).enter()))
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    reason = report.read_text()
    assert "threads" in reason and "mp_context: fork" in reason, reason
    from sea import SeaEngine

    engine = SeaEngine(SeaConfig.load({"tiers": [{"path": str(shm_dir)}]}), disk_dir / "work")
    engine.view_refused(reason)
    engine.view_refused(reason)  # said once
    run_report = engine.close()
    assert run_report.paths_recorded == reason
    assert f"paths recorded by programs name the tiers, not the home: {reason}" in run_report.to_text()


# ------------------------------------------------------------------ a real user's files (second pass)
def _as_user(user: tuple[int, int], home: Path, function, *args, groups: tuple[int, ...] = ()) -> None:
    """``function(*args)`` in a process of a user without privileges (root bypasses every mode
    these tests are about), also in ``groups``; its traceback, if it raised, fails the test."""
    uid, gid = user
    failure = home / f"failure-{time.monotonic_ns()}.txt"
    pid = os.fork()
    if pid == 0:
        try:
            _python_reachable()
            os.setgroups(list(groups))
            os.setgid(gid)
            os.setuid(uid)
            os.environ["HOME"] = str(home)
            os.chdir(home)
            function(*args)
        except BaseException:
            failure.write_text(__import__("traceback").format_exc())
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert not failure.exists(), failure.read_text()


def _python_reachable() -> None:
    """In this (root's) process, about to become another user's: the interpreter and the paths it
    imports from made reachable to that user when a directory above them is closed to others (a
    ``pyenv`` under ``/root``, 0700), in a mount namespace of this process's own: a tmpfs open to
    all over the closed directory, each needed directory under it bound back."""
    from sea import view

    needed = {Path(p) for p in (sys.base_prefix, sys.prefix, *sys.path) if p and Path(p).is_dir()}
    closed: dict[Path, list[Path]] = {}
    for path in needed:
        for ancestor in reversed([path, *path.parents]):
            if not os.stat(ancestor).st_mode & stat.S_IXOTH:
                closed.setdefault(ancestor, []).append(path)
                break
    if not closed:
        return
    os.unshare(os.CLONE_NEWNS) if hasattr(os, "unshare") else view._check(view._libc.unshare(view._CLONE_NEWNS), "unshare")
    view._mount(None, "/", None, view._MS_REC | view._MS_SLAVE)
    for top, paths in closed.items():
        kept = {p: os.open(p, os.O_PATH | os.O_DIRECTORY) for p in paths}
        view._mount("tmpfs", str(top), "tmpfs", 0, "mode=755")
        for path, fd in kept.items():
            path.mkdir(parents=True, exist_ok=True)
            view._mount(f"/proc/self/fd/{fd}", str(path), None, view._MS_BIND)


def _leaves_private_files():
    import os

    with open("../shared.txt", "w") as f:  # beside its own directory
        f.write("for the next node")
    return os.path.abspath("out.txt")


def _reads_shared(path):
    import os

    os.mkdir("private", 0o700)  # as tempfile.mkdtemp(dir=".") makes it
    with open("private/subject.txt", "w") as f:
        f.write("a name, a date of birth")
    os.chmod(".", 0o700)  # its own directory too (it came home 0755: the eighteenth adversarial pass)
    with open(os.path.join(os.path.dirname(path), "..", "shared.txt")) as f:
        return f.read()


def _run_modes_workflow(plugin: str, base: str, tier: str) -> None:
    from nipype import Function, Node, Workflow

    wf = Workflow(name="modes", base_dir=base)
    first = Node(Function(output_names=["out"], function=_leaves_private_files), name="first")
    second = Node(Function(input_names=["path"], output_names=["out"], function=_reads_shared), name="second")
    middle = Node(Function(output_names=["out"], function=_leaves_private_files), name="middle")  # read: evicted
    last = Node(Function(input_names=["path"], output_names=["out"], function=_reads_shared), name="last")
    wf.connect([(first, second, [("out", "path")]), (middle, last, [("out", "path")])])
    wf.config["execution"]["poll_sleep_duration"] = 0.05
    args = {"n_procs": 2, **({"sea": {"tiers": [{"path": tier}]}} if plugin == "SeaMultiProc" else {})}
    wf.run(plugin=plugin, plugin_args=args)


def _modes(root: Path) -> dict[str, str]:
    found = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if not any(part.startswith(("_", ".")) or part.endswith((".pklz", ".json", ".rst")) for part in Path(rel).parts):
                found[rel] = oct(stat.S_IMODE(os.lstat(path).st_mode))
    return found


def _in_a_user_namespace_of_ones_own(function, *args) -> None:
    """``function(*args)`` as Apptainer without setuid (or rootless Podman) runs a container: in a
    user namespace that maps the user's own ids only, where the host's root's directories (``/``,
    ``/dev/shm``) show an owner it does not map (65534)."""
    import ctypes

    uid, gid, libc = os.getuid(), os.getgid(), ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x10000000) != 0:  # CLONE_NEWUSER
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER)")
    libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: a process that dropped root's ids may then write its own maps
    Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1\n")
    Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1\n")
    assert os.stat("/dev/shm").st_uid not in (0, uid), "the host's root is mapped here"
    function(*args)


def test_in_a_container_without_privileges_the_hosts_dev_shm_is_a_tier_as_on_the_host(disk_dir, shm_dir, other_user):
    """The fifteenth adversarial pass: in a user namespace that maps only the user's own ids
    (Apptainer's unprivileged mode, rootless Podman's ``--userns=keep-id``) the host's ``/dev/shm``
    and every directory above a tier show the overflow uid 65534, and Sea refused them as another
    user's: a run with its tier named failed in one line where MultiProc runs, one with its tiers
    found ran home-only. Such an owner is taken as root's (the host's system directories), and the
    run places its nodes on the tier, its results those of MultiProc in the same namespace."""
    uid, gid = other_user
    for path in (disk_dir, shm_dir):
        os.chown(path, uid, gid)
    for plugin in ("MultiProc", "SeaMultiProc"):
        _as_user(other_user, disk_dir, _in_a_user_namespace_of_ones_own, _run_modes_workflow, plugin, str(disk_dir / plugin), str(shm_dir))
    multiproc, sea = _modes(disk_dir / "MultiProc" / "modes"), _modes(disk_dir / "SeaMultiProc" / "modes")
    assert multiproc["second/private"] == multiproc["second"] == "0o700" and multiproc["shared.txt"]
    for rel in ("second", "second/private", "second/private/subject.txt", "last", "last/private", "shared.txt"):
        assert sea.get(rel) == multiproc.get(rel), (rel, sea.get(rel), multiproc.get(rel))
    report = RunReport.from_json(disk_dir / "SeaMultiProc" / "sea-report.json")
    assert report.success and report.tiers[0].nodes_placed == 4 and report.paths_recorded == "", report.to_text()
    assert sea_private_dirs(shm_dir) == []


def test_a_users_modes_and_files_beside_a_node_are_kept_as_multiproc_keeps_them(disk_dir, shm_dir, other_user):
    """Run by a user without privileges, nodes leave what the second adversarial pass found Sea
    mishandled, each of which MultiProc keeps: a directory only its owner may enter (it came home
    open to all), a read-only tree (left on the tier forever), a file written beside the node's
    own directory (lost). Under Sea the home holds
    the same, with the same modes, and nothing is left on the tier."""
    uid, gid = other_user
    for path in (disk_dir, shm_dir):
        os.chown(path, uid, gid)
    for plugin in ("MultiProc", "SeaMultiProc"):
        _as_user(other_user, disk_dir, _run_modes_workflow, plugin, str(disk_dir / plugin), str(shm_dir))
    multiproc, sea = _modes(disk_dir / "MultiProc" / "modes"), _modes(disk_dir / "SeaMultiProc" / "modes")
    assert multiproc["second/private"] == multiproc["second"] == "0o700" and multiproc["shared.txt"]
    for rel in ("second", "second/private", "second/private/subject.txt", "last", "last/private", "shared.txt"):
        assert sea.get(rel) == multiproc.get(rel), (rel, sea.get(rel), multiproc.get(rel))
    report = RunReport.from_json(disk_dir / "SeaMultiProc" / "sea-report.json")
    assert report.success and report.nodes_run == 4, report.to_text()
    assert sea_private_dirs(shm_dir) == []


BESIDE_TASK = """
        from pydra.compose import python, workflow
        from pydra.engine.submitter import Submitter

        @python.define
        def Beside(x):
            with open("../shared.txt", "{mode}") as f:  # beside its own directory
                f.write("{text}")
            return x
"""


def test_files_written_beside_a_node_at_its_tier_path_reach_the_home(disk_dir, shm_dir):
    """Where nodes run at their tier paths (namespaces refused, as in many containers; here
    ``logical_paths: false``), a node writing ``../shared.txt`` writes it beside its directory on
    the tier, and it went with the tier. Under MultiProc and ``cf`` it is in the home: under Sea too,
    at the run's end, said in the report; the node reading it in the run reads it as before."""
    done = run_script(BESIDE_TASK.format(mode="w", text="for the next node") + f"""
        @python.define
        def Then(x):
            return x + 1

        @workflow.define
        def Both(x):
            return workflow.add(Then(x=workflow.add(Beside(x=x)).out)).out

        sea = {{"tiers": [{{"path": {str(shm_dir)!r}}}], "logical_paths": False}}
        for worker, args in (("cf", {{}}), ("sea", {{"sea": sea}})):
            with Submitter(worker=worker, cache_root={str(disk_dir)!r} + "/" + worker, **args) as sub:
                assert sub(Both(x=1)).outputs.out == 2
        from nipype import Function, Node, Workflow
        from test_never_worse import _leaves_private_files, _reads_shared
        for plugin, args in (("MultiProc", {{}}), ("SeaMultiProc", {{"sea": sea}})):
            wf = Workflow(name="beside", base_dir={str(disk_dir)!r} + "/" + plugin)
            first = Node(Function(output_names=["out"], function=_leaves_private_files), name="first")
            second = Node(Function(input_names=["path"], output_names=["out"], function=_reads_shared), name="second")
            wf.connect(first, "out", second, "path")
            res = wf.run(plugin=plugin, plugin_args={{"n_procs": 2, **args}})
            assert [n.result.outputs.out for n in res.nodes() if n.name == "second"] == ["for the next node"]
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    for mine, theirs in (("sea", "cf"), ("SeaMultiProc/beside", "MultiProc/beside")):
        assert (disk_dir / mine / "shared.txt").read_text() == (disk_dir / theirs / "shared.txt").read_text() == "for the next node"
    for home, stray in (("sea", "shared.txt"), ("SeaMultiProc", "beside/shared.txt")):
        report = RunReport.from_json(disk_dir / home / "sea-report.json")
        assert report.strays_home == [stray] and "beside node directories" in report.to_text(), report.to_text()
    assert sea_private_dirs(shm_dir) == []
    # a file of that name already in the home (the node, at its tier path, did not see it): the
    # home's stays (the copy replaced it: an append lost the lines before it), and the report says so
    (disk_dir / "sea" / "shared.txt").write_text("the user's")
    done = run_script(BESIDE_TASK.format(mode="a", text="appended") + f"""
        @workflow.define
        def Once(x):
            return workflow.add(Beside(x=x)).out

        with Submitter(worker="sea", cache_root={str(disk_dir / "sea")!r}, sea={{"tiers": [{{"path": {str(shm_dir)!r}}}], "logical_paths": False}}) as sub:
            assert sub(Once(x=2)).outputs.out == 2
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (disk_dir / "sea" / "shared.txt").read_text() == "the user's"
    assert RunReport.from_json(disk_dir / "sea" / "sea-report.json").strays_left == ["shared.txt"]
    assert sea_private_dirs(shm_dir) == []


RULED_CHAIN = """
    import json, sys
    from nipype import Function, Node, Workflow
    from nipype.interfaces.io import DataSink

    def make():
        import os, time
        with open("data.txt", "w") as f:
            f.write("x" * 100000)
        time.sleep(0.8)
        return os.path.abspath("data.txt")

    def step(infile, tag):
        import os, time
        with open("out.txt", "w") as f:
            f.write(tag + open(infile).read()[:50])
        time.sleep(0.8)  # worth a checkpoint (more than sea.checkpoint.MIN_SPARED)
        return os.path.abspath("out.txt")

    plugin, base, tag, sea = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    wf = Workflow(name="wf", base_dir=base)
    a = Node(Function(output_names=["f"], function=make), name="a")
    b = Node(Function(input_names=["infile", "tag"], output_names=["f"], function=step), name="b")
    c = Node(Function(input_names=["infile", "tag"], output_names=["f"], function=step), name="c")
    b.inputs.tag, c.inputs.tag = "b", tag
    sink = Node(DataSink(base_directory=base + "/out"), name="sink")
    wf.connect([(a, b, [("f", "infile")]), (b, c, [("f", "infile")]), (c, sink, [("f", "res")])])
    wf.config["execution"]["poll_sleep_duration"] = 0.05
    wf.run(plugin=plugin, plugin_args={"n_procs": 2, **({"sea": sea} if plugin == "SeaMultiProc" else {})})
"""


@pytest.mark.parametrize("mode", ["remove", pytest.param("keep", marks=pytest.mark.slow)])  # keep: the same path, with --run-slow
def test_a_rule_dropping_a_file_a_consumer_reads_leaves_no_directory_taken_as_done(disk_dir, shm_dir, mode):
    """A rule removes (or keeps on the tier) the file node ``b`` hands to ``c``; ``auto`` keeps
    ``b``'s directory. Its copy home held the result but not the file: Nipype took ``b`` as done on
    the rerun after ``c`` changed, and ``c`` failed on that run and every later one. Now the
    directory is not kept without the file: the rerun recomputes ``b``, as MultiProc's rerun runs
    what it must, and its outputs are MultiProc's."""
    script = script_file(RULED_CHAIN)
    # on b's output, and (remove) on a's too: a's result, re-pickled in the view, named no output,
    # so a's directory went home without the file (the fourth adversarial pass)
    rules = [{"pattern": pattern, "mode": mode} for pattern in ("wf/b/out.txt", "wf/a/data.txt")[: 2 if mode == "remove" else 1]]
    sea = {"tiers": [{"path": str(shm_dir)}], "checkpoint_budget": "10MiB", "rules": rules}
    for tag in ("first", "changed"):
        done = subprocess.run([sys.executable, str(script), "SeaMultiProc", str(disk_dir / "sea"), tag, json.dumps(sea)], capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, (tag, done.stderr[-3000:])
    # what MultiProc's rerun writes (each node's function is pure: c's tag, then the start of b's file)
    assert (disk_dir / "sea" / "out" / "res" / "out.txt").read_text() == "changed" + ("b" + "x" * 100000)[:50]
    if mode == "keep":  # what the rule kept stays on the tier, said, until `sea recover` or a removal
        for kept in sea_private_dirs(shm_dir):
            shutil.rmtree(kept)
    assert sea_private_dirs(shm_dir) == []


def _appends_beside(x):
    with open("../log.txt", "a") as f:  # a log beside the nodes' directories, in the lab's group
        f.write(f"line {x}\n")
    return x


def _run_appending_workflow(plugin: str, base: str, tier: str) -> None:
    from nipype import Function, Node, Workflow

    wf = Workflow(name="lab", base_dir=base)
    first = Node(Function(input_names=["x"], output_names=["x"], function=_appends_beside), name="first")
    second = Node(Function(input_names=["x"], output_names=["x"], function=_appends_beside), name="second")
    first.inputs.x = 1
    wf.connect(first, "x", second, "x")
    wf.config["execution"]["poll_sleep_duration"] = 0.05
    wf.run(plugin=plugin, plugin_args={"n_procs": 2, **({"sea": {"tiers": [{"path": tier}]}} if plugin == "SeaMultiProc" else {})})


def test_a_work_directory_of_a_lab_group_runs_as_under_multiproc(disk_dir, shm_dir, other_user):
    """A work directory in a lab's setgid directory (a group of the user's other than their own):
    a user namespace maps their own group only, so a node changing a file there beside its
    directory failed with EOVERFLOW. The view is not used in such a home (said in one line, and in
    the report): nodes run at their tier paths, and the file is what MultiProc leaves."""
    made = subprocess.run(["groupadd", "--system", "sea-lab"], capture_output=True, text=True)
    assert made.returncode in (0, 9), made.stderr
    lab = __import__("grp").getgrnam("sea-lab").gr_gid
    uid, gid = other_user
    os.chown(shm_dir, uid, gid)
    os.chown(disk_dir, uid, lab)
    disk_dir.chmod(0o2775)
    for plugin in ("MultiProc", "SeaMultiProc"):
        _as_user(other_user, disk_dir, _run_appending_workflow, plugin, str(disk_dir / plugin), str(shm_dir), groups=(lab,))
    for plugin in ("MultiProc", "SeaMultiProc"):
        assert (disk_dir / plugin / "lab" / "log.txt").read_text() == "line 1\nline 1\n", plugin
    report = RunReport.from_json(disk_dir / "SeaMultiProc" / "sea-report.json")
    assert report.success and "belongs to group" in report.paths_recorded, report.to_text()
    assert sea_private_dirs(shm_dir) == []


def test_a_job_whose_checksum_another_node_has_does_not_hang(tmp_path, shm_dir):
    """Two nodes of a Pydra workflow make jobs with the same checksums (the same task, the same
    inputs): Pydra submits one and waits for the other's result in its cache. Under ``sea`` the
    first's directory stays on its tier (the checkpoint budget): the second finds its result there
    (Pydra's own ``test_wf_3nd_ndst_7``, which hung)."""
    done = run_script(f"""
        from pydra.compose import python, workflow
        from pydra.engine.submitter import Submitter

        @python.define
        def Add2(x): return x + 2

        @python.define
        def Multiply(x, y): return x * y

        @workflow.define
        def Worky(x):
            add2x = workflow.add(Add2().split("x", x=x), name="add2x")
            add2y = workflow.add(Add2().split("x", x=x), name="add2y")
            return workflow.add(Multiply(x=add2x.out, y=add2y.out).split(("_add2x", "_add2y"))).out

        with Submitter(worker="sea", cache_root={str(tmp_path / "cache")!r}, sea={{"tiers": [{{"path": {str(shm_dir)!r}}}]}}) as sub:
            result = sub(Worky(x=[1, 2]))
        assert not result.errored, result.errors
        print(result.outputs.out)
    """, timeout=90)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("[9, 16]")


def test_a_read_only_tree_and_an_unreadable_file_are_removed_and_copied_by_their_owner(disk_dir, shm_dir, other_user):
    """A node's read-only tree (a dataset's copy, 0555 directories) is removed from the tier by its
    owner (eviction left it there for good), and a file its owner made unreadable (0000) is copied
    home with its mode (the copy failed and the run with it), as a user without privileges."""
    from sea.private import PrivateDir
    from sea.stager import stage_copy

    uid, gid = other_user
    for path in (disk_dir, shm_dir):
        os.chown(path, uid, gid)

    def as_owner():
        private = PrivateDir.create(shm_dir, "test")
        tree = private.path / "wf" / "node" / "atlas" / "labels"
        tree.mkdir(parents=True)
        (tree / "l.txt").write_text("labels")
        for path, mode in ((tree / "l.txt", 0o444), (tree, 0o555), (tree.parent, 0o555)):
            os.chmod(path, mode)
        locked = private.path / "wf" / "node" / "locked.txt"
        locked.write_text("no one reads this")
        os.chmod(locked, 0)
        tmp, size, _ = stage_copy(locked, disk_dir / "locked.txt")
        os.replace(tmp, disk_dir / "locked.txt")
        assert size == 17 and stat.S_IMODE(os.lstat(disk_dir / "locked.txt").st_mode) == 0 and stat.S_IMODE(os.lstat(locked).st_mode) == 0
        private.remove(private.path / "wf" / "node")
        assert not (private.path / "wf" / "node").exists()
        private.remove_all()

    _as_user(other_user, disk_dir, as_owner)
    assert sea_private_dirs(shm_dir) == []


@pytest.mark.parametrize("checkpoints", ["auto", "all"])
def test_a_mapnode_sub_node_out_of_room_on_its_tier_reruns_on_the_next(disk_dir, tmpfs_factory, checkpoints):
    """Sub-nodes of a MapNode fill a 5 MiB tier (3 MiB each) and a sink delivers them: the one that
    runs out of room runs again on the next tier, as whole nodes do (the retry failed inside Sea's
    placement, and a sink retried at home wrote to its staging on the full tier again). The MapNode
    itself runs in the home; where it is a checkpoint (``all``; under ``auto`` when a loaded machine
    made recomputing it dear), its sub-node that ran on the tier comes home into its directory."""
    tier = tmpfs_factory("5M")
    done = run_script(f"""
        import os
        from nipype import Function, MapNode, Node, Workflow
        from nipype.interfaces.io import DataSink

        def big(i):
            import os, time
            os.makedirs("d")
            with open("d/big.bin", "wb") as f:
                for _ in range(3):
                    f.write(b"x" * 2**20)
                    f.flush()
                    time.sleep(0.05)
            return os.path.abspath("d")

        def count(d):
            import os
            return len(os.listdir(d))

        wf = Workflow(name="wf", base_dir={str(disk_dir / "work")!r})
        a = MapNode(Function(input_names=["i"], output_names=["d"], function=big), iterfield=["i"], name="a")
        a.inputs.i = [1, 2, 3]
        b = MapNode(Function(input_names=["d"], output_names=["c"], function=count), iterfield=["d"], name="b")
        sink = Node(DataSink(base_directory={str(disk_dir / "out")!r}), name="sink")
        wf.connect([(a, b, [("d", "d")]), (a, sink, [("d", "dirs")])])
        wf.config["execution"]["poll_sleep_duration"] = 0.05
        wf.run(plugin="SeaMultiProc", plugin_args={{"n_procs": 2, "sea": {{"tiers": [{{"path": {str(tier)!r}}}], "checkpoints": {checkpoints!r}}}}})
    """, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    delivered = sorted((disk_dir / "out" / "dirs").glob("*/d/big.bin"))
    assert len(delivered) == 3 and all(p.stat().st_size == 3 * 2**20 for p in delivered)
    if checkpoints == "all":  # the MapNode's directory stays in the home whole: the sub-node run on the tier came home into it
        subs = sorted((disk_dir / "work" / "wf" / "a" / "mapflow").glob("_a*"))
        assert len(subs) == 3 and all(not s.is_symlink() and (s / "d" / "big.bin").stat().st_size == 3 * 2**20 for s in subs), subs
    assert sea_private_dirs(tier) == [], done.stderr[-3000:]  # (the sub-node stayed on the tier, the home's link to it dangling once it went)


def test_a_report_path_naming_a_directory_or_seas_own_files_is_one_line(disk_dir, shm_dir):
    """``report:`` naming the workflow's directory ended the run in a traceback (and left
    ``wf.tmp``); naming ``.sea/journal.jsonl`` overwrote the journal: both are refused, before any
    node runs, in one line."""
    from sea import SeaEngine

    with pytest.raises(SeaConfigError, match=r"inside \.sea/"):
        SeaConfig.load({"report": ".sea/journal.jsonl"})
    (disk_dir / "work" / "wf").mkdir(parents=True)
    with pytest.raises(SeaConfigError, match="names a directory in the home"):
        SeaEngine(SeaConfig.load({"tiers": [{"path": str(shm_dir)}], "report": "wf"}), disk_dir / "work")
    assert sea_private_dirs(shm_dir) == [] and not (disk_dir / "work" / ".sea" / "run.lock").exists()


def test_a_node_that_removes_its_producers_file_runs_as_under_multiproc_and_leaves_nothing_mounted(disk_dir, shm_dir):
    """A node removes the file its producer handed it (outside its own directory: the overlay
    marks it removed in its upper layer), and later nodes of the same worker process write beside
    their own directories: all succeed, as under MultiProc, and their files are home (the failed
    copy of the mark left the first node's mounts in place, and the next nodes' files were lost)."""
    done = run_script(f"""
        from nipype import Function, Node, Workflow

        def make():
            import os
            os.makedirs("sub")
            with open("sub/a.txt", "w") as f:
                f.write("a")
            return os.path.abspath("sub/a.txt")

        def consume(path):
            import os
            os.remove(path)
            return path

        def beside(i, after):
            with open(f"../beside-{{i}}.txt", "w") as f:
                f.write(str(i))
            return i

        wf = Workflow(name="wf", base_dir={str(disk_dir / "work")!r})
        make_node = Node(Function(output_names=["path"], function=make), name="make")
        consume_node = Node(Function(input_names=["path"], output_names=["path"], function=consume), name="consume")
        wf.connect(make_node, "path", consume_node, "path")
        for i in range(3):
            node = Node(Function(input_names=["i", "after"], output_names=["i"], function=beside), name=f"beside{{i}}")
            node.inputs.i = i
            wf.connect(consume_node, "path", node, "after")
        wf.config["execution"]["poll_sleep_duration"] = 0.05
        wf.run(plugin="SeaMultiProc", plugin_args={{"n_procs": 1, "sea": {{"tiers": [{{"path": {str(shm_dir)!r}}}]}}}})
    """, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in (disk_dir / "work" / "wf").glob("beside-*.txt")) == ["beside-0.txt", "beside-1.txt", "beside-2.txt"]
    assert "could not all be kept" not in done.stderr
    assert str(disk_dir) not in Path("/proc/self/mountinfo").read_text()


def test_a_sea_directory_another_user_made_in_the_home_is_refused_in_one_line(disk_dir, shm_dir, other_user):
    """In a base_dir others may write (1777), another user makes ``.sea/`` (with a record of their
    own) before the victim's first run: Sea refused nothing and trusted it (the attack on the view
    read a planted file). Now it says whose it is, in one line, before any node runs."""
    from sea import SeaEngine

    home = disk_dir / "shared"
    home.mkdir(mode=0o1777)
    os.chmod(home, 0o1777)
    (home / ".sea").mkdir()
    os.chown(home / ".sea", *other_user)
    with pytest.raises(SeaError, match=rf"belongs to another user \(uid {other_user[0]}\)"):
        SeaEngine(SeaConfig.load({"tiers": [{"path": str(shm_dir)}]}), home)
    assert sea_private_dirs(shm_dir) == []


def _notes_beside(in_file):
    import os

    try:
        with open(os.path.join(os.path.dirname(in_file), "notes.txt"), "a") as f:  # a log beside its input
            f.write("the node ran\n")
    except PermissionError:
        return "refused"
    return "written"


def _run_notes_beside(plugin: str, base: str, tier: str, in_file: str) -> None:
    from nipype import Function, Node, Workflow

    wf = Workflow(name="readonly", base_dir=base)
    node = Node(Function(input_names=["in_file"], output_names=["out"], function=_notes_beside), name="notes")
    node.inputs.in_file = in_file
    wf.add_nodes([node])
    wf.config["execution"]["poll_sleep_duration"] = 0.05
    graph = wf.run(plugin=plugin, plugin_args={"n_procs": 1, **({"sea": {"tiers": [{"path": tier}], "prefetch": True}} if plugin == "SeaMultiProc" else {})})
    (ran,) = graph.nodes()
    Path(base, "answer.txt").write_text(ran.result.outputs.out)


def test_a_node_may_not_write_beside_a_prefetched_input_in_a_directory_its_user_may_not_write(disk_dir, shm_dir, other_user):
    """F4 of the adversarial passes: a user without privileges, an input in a data directory they
    may read but not write (root's, 0755). The input overlay would have let a node write a file
    beside it there (into its upper layer), which MultiProc refuses: such a directory is not
    overlaid, and the node is refused as under MultiProc, the directory unchanged."""
    uid, gid = other_user
    for path in (disk_dir, shm_dir):
        os.chown(path, uid, gid)
    data = disk_dir / "data"
    data.mkdir(mode=0o755)
    (data / "sub-01_bold.nii").write_bytes(b"\1" * 2**20)
    before = tree_files(data)
    for plugin in ("MultiProc", "SeaMultiProc"):
        base = disk_dir / plugin
        base.mkdir()
        os.chown(base, uid, gid)
        _as_user(other_user, disk_dir, _run_notes_beside, plugin, str(base), str(shm_dir), str(data / "sub-01_bold.nii"))
        assert (base / "answer.txt").read_text() == "refused", plugin
    assert tree_files(data) == before
    report = RunReport.from_json(disk_dir / "SeaMultiProc" / "sea-report.json")
    assert report.success and report.prefetch_hits == 1, report.to_text()
    assert sea_private_dirs(shm_dir) == []
