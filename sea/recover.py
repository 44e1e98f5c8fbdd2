"""``sea recover``: finish the flush of copies a run kept on a tier.

When a declared output cannot be committed home (the home full, over quota, unreachable), Sea ends
the run with :class:`~sea.SeaFlushError` and keeps the tier's copy, marked as kept (see
:meth:`sea.private.PrivateDir.mark_kept`) so that no later run removes it. Once the cause is fixed,
``sea recover DIR`` copies what is there to where it belongs, with the stager's own atomic copy
(a temporary name, ``fsync``, a rename: a partial file never appears at a final path), and removes
the directory once everything is home. A node's directory is copied whole beside its path and put
in place by one rename, as a run does (:func:`sea.stager.copy_tree_in`): one recovered half (the home
filled up again, the command was killed) never looks like a node the engine may take as done.
Files a ``keep`` rule left stay where they are.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

from .config import SeaConfigError
from .private import KEPT_FILE, OWNER_FILE
from .stager import atomic_copy, copy_tree_in, walk_files


@dataclass
class Recovered:
    directory: Path
    files: int = 0
    bytes: int = 0
    destinations: set[str] = field(default_factory=set)
    removed: bool = False
    left: list[str] = field(default_factory=list)  # kept by a rule: not Sea's to move

    def to_text(self) -> str:
        where = ", ".join(sorted(self.destinations)) or "nowhere"
        text = f"{self.directory}: {self.files} file(s) ({self.bytes} bytes) copied home to {where}"
        if self.removed:
            return text + f"; {self.directory} removed"
        return text + f"; {len(self.left)} file(s) kept there by a rule stay"


def kept_directories(path: Path) -> list[Path]:
    """``path`` itself if it is a directory a run kept, else the kept directories in it (a tier root)."""
    path = Path(path)
    if not os.path.lexists(path):
        raise SeaConfigError(f"{path} does not exist: give a directory the report's KEPT line names (or the tier it is in)")
    if not path.is_dir():
        raise SeaConfigError(f"{path} is not a directory: give a directory the report's KEPT line names (or the tier it is in)")
    if os.path.lexists(path / KEPT_FILE):
        return [path]
    # in a tier root (/dev/shm) anyone may make a sea-* directory: only this user's own are theirs to recover
    found = sorted(p for p in path.glob("sea-*") if os.path.lexists(p / KEPT_FILE) and _own_directory(p))
    if not found:
        raise SeaConfigError(f"{path} holds nothing a Sea run kept (no {KEPT_FILE} in it, nor in a sea-* directory below it)")
    return found


def _own_directory(path: Path) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()


def recover(directory: Path) -> Recovered:
    """Copy the kept copies in ``directory`` home; remove it when nothing else is left in it."""
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise SeaConfigError(f"{directory} is not a private directory of yours (a link, another user's, or writable by others): not recovered")
    try:
        record = json.loads((directory / KEPT_FILE).read_text())
    except (ValueError, UnicodeDecodeError):
        raise SeaConfigError(f"{directory / KEPT_FILE} is damaged (not the record a run writes): the copies in {directory} are not recovered; copy them home by hand") from None
    done = Recovered(directory)
    for copy in record.get("copies", []):
        source, target = directory / copy["from"], Path(copy["to"])
        _unlink_links_into(target, directory)  # a node's path in the home linked to its kept copy: it becomes the copy
        if target != Path("/") and source.is_dir() and not source.is_symlink():  # a node's directory, not a sink's staging
            copied, files = copy_tree_in(source, _made(target.parent) / target.name)
            done.bytes, done.files = done.bytes + copied, done.files + files
        else:
            for src in _entries(source):
                done.bytes += atomic_copy(src, target / src.relative_to(source) if src != source else target)
                done.files += 1
        done.destinations.add(str(target))
    # all home: what is left served only those copies (the nodes' own files), but what a rule keeps
    rule = [directory / r for r in record.get("rule", [])]
    done.left = [str(p.relative_to(directory)) for r in rule for p in _entries(r)]
    if not done.left:
        shutil.rmtree(directory)
        done.removed = True
        return done
    for entry in os.listdir(directory):
        path = directory / entry
        if entry in (OWNER_FILE, KEPT_FILE) or any(path == r or path in r.parents for r in rule):
            continue
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    record["copies"] = []
    (directory / KEPT_FILE).write_text(json.dumps(record, indent=1))
    return done


def _unlink_links_into(target: Path, directory: Path) -> None:
    """``target`` or a directory above it is a link into ``directory`` (a MapNode's path in the home,
    linked to where it ran): copying through it would write into ``directory`` itself, which then
    goes, leaving the link dangling. Such a link is removed: the copy makes a real directory there."""
    inside = directory.resolve()
    for path in [target, *target.parents]:
        if path.is_symlink() and Path(os.path.realpath(path)).is_relative_to(inside):
            path.unlink()
            return


def _made(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def _entries(root: Path):
    """Files, links and empty directories under ``root`` (``root`` itself if it is a file)."""
    if not root.is_dir() or root.is_symlink():
        yield root
        return
    yield from walk_files(root, empty_dirs=True)
