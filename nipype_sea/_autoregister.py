"""Make ``workflow.run(plugin='SeaMultiProc')`` work without importing nipype_sea first, and a
mistyped Sea plugin or worker name end in one line naming the right one.

Nipype resolves a plugin name as the attribute ``<name>Plugin`` of ``nipype.pipeline.plugins``.
The distribution installs ``sea_workflows.pth``, which calls :func:`install` at interpreter start:
it imports nothing from Nipype or Pydra, it only arranges that when ``nipype.pipeline.plugins`` is
imported, the module gains a PEP 562 ``__getattr__`` that loads Sea's plugins on first use (and
says which one a name like ``SeaMultiproc`` meant), and that when ``pydra.workers.base`` is, its
``Worker.plugin`` says that a name like ``"Sea"`` meant ``"sea"``. Other names are the engines'.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import importlib.abc
import sys

TARGET = "nipype.pipeline.plugins"
PYDRA_TARGET = "pydra.workers.base"
PROVIDED = {"SeaMultiProcPlugin": "nipype_sea.plugin", "SeaDaskPlugin": "nipype_sea.dask_plugin"}


def _meant(name: str, names: list[str]) -> str | None:
    """The Sea name a mistyped ``name`` (one that says "sea", in any case) meant, if one is close."""
    if "sea" not in name.lower():
        return None
    same = [n for n in names if n.lower() == name.lower()]
    return (same or difflib.get_close_matches(name, names, n=1, cutoff=0.6) or [None])[0]


def _one_line(message: str, like: type[Exception]) -> Exception:
    """An error that ends the script in ``message`` alone (:func:`sea.console.one_line_errors`),
    and is still the ``like`` the engine's callers may catch."""
    from sea import console
    from sea.config import SeaConfigError

    console.one_line_errors()
    return type("SeaNameError", (SeaConfigError, like), {})(message)


def _module_getattr(name: str):
    if name in PROVIDED:
        return getattr(importlib.import_module(PROVIDED[name]), name)
    meant = _meant(name, list(PROVIDED))
    if meant is not None and name.endswith("Plugin"):
        raise _one_line(f"Nipype has no plugin {name[: -len('Plugin')]!r}: Sea's is {meant[: -len('Plugin')]!r}", AttributeError)
    raise AttributeError(f"module {TARGET!r} has no attribute {name!r}")


def attach(module) -> None:
    if "__getattr__" not in vars(module):
        module.__getattr__ = _module_getattr


def attach_pydra(module) -> None:
    """Pydra's ``Worker.plugin(name)`` (what ``Submitter(worker=name)`` calls), saying which name a
    mistyped Sea worker name meant."""
    worker = getattr(module, "Worker", None)
    lookup = getattr(worker, "plugin", None)
    if lookup is None or getattr(lookup, "sea", False):
        return

    @functools.wraps(lookup)
    def plugin(name):
        try:
            return lookup(name)
        except ValueError:
            if isinstance(name, str) and _meant(name, ["sea"]) is not None:
                raise _one_line(f"Pydra has no worker {name!r}: Sea's is 'sea' (Submitter(worker=\"sea\", ...))", ValueError) from None
            raise

    plugin.sea = True
    worker.plugin = staticmethod(plugin)


ATTACH = {TARGET: attach, PYDRA_TARGET: attach_pydra}


class _AttachingLoader(importlib.abc.Loader):
    def __init__(self, inner):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        ATTACH[module.__name__](module)

    def __getattr__(self, name):
        return getattr(self._inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in ATTACH:
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
        for name, attach_to in ATTACH.items():
            if name in sys.modules:
                attach_to(sys.modules[name])
        if not all(name in sys.modules for name in ATTACH) and not any(isinstance(f, _Finder) for f in sys.meta_path):
            sys.meta_path.insert(0, _Finder())
    except Exception:  # noqa: BLE001
        pass
