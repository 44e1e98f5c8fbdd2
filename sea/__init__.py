"""Sea for workflows: node working directories on fast node-local storage, outputs staged home.

The core is framework-neutral: it imports nothing from Nipype or Pydra. Adapters (``nipype_sea``,
``pydra_sea``) translate their engine's graph and callbacks into :class:`SeaEngine` calls.
``__version__`` is the installed distribution's (one source: ``setup.cfg``).
"""

import importlib.metadata as _metadata

from .config import Mode, Rule, SeaConfig, SeaConfigError, TierSpec
from .console import SeaError
from .engine import Placement, SeaEngine, SeaFlushError, SeaHomeMoved
from .graph import NodeSpec, WorkflowGraph
from .private import SeaTierSwapped
from .report import RunReport

try:
    __version__ = _metadata.version("sea-workflows")
except _metadata.PackageNotFoundError:  # run from a checkout that is not installed
    __version__ = "0+unknown"

__all__ = [
    "Mode",
    "NodeSpec",
    "Placement",
    "Rule",
    "RunReport",
    "SeaConfig",
    "SeaConfigError",
    "SeaEngine",
    "SeaError",
    "SeaFlushError",
    "SeaHomeMoved",
    "SeaTierSwapped",
    "TierSpec",
    "WorkflowGraph",
]
