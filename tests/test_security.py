"""Shared nodes: /dev/shm and /tmp are writable by every user. Sea's directories there are private
and unpredictable, a path someone else planted is refused and never followed, and neither a flush
nor an eviction follows a link out of a node's directory."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from nipype.pipeline.engine import Workflow

from sea import SeaConfig, SeaConfigError
from sea.tiers import StorageHierarchy

from conftest import sea_private_dirs
from nipype_workflows import fn, run


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
    with pytest.raises(SeaConfigError, match="belongs to uid 65534, not to you"):
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
