"""Only here to ship ``sea_workflows.pth`` (metadata lives in setup.cfg).

The .pth file registers the plugin name ``SeaMultiProc`` with Nipype at interpreter start, so
``workflow.run(plugin='SeaMultiProc')`` works without importing nipype_sea first. setup.cfg alone
cannot place a file at the top of site-packages.
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithPth(build_py):
    def run(self):
        super().run()
        self.copy_file("sea_workflows.pth", os.path.join(self.build_lib, "sea_workflows.pth"), preserve_mode=False)


setup(cmdclass={"build_py": BuildPyWithPth})
