"""Prefetch: input files on the shared filesystem copied to a tier ahead of their readers.

The core on real directories (which readers get copies, the budget, eviction after the last
reader); and Nipype's study workflow (a grabber per subject, its outputs read by a Function
node), whose readers read the copies: outputs byte-identical to MultiProc's, and a rerun with or
without prefetch finds the same cached work."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import threading
import time
from pathlib import Path

import pytest

from sea.config import PrefetchSpec, SeaConfig
from sea.prefetch import PREFETCH_DIR, Prefetcher
from sea.report import RunReport
from sea.tiers import StorageHierarchy

from conftest import sea_private_dirs, tree_files
from nipype_workflows import build_full, make_subjects, run
from slowfs_fixtures import slowfs_scratch


def _files(directory: Path, n: int, mib: int = 1) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        path = directory / f"sub-{i:02d}_bold.nii"
        path.write_bytes(bytes([i]) * (mib * 2**20))
        (directory / f"sub-{i:02d}_bold.json").write_text('{"RepetitionTime": 2}')  # a sidecar
        paths.append(path)
    return paths


def _prefetcher(tmp_path, shm_dir, **spec) -> tuple[Prefetcher, StorageHierarchy]:
    home = tmp_path / "home"
    home.mkdir()
    hierarchy = StorageHierarchy.build(SeaConfig.load({"tiers": [{"path": str(shm_dir)}]}), home)
    return Prefetcher(PrefetchSpec(enabled=True, **spec), hierarchy, order=sorted), hierarchy


def test_the_next_readers_get_copies_that_go_after_their_last_reader(tmp_path, shm_dir):
    prefetcher, hierarchy = _prefetcher(tmp_path, shm_dir, lookahead=2)
    sources = _files(tmp_path / "shared", 4)
    for i, source in enumerate(sources):
        prefetcher.expect(f"r{i}", [source])
    first = prefetcher.copies_for("r0")  # waits for r0's copy; r1 and r2 are now the next two
    copy = Path(first[str(sources[0])])
    assert copy.read_bytes() == sources[0].read_bytes() and copy.name == sources[0].name
    assert (copy.parent / "sub-00_bold.json").is_file(), "the sidecar was not copied with its image"
    assert copy.stat().st_mtime == sources[0].stat().st_mtime, "the copy lost the source's timestamp"
    assert hierarchy.fast_tiers[0].reserved >= 2**20, "the copies' room is not reserved on the tier"
    prefetcher.reader_done("r0")
    assert not copy.exists(), "the copy outlived its only reader"
    for reader in ("r1", "r2", "r3"):
        assert len(prefetcher.copies_for(reader)) == 1
        prefetcher.reader_done(reader)
    assert prefetcher.stats.files == 4 and prefetcher.stats.hits == 4 and prefetcher.stats.misses == 0
    prefetcher.close()
    assert hierarchy.fast_tiers[0].reserved == 0
    assert not any((hierarchy.fast_tiers[0].workdir / PREFETCH_DIR).rglob("*.nii"))
    hierarchy.close()
    assert sea_private_dirs(shm_dir) == []


def test_copies_are_written_in_the_directory_sea_made_even_once_its_name_was_swapped_for_a_link(tmp_path, shm_dir):
    """A tier in a directory another user may change (a sticky one, trusted in a user namespace:
    docs/containers.md): that user renames Sea's directory there and puts a link to a directory of
    theirs in its place. The copies of the user's inputs went through the link, where that user reads
    them (the sixteenth adversarial pass); they go to the directory Sea made and holds open."""
    prefetcher, hierarchy = _prefetcher(tmp_path, shm_dir, lookahead=1)
    source = _files(tmp_path / "shared", 1)[0]
    workdir = hierarchy.fast_tiers[0].workdir
    theirs, moved = tmp_path / "theirs", workdir.with_name(workdir.name + "-moved")
    theirs.mkdir()
    os.rename(workdir, moved)
    os.symlink(theirs, workdir)
    try:
        prefetcher.expect("r0", [source])
        deadline = time.monotonic() + 30
        while not prefetcher.copied("r0"):
            assert time.monotonic() < deadline, "the copy never ended"
            time.sleep(0.01)
        assert tree_files(theirs) == {}, "a copy of the user's input went through the swapped link"
        copies = list((moved / PREFETCH_DIR).rglob(source.name))
        assert len(copies) == 1 and copies[0].read_bytes() == source.read_bytes()
    finally:
        os.unlink(workdir)
        os.rename(moved, workdir)
    prefetcher.close()
    hierarchy.close()
    assert sea_private_dirs(shm_dir) == []


def test_readers_whose_order_the_adapter_gives_are_copied_for_in_that_order(tmp_path, shm_dir):
    """A Dask worker runs the nodes sent to it in the order they were sent, which need not be the
    engine's: its prefetch copies for the next ones in that order (here the reverse of the engine's)."""
    home = tmp_path / "home"
    home.mkdir()
    hierarchy = StorageHierarchy.build(SeaConfig.load({"tiers": [{"path": str(shm_dir)}]}), home)
    prefetcher = Prefetcher(PrefetchSpec(enabled=True, lookahead=1), hierarchy, order=sorted, threads=1)
    sources = _files(tmp_path / "shared", 3)
    for position, (reader, source) in enumerate(zip(("c", "b", "a"), reversed(sources), strict=True)):
        prefetcher.expect(reader, [source], position)
    prefetcher._pool.submit(lambda: None).result()  # one thread: the copy submitted before this one ended
    copied = [p.name for p in (hierarchy.fast_tiers[0].workdir / PREFETCH_DIR).rglob("*.nii")]
    assert copied == [sources[2].name], f"the first reader in the engine's order was copied for: {copied}"
    for reader in ("c", "b", "a"):
        assert len(prefetcher.copies_for(reader)) == 1, reader
        prefetcher.reader_done(reader)
    prefetcher.close()
    hierarchy.close()


def test_a_copy_leaves_the_next_nodes_room_on_the_tier(tmp_path, shm_dir):
    """Seen on the busy benchmark with one 144 MiB tier: prefetch's copies took the room the next
    node's directory needed, and it spilled to the home (1.27x the big tiers' makespan; 1.17x
    once copies leave that room). A copy takes only the room beyond the next node's (``headroom``)."""
    home = tmp_path / "home"
    home.mkdir()
    hierarchy = StorageHierarchy.build(SeaConfig.load({"tiers": [{"path": str(shm_dir), "capacity": "4MiB"}]}), home)
    sources = _files(tmp_path / "shared", 2)
    for headroom, copied in ((3 * 2**20 + 1, 0), (2 * 2**20, 1)):  # a 1 MiB image (and its sidecar) on a 4 MiB tier
        prefetcher = Prefetcher(PrefetchSpec(enabled=True, budget="100%"), hierarchy, order=sorted, headroom=lambda h=headroom: h)
        prefetcher.expect("r", [sources[copied]])
        assert len(prefetcher.copies_for("r")) == copied, f"headroom {headroom}: the copy took the next node's room"
        prefetcher.reader_done("r")
        prefetcher.close()
    hierarchy.close()


def test_a_file_read_by_two_nodes_stays_until_both_finished(tmp_path, shm_dir):
    prefetcher, hierarchy = _prefetcher(tmp_path, shm_dir)
    (source,) = _files(tmp_path / "shared", 1)
    prefetcher.expect("a", [source])
    prefetcher.expect("b", [source])
    copy = Path(prefetcher.copies_for("a")[str(source)])
    prefetcher.reader_done("a")
    assert copy.exists()
    assert prefetcher.copies_for("b") == {str(source): str(copy)}
    prefetcher.reader_done("b")
    assert not copy.exists()
    prefetcher.close()
    hierarchy.close()


def test_the_budget_bounds_the_copies_and_a_reader_without_one_reads_the_original(tmp_path, shm_dir):
    prefetcher, hierarchy = _prefetcher(tmp_path, shm_dir, budget="3MiB", lookahead=10)
    sources = _files(tmp_path / "shared", 5, mib=1)
    for i, source in enumerate(sources):
        prefetcher.expect(f"r{i}", [source])
    prefetcher._pool.submit(lambda: None).result()  # let the copies start
    held = sum(p.stat().st_size for p in (hierarchy.fast_tiers[0].workdir / PREFETCH_DIR).rglob("*.nii"))
    assert held <= 3 * 2**20, "more than the budget was copied ahead"
    assert prefetcher.copies_for("r4") == {}, "a reader beyond the budget got a copy"  # not started: dropped
    for i in range(4):
        prefetcher.copies_for(f"r{i}")
        prefetcher.reader_done(f"r{i}")
    prefetcher.reader_done("r4")
    assert prefetcher.stats.misses >= 1
    prefetcher.close()
    assert hierarchy.fast_tiers[0].reserved == 0
    hierarchy.close()


def test_a_reader_waits_while_copies_are_under_way_and_a_copy_ending_wakes_the_engine(tmp_path, shm_dir):
    """The adapter's loop does not wait inside ``copies_for``: a reader whose input has no copy yet
    waits to be started while copies are under way (its own, or one ahead of it: started now, it
    would read the shared filesystem beside them), and each copy's end calls ``on_copied`` (the
    engine's wake-up). With no copy under way, a reader without a copy starts and reads the original."""
    woken = threading.Event()
    with slowfs_scratch(write_mbps=200, read_mbps=8, meta_latency_ms=0) as fs:  # a 4 MiB copy: 0.5 s
        home = tmp_path / "home"
        home.mkdir()
        hierarchy = StorageHierarchy.build(SeaConfig.load({"tiers": [{"path": str(shm_dir)}]}), home)
        prefetcher = Prefetcher(PrefetchSpec(enabled=True, lookahead=1), hierarchy, order=sorted, on_copied=woken.set)
        sources = _files(fs.path / "shared", 2, mib=4)
        prefetcher.expect("r0", [sources[0]])  # its copy starts
        prefetcher.expect("r1", [sources[1]])  # beyond the lookahead: no copy yet
        assert prefetcher.pending("r0") and prefetcher.pending("r1")
        assert woken.wait(30), "the copy's end did not wake the engine"
        assert not prefetcher.pending("r0") and not prefetcher.pending("r1")  # nothing under way: r1 would read the original
        assert len(prefetcher.copies_for("r0")) == 1  # r0 starts: r1's copy starts
        assert prefetcher.pending("r1")
        prefetcher.reader_done("r0")
        prefetcher.close()
        hierarchy.close()


def test_auto_stops_where_the_shared_filesystem_reads_as_fast_as_the_tier_and_goes_on_where_it_is_slow(tmp_path, shm_dir, disk_dir):
    """``enabled: auto`` times its first copy against copying it again within the tier. The local
    disk (its page cache) reads about as fast as /dev/shm: prefetch stops, the copies not started are
    dropped and their readers read the originals. A filesystem read at 20 MB/s: it goes on."""
    from sea.prefetch import PAYS_FROM

    home = tmp_path / "home"
    home.mkdir()
    hierarchy = StorageHierarchy.build(SeaConfig.load({"tiers": [{"path": str(shm_dir)}]}), home)
    fast = Prefetcher(PrefetchSpec(enabled="auto", lookahead=4), hierarchy, order=sorted)
    sources = _files(disk_dir / "shared", 8, mib=4)
    for i, source in enumerate(sources):
        fast.expect(f"r{i}", [source])
    fast.copies_for("r0")  # its copy ended, measured (or another was, first)
    assert fast.stats.slowdown is not None and fast.stats.slowdown < PAYS_FROM and fast.stats.stopped, fast.stats
    assert not fast.pending("r7"), "a reader waits for copies that will not be made"
    assert fast.copies_for("r7") == {}, "prefetch went on after it stopped"
    assert fast.stats.misses == 0, "an original read because prefetch stopped is counted as a copy missed"
    assert fast.stats.files <= 4, "more copies were made than the first lookahead's"
    fast.close()
    assert hierarchy.fast_tiers[0].reserved == 0, "the dropped copies kept their room"

    with slowfs_scratch(read_mbps=20) as fs:
        sources = _files(fs.path / "shared", 3, mib=2)
        slow = Prefetcher(PrefetchSpec(enabled="auto", lookahead=3), hierarchy, order=sorted)
        for i, source in enumerate(sources):
            slow.expect(f"r{i}", [source])
        for i in range(3):
            assert len(slow.copies_for(f"r{i}")) == 1, f"r{i} got no copy where the shared filesystem is slow"
            slow.reader_done(f"r{i}")
        assert slow.stats.slowdown >= PAYS_FROM and not slow.stats.stopped, slow.stats
        slow.close()


def test_auto_is_the_default_and_reads_small_files_where_they_are_until_prefetch_proved_it_pays(tmp_path, shm_dir):
    """A workflow of small inputs runs as without prefetch: under ``auto`` nothing under 1 MiB is
    copied (nor does its reader wait for copies) until a larger file's copy proved the shared
    filesystem slow; after that small files are copied too. ``enabled: true`` copies them at once."""
    from sea.prefetch import MEASURED_BYTES

    assert SeaConfig.load({}).prefetch == PrefetchSpec() and PrefetchSpec().enabled == "auto"
    home = tmp_path / "home"
    home.mkdir()
    hierarchy = StorageHierarchy.build(SeaConfig.load({"tiers": [{"path": str(shm_dir)}]}), home)
    with slowfs_scratch(read_mbps=20) as fs:
        shared = fs.path / "shared"
        shared.mkdir()
        small = []
        for i in range(4):
            small.append(shared / f"small{i}.bin")
            small[-1].write_bytes(bytes([i]) * (MEASURED_BYTES // 4))
        big = shared / "big.bin"
        big.write_bytes(b"b" * 2 * MEASURED_BYTES)

        auto = Prefetcher(PrefetchSpec(), hierarchy, order=sorted)
        auto.expect("a0", [small[0]])
        auto.expect("a1", [small[1]])
        assert not auto.pending("a0") and auto.copies_for("a0") == {}, "a small file was copied before prefetch proved it pays"
        auto.expect("b", [big])
        assert list(auto.copies_for("b")) == [str(big)]  # measured: a 20 MB/s read pays
        assert auto.stats.slowdown is not None and not auto.stats.stopped, auto.stats
        auto.expect("c", [small[2]])
        assert list(auto.copies_for("c")) == [str(small[2])], "a small file was not copied once prefetch proved it pays"
        assert auto.stats.misses == 0, "a small file left where it is counted as a copy missed"
        auto.close()

        on = Prefetcher(PrefetchSpec(enabled=True), hierarchy, order=sorted)
        on.expect("d", [small[3]])
        assert list(on.copies_for("d")) == [str(small[3])]
        on.close()
    assert hierarchy.fast_tiers[0].reserved == 0


def test_the_report_says_when_auto_could_not_measure(tmp_path):
    from sea.report import RunReport

    text = RunReport(prefetch_misses=2, prefetch_stopped=True, prefetch_slowdown=None).to_text()
    assert "stopped (auto): the shared filesystem could not be measured" in text
    assert "a copy took 0.8x" in RunReport(prefetch_misses=2, prefetch_stopped=True, prefetch_slowdown=0.8).to_text()
    assert "stopped (auto): a copy took 1.1x" in RunReport(prefetch_stopped=True, prefetch_slowdown=1.1).to_text(), "a stop that missed nothing is not said"


def _hash_files(home: Path) -> list[str]:
    """The hash files of the grabbers and of the nodes reading the raw data. (Downstream nodes'
    hashes name their producers' directories on the tier, whose names differ from run to run,
    with or without prefetch: Sea's journal, not Nipype's hash, resumes those.)"""
    return sorted(str(p.relative_to(home)) for name in ("select", "smooth") for p in home.rglob(f"{name}/_0x*.json"))


def _read_by_smooth(home: Path) -> list[str]:
    from nipype.pipeline.engine.utils import loadpkl

    return sorted(str(loadpkl(p).inputs["in_file"]) for p in home.rglob("result_smooth.pklz"))


def test_nipype_readers_read_the_copies_with_identical_outputs_and_the_same_hashes(tmp_path, shm_dir, disk_dir):
    """keep_intermediates brings every node's directory home, with its hash file and the inputs it ran with."""
    shared = disk_dir / "shared"
    subjects = make_subjects(shared, n_subjects=3, mib=1)
    run(build_full(shared, subjects, tmp_path / "ref", tmp_path / "ref-out"), "MultiProc")
    sea = {"tiers": [{"path": str(shm_dir)}], "keep_intermediates": True}
    with_prefetch = tmp_path / "home"
    run(build_full(shared, subjects, with_prefetch, tmp_path / "out"), "SeaMultiProc", sea={**sea, "prefetch": {"enabled": True}})
    assert tree_files(tmp_path / "out") == tree_files(tmp_path / "ref-out")
    report = RunReport.from_json(with_prefetch / "sea-report.json")
    print(report.to_text())
    assert report.prefetch_files == 3, report.to_text()  # each subject's image, found through its grabber
    assert report.prefetch_hits == 3 and report.prefetch_misses == 0, report.to_text()
    # each reader read its copy through the original's path (the copy is bound over it in the
    # node's view, sea.view): it records the path MultiProc would, and the run counted the hits
    assert _read_by_smooth(with_prefetch) == sorted(str(shared / f"sub-{s}_bold.nii.gz") for s in subjects)
    assert sea_private_dirs(shm_dir) == [], "a copy was left on the tier"

    hashes = _hash_files(with_prefetch)
    shutil.move(with_prefetch, tmp_path / "home-prefetched")  # the same home path, without prefetch
    run(build_full(shared, subjects, with_prefetch, tmp_path / "out-without"), "SeaMultiProc", sea=sea)
    assert tree_files(tmp_path / "out-without") == tree_files(tmp_path / "ref-out")
    assert _read_by_smooth(with_prefetch) == sorted(str(shared / f"sub-{s}_bold.nii.gz") for s in subjects)
    assert len(hashes) == 6 and _hash_files(with_prefetch) == hashes, "prefetch changed a reader's hash"

    for prefetch in (False, True):  # a rerun, with or without prefetch, finds the work done
        run(build_full(shared, subjects, with_prefetch, tmp_path / "out-without"), "SeaMultiProc", sea={**sea, "prefetch": prefetch})
        again = RunReport.from_json(with_prefetch / "sea-report.json")
        assert again.nodes_run == 0, f"prefetch {prefetch}: the rerun executed {again.nodes_run} nodes"
    assert all(os.path.isfile(shared / f"sub-{s}_bold.nii.gz") for s in subjects)


def _pair(first, second):
    return (first, second)


def _sizes(files):
    import os

    return [os.path.getsize(f) for f in files]


def test_a_node_handing_on_the_paths_it_read_hands_on_the_originals(tmp_path, shm_dir, disk_dir):
    """Seen with MRtrix's gradient table: a node that read prefetched copies and returns their
    paths must hand its consumers the originals, which outlive the copies."""
    from nipype import Function, Node, Workflow

    shared = _files(disk_dir / "shared", 2)
    wf = Workflow(name="handing_on", base_dir=str(tmp_path / "home"))
    pair = Node(Function(input_names=["first", "second"], output_names=["files"], function=_pair), name="pair")
    pair.inputs.first, pair.inputs.second = str(shared[0]), str(shared[1])
    sizes = Node(Function(input_names=["files"], output_names=["sizes"], function=_sizes), name="sizes")
    wf.connect(pair, "files", sizes, "files")
    wf.config["execution"]["poll_sleep_duration"] = 0.05
    graph = wf.run(plugin="SeaMultiProc", plugin_args={"n_procs": 2, "sea": {"tiers": [{"path": str(shm_dir)}], "prefetch": True, "keep_intermediates": True}})
    # pair read the copies; sizes, handed the originals, is a reader of them too and read the copies
    assert RunReport.from_json(tmp_path / "home" / "sea-report.json").prefetch_hits == 4
    from nipype.pipeline.engine.utils import loadpkl

    (result,) = (tmp_path / "home").rglob("result_pair.pklz")
    assert list(loadpkl(result).outputs.files) == [str(p) for p in shared], "the copies' paths were handed on"
    assert graph is not None


def test_a_shared_filesystem_mounted_below_a_tier_is_read_ahead_and_the_tiers_own_is_not(shm_dir, disk_dir):
    """Found by the benchmark, whose shared filesystem is mounted under /var/tmp, a tier: a file is
    on a tier when it is on the tier's filesystem, not when its path is under the tier's."""
    from sea.engine import SeaEngine

    from conftest import mounted_tmpfs

    (local,) = _files(disk_dir / "local", 1)  # on the tier's own disk: already node-local
    with mounted_tmpfs("8M", parent=str(disk_dir)) as mount:
        (shared,) = _files(mount / "shared", 1)
        engine = SeaEngine(SeaConfig.load({"tiers": [{"path": str(disk_dir)}], "prefetch": True}), shm_dir)  # a home off the tier's disk
        engine.expect_reads("reader", [str(shared), str(local)])
        copies = engine.prefetched("reader")
        assert list(copies) == [str(shared)] and Path(copies[str(shared)]).read_bytes() == shared.read_bytes()
        engine.close()
        assert sorted(p.name for p in disk_dir.iterdir()) == sorted(["local", mount.name]), "a copy or Sea's directory was left"


def test_what_a_reader_changes_in_its_copy_is_put_at_the_original(tmp_path, shm_dir):
    """Without prefetch a node that changes its input in place changes the original: a reader that
    appended to its copy, and wrote a file beside it, leaves both at the original's place once it
    finished (the original's inode kept), and what it did not change is not written again."""
    prefetcher, hierarchy = _prefetcher(tmp_path, shm_dir, lookahead=1)
    (source,) = _files(tmp_path / "shared", 1)
    sidecar = source.with_suffix(".json")
    inode, sidecar_ctime = source.stat().st_ino, sidecar.stat().st_ctime_ns
    prefetcher.expect("wf/a", [source])
    prefetcher.advance()
    copy = Path(prefetcher.copies_for("wf/a")[str(source)])
    with open(copy, "ab") as f:
        f.write(b"appended in place")
    (copy.parent / "note.txt").write_text("written beside its input")
    prefetcher.reader_done("wf/a")
    prefetcher.close()
    assert source.read_bytes() == bytes([0]) * 2**20 + b"appended in place" and source.stat().st_ino == inode
    assert (source.parent / "note.txt").read_text() == "written beside its input"
    assert sidecar.stat().st_ctime_ns == sidecar_ctime, "the sidecar, unchanged, was written again"
    assert prefetcher.stats.written_back == 2
    assert not list((shm_dir).rglob("*.nii")), "the copy was left on the tier"


def _append_to(in_file):
    with open(in_file, "ab") as f:
        f.write(b"appended by the node")
    return in_file


def _read_size(in_file):
    import os

    return os.path.getsize(in_file)


def _changing_its_input(
    tmp_path, shm_dir, disk_dir, change, beside_the_home: bool = False, beside: tuple[str, ...] = (), tier_beside: bool = False, other_fs_beside: bool = False
) -> dict:
    """Per plugin, MultiProc then SeaMultiProc with prefetch: a node that ``change`` s its input file
    (a function of it), then a node reading its size; (that size, the input's bytes, the names in
    its directory). ``beside``: directories beside the input before the run, a file in each;
    ``tier_beside``: Sea's tier a tmpfs mounted beside the input (for the run only);
    ``other_fs_beside``: a tmpfs of nobody's mounted beside the input (for the run only, not seen)."""
    from nipype import Function, Node, Workflow

    from conftest import mounted_tmpfs

    seen = {}
    for plugin in ("MultiProc", "SeaMultiProc"):
        (source,) = _files(disk_dir / plugin, 1)
        for name in beside:
            (source.parent / name).mkdir()
            (source.parent / name / "kept.txt").write_text(f"in {name} before the run")
        home = tmp_path / plugin if not beside_the_home else disk_dir / plugin / "work"
        wf = Workflow(name="changing", base_dir=str(home))
        changing = Node(Function(input_names=["in_file"], output_names=["out_file"], function=change), name="change")
        changing.inputs.in_file = str(source)
        size = Node(Function(input_names=["in_file"], output_names=["size"], function=_read_size), name="size")
        wf.connect(changing, "out_file", size, "in_file")
        wf.config["execution"]["poll_sleep_duration"] = 0.05
        with contextlib.ExitStack() as stack:
            tier = stack.enter_context(mounted_tmpfs("64M", parent=str(source.parent))) if tier_beside else shm_dir
            if other_fs_beside:
                (stack.enter_context(mounted_tmpfs("1M", parent=str(source.parent))) / "theirs.txt").write_text("another filesystem's")
            sea = {"tiers": [{"path": str(tier)}], "prefetch": True}
            graph = wf.run(plugin=plugin, plugin_args={"n_procs": 2, **({"sea": sea} if plugin == "SeaMultiProc" else {})})
        (node,) = [n for n in graph.nodes() if n.name == "size"]
        inputs = {k: v for k, v in tree_files(source.parent).items() if not k.startswith("work/")}
        seen[plugin] = (node.result.outputs.size, source.read_bytes(), sorted(p.name for p in source.parent.iterdir() if p.name != "work"), inputs)
    return seen


def test_a_node_changing_its_input_in_place_changes_the_original_as_under_multiproc(tmp_path, shm_dir, disk_dir):
    seen = _changing_its_input(tmp_path, shm_dir, disk_dir, _append_to)
    assert seen["SeaMultiProc"] == seen["MultiProc"]
    assert seen["MultiProc"][1].endswith(b"appended by the node")
    assert RunReport.from_json(tmp_path / "SeaMultiProc" / "sea-report.json").prefetch_hits >= 1


def _one_copy(tmp_path, shm_dir, mib: int = 1, other_name: str | None = None):
    prefetcher, hierarchy = _prefetcher(tmp_path, shm_dir, lookahead=1)
    (source,) = _files(tmp_path / "shared", 1, mib)
    if other_name is not None:
        os.link(source, source.with_name(other_name))
    prefetcher.expect("wf/a", [source])
    prefetcher.advance()
    return prefetcher, source


def test_a_reader_rewriting_its_copy_replaces_the_original_whole_never_truncating_it(tmp_path, shm_dir):
    """A copy rewritten (not appended to) goes to the original's place as a new file renamed over
    it, so that a kill leaves the old file or the new one; appended bytes are appended, the original's
    inode kept (a kill mid-way leaves its old bytes and part of the new, as the node's own write would)."""
    prefetcher, source = _one_copy(tmp_path, shm_dir)
    inode = source.stat().st_ino
    copy = Path(prefetcher.copies_for("wf/a")[str(source)])
    copy.write_bytes(b"rewritten")
    prefetcher.reader_done("wf/a")
    prefetcher.close()
    assert source.read_bytes() == b"rewritten"
    assert source.stat().st_ino != inode, "the original was truncated and rewritten in place: a kill then leaves it empty"


def test_a_write_back_goes_only_to_the_file_that_was_copied(tmp_path, shm_dir):
    """Another user who can write in the input's directory swaps the input for a link to a file of
    the run's user while a node changes its copy: nothing is written through the link, and it is said."""
    prefetcher, source = _one_copy(tmp_path, shm_dir)
    copy = Path(prefetcher.copies_for("wf/a")[str(source)])
    victim = tmp_path / "secret"
    victim.write_text("the run's user's own file")
    victim.chmod(0o600)
    source.unlink()
    source.symlink_to(victim)
    with open(copy, "ab") as f:
        f.write(b"appended by the node")
    prefetcher.reader_done("wf/a")
    prefetcher.close()
    assert victim.read_text() == "the run's user's own file" and oct(victim.stat().st_mode & 0o777) == "0o600"
    assert source.is_symlink() and prefetcher.stats.written_back == 0


def test_a_copy_whose_original_changed_since_is_not_handed_out(tmp_path, shm_dir):
    """A node that ran meanwhile changed the original through another path: the reader reads the
    original, as without prefetch (it read the copy as it was before that node ran)."""
    prefetcher, source = _one_copy(tmp_path, shm_dir)
    deadline = __import__("time").monotonic() + 30
    while prefetcher.pending("wf/a") and __import__("time").monotonic() < deadline:
        __import__("time").sleep(0.01)
    with open(tmp_path / "shared" / ".." / "shared" / source.name, "ab") as f:
        f.write(b"appended by an earlier node")
    assert prefetcher.copies_for("wf/a") == {}
    prefetcher.reader_done("wf/a")
    prefetcher.close()
    assert source.read_bytes().endswith(b"appended by an earlier node")


def test_a_copy_whose_companion_changed_since_is_not_handed_out(tmp_path, shm_dir):
    """The thirteenth adversarial pass: a node appended to the input's sidecar (a companion copied
    with it) after the copy was made; the next reader read the sidecar's stale copy and what it
    wrote there replaced the node's line, without a word. A change to any file of the copy makes
    the reader read the originals, as without prefetch."""
    prefetcher, source = _one_copy(tmp_path, shm_dir)
    deadline = __import__("time").monotonic() + 30
    while prefetcher.pending("wf/a") and __import__("time").monotonic() < deadline:
        __import__("time").sleep(0.01)
    with open(source.with_suffix(".json"), "a") as f:
        f.write("appended by an earlier node")
    assert prefetcher.copies_for("wf/a") == {}
    prefetcher.reader_done("wf/a")
    prefetcher.close()


def test_a_copy_whose_original_changed_keeping_its_size_and_mtime_is_not_handed_out(tmp_path, shm_dir):
    """The earlier node rewrote bytes in place and put the mtime back (``touch -r``, ``cp -p``; a
    coarse-grained mtime does the same): its ctime says it changed, and the reader reads the original."""
    prefetcher, source = _one_copy(tmp_path, shm_dir)
    deadline = __import__("time").monotonic() + 30
    while prefetcher.pending("wf/a") and __import__("time").monotonic() < deadline:
        __import__("time").sleep(0.01)
    before = source.stat()
    with open(source, "r+b") as f:
        f.seek(before.st_size - 4)
        f.write(b"by-a")
    os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (source.stat().st_size, source.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert prefetcher.copies_for("wf/a") == {}
    prefetcher.reader_done("wf/a")
    prefetcher.close()
    assert source.read_bytes().endswith(b"by-a")


def test_a_rewrite_keeps_the_other_names_of_a_file_with_hard_links(tmp_path, shm_dir):
    """An input with a second name (a hard link) a node rewrites in its copy: as under MultiProc,
    where the node rewrote the one file in place, both names show the new bytes."""
    prefetcher, source = _one_copy(tmp_path, shm_dir, other_name="other-name.nii")
    other = source.with_name("other-name.nii")
    copy = Path(prefetcher.copies_for("wf/a")[str(source)])
    copy.write_bytes(b"rewritten")
    prefetcher.reader_done("wf/a")
    prefetcher.close()
    assert source.read_bytes() == other.read_bytes() == b"rewritten"
    assert source.stat().st_nlink == 2 and source.stat().st_ino == other.stat().st_ino


def test_a_rewrite_does_not_undo_what_changed_the_original_since_it_was_copied(tmp_path, shm_dir):
    """Something else rewrote the original while the reader ran on its copy. Under MultiProc the
    later writer wins, and which was later is not known here: the change at the original's place is
    kept, and the reader's is said in the log, not put over it."""
    prefetcher, source = _one_copy(tmp_path, shm_dir)
    copy = Path(prefetcher.copies_for("wf/a")[str(source)])
    source.write_bytes(b"changed by another writer")
    copy.write_bytes(b"rewritten by the reader")
    prefetcher.reader_done("wf/a")
    prefetcher.close()
    assert source.read_bytes() == b"changed by another writer" and prefetcher.stats.written_back == 0


def _replace(in_file):
    import os

    with open(in_file + ".tmp", "wb") as f:
        f.write(b"replaced by the node")
    os.replace(in_file + ".tmp", in_file)  # an atomic save, as sed -i and most tools make it
    return in_file


def test_a_node_replacing_its_prefetched_input_replaces_the_original_as_under_multiproc(tmp_path, shm_dir, disk_dir):
    """In the view the copy is seen at the original through an overlay of its directory: renaming
    over it replaces the original, as MultiProc's node does; no temporary left, the consumer run."""
    seen = _changing_its_input(tmp_path, shm_dir, disk_dir, _replace)
    assert seen["SeaMultiProc"] == seen["MultiProc"] and seen["MultiProc"][1] == b"replaced by the node"
    report = RunReport.from_json(tmp_path / "SeaMultiProc" / "sea-report.json")
    assert report.busy_retries == 0 and report.prefetch_hits >= 1, report.to_text()


@pytest.mark.parametrize(
    "change", [pytest.param("replace", marks=pytest.mark.slow), "log-mkdir-sed", "log-mkdir-sed-tier-beside", "log-mkdir-sed-other-fs-beside"]
)  # sed renames over it too
def test_a_node_changing_its_input_beside_the_work_directory_does_it_once_as_under_multiproc(tmp_path, shm_dir, disk_dir, change):
    """An input in the directory that holds the home was not overlaid (the overlay would hide the
    node's own view): its copy was bound over the original, and a rename over it failed (EBUSY).
    Python's rename named the input, and the node ran again on the originals; ``sed -i`` in a
    subprocess named it in sed's stderr only, and the node failed where MultiProc's succeeds (the
    thirteenth adversarial pass). Now the home, and a tier in that directory, are bound again over
    the directory's overlay: all is done once, as under MultiProc, and nothing is rerun. Where
    another filesystem is mounted in that directory (which an overlay would hide), the node reads
    and changes the originals there (the sixteenth pass: sed failed on the copy bound over one)."""
    function = {"replace": _replace}.get(change, _logs_makes_and_edits_beside)
    seen = _changing_its_input(
        tmp_path, shm_dir, disk_dir, function, beside_the_home=True, tier_beside=change.endswith("tier-beside"), other_fs_beside=change.endswith("other-fs-beside")
    )
    assert seen["SeaMultiProc"] == seen["MultiProc"], seen
    report = RunReport.from_json(disk_dir / "SeaMultiProc" / "work" / "sea-report.json")
    assert report.busy_retries == 0 and report.prefetch_hits >= 1, report.to_text()


def _renames_the_directory_beside(in_file):
    import os

    directory = os.path.dirname(in_file)
    os.rename(os.path.join(directory, "derivatives"), os.path.join(directory, "derivatives.old"))  # a previous run's, set aside
    os.mkdir(os.path.join(directory, "derivatives"))
    with open(os.path.join(directory, "derivatives", "out.txt"), "w") as f:
        f.write("made beside the input")
    return in_file


def test_a_node_renaming_a_directory_that_was_beside_its_prefetched_input_ends_as_under_multiproc(tmp_path, shm_dir, disk_dir):
    """The thirteenth adversarial pass: in the view the input's directory is an overlay, where a
    directory that was there before the node started cannot be renamed (``EXDEV``, the overlay
    made without ``redirect_dir``): the node failed, where MultiProc's renames it. Now the node runs
    again on the original files, as a node that could not rename its input does (EBUSY), and the
    directory ends as MultiProc leaves it, the rerun said in the report."""
    seen = _changing_its_input(tmp_path, shm_dir, disk_dir, _renames_the_directory_beside, beside=("derivatives",))
    assert seen["SeaMultiProc"] == seen["MultiProc"]
    assert {"derivatives.old/kept.txt", "derivatives/out.txt"} <= set(seen["MultiProc"][3]), seen["MultiProc"][3]
    report = RunReport.from_json(tmp_path / "SeaMultiProc" / "sea-report.json")
    assert report.busy_retries == 1 and report.prefetch_hits >= 1, report.to_text()


def _logs_makes_and_edits_beside(in_file):
    import os
    import subprocess

    directory = os.path.dirname(in_file)
    with open(os.path.join(directory, "notes.txt"), "a") as f:  # a log beside its input
        f.write("the node ran\n")
    os.mkdir(os.path.join(directory, "derivatives"))  # no exist_ok: made once, or the node fails
    with open(os.path.join(directory, "derivatives", "out.txt"), "w") as f:
        f.write("made beside the input")
    subprocess.run(["sed", "-i", "1s/^/edited by sed/", in_file], check=True)  # a rename over it, out of Python's sight
    return in_file


def test_what_a_node_does_beside_its_prefetched_input_is_done_once_as_under_multiproc(tmp_path, shm_dir, disk_dir):
    """The ninth adversarial pass: a node that appended to a log beside its input, made a directory
    there, then ran ``sed -i`` on the input through a subprocess. With the copy bound over the
    original, sed's rename failed (EBUSY, in sed's stderr only: the node failed, the input
    unchanged); had it rerun, the log had two lines and ``mkdir`` failed. Now all is done once, as
    under MultiProc: the same files beside the input, byte for byte."""
    seen = _changing_its_input(tmp_path, shm_dir, disk_dir, _logs_makes_and_edits_beside)
    assert seen["SeaMultiProc"] == seen["MultiProc"]
    assert seen["MultiProc"][1].startswith(b"edited by sed") and seen["MultiProc"][3]["notes.txt"] == b"the node ran\n"
    report = RunReport.from_json(tmp_path / "SeaMultiProc" / "sea-report.json")
    assert report.busy_retries == 0 and report.prefetch_hits >= 1, report.to_text()


def _appends_at(in_file, target, data, before, after):
    import os
    import time

    time.sleep(before)
    with open(in_file if target is None else os.path.join(os.path.dirname(in_file), target), "ab") as f:  # not an input: not copied
        f.write(data)
    time.sleep(after)
    return in_file


@pytest.mark.parametrize("target", ["its-input", "notes.txt"])
def test_two_nodes_appending_at_once_to_their_input_or_beside_it_keep_both_appends(tmp_path, shm_dir, disk_dir, target):
    """The tenth adversarial pass: two nodes running at once append to the input they both read
    (each sees it through its own overlay) or to a log beside it; the one that ended last had its
    append dropped (said in the log). Now both appends are kept, in the order the nodes ended, as
    under MultiProc (where they are in the order written: the same here, by the sleeps)."""
    from nipype import Function, Node, Workflow

    seen = {}
    for plugin, sea in (("MultiProc", None), ("SeaMultiProc", {"tiers": [{"path": str(shm_dir)}], "prefetch": True})):
        (source,) = _files(disk_dir / plugin, 1)
        (source.parent / "notes.txt").write_bytes(b"notes before\n")
        wf = Workflow(name="two", base_dir=str(tmp_path / plugin))
        for name, data, before, after in (("m", b"by-m\n", 0.0, 1.0), ("b", b"by-b\n", 0.5, 1.5)):
            node = Node(Function(input_names=["in_file", "target", "data", "before", "after"], output_names=["out"], function=_appends_at), name=name)
            node.inputs.in_file, node.inputs.data, node.inputs.before, node.inputs.after = str(source), data, before, after
            node.inputs.target = None if target == "its-input" else target
            wf.add_nodes([node])
        wf.config["execution"]["poll_sleep_duration"] = 0.05
        wf.run(plugin=plugin, plugin_args={"n_procs": 2, **({"sea": sea} if sea else {})})
        seen[plugin] = tree_files(source.parent)
    changed = source.name if target == "its-input" else target
    assert seen["MultiProc"][changed].endswith(b"by-m\nby-b\n")
    assert seen["SeaMultiProc"] == seen["MultiProc"]
    assert RunReport.from_json(tmp_path / "SeaMultiProc" / "sea-report.json").prefetch_hits == 2


_TWO_RUNS = """
import sys
from nipype import Function, Node, Workflow

def appends(in_file, tag, meet):
    import glob, os, time
    open(in_file, "ab").write(tag.encode())
    with open(os.path.join(os.path.dirname(in_file), "notes.txt"), "a") as f:
        f.write(tag + "\\n")
    open(os.path.join(meet, tag), "w").close()
    while len(arrived := glob.glob(os.path.join(meet, "*"))) < 4:
        time.sleep(0.01)
    time.sleep(max(0, max(os.stat(p).st_mtime for p in arrived) + 0.5 - time.time()))  # the four, of both runs, return at once
    return tag

base, tier, in_file, run, meet = sys.argv[1:6]
wf = Workflow(name="wf", base_dir=base)
for i in range(2):
    node = Node(Function(input_names=["in_file", "tag", "meet"], output_names=["out"], function=appends), name=f"n{i}")
    node.inputs.in_file, node.inputs.tag, node.inputs.meet = in_file, f"{run}{i}", meet
    wf.add_nodes([node])
wf.config["execution"]["poll_sleep_duration"] = 0.05
wf.run(plugin="SeaMultiProc", plugin_args={"n_procs": 2, "sea": {"tiers": [{"path": tier}], "prefetch": True}})
"""


def test_two_runs_on_one_data_directory_keep_every_append_beside_and_to_their_input(tmp_path, shm_dir, disk_dir):
    """The twelfth adversarial pass (X1): two Sea runs, each with its own work directory and tier,
    read one data directory; their four nodes append to the input and a line to a log beside it
    and return at once. A line was lost without a word in half the trials: each run held its
    own lock and record of the files it put back. They are the user's on the node now
    (:mod:`sea.puts`): every append is kept, as under MultiProc."""
    import subprocess
    import sys

    script = tmp_path / "run.py"
    script.write_text(_TWO_RUNS)
    for trial in range(2):  # a line was lost in one trial of two or more
        (source,) = _files(disk_dir / f"data{trial}", 1)
        (source.parent / "notes.txt").write_bytes(b"before\n")
        (meet := tmp_path / f"meet{trial}").mkdir()
        runs = [
            subprocess.Popen(
                [sys.executable, str(script), str(tmp_path / f"run{trial}{r}"), str(shm_dir), str(source), r, str(meet)],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            for r in "AB"
        ]
        logs = [p.communicate(timeout=300)[0].decode() for p in runs]
        assert [p.returncode for p in runs] == [0, 0], logs
        lines = (source.parent / "notes.txt").read_text().splitlines()
        assert sorted(lines) == ["A0", "A1", "B0", "B1", "before"], (trial, logs)
        tail = source.read_bytes()[2**20 :]
        assert sorted(tail[i : i + 2] for i in range(0, len(tail), 2)) == [b"A0", b"A1", b"B0", b"B1"], tail
        assert not any("could not" in log for log in logs), logs


def _replaces_then_waits(in_file, started):
    import os
    import time

    with open(in_file + ".tmp", "wb") as f:
        f.write(b"replaced by the node")
    os.replace(in_file + ".tmp", in_file)
    with open(os.path.join(os.path.dirname(in_file), "new.txt"), "w") as f:
        f.write("made beside its input")
    with open(started, "w"):
        pass
    time.sleep(2)
    return in_file


@pytest.mark.parametrize("view", [True, False], ids=["view", "no-view"])
def test_an_input_directory_renamed_and_a_link_put_in_its_place_while_the_node_runs(tmp_path, shm_dir, disk_dir, view):
    """The tenth adversarial pass: whoever owns the input's directory renames it while the node
    runs, and puts a link to another directory at its name. The node's changes, made before,
    were lost, and its overlay stayed mounted in the worker (unmounted by path, through the link).
    Now they are in the renamed directory, as under MultiProc, and nothing goes through the link.
    Without a view (``logical_paths: false``) the node changes the copy, which went back by path,
    through the link (the thirteenth pass): now into the directory the input was copied from
    only, found by a descriptor checked to hold it; not found, the run says the changes are lost."""
    import threading

    from nipype import Function, Node, Workflow

    seen = {}
    for plugin, sea in (("MultiProc", None), ("SeaMultiProc", {"tiers": [{"path": str(shm_dir)}], "prefetch": True, "logical_paths": view})):
        (source,) = _files(disk_dir / plugin / "data", 1)
        elsewhere = disk_dir / plugin / "elsewhere"
        elsewhere.mkdir()
        started = tmp_path / f"{plugin}-started"

        def swap(data=source.parent, elsewhere=elsewhere, started=started):
            while not started.exists():
                __import__("time").sleep(0.02)
            data.rename(data.with_name("data.old"))
            data.symlink_to(elsewhere)

        swapper = threading.Thread(target=swap, daemon=True)
        swapper.start()
        wf = Workflow(name="swapped", base_dir=str(tmp_path / plugin))
        node = Node(Function(input_names=["in_file", "started"], output_names=["out"], function=_replaces_then_waits), name="m")
        node.inputs.in_file, node.inputs.started = str(source), str(started)
        wf.add_nodes([node])
        wf.config["execution"]["poll_sleep_duration"] = 0.05
        wf.run(plugin=plugin, plugin_args={"n_procs": 1, **({"sea": sea} if sea else {})})
        swapper.join(timeout=30)
        seen[plugin] = (tree_files(disk_dir / plugin / "data.old"), tree_files(elsewhere))
    assert seen["MultiProc"][0][source.name] == b"replaced by the node" and seen["MultiProc"][1] == {}
    if view:
        assert seen["SeaMultiProc"] == seen["MultiProc"]
    else:
        assert seen["SeaMultiProc"][1] == {}, "a change went through the link"


def _makes_a_directory_beside(in_file):
    import os

    directory = os.path.dirname(in_file)
    made = os.path.join(directory, ".out.partial")
    os.mkdir(made)
    for i in range(300):
        with open(os.path.join(made, f"f{i:03d}.txt"), "w") as f:
            f.write(f"file {i}\n")
    os.rename(made, os.path.join(directory, "out"))  # whole, at once: nothing of it is written after
    return in_file


def test_a_directory_made_beside_an_input_and_swapped_for_a_link_as_it_is_made_again_sends_nothing_through_it(tmp_path, shm_dir, disk_dir):
    """The twelfth adversarial pass (X2): whoever may write in an input's directory (the run's own
    user here: a directory another user may write in is not overlaid) watches for the
    directory a node made there (``out``, with 300 files) and, as soon as it is there, renames it
    and puts a link to another directory in its place. Under MultiProc the node made it whole
    before that: nothing reaches the link's target. Sea made it again, entry by entry, by path as
    the node returned: the files after the swap went through the link (as root, into any
    directory). Now each entry goes through a descriptor of its directory opened without following
    a link: nothing reaches the target; the files are in the renamed directory, or said to be lost."""
    import threading

    from nipype import Function, Node, Workflow

    seen = {}
    for plugin, sea in (("MultiProc", None), ("SeaMultiProc", {"tiers": [{"path": str(shm_dir)}], "prefetch": True})):
        (source,) = _files(disk_dir / plugin / "data", 1)
        target = disk_dir / plugin / "target"
        target.mkdir()
        stop = threading.Event()

        def swap(data=source.parent, target=target, stop=stop):
            out = data / "out"
            while not stop.is_set():
                try:
                    if stat.S_ISDIR(out.lstat().st_mode):
                        out.rename(data / "out.swapped")
                        out.symlink_to(target)
                        return
                except FileNotFoundError:
                    pass
                time.sleep(0.0005)

        swapper = threading.Thread(target=swap, daemon=True)
        swapper.start()
        wf = Workflow(name="beside", base_dir=str(tmp_path / plugin))
        node = Node(Function(input_names=["in_file"], output_names=["out"], function=_makes_a_directory_beside), name="m")
        node.inputs.in_file = str(source)
        wf.add_nodes([node])
        wf.config["execution"]["poll_sleep_duration"] = 0.05
        wf.run(plugin=plugin, plugin_args={"n_procs": 1, **({"sea": sea} if sea else {})})
        stop.set()
        swapper.join(timeout=30)
        assert (source.parent / "out").is_symlink(), f"{plugin}: the directory was not swapped"
        seen[plugin] = (tree_files(target), tree_files(source.parent / "out.swapped"))
    assert seen["MultiProc"][0] == {} and len(seen["MultiProc"][1]) == 300
    assert seen["SeaMultiProc"][0] == {}, f"{len(seen['SeaMultiProc'][0])} of the node's files went through the link"
    assert seen["SeaMultiProc"][1].items() <= seen["MultiProc"][1].items()


def _edits_with_sed(in_file):
    import subprocess

    subprocess.run(["sed", "-i", "1s/^/edited by sed/", in_file], check=True)  # a new file renamed over its name
    return in_file


def test_an_input_that_is_a_link_into_an_annex_is_replaced_at_its_name_and_the_annex_object_kept(tmp_path, shm_dir, disk_dir):
    """The thirteenth adversarial pass: a dataset whose files are links to read-only objects (a
    DataLad dataset's annex), a node editing its input with ``sed -i``. Under MultiProc sed's new
    file replaces the link and the object stays as it was; Sea put the node's change back through
    the link, rewriting the annex's object. Now the link is replaced, as under MultiProc."""
    from nipype import Function, Node, Workflow

    seen = {}
    for plugin, sea in (("MultiProc", None), ("SeaMultiProc", {"tiers": [{"path": str(shm_dir)}], "prefetch": True})):
        data = disk_dir / plugin / "dataset"
        objects = data / ".git" / "annex" / "objects"
        objects.mkdir(parents=True)
        obj = objects / "MD5E-s1048576--0123.nii"
        obj.write_bytes(b"\0" * 2**20)
        obj.chmod(0o444)
        objects.chmod(0o555)
        link = data / "sub-00_bold.nii"
        link.symlink_to(os.path.relpath(obj, data))
        wf = Workflow(name="annexed", base_dir=str(tmp_path / plugin))
        node = Node(Function(input_names=["in_file"], output_names=["out"], function=_edits_with_sed), name="m")
        node.inputs.in_file = str(link)
        wf.add_nodes([node])
        wf.config["execution"]["poll_sleep_duration"] = 0.05
        wf.run(plugin=plugin, plugin_args={"n_procs": 1, **({"sea": sea} if sea else {})})
        seen[plugin] = (link.is_symlink(), link.read_bytes()[:20], obj.read_bytes() == b"\0" * 2**20, oct(obj.stat().st_mode & 0o777))
        objects.chmod(0o755)
    assert seen["MultiProc"] == (False, b"edited by sed\0\0\0\0\0\0\0", True, "0o444")
    assert seen["SeaMultiProc"] == seen["MultiProc"]


def _seds_the_first(in_files):
    import subprocess

    subprocess.run(["sed", "-i", "1s/^/edited by sed/", in_files[0]], check=True)
    return in_files[0]


def test_a_node_with_many_inputs_in_one_directory_edits_one_as_under_multiproc(tmp_path, shm_dir, disk_dir):
    """The thirteenth adversarial pass: with five inputs in one directory, the overlay's layers
    (their copies' directories on the tier) passed the 256 bytes the kernel takes for an option;
    the copies were bound over their originals instead, and a Function node's ``sed -i`` failed
    with EBUSY on its temporary's rename (not rerun: sed named no input). The layers now go by
    descriptor, one at a time."""
    from nipype import Function, Node, Workflow

    seen = {}
    for plugin, sea in (("MultiProc", None), ("SeaMultiProc", {"tiers": [{"path": str(shm_dir)}], "prefetch": True})):
        sources = _files(disk_dir / plugin / "data", 8)
        wf = Workflow(name="many", base_dir=str(tmp_path / plugin))
        node = Node(Function(input_names=["in_files"], output_names=["out"], function=_seds_the_first), name="m")
        node.inputs.in_files = [str(s) for s in sources]
        wf.add_nodes([node])
        wf.config["execution"]["poll_sleep_duration"] = 0.05
        wf.run(plugin=plugin, plugin_args={"n_procs": 1, **({"sea": sea} if sea else {})})
        seen[plugin] = tree_files(sources[0].parent)
    assert seen["MultiProc"]["sub-00_bold.nii"].startswith(b"edited by sed")
    assert seen["SeaMultiProc"] == seen["MultiProc"]
    report = RunReport.from_json(tmp_path / "SeaMultiProc" / "many" / ".." / "sea-report.json")
    assert report.prefetch_hits == 8 and report.busy_retries == 0, report.to_text()


@pytest.mark.skipif(os.geteuid() != 0, reason="gives files away: as root")
def test_the_owner_and_mode_a_put_back_gives_never_go_through_a_link_put_at_its_name(tmp_path):
    """The eleventh adversarial pass: a user who can write in an input's directory swapped the
    temporary Sea writes there for a link to a root-only file; Sea, as root, gave the node's owner
    and mode to that file (a privilege escalation on /etc/shadow). Owner and mode now go to the
    entry itself: a link keeps its target as it was."""
    from sea.stager import own_like
    from sea.view import _same_owner

    victim = tmp_path / "victim"
    victim.write_text("root's own")
    victim.chmod(0o600)
    link = tmp_path / "in.nii.sea-tmp-1234"
    link.symlink_to(victim)
    own_like(link, 65534, 65534, 0o644)
    _same_owner(str(link), os.stat_result((0o100644, 0, 0, 1, 65534, 65534, 0, 0, 0, 0)))  # a regular file's owner and mode
    st = victim.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, 0, 0o600), "the link was followed"
    regular = tmp_path / "file"
    regular.write_text("x")
    own_like(regular, 65534, 65534, 0o640)
    assert (regular.stat().st_uid, regular.stat().st_mode & 0o777) == (65534, 0o640)


@pytest.mark.parametrize(
    ("elsewhere", "named"),
    [
        ("OSError: [Errno 16] Device or resource busy: '/dev/sdz1'", "OSError: [Errno 16] Device or resource busy: '{source}.tmp' -> '{source}'"),
        ("OSError: [Errno 18] Invalid cross-device link: '{disk}/derivatives' -> '{shm}/derivatives'",
         "OSError: [Errno 18] Invalid cross-device link: '{beside}/derivatives' -> '{beside}/derivatives.old'"),
    ],
    ids=["EBUSY", "EXDEV"],
)  # fmt: skip
def test_only_an_error_on_a_file_read_from_a_copy_or_beside_it_reruns_the_node_on_the_originals(tmp_path, shm_dir, disk_dir, elsewhere, named):
    """A node that failed on EBUSY for a path of its own (a device, another mount), or on EXDEV for a
    rename of its own across filesystems, fails as under MultiProc; one whose EBUSY names an input
    file it read from a prefetched copy, or whose EXDEV names a path in such a file's directory (an
    overlay in its view), runs again."""
    from sea import NodeSpec, SeaEngine, WorkflowGraph

    (source,) = _files(disk_dir / "shared", 1)
    config = SeaConfig.load({"tiers": [{"path": str(shm_dir)}], "prefetch": True, "progress": "off"})
    engine = SeaEngine(config, tmp_path / "home")
    engine.update_graph(WorkflowGraph.from_specs([NodeSpec("wf/a", kind="job")]))
    engine.expect_reads("wf/a", [str(source)])
    engine.place("wf/a")
    assert str(source) in engine.prefetched("wf/a")
    places = {"source": source, "beside": source.parent, "disk": disk_dir, "shm": shm_dir}
    assert engine.retry_elsewhere("wf/a", elsewhere.format(**places)) is None
    assert engine.retry_elsewhere("wf/a", named.format(**places)) is not None
    assert engine.report.busy_retries == 1
    engine.node_finished("wf/a")
    engine.close()
