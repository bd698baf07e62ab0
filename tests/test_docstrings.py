"""Each package's docstring names every module of its package, so its map of the folder stays whole.

Read from the installed package's source (nothing imported): a module is a
``.py`` file or a folder with an ``__init__.py``; ``__init__`` and
``__main__`` are the package itself. A module counts as named when its
dotted name (``amp_rewrite.paint.rules``, as a ``:mod:`` reference writes
it) stands alone in the docstring, not only as the start of a longer one.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(importlib.util.find_spec("amp_rewrite").origin).parent


def packages() -> dict[str, Path]:
    """Every package of the installed amp_rewrite, by dotted name, with its folder."""
    found = {}
    for init in sorted(ROOT.rglob("__init__.py")):
        folder = init.parent
        found[".".join(("amp_rewrite", *folder.relative_to(ROOT).parts))] = folder
    return found


def modules(folder: Path) -> list[str]:
    """The names of a package's modules and subpackages."""
    files = [p.stem for p in folder.glob("*.py") if not (p.stem.startswith("__") and p.stem.endswith("__"))]
    folders = [p.name for p in folder.iterdir() if (p / "__init__.py").is_file()]
    return sorted(files + folders)


def unnamed(package: str, folder: Path) -> list[str]:
    docstring = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
    return [name for name in modules(folder)
            if not re.search(re.escape(f"{package}.{name}") + r"(?!\.?\w)", docstring)]


def test_the_walk_finds_the_packages_and_their_modules():
    found = packages()
    assert {"amp_rewrite", "amp_rewrite.paint", "amp_rewrite.runtime.tf1.session"} <= set(found)
    assert {"rules", "read_outs", "normalization"} <= set(modules(found["amp_rewrite.paint"]))
    assert {"cli", "pipeline"} <= set(modules(found["amp_rewrite"]))
    assert "__main__" not in modules(found["amp_rewrite"])


@pytest.mark.parametrize("package", sorted(packages()))
def test_the_package_docstring_names_every_module(package):
    missing = unnamed(package, packages()[package])
    assert not missing, f"{package}'s docstring does not name {', '.join(f'{package}.{m}' for m in missing)}"
