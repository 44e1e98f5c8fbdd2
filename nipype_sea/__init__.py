"""Sea for Nipype: ``workflow.run(plugin='SeaMultiProc', plugin_args={'sea': ...})``.

Importing this package does not import Nipype (it is imported at interpreter start by the
distribution's ``.pth`` file to register the plugin name); the plugin class loads on first use.
"""

from ._autoregister import install

install()


def __getattr__(name: str):
    if name == "SeaMultiProcPlugin":
        from .plugin import SeaMultiProcPlugin

        return SeaMultiProcPlugin
    if name == "SeaDaskPlugin":
        from .dask_plugin import SeaDaskPlugin

        return SeaDaskPlugin
    raise AttributeError(f"module 'nipype_sea' has no attribute {name!r}")


__all__ = ["SeaDaskPlugin", "SeaMultiProcPlugin"]
