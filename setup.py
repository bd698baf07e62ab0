"""Installs the ENABLE_AUTO_MP start-up files into site-packages.

Everything else is declared in pyproject.toml. Wheels get the ``.pth`` and
``.start`` files at their root (which is site-packages); editable installs
get them too, written beside the editable finder.
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

STARTUP_FILES = ("amp_rewrite_autoload.pth", "amp_rewrite_autoload.start")
HERE = os.path.dirname(os.path.abspath(__file__))


def _copy_startup_files(command, directory):
    for name in STARTUP_FILES:
        command.copy_file(os.path.join(HERE, name), os.path.join(directory, name))


class BuildPyWithStartupFiles(build_py):
    """build_py that also puts the start-up files at the root of build_lib."""

    def run(self):
        super().run()
        if not getattr(self, "editable_mode", False):
            _copy_startup_files(self, self.build_lib)

    def get_outputs(self, *args, **kwargs):
        outputs = list(super().get_outputs(*args, **kwargs))
        if not getattr(self, "editable_mode", False):
            outputs += [os.path.join(self.build_lib, name) for name in STARTUP_FILES]
        return outputs


cmdclass = {"build_py": BuildPyWithStartupFiles}

try:
    from setuptools.command.editable_wheel import editable_wheel
except ImportError:  # setuptools without PEP 660 support
    editable_wheel = None

if editable_wheel is not None and hasattr(editable_wheel, "_install_namespaces"):

    class EditableWheelWithStartupFiles(editable_wheel):
        """editable_wheel that writes the start-up files into the wheel's root."""

        def _install_namespaces(self, installation_dir, pth_prefix):
            super()._install_namespaces(installation_dir, pth_prefix)
            _copy_startup_files(self, installation_dir)

    cmdclass["editable_wheel"] = EditableWheelWithStartupFiles

setup(cmdclass=cmdclass)
