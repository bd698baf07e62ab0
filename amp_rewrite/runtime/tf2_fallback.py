"""Falling back to float32 in TF2 when no loss scale helps.

A TF1 session switches to its float32 graph after a step is skipped with the
loss scale at its floor of 1 (:mod:`amp_rewrite.runtime.session`). Here the
same happens to a rewritten ``tf.function`` that applies a guarded optimizer
(a custom training loop, or the train function Keras' ``fit`` traces): after
each eager call, the process's loss-scale state
(:mod:`amp_rewrite.runtime.tf2_loss_scale`) says whether the call skipped a
step at scale 1. If it did, the gradients are not finite even unscaled, so no
scale helps; the function gets its traced float32 body back for the next call
(:func:`amp_rewrite.runtime.tf_function.restore`), with one warning naming
why. Variables and optimizer slots are captured by the function, not copied,
so training goes on from their values. ``AMP_REWRITE_STRICT=1`` raises
instead.

The watch costs two scalar variable reads per call, and only functions that
hold a guarded apply get it, under dynamic loss scaling. XLA-compiled
functions record no skip cause, so they are not watched.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any

from amp_rewrite import tf_internals

logger = logging.getLogger(__name__)

FLOOR_REASON = ("a step was skipped with the loss scale at its floor of 1: the gradients are not finite even "
                "unscaled, so no scale helps; the loss itself is not finite, or an op overflows in half whatever "
                "the scale (AMP_REWRITE_FIND_OVERFLOW=1 names it; keep it float32 with "
                "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_DENYLIST_ADD or AMP_REWRITE_KEEP_FLOAT32)")


def is_wanted() -> bool:
    """Whether functions are watched: only under dynamic scaling, where a skip at 1 means no scale helps.

    A fixed scale (``AMP_LOSS_SCALE=1`` included) never moves, so its skips
    say nothing about other scales; they are counted as before.
    """
    from amp_rewrite.runtime import tf2_loss_scale

    settings = tf2_loss_scale.settings()
    return settings is not None and settings.loss_scale.is_dynamic


class FloorWatch:
    """The ``_call_flat`` of a watched function: calls it, then calls ``on_hopeless(cf, reason)`` after a skip at 1.

    ``on_hopeless`` runs after the call returned its outputs (which are still
    returned), so the step that skipped is not run again. The first-call
    guard of :mod:`amp_rewrite.runtime.tf_function` uses :meth:`count` and
    :meth:`check` around the first call, which it runs itself.
    """

    def __init__(self, concrete_function, on_hopeless: Callable[[object, str], None]):
        self.function_ref = weakref.ref(concrete_function)
        self.on_hopeless = on_hopeless

    def __call__(self, tensor_inputs, captured_inputs):
        import tensorflow as tf

        cf: Any = self.function_ref()
        if not tf.executing_eagerly():
            return tf_internals.call_concrete_function(cf, tensor_inputs, captured_inputs)
        before = self.count()
        outputs = tf_internals.call_concrete_function(cf, tensor_inputs, captured_inputs)
        self.check(cf, before)
        return outputs

    @staticmethod
    def count() -> int | None:
        """The process's skipped-step count now (None before any step was scaled)."""
        return _skipped_steps()

    def check(self, concrete_function, before: int | None) -> None:
        """Calls ``on_hopeless`` if a step was skipped at the floor since the count was ``before``."""
        if _skipped_at_floor_since(before):
            self.on_hopeless(concrete_function, FLOOR_REASON)


def floor_watch(concrete_function, on_hopeless: Callable[[object, str], None]) -> FloorWatch:
    """A :class:`FloorWatch` for ``concrete_function``."""
    return FloorWatch(concrete_function, on_hopeless)


def _skipped_steps() -> int | None:
    from amp_rewrite.runtime import tf2_loss_scale

    if not tf2_loss_scale.has_state():
        return None
    return int(tf2_loss_scale.state().skipped_steps.numpy())


def _skipped_at_floor_since(before: int | None) -> bool:
    """Whether a step was skipped since the count was ``before``, the last one with the scale at 1."""
    from amp_rewrite.runtime import tf2_loss_scale

    after = _skipped_steps()
    if after is None or after == (before or 0):
        return False
    return float(tf2_loss_scale.state().last_skip.scale.numpy()) <= 1.0
