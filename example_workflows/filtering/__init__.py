"""A compute-bound pipeline: spatial smoothing, temporal filtering and scaling of 4D images."""

from .workflow import build_workflow, make_images

__all__ = ["build_workflow", "make_images"]
