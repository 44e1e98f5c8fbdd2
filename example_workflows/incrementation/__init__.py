"""The seeds' incrementation application (Algorithm 1) as a Nipype workflow."""

from .workflow import build_workflow, make_chunks

__all__ = ["build_workflow", "make_chunks"]
