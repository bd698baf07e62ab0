"""Start-up bootstrap of amp-rewrite's ``ENABLE_AUTO_MP`` switch.

Installed as a top-level module next to ``amp_rewrite_autoload.pth`` (and the
PEP 829 ``amp_rewrite_autoload.start``), so that loading it does not import the
``amp_rewrite`` package. Guarantees:

- The ``.pth`` line reads ``ENABLE_AUTO_MP`` and ``TF_ENABLE_AUTO_MIXED_PRECISION``
  itself and imports this module only when one of them is ``1``/``true``: an
  unset variable costs no import at start-up.
- When enabled, :func:`activate_from_env` adds one finder to ``sys.meta_path``
  (through ``_amp_rewrite_import_hook``, the other module loaded here). It
  imports nothing else; ``amp_rewrite.runtime`` is imported, and the patches
  applied, right after the script's ``import tensorflow`` finishes.
- :data:`ENV_NAMES`, :data:`TRUE_VALUES` and :data:`STRICT_ENV` repeat
  :mod:`amp_rewrite.environment`'s (a test holds them equal): importing that
  package here would cost every enabled script its import before TensorFlow's.
- Nothing here ever raises into the interpreter's start-up or into the
  script's ``import tensorflow``: a failure is reported on stderr and the
  script runs unchanged.
"""

from __future__ import annotations

import os
import sys

import _amp_rewrite_import_hook as import_hook

ENV_NAMES = ("ENABLE_AUTO_MP", "TF_ENABLE_AUTO_MIXED_PRECISION")
TRUE_VALUES = ("1", "true", "yes", "on")
STRICT_ENV = "AMP_REWRITE_STRICT"


def is_requested(environ=None) -> bool:
    """Whether ``ENABLE_AUTO_MP`` (or NVIDIA's alias) asks for mixed precision."""
    environ = os.environ if environ is None else environ
    return any(environ.get(name, "").strip().lower() in TRUE_VALUES for name in ENV_NAMES)


def activate_from_env() -> None:
    """The start-up entry point: arm the import hook when the variable asks for it."""
    if not is_requested():
        return
    try:
        # Under the start-up owner, which amp_rewrite.disable() removes before the import.
        import_hook.after_import(_enable_runtime_from_env, owner=import_hook.STARTUP, is_strict=_is_strict)
    except Exception as exc:  # start-up must never fail because of us
        print(f"amp-rewrite: could not install the import hook: {exc!r}", file=sys.stderr)


def _enable_runtime_from_env(module) -> None:
    from amp_rewrite import runtime

    runtime.enable(from_env=True)


def _is_strict() -> bool:
    return os.environ.get(STRICT_ENV, "").strip().lower() in TRUE_VALUES
