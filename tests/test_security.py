"""Shared nodes: /dev/shm and /tmp are writable by every user. Sea's directories there are private
and unpredictable, a path someone else planted is refused and never followed, and neither a flush
nor an eviction follows a link out of a node's directory."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from nipype.pipeline.engine import Workflow

from sea import SeaConfig, SeaConfigError, SeaTierSwapped
from sea.tiers import StorageHierarchy

from conftest import build_tiers_as, sea_private_dirs, tree_files
from nipype_workflows import build_full, fn, make_subjects, run


def hierarchy(tier: Path, home: Path) -> StorageHierarchy:
    return StorageHierarchy.build(SeaConfig.load({"tiers": [{"path": str(tier)}]}), home)


def test_private_directories_are_0700_and_unpredictable(disk_dir, shm_dir):
    first, second = hierarchy(shm_dir, disk_dir / "a"), hierarchy(shm_dir, disk_dir / "b")
    try:
        dirs = [first.fast_tiers[0].workdir, second.fast_tiers[0].workdir]
        assert dirs[0] != dirs[1] and dirs[0].parent == dirs[1].parent == shm_dir.resolve()
        for d in dirs:
            assert stat.S_IMODE(d.stat().st_mode) == 0o700 and d.stat().st_uid == os.getuid()
            assert len(d.name) >= len("sea-") + 8, "a name short enough to guess"
    finally:
        first.close()
        second.close()


def test_a_planted_symlink_in_a_world_writable_directory_is_refused(disk_dir, shm_dir):
    world = shm_dir / "world"
    world.mkdir()
    world.chmod(0o1777)  # like /dev/shm and /tmp
    target = disk_dir / "attacker-controlled"
    target.mkdir()
    (world / "tier").symlink_to(target)
    with pytest.raises(SeaConfigError, match="symbolic link in the world-writable") as info:
        hierarchy(world / "tier", disk_dir / "home")
    assert "\n" not in str(info.value)
    assert not list(target.iterdir()), "Sea wrote through the planted link"


def test_a_directory_of_someone_else_in_a_world_writable_directory_is_refused(disk_dir, shm_dir):
    world = shm_dir / "world"
    world.mkdir()
    world.chmod(0o1777)
    theirs = world / "tier"
    theirs.mkdir(mode=0o777)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(SeaConfigError, match="not safe on a shared node: .* belongs to uid 65534, who could swap"):
        hierarchy(theirs, disk_dir / "home")
    assert not list(theirs.iterdir())
    mine = world / "mine"
    mine.mkdir()
    hierarchy(mine, disk_dir / "home").close()  # one's own directory there is fine


def plant_links(victim_file: str, victim_dir: str) -> str:
    """A node that leaves links to files outside its directory (as tools sometimes do)."""
    import os

    os.symlink(victim_file, "link_to_file")
    os.symlink(victim_dir, "link_to_dir")
    with open("out.txt", "w") as f:
        f.write("made")
    return os.path.abspath("out.txt")


def read_it(in_file: str) -> str:
    import os

    with open(in_file) as f, open("copy.txt", "w") as g:
        g.write(f.read())
    return os.path.abspath("copy.txt")


@pytest.mark.parametrize("keep_intermediates", [False, True], ids=["evicted", "flushed"])
def test_links_in_a_node_directory_are_neither_followed_by_eviction_nor_by_a_flush(disk_dir, shm_dir, keep_intermediates):
    outside = disk_dir / "must-survive"
    (outside / "dir").mkdir(parents=True)
    (outside / "file.txt").write_text("precious")
    (outside / "dir" / "inner.txt").write_text("precious too")
    wf = Workflow(name="links", base_dir=str(disk_dir / "work"))
    wf.config["execution"]["remove_unnecessary_outputs"] = False  # Nipype would delete the file link itself
    plant = fn("plant", plant_links, ["victim_file", "victim_dir"], ["out_file"])
    plant.inputs.victim_file, plant.inputs.victim_dir = str(outside / "file.txt"), str(outside / "dir")
    read = fn("read", read_it, ["in_file"], ["out_file"])
    wf.connect(plant, "out_file", read, "in_file")
    run(wf, "SeaMultiProc", {"tiers": [{"path": str(shm_dir)}], "keep_intermediates": keep_intermediates})
    assert (outside / "file.txt").read_text() == "precious"
    assert (outside / "dir" / "inner.txt").read_text() == "precious too"
    assert sea_private_dirs(shm_dir) == []
    if keep_intermediates:  # the node's directory came home: its links are links, not copies of their targets
        home_copy = disk_dir / "work" / "links" / "plant"
        assert (home_copy / "link_to_file").is_symlink() and os.readlink(home_copy / "link_to_file") == str(outside / "file.txt")
        assert (home_copy / "link_to_dir").is_symlink()


# ------------------------------------------------------------------ tier roots others can write
@pytest.fixture(scope="session")
def attacker(other_user) -> tuple[int, int]:
    """A real second user on this machine (conftest's ``other_user``): the other user of a shared node."""
    return other_user


def unsafe_roots(base: Path, uid: int, gid: int) -> dict[str, tuple[Path, str]]:
    """Three tier roots where ``uid`` could rename Sea's directory, and what the refusal says."""
    theirs = base / "theirs"  # a 1777 directory another user made, e.g. /dev/shm/shared
    theirs.mkdir()
    theirs.chmod(0o1777)
    os.chown(theirs, uid, gid)
    (theirs / "tier").mkdir()  # ours, one level below theirs
    open_dir = base / "open"  # 0777, no sticky bit
    open_dir.mkdir()
    open_dir.chmod(0o777)
    project = base / "project"  # a group-writable project scratch directory
    project.mkdir()
    os.chown(project, 0, gid)
    project.chmod(0o775)
    return {
        "below another user's sticky directory": (theirs / "tier", f"belongs to uid {uid}"),
        "world-writable without the sticky bit": (open_dir, "is writable by every user"),
        "group-writable": (project, f"is writable by group {gid}"),
    }


def test_a_tier_root_another_user_can_write_is_refused_in_one_line(disk_dir, shm_dir, attacker):
    for case, (root, says) in unsafe_roots(shm_dir, *attacker).items():
        with pytest.raises(SeaConfigError, match=says) as info:
            hierarchy(root, disk_dir / "home")
        assert "\n" not in str(info.value) and "swap Sea's directory" in str(info.value), case
        assert not list(root.glob("sea-*")), f"{case}: Sea made its directory before refusing"
        # `sea check` says the same in one line, exit status 2
        config = disk_dir / f"{root.name}.yml"
        config.write_text(f"tiers: [{{path: {root}}}]\n")

        done = subprocess.run([sys.executable, "-m", "sea.cli", "check", str(config), "--home", str(disk_dir / "home")], capture_output=True, text=True)
        assert done.returncode == 2 and says in done.stderr + done.stdout, (case, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr
    sticky = shm_dir / "sticky"  # root's sticky directory, like /dev/shm itself: fine
    sticky.mkdir()
    sticky.chmod(0o1777)
    hierarchy(sticky, disk_dir / "home").close()


def test_an_unprivileged_user_is_refused_a_tier_root_can_write(disk_dir, shm_dir, attacker):
    """The other side: an unprivileged user given root's world-writable directory as a tier."""

    shm_dir.chmod(0o755)
    disk_dir.chmod(0o755)
    open_dir = shm_dir / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    home = disk_dir / "home"
    home.mkdir()
    os.chown(home, *attacker)
    (said,) = build_tiers_as(*attacker, [open_dir], home)
    assert "is writable by every user" in said and not list(open_dir.iterdir())


# ------------------------------------------------------------------ a private directory swapped mid-run
def swap_private_dir(tier_root: str) -> str:
    """Done as an attacker who can write the tier root would, mid-run: Sea's directory renamed and
    a link of theirs in its place (to the renamed directory, so that this node's own result still
    lands; they could point it anywhere later)."""
    import glob
    import os

    private = glob.glob(os.path.join(tier_root, "sea-*"))[0]
    os.rename(private, private + "-stolen")
    os.symlink(private + "-stolen", private)
    with open(os.path.join(tier_root, "victim.txt"), "w") as f:
        f.write("a file the next node would read")
    return os.path.join(tier_root, "victim.txt")


def test_a_private_directory_swapped_mid_run_is_refused_never_followed(disk_dir, shm_dir):
    wf = Workflow(name="wf", base_dir=str(disk_dir / "work"))
    swap = fn("swap", swap_private_dir, ["tier_root"], ["out_file"])
    swap.inputs.tier_root = str(shm_dir)
    after = fn("after", read_it, ["in_file"], ["out_file"])
    wf.connect(swap, "out_file", after, "in_file")
    with pytest.raises(SeaTierSwapped, match="was replaced by another \\(a symbolic link\\)") as info:
        run(wf, "SeaMultiProc", {"tiers": [{"path": str(shm_dir)}]})
    assert "\n" not in str(info.value)
    link = next(p for p in shm_dir.glob("sea-*") if p.is_symlink())
    assert not (link.resolve() / "wf" / "after").exists(), "a node was sent into the swapped-in directory"
    assert os.path.islink(link), "Sea removed the planted link (it is not Sea's to remove)"


def test_removal_never_leaves_the_private_directory(disk_dir, shm_dir):
    """Eviction goes through the descriptor Sea holds: a link planted at any depth, even in place
    of the private directory itself, is removed as a link, its target untouched."""
    outside = disk_dir / "outside"
    (outside / "node").mkdir(parents=True)
    (outside / "node" / "keep.txt").write_text("precious")
    built = hierarchy(shm_dir, disk_dir / "home")
    tier = built.fast_tiers[0]
    try:
        (tier.workdir / "wf").mkdir()
        (tier.workdir / "wf" / "node").symlink_to(outside / "node")  # a link where a node directory was
        built.remove(tier.workdir / "wf" / "node" / "keep.txt")
        built.remove(tier.workdir / "wf" / "node")
        assert (outside / "node" / "keep.txt").read_text() == "precious"
        assert not os.path.lexists(tier.workdir / "wf" / "node")
        workdir = tier.workdir
        workdir.rename(shm_dir / "moved")
        workdir.symlink_to(outside)  # the whole private directory swapped
        built.remove(workdir / "node")
        assert (outside / "node" / "keep.txt").read_text() == "precious"
    finally:
        built.close()
    assert (outside / "node" / "keep.txt").read_text() == "precious"
    assert workdir.is_symlink(), "the planted link is not Sea's to remove"
    assert [p.name for p in (shm_dir / "moved").iterdir()] == [], "Sea's own directory, wherever it went, is emptied through its descriptor"


ATTACK = '''
import errno, os, sys, time
world, victim, until = sys.argv[1], sys.argv[2], float(sys.argv[3])
os.setgroups([]); os.setgid(int(sys.argv[5])); os.setuid(int(sys.argv[4]))
tried = won = planted = 0
n = 0
while time.time() < until and not os.path.exists(os.path.join(world, "stop")):
    for name in os.listdir(world):
        path = os.path.join(world, name)
        if not name.startswith("sea-") or os.path.islink(path) or name.startswith("sea-planted"):
            continue
        for attempt in (
            lambda: os.rename(path, path + "-stolen"),           # swap Sea's directory...
            lambda: os.listdir(path),                            # read what is in it
            lambda: open(os.path.join(path, "x"), "w").close(),  # write into it
        ):
            tried += 1
            try:
                attempt()
                won += 1
            except OSError as e:
                if e.errno not in (errno.EPERM, errno.EACCES, errno.ENOENT):
                    raise
        try:  # ...for a link of ours: succeeds only once Sea has let the name go, which is no harm
            os.symlink(victim, path)
            planted += 1
        except OSError:
            pass
    n += 1
    try:  # a directory that looks like a dead run's private one, and a link that looks like one
        os.symlink(victim, os.path.join(world, f"sea-planted{n}"))
        os.makedirs(os.path.join(world, f"sea-planteddir{n}"))
        with open(os.path.join(world, f"sea-planteddir{n}", ".sea-owner"), "w") as f:
            f.write(f"999999 {os.uname().nodename} /\\n")
        os.symlink(victim, os.path.join(world, f"sea-planteddir{n}", "wf"))
        planted += 2
    except OSError:
        pass
print(tried, won, planted)
'''


def test_a_real_other_user_racing_a_busy_run_gets_nothing(disk_dir, shm_dir, attacker):
    """The other user of a shared node (a real account) hammers Sea's directories in a sticky,
    world-writable tier root (as /dev/shm is) for the whole of a run: every rename, swap, read and
    write is refused by the kernel, what they plant is neither followed nor removed, the run's
    outputs are those of a run alone, and a root-only directory they point at is untouched."""

    shm_dir.chmod(0o755)
    world = shm_dir / "world"
    world.mkdir()
    world.chmod(0o1777)
    victim = disk_dir / "root-only"
    victim.mkdir(mode=0o700)
    (victim / "secret.txt").write_text("precious")
    data = disk_dir / "data"
    subjects = make_subjects(data, n_subjects=3, mib=2)

    def outputs(base: Path, sea: dict | None) -> dict[str, bytes]:
        wf = build_full(data, subjects, base / "work", base / "out")
        run(wf, "SeaMultiProc" if sea else "MultiProc", sea)
        return tree_files(base / "out")

    alone = outputs(disk_dir / "alone", None)
    attack = subprocess.Popen(
        [sys.executable, "-c", ATTACK, str(world), str(victim), str(time.time() + 120), str(attacker[0]), str(attacker[1])],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/",
    )
    try:
        time.sleep(0.5)  # it is at work before Sea starts
        raced = outputs(disk_dir / "raced", {"tiers": [{"path": str(world)}]})
    finally:
        (world / "stop").touch()
        out, err = attack.communicate(timeout=60)
    assert attack.returncode == 0, err
    tried, won, planted = map(int, out.split())
    print(f"\nthe other user tried {tried} renames, reads and writes of Sea's directory ({won} succeeded) and planted {planted} entries")
    assert tried > 0 and planted > 0, "the attacker never saw Sea's directory: the race did not happen"
    assert won == 0, f"{won} of {tried} attempts on Sea's directory succeeded"
    assert raced == alone
    assert [p.name for p in victim.iterdir()] == ["secret.txt"] and (victim / "secret.txt").read_text() == "precious"
    theirs = [p for p in world.glob("sea-*") if p.is_symlink() or p.stat().st_uid == attacker[0]]
    assert len(theirs) == planted, "Sea removed what the other user planted"
    assert not [p for p in world.glob("sea-*") if p not in theirs], "Sea's own directory was left behind"
