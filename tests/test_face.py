"""The package's face (``amp_rewrite/__init__.py``): every public name resolves, and importing it stays light."""

import importlib
import os
import subprocess
import sys

import pytest

import amp_rewrite


@pytest.mark.parametrize("name", amp_rewrite.__all__)
def test_every_public_name_resolves_to_its_home_modules_object(name):
    value = getattr(amp_rewrite, name)
    assert value is not None
    if name in amp_rewrite._LAZY:
        assert value is getattr(importlib.import_module(amp_rewrite._LAZY[name]), name)


def test_every_lazily_loaded_name_is_public_and_the_list_has_no_duplicate():
    assert set(amp_rewrite._LAZY) <= set(amp_rewrite.__all__)
    assert len(set(amp_rewrite.__all__)) == len(amp_rewrite.__all__)


def test_an_unknown_name_is_an_attribute_error_naming_it():
    with pytest.raises(AttributeError, match="'no_such_name'"):
        amp_rewrite.no_such_name  # noqa: B018 - the attribute access is what is tested


def test_importing_the_package_imports_neither_tensorflow_nor_numpy_nor_the_runtime():
    code = ("import sys\n"
            "import amp_rewrite\n"
            "heavy = ('tensorflow', 'numpy', 'amp_rewrite.runtime')\n"
            "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
            "amp_rewrite.Config, amp_rewrite.rewrite, amp_rewrite.__all__\n"
            "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
            "amp_rewrite.is_enabled\n"
            "print('amp_rewrite.runtime' in sys.modules)\n")
    environ = {k: v for k, v in os.environ.items() if k not in ("ENABLE_AUTO_MP", "TF_ENABLE_AUTO_MIXED_PRECISION")}
    done = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == ["[]", "[]", "True"]
