"""Many small files through one DataSink: per-region time series, one small text file per region."""

from .workflow import build_workflow, make_atlas

__all__ = ["build_workflow", "make_atlas"]
