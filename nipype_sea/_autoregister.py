"""Make ``workflow.run(plugin='SeaMultiProc')`` work without importing nipype_sea first.

Nipype resolves a plugin name as the attribute ``<name>Plugin`` of ``nipype.pipeline.plugins``.
The distribution installs ``sea_workflows.pth``, which calls :func:`install` at interpreter start:
it imports nothing from Nipype, it only arranges that when ``nipype.pipeline.plugins`` is imported,
the module gains a PEP 562 ``__getattr__`` that loads Sea's plugins on first use.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys

TARGET = "nipype.pipeline.plugins"
PROVIDED = {"SeaMultiProcPlugin": "nipype_sea.plugin", "SeaDaskPlugin": "nipype_sea.dask_plugin"}


def _module_getattr(name: str):
    if name in PROVIDED:
        return getattr(importlib.import_module(PROVIDED[name]), name)
    raise AttributeError(f"module {TARGET!r} has no attribute {name!r}")


def attach(module) -> None:
    if "__getattr__" not in vars(module):
        module.__getattr__ = _module_getattr


class _AttachingLoader(importlib.abc.Loader):
    def __init__(self, inner):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        attach(module)

    def __getattr__(self, name):
        return getattr(self._inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _AttachingLoader(spec.loader)
                return spec
        return None


def install() -> None:
    """Idempotent; never raises (it runs at every interpreter start)."""
    try:
        if TARGET in sys.modules:
            attach(sys.modules[TARGET])
        elif not any(isinstance(f, _Finder) for f in sys.meta_path):
            sys.meta_path.insert(0, _Finder())
    except Exception:  # noqa: BLE001
        pass
