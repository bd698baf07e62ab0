"""Every environment variable amp-rewrite reads, by name, and how a switch is spelled.

The package reads the environment at three entry points only, each once into a
frozen value that everything after it is given:

- :meth:`amp_rewrite.Config.from_env`: a rewrite's configuration (TensorFlow's
  ``TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_*`` variables, the dump directory,
  the self-checks, the timing cache); the CLI and :func:`amp_rewrite.rewrite`
  without a ``config`` use it;
- :meth:`amp_rewrite.runtime.settings.RuntimeSettings.from_env`: the runtime's
  switches, read when the runtime is enabled.
- :func:`amp_rewrite.function`: its strict switch, read when it is called.

The start-up bootstrap (``_amp_rewrite_autoload`` and the ``.pth`` line that
loads it) runs when the interpreter starts, before TensorFlow, and must not
import this package; it keeps its own copy of :data:`ENABLE_ENVS` and
:data:`TRUE_VALUES`, which a test holds equal to these.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

TRUE_VALUES = ("1", "true", "yes", "on")
FALSE_VALUES = ("0", "false", "no", "off")

# The switch, and NVIDIA's name for it.
ENABLE_ENVS = ("ENABLE_AUTO_MP", "TF_ENABLE_AUTO_MIXED_PRECISION")

# TensorFlow's own variables: LEVEL, LOG_PATH, the list edits (ALLOWLIST_ADD, ...).
TF_PREFIX = "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_"
LEVEL_ENV = TF_PREFIX + "LEVEL"
TF_LOG_PATH_ENV = TF_PREFIX + "LOG_PATH"
EMULATE_FP16_ENV = TF_PREFIX + "EMULATE_FP16"
DENYLIST_ADD_ENV = TF_PREFIX + "DENYLIST_ADD"

# The pass.
DUMP_DIR_ENV = "AMP_REWRITE_DUMP_DIR"
CHECK_ENV = "AMP_REWRITE_CHECK"
STRICT_ENV = "AMP_REWRITE_STRICT"
TUNE_CACHE_ENV = "AMP_REWRITE_TUNE_CACHE"

# The runtime.
TARGET_ENV = "AMP_REWRITE_TARGET"
LOSS_SCALE_ENV = "AMP_LOSS_SCALE"
LOSS_SCALE_INIT_ENV = "AMP_LOSS_SCALE_INIT"
GROWTH_INTERVAL_ENV = "AMP_LOSS_SCALE_GROWTH_INTERVAL"
LOG_EVERY_ENV = "AMP_LOSS_SCALE_LOG_STEPS"
GROUPED_ENV = "AMP_LOSS_SCALE_GROUPED"
FIND_OVERFLOW_ENV = "AMP_REWRITE_FIND_OVERFLOW"
PROFILE_ENV = "AMP_REWRITE_PROFILE"
KEEP_FLOAT32_ENV = "AMP_REWRITE_KEEP_FLOAT32"
TUNE_ENV = "AMP_REWRITE_TUNE"
PEER_WAIT_ENV = "AMP_REWRITE_PEER_WAIT"

NAMES = (*ENABLE_ENVS, DUMP_DIR_ENV, CHECK_ENV, STRICT_ENV, TUNE_CACHE_ENV, TARGET_ENV, LOSS_SCALE_ENV,
         LOSS_SCALE_INIT_ENV, GROWTH_INTERVAL_ENV, LOG_EVERY_ENV, GROUPED_ENV, FIND_OVERFLOW_ENV, PROFILE_ENV,
         KEEP_FLOAT32_ENV, TUNE_ENV, PEER_WAIT_ENV)


def is_true(value: str | None) -> bool:
    """Whether a variable's value switches something on (``1``, ``true``, ``yes``, ``on``; any case)."""
    return (value or "").strip().lower() in TRUE_VALUES


def is_false(value: str | None) -> bool:
    """Whether a variable's value switches something off (``0``, ``false``, ``no``, ``off``; any case).

    Unset or empty is neither: a switch that is on by default stays on.
    """
    return (value or "").strip().lower() in FALSE_VALUES


def any_true(environ: Mapping[str, str], names: Iterable[str]) -> bool:
    """Whether any of ``names`` is set to a true value in ``environ``."""
    return any(is_true(environ.get(name)) for name in names)


def read_by_package(environ: Mapping[str, str]) -> list[str]:
    """The variables set in ``environ`` that amp-rewrite reads (so a test can start without them)."""
    return sorted(name for name in environ if name in NAMES or name.startswith(TF_PREFIX))
