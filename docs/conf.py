"""Sphinx configuration: the documentation is Markdown (MyST), built warning-free by
``tests/test_docs.py`` (``python -m sphinx -W -b html docs docs/_build/html``)."""

project = "Sea for workflows"
author = "Sea for workflows developers"
extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
myst_heading_anchors = 3  # links such as pydra.md#on-several-machines-dask
exclude_patterns = ["_build"]
html_theme = "alabaster"
