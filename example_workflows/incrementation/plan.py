"""``sea plan example_workflows.incrementation.plan:workflow``: the demo's workflow, not run.

The sizes are those of ``python -m example_workflows.incrementation --root /tmp/sea-demo`` (the README's); set
``SEA_DEMO_ROOT`` to plan another root.
"""

from __future__ import annotations

import os
from pathlib import Path

from .workflow import build_workflow, make_chunks


def workflow():
    root = Path(os.environ.get("SEA_DEMO_ROOT", "/tmp/sea-demo")).resolve()
    chunks, chunk_mib, iterations = 4, 8, 3
    make_chunks(root / "data", chunks, chunk_mib)
    return build_workflow(root / "data", chunks, iterations, root / "work", root / "out")
