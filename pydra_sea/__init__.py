"""Sea for Pydra 1.0: ``Submitter(worker="sea", cache_root=..., sea={...})``."""

from .worker import SeaWorker

__all__ = ["SeaWorker"]
