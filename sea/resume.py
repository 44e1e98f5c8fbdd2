"""Which nodes a rerun may skip.

Nipype and Pydra decide "cached" by re-hashing a node's inputs, which needs its input files; Sea
evicts intermediates, so that check cannot work for a node whose producer was evicted. The journal
records each finished node's chain hash (its own inputs and code, chained with everything
upstream). A node is skipped when the journal says it finished with the same chain hash, its
committed outputs are still at home, and every consumer is skipped too: a consumer that must run
needs its producer's data, which may be gone, so the producer runs again.
"""

from __future__ import annotations

import os
from pathlib import Path

from .graph import WorkflowGraph
from .journal import Journal, NodeRecord


def plan_skips(graph: WorkflowGraph, journal: Journal, home: Path) -> set[str]:
    """The keys of nodes whose work is complete and that no running node will need."""
    skip: set[str] = set()
    for key in reversed(graph.topological()):
        record = journal.get(key)
        if record is None or not _complete(record, graph, key, home / key):
            continue
        if all(consumer in skip for consumer in graph.consumers(key)):
            skip.add(key)
    return skip


def _complete(record: NodeRecord, graph: WorkflowGraph, key: str, logical: Path) -> bool:
    spec = graph.nodes[key]
    if not record.done or record.chain != graph.chain(key):
        return False
    if spec.sink_destination is not None and not record.flushed:
        return False
    for dst, (size, mtime_ns) in record.committed.items():
        try:
            st = os.lstat(dst)
        except FileNotFoundError:
            return False
        if st.st_size != size or st.st_mtime_ns != mtime_ns:
            return False
    if record.evicted or (not graph.consumers(key) and not spec.persist_dir):
        return True  # its directory is gone, or nobody will read it
    # its directory must be a real one at home (a link into an old tier is stale)
    return logical.is_dir() and not logical.is_symlink()
