"""Start-up bootstrap of amp-rewrite's ``ENABLE_AUTO_MP`` switch.

Installed as a top-level module next to ``amp_rewrite_autoload.pth`` (and the
PEP 829 ``amp_rewrite_autoload.start``), so that loading it does not import the
``amp_rewrite`` package. Guarantees:

- The ``.pth`` line reads ``ENABLE_AUTO_MP`` and ``TF_ENABLE_AUTO_MIXED_PRECISION``
  itself and imports this module only when one of them is ``1``/``true``: an
  unset variable costs no import at start-up.
- When enabled, :func:`activate_from_env` adds one finder to ``sys.meta_path``.
  It imports nothing else; ``amp_rewrite.runtime`` is imported, and the
  patches applied, right after the script's ``import tensorflow`` finishes.
- Nothing here ever raises into the interpreter's start-up or into the
  script's ``import tensorflow``: a failure is reported on stderr and the
  script runs unchanged.
"""

from __future__ import annotations

import os
import sys

ENV_NAMES = ("ENABLE_AUTO_MP", "TF_ENABLE_AUTO_MIXED_PRECISION")
TRUE_VALUES = ("1", "true", "yes", "on")
WATCHED_MODULE = "tensorflow"


def is_requested(environ=None) -> bool:
    """Whether ``ENABLE_AUTO_MP`` (or NVIDIA's alias) asks for mixed precision."""
    environ = os.environ if environ is None else environ
    return any(environ.get(name, "").strip().lower() in TRUE_VALUES for name in ENV_NAMES)


def activate_from_env() -> None:
    """The start-up entry point: arm the import hook when the variable asks for it."""
    if not is_requested():
        return
    try:
        install_post_import_hook(_enable_runtime_from_env)
    except Exception as exc:  # start-up must never fail because of us
        print(f"amp-rewrite: could not install the import hook: {exc!r}", file=sys.stderr)


def _enable_runtime_from_env(module) -> None:
    from amp_rewrite import runtime

    runtime.enable(from_env=True)


class _NotifyingLoader:
    """Wraps the real loader of the watched module; calls back once it has executed."""

    def __init__(self, loader, callback):
        self._loader = loader
        self._callback = callback

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        # Hand the module back its real loader before anyone else looks at it.
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        try:
            self._callback(module)
        except Exception as exc:
            if os.environ.get("AMP_REWRITE_STRICT", "").strip().lower() in TRUE_VALUES:
                raise  # strict mode promised to raise rather than run in float32
            reason = str(exc) if type(exc).__module__.startswith("amp_rewrite") else repr(exc)
            print(f"amp-rewrite: not enabled, patching {module.__name__} failed: {reason}",
                  file=sys.stderr)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class PostImportFinder:
    """A meta-path finder that runs ``callback(module)`` after ``WATCHED_MODULE`` executes.

    It finds nothing itself: it asks the finders after it for the real spec and
    wraps that spec's loader. It fires at most once and then removes itself.
    """

    def __init__(self, callback, name: str = WATCHED_MODULE):
        self.callback = callback
        self.name = name

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        self.uninstall()
        spec = _find_spec_after(self, fullname, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _NotifyingLoader(spec.loader, self.callback)
        return spec

    def uninstall(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)


def _find_spec_after(finder, fullname, path, target):
    for other in list(sys.meta_path):
        if other is finder or not hasattr(other, "find_spec"):
            continue
        spec = other.find_spec(fullname, path, target)
        if spec is not None:
            return spec
    return None


def install_post_import_hook(callback, name: str = WATCHED_MODULE):
    """Calls ``callback(module)`` once ``name`` is imported; at once if it already is.

    Returns the installed :class:`PostImportFinder`, or None when the module was
    already imported. Installing again replaces an earlier finder of this module.
    """
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return None
    remove_post_import_hooks(name)
    finder = PostImportFinder(callback, name)
    sys.meta_path.insert(0, finder)
    return finder


def remove_post_import_hooks(name: str = WATCHED_MODULE) -> None:
    """Removes every pending finder of this module installed here."""
    for finder in [f for f in sys.meta_path if isinstance(f, PostImportFinder) and f.name == name]:
        finder.uninstall()
