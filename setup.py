"""Installs the ENABLE_AUTO_MP start-up files into site-packages, and finds the packages.

Everything else is declared in pyproject.toml. Wheels get the ``.pth`` and
``.start`` files at their root (which is site-packages); editable installs
get them too, written beside the editable finder.

The packages are found, not listed: every folder under ``amp_rewrite/`` (a
data folder such as ``report/template`` too, so that its files install
without setuptools' warning about an unlisted importable folder), and the op
lists. Those live at the top of the repository (they are data, edited by
people) and install as ``amp_rewrite.lists``, one package per target's folder
for the same reason; pyproject.toml maps ``amp_rewrite.lists`` to ``lists/``.
This is here because pyproject.toml's ``packages.find`` walks folders under
their own names and cannot find a package whose folder is mapped elsewhere.
"""

import os

from setuptools import find_namespace_packages, setup
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


def packages() -> list[str]:
    """``amp_rewrite`` and every folder under it, then ``amp_rewrite.lists`` and a package per target's lists."""
    found = find_namespace_packages(HERE, include=["amp_rewrite", "amp_rewrite.*"], exclude=["*__pycache__"])
    lists = os.path.join(HERE, "lists")
    targets = sorted(name for name in os.listdir(lists) if os.path.isdir(os.path.join(lists, name)))
    return sorted(found) + ["amp_rewrite.lists", *(f"amp_rewrite.lists.{target}" for target in targets)]


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

setup(cmdclass=cmdclass, packages=packages())
