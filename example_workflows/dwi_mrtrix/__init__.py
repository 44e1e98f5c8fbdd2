"""A diffusion MRI pipeline on the MRtrix3 command-line tools (Debian's ``mrtrix3``) through Nipype's
``nipype.interfaces.mrtrix3``, on simulated multi-shell DWI in BIDS layout."""

from .data import make_dataset
from .workflow import TOOLS, build_workflow

__all__ = ["TOOLS", "build_workflow", "make_dataset"]
