"""The run journal: what Sea did with each node, kept in the home so a rerun can resume.

An append-only JSON-lines file at ``<home>/.sea/journal.jsonl``. A record is written only after
the thing it states has happened (a node finished, its files committed home, its directory
evicted), so a lost record can only make a rerun redo work, never skip work that is missing.

Records reach the file from a writer thread, in order, several per write: the home is on the
shared filesystem, where one small write can wait tens of milliseconds behind the stager's
copies (measured: 160 records cost the scheduler 4.8 s on the busy benchmark filesystem when it
wrote them itself). A record still queued when the process is killed is lost, which the rule
above makes safe.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import threading
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger("sea")
EVENTS = {"started", "done", "committed", "evicted", "checkpointed", "packed", "dropped", "forgotten", "interrupted"}


@dataclass
class NodeRecord:
    chain: str = ""
    done: bool = False
    evicted: bool = False
    flushed: bool = False  # its declared outputs are all committed home
    committed: dict[str, tuple[int, int]] = field(default_factory=dict)  # dst -> (size, mtime_ns)
    # its whole directory is in the home, put there by Sea: the directory's st_mtime_ns then (a run
    # that changes it since, another plugin rerunning the node there, changes it; a copy made with
    # its timestamps, a backup restored, keeps it), and the nodes whose directories its results
    # name (they must be in the home too for it to be usable)
    checkpoint: int | None = None
    needs: tuple[str, ...] = ()
    reads: dict[str, tuple[int, int]] = field(default_factory=dict)  # input data it read: path -> (size, mtime_ns)
    # its directory is packed in the home (sea.pack): the pack's name in .sea/checkpoints, its size
    # and st_mtime_ns (another file put there is not it), and the nodes its results name (as above)
    pack: tuple[str, int, int] | None = None


class Journal:
    def __init__(self, path: Path):
        self.path = path
        self.records: dict[str, NodeRecord] = {}
        self.stopped: dict | None = None  # this session's "interrupted" record: kept by the compaction
        self._lock = threading.Lock()
        damaged = self._replay() if path.exists() else []
        if damaged:
            shown = ", ".join(map(str, damaged[:5])) + (f" and {len(damaged) - 5} more" if len(damaged) > 5 else "")
            logger.warning("[Sea] %s: line(s) %s damaged, skipped (their nodes may run again); the journal is rewritten without them", path, shown)
            self._compact()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a", encoding="utf-8")
        self.bytes = self._file.tell()  # its size in the home (what it adds to what Sea leaves there)
        self._lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._refused = False  # a write failed: the lines after it are not written
        self._writer = threading.Thread(target=self._write_lines, name="sea-journal", daemon=True)
        self._writer.start()

    def _write_lines(self) -> None:
        """Append queued lines, all that are waiting in one write, until ``None`` arrives."""
        while True:
            lines = [self._lines.get()]
            while not self._lines.empty():
                lines.append(self._lines.get())
            done = lines[-1] is None
            text = "".join(line for line in lines if line is not None)
            if text and not self._refused:
                try:
                    self._file.write(text)
                    self._file.flush()
                except OSError as exc:  # the home refuses writes (full, read-only, failing): the run goes on, said once
                    self._refused = True
                    logger.warning("[Sea] the journal %s could not be written (%s): a rerun recomputes what it does not record", self.path, exc.strerror or exc)
            if done:
                return

    @classmethod
    def read(cls, path: Path) -> dict[str, NodeRecord]:
        """The records of a journal another process writes (a Dask worker's), without opening it to write."""
        reader = cls.__new__(cls)
        reader.path, reader.records = path, {}
        if path.exists():
            reader._replay()
        return reader.records

    def _replay(self) -> list[int]:
        """Apply every record; returns the numbers of the damaged lines, which are skipped (a
        journal only spares recomputation: without a record, a node runs again). A torn last line,
        what a kill mid-write leaves, is skipped without a word."""
        damaged = []
        with open(self.path, "rb") as fh:  # bytes: one bad byte costs its line, not the journal
            lines = fh.readlines()
        for number, raw in enumerate(lines, 1):
            try:
                self._apply(json.loads(raw.decode("utf-8")))
            except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
                if raw.endswith(b"\n") or number < len(lines):
                    damaged.append(number)
        return damaged

    def _apply(self, entry: dict) -> None:
        """One record, checked whole before it changes anything (ValueError, TypeError, KeyError if damaged)."""
        key, event = entry["key"], entry["event"]
        if not isinstance(key, str) or event not in EVENTS:
            raise ValueError(f"not a journal record: {entry!r}")
        if event == "interrupted":  # about the run, not a node
            return
        if event == "started":
            self.records[key] = NodeRecord(chain=_text(entry["chain"]))
            return
        if event == "forgotten":
            self.records.pop(key, None)
            return
        if event == "done":
            chain = _text(entry["chain"])
            reads = {_text(path): (int(size), int(mtime)) for path, (size, mtime) in entry.get("reads", {}).items()}
            rec = self.records.setdefault(key, NodeRecord())
            rec.chain, rec.done, rec.reads = chain, True, reads
        elif event == "committed":
            files = {_text(dst): (int(size), int(mtime)) for dst, size, mtime in entry["files"]}
            rec = self.records.setdefault(key, NodeRecord())
            rec.flushed = True
            rec.committed.update(files)
        elif event == "evicted":
            self.records.setdefault(key, NodeRecord()).evicted = True
        elif event == "packed":
            name, size, mtime_ns = _text(entry["pack"]), int(entry["size"]), int(entry["mtime_ns"])
            if "/" in name or name.startswith("."):
                raise ValueError(f"not a pack's name: {name!r}")
            needs = tuple(_text(n) for n in entry.get("needs", ()))
            rec = self.records.setdefault(key, NodeRecord())
            rec.pack, rec.needs = (name, size, mtime_ns), needs
        elif event == "dropped":
            rec = self.records.get(key)
            if rec is not None:
                rec.pack = None
        elif event == "checkpointed":
            checkpoint, needs = int(entry["mtime_ns"]), tuple(_text(n) for n in entry.get("needs", ()))
            rec = self.records.setdefault(key, NodeRecord())
            rec.checkpoint, rec.needs = checkpoint, needs

    def get(self, key: str) -> NodeRecord | None:
        return self.records.get(key)

    def write(self, event: str, key: str, **data: object) -> None:
        entry = {"event": event, "key": key, **data}
        with self._lock:
            if event == "interrupted":
                self.stopped = entry
            self._apply(entry)
            line = json.dumps(entry, sort_keys=True) + "\n"
            self.bytes += len(line)
            self._lines.put(line)

    def close(self, compact: bool = True) -> None:
        """Rewrite the journal as one record per node (so it does not grow with every rerun);
        ``compact=False``: only close it (its directory is gone)."""
        with self._lock:
            if self._file.closed:
                return
            self._lines.put(None)
            self._writer.join()
            try:
                self._file.close()
                if compact and not self._refused:
                    self._compact()
            except OSError as exc:  # the home refuses writes (full, read-only, failing): what is written stays
                if not self._refused:
                    logger.warning("[Sea] the journal %s could not be written to its end (%s): a rerun recomputes what it does not record", self.path, exc.strerror or exc)
                with contextlib.suppress(OSError):
                    self.path.with_name(self.path.name + ".tmp").unlink(missing_ok=True)

    def current_path(self) -> Path | None:
        """Where the journal file is now, if it was moved with its directory (``None``: removed)."""
        try:
            where = os.readlink(f"/proc/self/fd/{self._file.fileno()}")
        except (OSError, ValueError):  # closed, or no /proc
            return None
        return None if where.endswith(" (deleted)") else Path(where)

    def _compact(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            for key, rec in sorted(self.records.items()):
                for entry in _entries(key, rec):
                    fh.write(json.dumps(entry, sort_keys=True) + "\n")
            if self.stopped is not None:
                fh.write(json.dumps(self.stopped, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{value!r} is not a string")
    return value


def _entries(key: str, rec: NodeRecord) -> list[dict]:
    entries = [{"event": "started", "key": key, "chain": rec.chain}]
    if rec.done:
        entries.append({"event": "done", "key": key, "chain": rec.chain, **({"reads": {p: list(f) for p, f in rec.reads.items()}} if rec.reads else {})})
    if rec.flushed:
        entries.append({"event": "committed", "key": key, "files": [[d, s, m] for d, (s, m) in sorted(rec.committed.items())]})
    if rec.evicted:
        entries.append({"event": "evicted", "key": key})
    if rec.checkpoint is not None:
        entries.append({"event": "checkpointed", "key": key, "mtime_ns": rec.checkpoint, "needs": list(rec.needs)})
    if rec.pack is not None:
        name, size, mtime_ns = rec.pack
        entries.append({"event": "packed", "key": key, "pack": name, "size": size, "mtime_ns": mtime_ns, "needs": list(rec.needs)})
    return entries
