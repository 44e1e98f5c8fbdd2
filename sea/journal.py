"""The run journal: what Sea did with each node, kept in the home so a rerun can resume.

An append-only JSON-lines file at ``<home>/.sea/journal.jsonl``. A record is written only after
the thing it states has happened (a node finished, its files committed home, its directory
evicted), so a lost record can only make a rerun redo work, never skip work that is missing.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class NodeRecord:
    chain: str = ""
    done: bool = False
    evicted: bool = False
    committed: dict[str, tuple[int, int]] = field(default_factory=dict)  # dst -> (size, mtime_ns)


class Journal:
    def __init__(self, path: Path):
        self.path = path
        self.records: dict[str, NodeRecord] = {}
        self._lock = threading.Lock()
        if path.exists():
            self._replay()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a", encoding="utf-8")

    def _replay(self) -> None:
        with open(self.path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a torn last line after a kill
                rec = self.records.setdefault(entry["key"], NodeRecord())
                event = entry["event"]
                if event == "started":
                    self.records[entry["key"]] = NodeRecord(chain=entry["chain"])
                elif event == "done":
                    rec.chain, rec.done = entry["chain"], True
                elif event == "committed":
                    rec.committed.update({dst: (size, mtime) for dst, size, mtime in entry["files"]})
                elif event == "evicted":
                    rec.evicted = True
                elif event == "forgotten":
                    del self.records[entry["key"]]

    def get(self, key: str) -> NodeRecord | None:
        return self.records.get(key)

    def write(self, event: str, key: str, **data: object) -> None:
        line = json.dumps({"event": event, "key": key, **data}, sort_keys=True)
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.flush()
                os.fsync(self._file.fileno())
                self._file.close()
