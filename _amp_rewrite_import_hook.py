"""Run code around or after the import of one module, whenever the script imports it.

The one place amp-rewrite touches ``sys.meta_path``. Three users share it:
the start-up bootstrap (``_amp_rewrite_autoload``) enables the runtime once
the script's ``import tensorflow`` finishes; :func:`amp_rewrite.enable`,
called before that import, applies its patches then; and the CLI keeps the
banner TensorFlow's C++ code prints while it loads away from its users.

It is a top-level module that imports nothing but the standard library, so
the bootstrap can load it at interpreter start without importing the
``amp_rewrite`` package (and so this module imports neither of its users).

A :class:`PostImportFinder` finds nothing itself: it asks the finders after
it in ``sys.meta_path`` for the real spec and wraps that spec's loader. It
fires at most once and then removes itself; the module gets its real loader
back before anything else looks at it. Finders of different owners stack:
each wraps what the ones after it return.

A callback that fails while the script imports the module never breaks that
import: one line on stderr names the module and the reason, and the script
runs unchanged, unless the callback's owner is in strict mode (then the
import raises).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from typing import Any

WATCHED_MODULE = "tensorflow"

# Who installed a finder: each user removes only its own.
STARTUP = "start-up"
RUNTIME = "runtime"
CLI = "cli"


class _WrappingLoader:
    """Runs the real loader inside ``around()``, then ``after(module)`` once it has executed."""

    def __init__(self, loader, finder: PostImportFinder):
        self._loader = loader
        self._finder = finder

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        with self._finder.around():
            self._loader.exec_module(module)
        if self._finder.after is None:
            return
        try:
            self._finder.after(module)
        except Exception as exc:
            if self._finder.is_strict():
                raise  # strict mode promised to raise rather than run in float32
            reason = str(exc) if type(exc).__module__.startswith("amp_rewrite") else repr(exc)
            print(f"amp-rewrite: not enabled, patching {module.__name__} failed: {reason}", file=sys.stderr)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class PostImportFinder:
    """A meta-path finder that wraps the import of module ``name``.

    Attributes:
        name: the module watched.
        after: called with the module once it has executed (None: nothing).
        around: a context-manager factory the module executes inside.
        owner: who installed it, so that owner can remove its own finders.
        is_strict: whether a failure of ``after`` raises into the import
            instead of being reported in one line.
    """

    def __init__(self, name: str, *, after: Callable[[Any], None] | None = None,
                 around: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
                 owner: str = "", is_strict: Callable[[], bool] = lambda: False):
        self.name = name
        self.after = after
        self.around = around
        self.owner = owner
        self.is_strict = is_strict

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        spec = _find_spec_after(self, fullname, path, target)
        self.uninstall()
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _WrappingLoader(spec.loader, self)
        return spec

    def uninstall(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)


def _find_spec_after(finder, fullname, path, target):
    """The spec the finders after ``finder`` in ``sys.meta_path`` give (all of them when it is not there)."""
    finders = sys.meta_path[sys.meta_path.index(finder) + 1:] if finder in sys.meta_path else list(sys.meta_path)
    for other in finders:
        find = getattr(other, "find_spec", None)
        if other is finder or find is None:
            continue
        spec = find(fullname, path, target)
        if spec is not None:
            return spec
    return None


def after_import(callback: Callable[[Any], None], *, owner: str, name: str = WATCHED_MODULE,
                 is_strict: Callable[[], bool] = lambda: False) -> PostImportFinder | None:
    """Calls ``callback(module)`` once ``name`` is imported; at once (raising what it raises) if it already is.

    Returns the installed :class:`PostImportFinder`, or None when the module was
    already imported. Installing again for the same owner replaces its earlier finder.
    """
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return None
    remove(owner=owner, name=name)
    finder = PostImportFinder(name, after=callback, owner=owner, is_strict=is_strict)
    sys.meta_path.insert(0, finder)
    return finder


def around_import(around: Callable[[], contextlib.AbstractContextManager], *, owner: str,
                  name: str = WATCHED_MODULE) -> PostImportFinder | None:
    """Makes the first import of ``name`` execute inside ``around()``; nothing if it is imported or pending."""
    if name in sys.modules or pending(owner=owner, name=name):
        return None
    finder = PostImportFinder(name, around=around, owner=owner)
    sys.meta_path.insert(0, finder)
    return finder


def pending(*, owner: str, name: str = WATCHED_MODULE) -> list[PostImportFinder]:
    """The finders of ``owner`` still waiting for ``name``."""
    return [f for f in sys.meta_path if isinstance(f, PostImportFinder) and f.owner == owner and f.name == name]


def remove(*, owner: str, name: str = WATCHED_MODULE) -> None:
    """Removes every pending finder ``owner`` installed for ``name``."""
    for finder in pending(owner=owner, name=name):
        finder.uninstall()
