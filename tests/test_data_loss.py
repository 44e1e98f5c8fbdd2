"""What an unlucky user meets (issue 16's data-loss cases): names as long as a file name may be,
empty directories in a sink's outputs, copies kept after a failed flush. Each one against MultiProc
on the same workflow: Sea delivers the same tree, and never removes what it kept on purpose."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from nipype import Node, Workflow
from nipype.interfaces.io import DataSink

from sea.engine import JOURNAL
from sea.report import RunReport

from conftest import sea_private_dirs
from nipype_workflows import build_full, fn, make_subjects, run
from slowfs_fixtures import *  # noqa: F403 - the fixtures, which pytest finds by name


def write_named(length: int) -> str:
    """An output file whose name is ``length`` bytes long, in a directory with an empty subdirectory."""
    import os

    os.makedirs("result/empty/deeper")
    os.makedirs("result/full")
    name = ("x" * length)[: length - 4] + ".txt"
    with open(os.path.join("result", "full", name), "w") as f:
        f.write(name)
    return os.path.abspath("result")


def tree(root: Path) -> dict[str, bytes | None]:
    """Files with their bytes and directories (None): an empty directory counts."""
    found: dict[str, bytes | None] = {}
    for dirpath, dirs, files in os.walk(root):
        for d in dirs:
            found[str(Path(dirpath, d).relative_to(root)) + "/"] = None
        for f in files:
            found[str(Path(dirpath, f).relative_to(root))] = Path(dirpath, f).read_bytes()
    return found


def sink_workflow(base: Path, out: Path, length: int) -> Workflow:
    wf = Workflow(name="names", base_dir=str(base))
    make = fn("make", write_named, ["length"], ["out_dir"])
    make.inputs.length = length
    sink = Node(DataSink(base_directory=str(out)), name="sink")
    wf.connect(make, "out_dir", sink, "derivatives.@result")
    return wf


@pytest.mark.parametrize("length", [240, 255])
def test_long_names_and_empty_directories_reach_home_as_under_multiproc(disk_dir, shm_dir, length):
    run(sink_workflow(disk_dir / "mp-work", disk_dir / "mp-out", length), "MultiProc")
    expected = tree(disk_dir / "mp-out")
    assert any(k.endswith("empty/deeper/") for k in expected), "MultiProc's DataSink keeps empty directories"
    sea = {"tiers": [{"path": str(shm_dir)}]}
    for attempt in ("first run", "rerun"):
        run(sink_workflow(disk_dir / "work", disk_dir / "out", length), "SeaMultiProc", sea)
        assert tree(disk_dir / "out") == expected, attempt
    assert sea_private_dirs(shm_dir) == []


FAILING_RUN = """
import sys
sys.path.insert(0, {tests!r})
from nipype_workflows import build_full, make_subjects, run
from sea import SeaFlushError
try:
    run(build_full(Path({data!r}), {subjects!r}, Path({home!r}), Path({out!r})), "SeaMultiProc", {{"tiers": [{{"path": {tier!r}}}]}})
except SeaFlushError as error:
    print(error)
"""


def test_copies_kept_after_a_failed_flush_survive_later_runs_and_are_recovered(disk_dir, shm_dir, slowfs_factory):
    """The home refuses one output (ENOSPC: a quota). The run ends in SeaFlushError and keeps the
    tier's copy; a later Sea run on the same tier, of another workflow, in another process, leaves
    it alone; the report says where it is; once the quota is fixed, ``sea recover`` brings it home
    and the outputs are MultiProc's, byte for byte."""
    data = disk_dir / "data"
    subjects = make_subjects(data, n_subjects=2, mib=1)
    run(build_full(data, subjects, disk_dir / "mp-work", disk_dir / "mp-out"), "MultiProc")
    expected = tree(disk_dir / "mp-out")
    fs = slowfs_factory(fail_pattern="out/group/*group_mean.nii*", fail_errno="ENOSPC")
    home, out = fs.path / "work", fs.path / "out"
    script = FAILING_RUN.format(tests=str(Path(__file__).parent), data=str(data), subjects=subjects, home=str(home), out=str(out), tier=str(shm_dir))
    failed = subprocess.run([sys.executable, "-c", "from pathlib import Path\n" + script], capture_output=True, text=True, cwd=disk_dir)
    assert failed.returncode == 0 and "could not be committed home" in failed.stdout, failed.stderr[-3000:]
    assert f"sea recover {shm_dir}" in failed.stdout, failed.stdout
    kept = sea_private_dirs(shm_dir)
    assert len(kept) == 1 and list(kept[0].rglob("group_mean.nii")), "the tier's copy was not kept"

    # another workflow, another process (the failed one is dead): the kept copy stays
    later = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parents[1])!r}]\n"
         "from pathlib import Path\nfrom test_data_loss import sink_workflow\nfrom nipype_workflows import run\n"
         f"run(sink_workflow(Path({str(disk_dir / 'other')!r}), Path({str(disk_dir / 'other-out')!r}), 40), 'SeaMultiProc', {{'tiers': [{{'path': {str(shm_dir)!r}}}]}})"],
        capture_output=True, text=True, cwd=disk_dir,
    )
    assert later.returncode == 0, later.stderr[-3000:]
    assert "holds files an earlier run kept" in later.stderr + later.stdout
    assert sea_private_dirs(shm_dir) == kept and list(kept[0].rglob("group_mean.nii")), "a later run removed the kept copy"

    shown = subprocess.run([sys.executable, "-m", "sea.cli", "report", str(home)], capture_output=True, text=True)
    assert f"KEPT on a tier: {kept[0]}" in shown.stdout and f"sea recover {kept[0]}" in shown.stdout, shown.stdout
    assert tree(out) != expected

    still_full = subprocess.run([sys.executable, "-m", "sea.cli", "recover", str(shm_dir)], capture_output=True, text=True)
    assert still_full.returncode == 1 and still_full.stderr.count("\n") == 1 and "Traceback" not in still_full.stderr, still_full.stderr
    assert sea_private_dirs(shm_dir) == kept, "a recovery that failed removed the kept copy"

    fs.clear_faults()
    recovered = subprocess.run([sys.executable, "-m", "sea.cli", "recover", str(shm_dir)], capture_output=True, text=True)
    assert recovered.returncode == 0 and "removed" in recovered.stdout, recovered.stdout + recovered.stderr
    assert tree(out) == expected
    assert sea_private_dirs(shm_dir) == []


@pytest.mark.parametrize(
    "damage",
    [b'{"event": "started", "key": 5, "chain": "x"}\n', b'{"event": "done", "key": "study/x", "chain": "\xff\xfe"}\n', b"[1, 2]\n"],
    ids=["non-string key", "non-UTF-8 byte", "not a record"],
)
def test_a_damaged_journal_costs_at_most_recomputation(disk_dir, shm_dir, caplog, damage):
    """A journal is an optimisation: a damaged line is skipped with one warning naming it, the
    journal is rewritten without it, the rest still spares the rerun its work, and nothing is left
    on a tier."""
    data = disk_dir / "data"
    subjects = make_subjects(data, n_subjects=2, mib=1)
    sea = {"tiers": [{"path": str(shm_dir)}]}
    run(build_full(data, subjects, disk_dir / "work", disk_dir / "out"), "SeaMultiProc", sea)
    expected = tree(disk_dir / "out")
    journal = disk_dir / "work" / JOURNAL
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(b"".join(lines[:3]) + damage + b"".join(lines[3:]))
    run(build_full(data, subjects, disk_dir / "work", disk_dir / "out"), "SeaMultiProc", sea)
    assert "line(s) 4 damaged, skipped" in caplog.text, caplog.text[-2000:]
    report = RunReport.from_json(disk_dir / "work" / "sea-report.json")
    assert report.success and report.nodes_run < report.nodes_total / 2, report.to_text()
    assert tree(disk_dir / "out") == expected and sea_private_dirs(shm_dir) == []
    for line in journal.read_bytes().splitlines():
        assert isinstance(json.loads(line.decode("utf-8"))["key"], str)
