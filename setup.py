"""Only here to ship two files setup.cfg cannot place (metadata lives in setup.cfg).

- ``sea_workflows.pth`` registers the plugin name ``SeaMultiProc`` with Nipype at interpreter start,
  so ``workflow.run(plugin='SeaMultiProc')`` works without importing nipype_sea first; it must sit at
  the top of site-packages.
- ``pydra/workers/sea.py`` makes ``Submitter(worker="sea")`` work: Pydra finds its workers as
  modules of its ``pydra.workers`` namespace package. We ship that one module, not the package.
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithPth(build_py):
    def run(self):
        super().run()
        self.copy_file("sea_workflows.pth", os.path.join(self.build_lib, "sea_workflows.pth"), preserve_mode=False)
        self.mkpath(os.path.join(self.build_lib, "pydra", "workers"))
        worker = os.path.join("pydra", "workers", "sea.py")
        self.copy_file(worker, os.path.join(self.build_lib, worker), preserve_mode=False)


setup(cmdclass={"build_py": BuildPyWithPth})
