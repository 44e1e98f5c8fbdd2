"""Never worse than MultiProc, beside a node's directory: what nodes write, append to, remove,
rename or make beside their directories in the view (and at tier paths without one) reaches the
home as MultiProc leaves it. Split from test_never_worse.py so that xdist's file-at-a-time
scheduling can run the two halves at once."""

from __future__ import annotations

import json
import os
import stat
import subprocess

import pytest

from sea.report import RunReport

from conftest import sea_private_dirs


def _tidies_beside(x):
    import os
    import shutil
    import time

    os.remove("../stale.flag")
    os.rename("../todo.txt", "../done.txt")
    shutil.rmtree("../made")  # removed and made again: nothing of the old one is left
    os.mkdir("../made")
    with open("../made/new.txt", "w") as f:
        f.write("new")
    os.remove("../kept/old.txt")  # in a directory that stays
    shutil.rmtree("../thing")  # a directory that becomes a file
    with open("../thing", "w") as f:
        f.write("file")
    os.remove("../current")  # a link to a file outside the work directory, replaced by a file
    with open("../current", "w") as f:
        f.write("mine")
    os.remove("../flag")  # ... which another node makes again while this one still runs
    time.sleep(3)
    return x


def _flags_beside(x):
    import time

    time.sleep(1)  # after the other node removed it
    with open("../flag", "w") as f:
        f.write("theirs")
    return x


def test_what_a_node_removes_or_renames_beside_its_directory_is_removed_or_renamed(disk_dir, shm_dir):
    """In the view, a node removing or renaming files beside its directory (a flag, a to-do list,
    a directory it empties by removing it) did so in its overlay only: the home kept them, and
    both names of a renamed file. Then (the fourth adversarial pass): a removal inside a directory
    that stays was not done; a directory made a file put the file inside it; a link replaced by a
    file had the file's bytes written through it, outside the work directory; a file another node
    made again after this one removed it was removed. Now the home is as MultiProc leaves it."""
    from nipype import Function, Node, Workflow

    trees = {}
    for plugin in ("MultiProc", "SeaMultiProc"):
        wf_dir = disk_dir / plugin / "tidy"
        for directory in ("made", "kept", "thing"):
            (wf_dir / directory).mkdir(parents=True)
        victim = disk_dir / f"{plugin}-victim.txt"  # outside the work directory
        victim.write_text("untouched")
        (wf_dir / "current").symlink_to(victim)
        for name, text in (("stale.flag", "1"), ("todo.txt", "list"), ("made/old.txt", "old"), ("kept/old.txt", "old"),
                           ("kept/other.txt", "other"), ("thing/inside.txt", "in"), ("flag", "mine")):  # fmt: skip
            (wf_dir / name).write_text(text)
        wf = Workflow(name="tidy", base_dir=str(disk_dir / plugin))
        node = Node(Function(input_names=["x"], output_names=["x"], function=_tidies_beside), name="node")
        other = Node(Function(input_names=["x"], output_names=["x"], function=_flags_beside), name="other")
        node.inputs.x = other.inputs.x = 1
        wf.add_nodes([node, other])
        wf.config["execution"]["poll_sleep_duration"] = 0.05
        wf.run(plugin=plugin, plugin_args={"n_procs": 2, **({"sea": {"tiers": [{"path": str(shm_dir)}]}} if plugin == "SeaMultiProc" else {})})
        ours = ("stale.flag", "todo.txt", "done.txt", "made/old.txt", "made/new.txt", "kept/old.txt", "kept/other.txt", "thing", "current", "flag")
        trees[plugin] = {name: (wf_dir / name).read_text() for name in ours if (wf_dir / name).is_file()}
        trees[plugin].update(link=(wf_dir / "current").is_symlink(), victim=victim.read_text())
    assert trees["SeaMultiProc"] == trees["MultiProc"] == {
        "done.txt": "list", "made/new.txt": "new", "kept/other.txt": "other", "thing": "file", "current": "mine", "flag": "theirs",
        "link": False, "victim": "untouched",
    }, trees  # fmt: skip
    assert RunReport.from_json(disk_dir / "SeaMultiProc" / "sea-report.json").paths_recorded == ""


def _appends(x, data, before, after, target):
    import time

    time.sleep(before)
    with open(target, "ab") as f:  # a log the nodes beside it append to too
        f.write(data)
    time.sleep(after)
    return x


B_FIRST, C_HOME_FIRST = (0, 2), (2, 0)  # b appends first and ends last; c's bytes are home before b first writes


# by default one case of each kind (the order of the ends, a separator, a binary file a directory down);
# the others with --run-slow
SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    ("target", "b_times", "init", "b_data", "c_data", "expected"),
    [
        ("../log.txt", B_FIRST, b"line before\n", b"line from b\n", b"line from c\n", b"line before\nline from c\nline from b\n"),
        pytest.param("../log.txt", C_HOME_FIRST, b"line before\n", b"line from b\n", b"line from c\n", b"line before\nline from c\nline from b\n", marks=SLOW),
        pytest.param("../logs/log.txt", B_FIRST, b"line before\n", b"line from b\n", b"line from c\n", b"line before\nline from c\nline from b\n", marks=SLOW),
        pytest.param("../log.txt", B_FIRST, b"line before\n", b"done\n", b"done\n", b"line before\ndone\ndone\n", marks=SLOW),
        ("../log.txt", B_FIRST, b"header\nrow0", b"\nrow-b", b"\nrow-c", b"header\nrow0\nrow-c\nrow-b"),
        ("../logs/data.bin", B_FIRST, b"AB\nCD", b"EF", b"GH", b"AB\nCDGHEF"),
    ],
    ids=["appended-first-ended-last", "other-home-before-first-write", "in-a-directory-beside", "the-same-line", "separator-first",
         "binary-a-directory-down"],  # fmt: skip
)
def test_two_nodes_appending_to_one_file_beside_them_at_once_keep_every_byte(disk_dir, shm_dir, target, b_times, init, b_data, c_data, expected):
    """The fifth to seventh adversarial passes: two nodes running at once, each appending to a file
    beside their directories. In the view each appended to its own copy: the one that ended last
    replaced the other's bytes with its copy, silently; then merges guessed where each node's
    appends began, and added lines twice or dropped them (the same line by both, a separator
    written first, binary appends a directory down). Now each put of such a file notes its sizes
    before and after, and a node's appends start where its copy began, one of those sizes: every
    byte is kept once, as MultiProc's appends are (in the order the nodes ended)."""
    _two_nodes_appending(disk_dir, shm_dir, target, b_times, init, b_data, c_data, expected)


def test_two_nodes_appending_beside_them_among_hundreds_of_directories_keep_every_byte(disk_dir, shm_dir):
    """A workflow directory of more node directories than ``view.SIZES_AT_MOST`` (Pydra's cache, a
    big workflow, other subjects' nodes) is not listed for each node (its listing made a run's cost
    grow with the square of its jobs): the sizes its files had as a node started are not noted,
    and two nodes' appends to a file there are merged through the record each put leaves."""
    from sea.view import SIZES_AT_MOST

    _two_nodes_appending(disk_dir, shm_dir, "../log.txt", B_FIRST, b"line before\n", b"line from b\n", b"line from c\n",
                         b"line before\nline from c\nline from b\n", crowded=SIZES_AT_MOST + 1)  # fmt: skip


def test_a_node_lists_a_directory_of_hundreds_of_node_directories_beside_it_never(tmp_path, monkeypatch):
    """Each node noted the sizes of the files beside its directory, listing it again whenever it had
    changed: in a fan-out's flat directory (Pydra's cache), a new job directory each time, 18 ms a
    node at 20,000. A directory of more subdirectories than ``SIZES_AT_MOST`` is not listed."""
    from sea import view

    listed, scandir = [], os.scandir
    monkeypatch.setattr(os, "scandir", lambda path=".": listed.append(path) or scandir(path))
    for crowded in (view.SIZES_AT_MOST - 1, view.SIZES_AT_MOST + 1):
        directory = tmp_path / str(crowded)
        for n in range(crowded):
            (directory / f"node{n}").mkdir(parents=True)
        (directory / "log.txt").write_text("line before\n")
        listed.clear()
        sizes = view._sizes_beside(directory, directory / "node0")
        assert (sizes, len(listed)) == (({"../log.txt": 12}, 1) if crowded < view.SIZES_AT_MOST else ({}, 0)), crowded


def _two_nodes_appending(disk_dir, shm_dir, target, b_times, init, b_data, c_data, expected, crowded: int = 0) -> None:
    """Under MultiProc and SeaMultiProc (Sea's alone when ``crowded``: the bytes expected are
    MultiProc's, whose appends the cases above compare)."""
    from nipype import Function, Node, Workflow

    made = {}
    for plugin in ("MultiProc", "SeaMultiProc")[1 if crowded else 0 :]:
        (disk_dir / plugin / "wf" / "logs").mkdir(parents=True)
        for n in range(crowded):
            (disk_dir / plugin / "wf" / f"subject{n}").mkdir()
        (disk_dir / plugin / "wf" / target.removeprefix("../")).write_bytes(init)
        wf = Workflow(name="wf", base_dir=str(disk_dir / plugin))
        for name, data, (before, after) in (("b", b_data, b_times), ("c", c_data, (0.5, 0))):
            node = Node(Function(input_names=["x", "data", "before", "after", "target"], output_names=["x"], function=_appends), name=name)
            node.inputs.x, node.inputs.data, node.inputs.before, node.inputs.after, node.inputs.target = 1, data, before, after, target
            wf.add_nodes([node])
        wf.run(plugin=plugin, plugin_args={"n_procs": 2, **({"sea": {"tiers": [{"path": str(shm_dir)}]}} if plugin == "SeaMultiProc" else {})})
        made[plugin] = (disk_dir / plugin / "wf" / target.removeprefix("../")).read_bytes()
    assert crowded or sorted(made["MultiProc"]) == sorted(expected), made  # the same bytes (MultiProc's in the order written)
    assert made["SeaMultiProc"] == expected, made
    assert RunReport.from_json(disk_dir / "SeaMultiProc" / "sea-report.json").paths_recorded == ""


def _appends_to_a_colleagues_log(x):
    with open("../shared.log", "a") as f:
        f.write("from the node\n")
    return x


@pytest.mark.skipif(os.geteuid() != 0, reason="a file of another user's, beside the node: made as root")
def test_a_colleagues_file_a_node_appends_to_beside_it_stays_theirs(disk_dir, shm_dir):
    """The sixth adversarial pass: as root, a colleague's group-writable log beside the node
    directories that a node appended to came home owned by root. Now its owner and mode stay."""
    from nipype import Function, Node, Workflow

    seen = {}
    for plugin in ("MultiProc", "SeaMultiProc"):
        log = disk_dir / plugin / "wf" / "shared.log"
        log.parent.mkdir(parents=True)
        log.write_text("colleague\n")
        os.chown(log, 65534, 65534)
        os.chmod(log, 0o664)
        wf = Workflow(name="wf", base_dir=str(disk_dir / plugin))
        node = Node(Function(input_names=["x"], output_names=["x"], function=_appends_to_a_colleagues_log), name="node")
        node.inputs.x = 1
        wf.add_nodes([node])
        wf.run(plugin=plugin, plugin_args={"n_procs": 1, **({"sea": {"tiers": [{"path": str(shm_dir)}]}} if plugin == "SeaMultiProc" else {})})
        st = log.stat()
        seen[plugin] = (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode), log.read_text())
    assert seen["SeaMultiProc"] == seen["MultiProc"] == (65534, 65534, 0o664, "colleague\nfrom the node\n"), seen


def _reads_the_reference_beside(x):
    with open("../shared/ref.txt") as f:
        return f.read()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a filesystem inside the work directory: as root")
def test_a_filesystem_mounted_inside_the_work_directory_is_seen_by_nodes(disk_dir, shm_dir):
    """The sixth adversarial pass: a reference dataset bind-mounted inside the work directory
    (``wf/shared``) was hidden in a node's view (an overlay does not show what is mounted below its
    layers): the node failed where MultiProc's read it. Now the view binds it again."""
    from nipype import Function, Node, Workflow

    source = disk_dir / "reference"
    source.mkdir()
    (source / "ref.txt").write_text("reference")
    read = {}
    for plugin in ("MultiProc", "SeaMultiProc"):
        shared = disk_dir / plugin / "wf" / "shared"
        shared.mkdir(parents=True)
        subprocess.run(["mount", "--bind", "-o", "ro", str(source), str(shared)], check=True)
        try:
            wf = Workflow(name="wf", base_dir=str(disk_dir / plugin))
            node = Node(Function(input_names=["x"], output_names=["out"], function=_reads_the_reference_beside), name="node")
            node.inputs.x = 1
            wf.add_nodes([node])
            graph = wf.run(plugin=plugin, plugin_args={"n_procs": 1, **({"sea": {"tiers": [{"path": str(shm_dir)}]}} if plugin == "SeaMultiProc" else {})})
            read[plugin] = next(iter(graph.nodes())).result.outputs.out
        finally:
            subprocess.run(["umount", str(shared)], check=True)
    assert read == {"MultiProc": "reference", "SeaMultiProc": "reference"}
    assert RunReport.from_json(disk_dir / "SeaMultiProc" / "sea-report.json").paths_recorded == ""


def _links_and_an_empty_directory_beside(x):
    import os

    with open("../one.txt", "w") as f:
        f.write("one")
    os.link("../one.txt", "../two.txt")
    os.mkdir("../empty")
    return x


def test_at_tier_paths_what_a_node_makes_beside_its_directory_reaches_the_home_as_made(disk_dir, shm_dir):
    """The fifth adversarial pass: at tier paths (``logical_paths: false``, as where namespaces are
    refused), two names of one file written beside a node's directory reached the home as two files,
    and an empty directory not at all. Now as MultiProc leaves them."""
    from nipype import Function, Node, Workflow

    seen = {}
    for plugin in ("MultiProc", "SeaMultiProc"):
        wf = Workflow(name="wf", base_dir=str(disk_dir / plugin))
        node = Node(Function(input_names=["x"], output_names=["x"], function=_links_and_an_empty_directory_beside), name="node")
        node.inputs.x = 1
        wf.add_nodes([node])
        sea = {"tiers": [{"path": str(shm_dir)}], "logical_paths": False}
        wf.run(plugin=plugin, plugin_args={"n_procs": 1, **({"sea": sea} if plugin == "SeaMultiProc" else {})})
        one, two = (disk_dir / plugin / "wf" / name for name in ("one.txt", "two.txt"))
        seen[plugin] = (one.read_text(), os.path.samefile(one, two), (disk_dir / plugin / "wf" / "empty").is_dir())
    assert seen["SeaMultiProc"] == seen["MultiProc"] == ("one", True, True), seen
    report = RunReport.from_json(disk_dir / "SeaMultiProc" / "sea-report.json")
    assert sorted(report.strays_home) == ["wf/empty", "wf/one.txt", "wf/two.txt"], report.to_text()
    assert sea_private_dirs(shm_dir) == []


def _notes_beside_its_input(in_file):
    import os

    with open(os.path.join(os.path.dirname(in_file), "note.txt"), "w") as f:  # a QC node annotating its input
        f.write("qc ok")
    return in_file


def test_at_tier_paths_a_note_a_consumer_adds_to_its_producers_directory_is_kept(disk_dir, shm_dir):
    """The fifth adversarial pass: at tier paths with ``checkpoints: all`` (every node's directory
    home), a consumer writing into its producer's directory (a QC note beside its input) lost the
    note: the producer's copy home was made when it returned, and the rest was evicted, with a
    warning advising ``checkpoints: all``. Now the note is put in the producer's directory in the
    home, as MultiProc leaves it."""
    from nipype import Function, Node, Workflow

    notes = {}
    for plugin in ("MultiProc", "SeaMultiProc"):
        wf = Workflow(name="wf", base_dir=str(disk_dir / plugin))
        a = Node(Function(input_names=["n"], output_names=["f"], function=_makes_data), name="a")
        a.inputs.n = 1
        c = Node(Function(input_names=["in_file"], output_names=["f"], function=_notes_beside_its_input), name="c")
        wf.connect(a, "f", c, "in_file")
        sea = {"tiers": [{"path": str(shm_dir)}], "checkpoints": "all", "logical_paths": False}
        wf.run(plugin=plugin, plugin_args={"n_procs": 1, **({"sea": sea} if plugin == "SeaMultiProc" else {})})
        note = disk_dir / plugin / "wf" / "a" / "note.txt"
        notes[plugin] = note.read_text() if note.exists() else None
    assert notes == {"MultiProc": "qc ok", "SeaMultiProc": "qc ok"}
    assert sea_private_dirs(shm_dir) == []


def _records_where_it_ran(in_file):
    import os

    with open("b.txt", "w") as f:
        f.write(f"cwd={os.getcwd()} in={in_file}\n")  # as MRtrix3 and AFNI record their command line
    return os.path.abspath("b.txt")


def _makes_data(n):
    import os

    with open("data.txt", "w") as f:
        f.write(f"a{n}\n")
    return os.path.abspath("data.txt")


def test_a_node_placed_in_the_home_keeps_the_view_for_the_others(disk_dir, shm_dir, capfd):
    """The fifth adversarial pass: a node that no tier had room for (placed in the home) could not
    be shown its view (its directory was not made yet), and the view was then off for every later
    node of the run: their outputs recorded the tier's paths. And Nipype warned, for every node run
    in the view, that it could not remove its (bound) directory "Is it an NFS mount?"."""
    from nipype import Function, Node, Workflow
    from nipype.interfaces.io import DataSink

    recorded = {}
    for plugin, sea in (("MultiProc", None), ("SeaMultiProc", {"tiers": [{"path": str(shm_dir), "capacity": "20MiB"}], "default_node_size": "32MiB"})):
        base = disk_dir / "work"  # the same path each time: it is recorded
        wf = Workflow(name="wf", base_dir=str(base))
        a = Node(Function(input_names=["n"], output_names=["f"], function=_makes_data), name="a")
        a.inputs.n = 1
        b = Node(Function(input_names=["in_file"], output_names=["f"], function=_records_where_it_ran), name="b")
        sink = Node(DataSink(base_directory=str(disk_dir / f"out-{plugin}")), name="sink")
        wf.connect([(a, b, [("f", "in_file")]), (b, sink, [("f", "res")])])
        wf.run(plugin=plugin, plugin_args={"n_procs": 2, **({"sea": sea} if sea else {})})
        recorded[plugin] = (disk_dir / f"out-{plugin}" / "res" / "b.txt").read_text()
        base.rename(disk_dir / f"work-{plugin}")
    assert recorded["SeaMultiProc"] == recorded["MultiProc"] == f"cwd={disk_dir}/work/wf/b in={disk_dir}/work/wf/a/data.txt\n"
    report = RunReport.from_json(disk_dir / "work-SeaMultiProc" / "sea-report.json")
    assert report.success and report.paths_recorded == "", report.to_text()
    placed = {t["name"].split(":")[0]: t["nodes_placed"] for t in json.loads((disk_dir / "work-SeaMultiProc" / "sea-report.json").read_text())["tiers"]}
    assert placed["home"] >= 1 and placed["tier0"] >= 1, placed  # one in the home, one on the tier
    assert "Is it an NFS mount" not in capfd.readouterr().out


def _makes_odd_things_beside(x):
    import os

    os.mkfifo("../pipe")  # a named pipe: never opened by Sea, so it cannot hang (and was the end of the rest)
    with open("../sparse.bin", "wb") as f:
        f.truncate(64 * 2**20)  # a hole: no block
    with open("../one.txt", "w") as f:
        f.write("one")
    os.link("../one.txt", "../two.txt")  # two names, one file
    with open("../config.new", "w") as f:
        f.write("v2")
    os.replace("../config.new", "../config.txt")  # a new file under the old name: a snapshot's link to the old keeps it
    with open("../zz_after.txt", "w") as f:
        f.write("after")  # made after the pipe: the replay went no further than it
    return x


def test_what_a_node_makes_beside_its_directory_is_kept_as_what_it_is(disk_dir, shm_dir):
    """The fifth adversarial pass: in the view, the replay of what a node wrote beside its directory
    stopped at the first named pipe (everything after it lost), read devices, wrote sparse files
    dense, split hard links, wrote a replaced file's bytes into the old file (a snapshot hard-linked
    to it changed too: MultiProc's stays as it was), and copied the overlay's own attributes onto the
    home's entries. Now each entry is kept as MultiProc keeps it."""
    from nipype import Function, Node, Workflow

    seen = {}
    for plugin in ("MultiProc", "SeaMultiProc"):
        wf_dir = disk_dir / plugin / "odd"
        wf_dir.mkdir(parents=True)
        (wf_dir / "config.txt").write_text("v1")
        (disk_dir / plugin / "snapshot.txt").hardlink_to(wf_dir / "config.txt")  # as cp -al or rsync --link-dest leave
        wf = Workflow(name="odd", base_dir=str(disk_dir / plugin))
        node = Node(Function(input_names=["x"], output_names=["x"], function=_makes_odd_things_beside), name="node")
        node.inputs.x = 1
        wf.add_nodes([node])
        wf.run(plugin=plugin, plugin_args={"n_procs": 1, **({"sea": {"tiers": [{"path": str(shm_dir)}]}} if plugin == "SeaMultiProc" else {})})
        one, two = (wf_dir / "one.txt").stat(), (wf_dir / "two.txt").stat()
        xattrs = {name for entry in wf_dir.iterdir() for name in os.listxattr(entry, follow_symlinks=False) if "overlay" in name}
        seen[plugin] = {
            "pipe": stat.S_ISFIFO((wf_dir / "pipe").lstat().st_mode),
            "sparse blocks": (wf_dir / "sparse.bin").stat().st_blocks,
            "sparse size": (wf_dir / "sparse.bin").stat().st_size,
            "one file": (one.st_ino, one.st_nlink) == (two.st_ino, 2),
            "config": (wf_dir / "config.txt").read_text(),
            "snapshot": (disk_dir / plugin / "snapshot.txt").read_text(),
            "after": (wf_dir / "zz_after.txt").read_text(),
            "overlay xattrs": xattrs,
        }
    assert seen["SeaMultiProc"] == seen["MultiProc"] == {
        "pipe": True, "sparse blocks": 0, "sparse size": 64 * 2**20, "one file": True, "config": "v2", "snapshot": "v1",
        "after": "after", "overlay xattrs": set(),
    }, seen  # fmt: skip
    assert RunReport.from_json(disk_dir / "SeaMultiProc" / "sea-report.json").paths_recorded == ""
