"""Pydra finds its workers as modules of the ``pydra.workers`` namespace package: this one makes
``Submitter(worker="sea", ...)`` work once sea-workflows is installed. It only re-exports."""

from pydra_sea.worker import SeaWorker as Worker

__all__ = ["Worker"]
