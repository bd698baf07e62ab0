"""What the ``ENABLE_AUTO_MP`` runtime reads from the environment.

Every variable (named in :mod:`amp_rewrite.environment`) is read once, when
the runtime is enabled, into one frozen :class:`RuntimeSettings`; the
runtime's rewrites take their :class:`amp_rewrite.Config` from it
(:meth:`RuntimeSettings.rewrite_fields`) on top of TensorFlow's
``TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_*`` variables, which
:meth:`amp_rewrite.Config.from_env` reads.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from amp_rewrite.environment import (
    DUMP_DIR_ENV,
    FIND_OVERFLOW_ENV,
    GROUPED_ENV,
    GROWTH_INTERVAL_ENV,
    KEEP_FLOAT32_ENV,
    LOG_EVERY_ENV,
    LOSS_SCALE_ENV,
    LOSS_SCALE_INIT_ENV,
    PEER_WAIT_ENV,
    PROFILE_ENV,
    STRICT_ENV,
    TARGET_ENV,
    TF_LOG_PATH_ENV,
    TUNE_CACHE_ENV,
    TUNE_ENV,
    is_false,
    is_true,
)
from amp_rewrite.errors import UsageError
from amp_rewrite.paint.keep_patterns import compile_patterns, split_env

TARGETS = ("auto", "float16", "bfloat16")
#: ``AMP_REWRITE_TUNE=again``: every step is measured again, and its verdict replaces the cached one.
TUNE_AGAIN = "again"
DEFAULT_PEER_WAIT = 10.0
MAX_PEER_WAIT = 86400.0  # a day: a longer wait is no different, and its milliseconds must fit an int64

DEFAULT_INITIAL_SCALE = 2.0 ** 15
DEFAULT_GROWTH_INTERVAL = 2000
DEFAULT_LOG_EVERY = 1000


# The scale is a float32 variable; the step counters are int64 but a larger
# interval than int32 allows never triggers anyway.
FLOAT32_MAX = float(np.finfo(np.float32).max)
INT32_MAX = 2 ** 31 - 1


def _is_float32(value: float) -> bool:
    """Whether ``value`` is finite as a float32 (1e39 is finite as a double but inf in float32)."""
    with np.errstate(over="ignore"):
        return math.isfinite(value) and bool(np.isfinite(np.float32(value)))


@dataclass(frozen=True)
class LossScaleSettings:
    """Dynamic (``is_dynamic``) or fixed loss scaling.

    Attributes:
        is_dynamic: grow and shrink the scale; a fixed scale never changes.
        initial_scale: the scale of the first step (the fixed scale when not dynamic).
        growth_interval: consecutive finite steps before the scale doubles.
        log_every: a log line every this many training steps (0: only on skips).
        is_asked: loss scaling was asked for by name (``AMP_LOSS_SCALE`` set),
            which turns it on under bfloat16 even with the default values.
        grouped: unscale and check the gradients joined into a few large
            tensors rather than one by one (True), or one by one (False);
            None: joined where TensorFlow sees a GPU. How the step computes
            what it computes: no part of what a worker shares, nor of
            whether the settings ask for scaling.
    """

    is_dynamic: bool = True
    initial_scale: float = DEFAULT_INITIAL_SCALE
    growth_interval: int = DEFAULT_GROWTH_INTERVAL
    log_every: int = DEFAULT_LOG_EVERY
    is_asked: bool = False
    grouped: bool | None = field(default=None, compare=False)

    def __post_init__(self):
        scale = self.initial_scale
        if not (isinstance(scale, (int, float)) and _is_float32(scale) and float(np.float32(scale)) > 0):
            raise UsageError(f"loss scale {scale!r}: must be a number > 0 that float32 can hold")
        for name, low in (("growth_interval", 1), ("log_every", 0)):
            value = getattr(self, name)
            if not (isinstance(value, int) and low <= value <= INT32_MAX):
                raise UsageError(f"{name} {value!r}: must be an integer from {low} to {INT32_MAX}")


@dataclass(frozen=True)
class RuntimeSettings:
    """The runtime's switches.

    Attributes:
        dump_dir: where to write each graph before and after its rewrite, or None.
        is_strict: raise instead of falling back to the float32 graph.
        loss_scale: the loss-scaling settings.
        is_finding_overflow: probe rewritten tf.functions for the first op whose
            half output is not finite.
        target: ``auto`` (chosen for the machine), ``float16`` or ``bfloat16``.
        profile_after: profile one step after this many steps of a session or
            a rewritten tf.function, then never again; None: never.
        keep_float32: name patterns of nodes every rewrite keeps float32
            (``AMP_REWRITE_KEEP_FLOAT32``, separated by ``;``).
        is_timing_steps: each rewritten ``tf.function`` alternates its first
            calls between its half and its float32 body and keeps the faster
            (:mod:`amp_rewrite.runtime.tf2.function_trial`); ``ENABLE_AUTO_MP``
            turns it on unless ``AMP_REWRITE_TUNE=0`` (``AMP_REWRITE_TUNE=1`` is
            the same as unset). Off by default here, so settings made in code
            rewrite by the lists alone.
        is_measuring_again: with step timing on, every step is tried again, whatever the tuning cache holds,
            and its new verdict replaces the cached one (``AMP_REWRITE_TUNE=again``).
        tune_cache_dir: where step times are kept (None: the user cache directory).
        is_loss_scaled: None: loss scaling as the target and loss-scale
            settings ask (:func:`amp_rewrite.runtime.settings.scales_loss`); True or
            False: as a multi-worker job decided for every worker.
        peer_wait_seconds: how long a worker of a multi-worker job waits for
            the other workers' settings (:mod:`amp_rewrite.runtime.multi_worker`).
    """

    dump_dir: str | None = None
    is_strict: bool = False
    loss_scale: LossScaleSettings = LossScaleSettings()
    is_finding_overflow: bool = False
    target: str = "auto"
    profile_after: int | None = None
    keep_float32: tuple[str, ...] = ()
    is_timing_steps: bool = False
    is_measuring_again: bool = False
    tune_cache_dir: str | None = None
    is_loss_scaled: bool | None = None
    peer_wait_seconds: float = DEFAULT_PEER_WAIT

    def __post_init__(self):
        if self.target not in TARGETS:
            raise UsageError(f"unknown target {self.target!r}; choose one of {', '.join(TARGETS)}")
        compile_patterns(self.keep_float32, source=KEEP_FLOAT32_ENV)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RuntimeSettings:
        """Reads the ``AMP_*`` variables; a malformed value raises :class:`UsageError`."""
        environ = os.environ if environ is None else environ
        dump_dir = environ.get(DUMP_DIR_ENV) or environ.get(TF_LOG_PATH_ENV) or None
        return cls(dump_dir=dump_dir, is_strict=is_true(environ.get(STRICT_ENV)),
                   loss_scale=_loss_scale_from_env(environ), target=_target_from_env(environ),
                   is_finding_overflow=is_true(environ.get(FIND_OVERFLOW_ENV)),
                   profile_after=_profile_from_env(environ),
                   keep_float32=split_env(environ.get(KEEP_FLOAT32_ENV, "")),
                   is_timing_steps=_tune_from_env(environ) != "off",
                   is_measuring_again=_tune_from_env(environ) == TUNE_AGAIN,
                   tune_cache_dir=environ.get(TUNE_CACHE_ENV) or None,
                   peer_wait_seconds=min(_number(environ, PEER_WAIT_ENV, float, DEFAULT_PEER_WAIT, minimum=0.1),
                                         MAX_PEER_WAIT))

    def rewrite_fields(self) -> dict:
        """The :class:`amp_rewrite.Config` fields these settings decide: name patterns and the timing cache."""
        return {"keep_float32_patterns": self.keep_float32, "tune_cache_dir": self.tune_cache_dir}


def _tune_from_env(environ: Mapping[str, str]) -> str:
    """``on`` (unset, or a true value), ``off`` (a false value) or ``again`` (:data:`TUNE_AGAIN`)."""
    text = environ.get(TUNE_ENV, "")
    if not text.strip() or is_true(text):
        return "on"
    if is_false(text):
        return "off"
    if text.strip().lower() == TUNE_AGAIN:
        return TUNE_AGAIN
    raise UsageError(f"{TUNE_ENV}={text!r}: use 1 (the default), 0, or {TUNE_AGAIN} (measure every step again)")


def _target_from_env(environ: Mapping[str, str]) -> str:
    text = environ.get(TARGET_ENV, "").strip()
    target = text.lower() or "auto"
    if target not in TARGETS:
        raise UsageError(f"{TARGET_ENV}={text!r}: choose one of {', '.join(TARGETS)}")
    return target


def _profile_from_env(environ: Mapping[str, str]) -> int | None:
    if not environ.get(PROFILE_ENV, "").strip():
        return None
    return _number(environ, PROFILE_ENV, int, None, minimum=1)


def _loss_scale_from_env(environ: Mapping[str, str]) -> LossScaleSettings:
    is_asked = bool(environ.get(LOSS_SCALE_ENV, "").strip())
    mode = environ.get(LOSS_SCALE_ENV, "").strip().lower() or "dynamic"
    initial = _number(environ, LOSS_SCALE_INIT_ENV, float, DEFAULT_INITIAL_SCALE, minimum=1.0)
    interval = _number(environ, GROWTH_INTERVAL_ENV, int, DEFAULT_GROWTH_INTERVAL, minimum=1)
    log_every = _number(environ, LOG_EVERY_ENV, int, DEFAULT_LOG_EVERY, minimum=0)
    grouped = _switch(environ, GROUPED_ENV)
    if mode == "dynamic":
        return LossScaleSettings(True, initial, interval, log_every, is_asked, grouped)
    fixed = _parse(LOSS_SCALE_ENV, mode, float)
    if not (_is_float32(fixed) and fixed > 0 and float(np.float32(fixed)) > 0):
        raise UsageError(f"{LOSS_SCALE_ENV}={mode!r}: use 'dynamic' or a finite number > 0 that float32 can hold "
                         f"(at most {FLOAT32_MAX:.4g})")
    return LossScaleSettings(False, fixed, interval, log_every, is_asked, grouped)


def _switch(environ: Mapping[str, str], name: str) -> bool | None:
    """A variable that is on (1/true/yes/on), off (0/false/no/off) or unset (None); anything else is an error."""
    text = environ.get(name, "").strip()
    if not text:
        return None
    if is_true(text):
        return True
    if is_false(text):
        return False
    raise UsageError(f"{name}={text!r}: use 1 or 0 (unset: chosen for the device)")


def _number(environ, name, kind, default, *, minimum):
    text = environ.get(name, "").strip()
    if not text:
        return default
    value = _parse(name, text, kind)
    if kind is float and not _is_float32(value):
        raise UsageError(f"{name}={text!r}: must be a finite number float32 can hold (at most {FLOAT32_MAX:.4g})")
    if kind is int and value > INT32_MAX:
        raise UsageError(f"{name}={text!r}: must be at most {INT32_MAX}")
    if value < minimum:
        raise UsageError(f"{name}={text!r}: must be at least {minimum}")
    return value


def _parse(name, text, kind):
    try:
        return kind(text)
    except (ValueError, OverflowError):
        raise UsageError(f"{name}={text!r}: not a{'n integer' if kind is int else ' number'}") from None


def scales_loss(settings: RuntimeSettings) -> bool:
    """Whether optimizers get loss scaling: float16 always; bfloat16 only when asked.

    bfloat16 has float32's exponent range, so gradients need no scaling; an
    ``AMP_LOSS_SCALE`` in the environment (``is_asked``), or loss-scale
    settings other than the defaults, ask for it anyway. A multi-worker job's
    decision (``settings.is_loss_scaled``) overrides all of these.
    """
    if settings.is_loss_scaled is not None:
        return settings.is_loss_scaled
    return settings.target == "float16" or settings.loss_scale != LossScaleSettings()
