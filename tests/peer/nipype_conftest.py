"""conftest.py of the copied Nipype suite (written there by ``nipype_suite.py``; not collected here).

Nipype's own conftest (its fixtures and the temporary directory it sets up) is imported from the
installed package. With ``SEA_PEER=SeaMultiProc`` every ``Workflow.run`` that would use MultiProc,
Linear or the default plugin (Linear) runs under SeaMultiProc instead, with the same ``plugin_args``
and one tier; with ``SEA_PEER=MultiProc``, under MultiProc (the baseline Sea is held to: a test that
reads what nodes did to its own process needs Linear's single process).
"""

import json
import os
import shutil
import tempfile

from nipype import conftest as _nipype
from nipype.conftest import _docdir, add_np, legacy_printoptions, pytest_configure  # noqa: F401
from nipype.pipeline.engine.workflows import Workflow

SWAPPED = {"Linear", "MultiProc"}
# Tests skipped upstream on Python >= 3.8 that run a workflow: run here too (under both plugins)
UNSKIP = {"test_run_multiproc", "test_hold_job_until_procs_available"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.originalname in UNSKIP:
            item.own_markers = [mark for mark in item.own_markers if mark.name != "skipif"]


PLUGIN = os.environ.get("SEA_PEER")
_tier = None


def pytest_unconfigure(config):
    _nipype.pytest_unconfigure(config)
    if _tier is not None:
        shutil.rmtree(_tier, ignore_errors=True)


if PLUGIN in ("MultiProc", "SeaMultiProc"):
    _tier = tempfile.mkdtemp(prefix="sea-peer-tier-", dir="/dev/shm")
    _run = Workflow.run

    def run(self, plugin=None, plugin_args=None, updatehash=False):
        if plugin is None:
            from nipype import config

            plugin = config.get("execution", "plugin")
        if plugin in SWAPPED:
            args = {key: value for key, value in (plugin_args or {}).items() if key != "sea"}
            if PLUGIN == "SeaMultiProc":
                args["sea"] = {"tiers": [{"path": _tier}], **json.loads(os.environ.get("SEA_PEER_CONFIG", "{}"))}
            plugin, plugin_args = PLUGIN, args
            # MultiProc sleeps 2 s between rounds by default: the same shorter poll for both
            self.config.setdefault("execution", {})["poll_sleep_duration"] = 0.05
        return _run(self, plugin=plugin, plugin_args=plugin_args, updatehash=updatehash)

    Workflow.run = run

