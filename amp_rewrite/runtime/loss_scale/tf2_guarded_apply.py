"""TF2 loss scaling at the optimizer: the guarded apply and the line a skipped step prints.

:func:`guard_or_warn` runs an optimizer's own apply through the core's
:class:`~amp_rewrite.runtime.loss_scale.core.GuardedStep`: only when every
gradient is finite, with the scale updated either way. A skipped step prints
the scale it used and the first variables whose gradients were not finite;
a skip for the same cause as the one before (the same scale and the same
variables) is counted instead, with a line every ``log_every`` repeats.
"""

from __future__ import annotations

import logging

from amp_rewrite import tf_internals
from amp_rewrite.errors import first_line
from amp_rewrite.runtime.loss_scale import tf2_state as shared
from amp_rewrite.runtime.loss_scale.core import (
    APPLY_SCOPE,
    IS_FINITE,
    GuardedStep,
    is_grouped,
    nonfinite_flags,
    nonfinite_joined,
)
from amp_rewrite.runtime.loss_scale.tf2_state import TF2LossScaling

logger = logging.getLogger(shared.LOGGER_NAME)

NAMES_IN_SKIP_LINE = 3
OVERFLOW_HINT = "AMP_REWRITE_FIND_OVERFLOW=1 names the first op whose output was not finite."
# Causes of skips are compared by a hash of the names of the variables at fault.
CAUSE_BUCKETS = 2 ** 62


def guard_or_warn(scaling: TF2LossScaling, optimizer, apply, grads, variables) -> bool:
    """:func:`_guard`; if building it fails, a warning and False (the caller applies unguarded).

    Once the optimizer's own apply has been called, its errors (and any
    later one) propagate: applying again could update twice.
    ``AMP_REWRITE_STRICT=1`` raises instead.
    """
    called = []

    def tracked_apply(grads_, variables_):
        called.append(True)
        apply(grads_, variables_)

    try:
        _guard(scaling, optimizer, tracked_apply, grads, variables)
        return True
    except Exception as exc:  # the guard must never be what stops training
        if called or scaling.is_strict:
            raise
        logger.warning("amp-rewrite: %s applies without skipping non-finite steps: the loss-scale "
                       "guard failed: %s", type(optimizer).__name__, first_line(exc, with_type=True))
        return False


def _guard(scaling: TF2LossScaling, optimizer, apply, grads, variables) -> None:
    """Runs ``apply(grads, variables)`` if every gradient is finite; updates the scale either way."""
    loss_scale = scaling.state()
    scaling.track(optimizer, loss_scale)
    scaling.note_guarded_apply()
    # Joined, one scalar says whether to skip; a skip asks which gradients (the replicas sum per-gradient flags).
    import tensorflow as tf

    joined = is_grouped(scaling.loss_scale) and not tf.distribute.has_strategy()
    nonfinite = nonfinite_joined(grads) if joined else nonfinite_flags(grads)
    names = [_variable_name(v) for v in variables]
    guarded = _GuardedKerasApply(apply, loss_scale, names, scaling.loss_scale,
                                 names_overflow_finder=not scaling.is_finding_overflow)
    guarded.build_for_all_replicas(nonfinite, grads, variables)


def _variable_name(variable) -> str:
    name = getattr(variable, "path", None) or getattr(variable, "name", None) or "?"
    return name[:-2] if name.endswith(":0") else name


class _GuardedKerasApply(GuardedStep):
    """The guarded step around a Keras optimizer's apply; a skip says why, once per cause."""

    def __init__(self, apply, loss_scale, names, scaling, *, names_overflow_finder: bool):
        super().__init__(loss_scale, scaling)
        self.apply = apply
        self.names = names
        self.names_overflow_finder = names_overflow_finder

    def build(self, distribution, grads, variables, nonfinite):
        """``nonfinite``: one flag per gradient, or (joined) one scalar, whose skip branch flags them itself."""
        import tensorflow as tf

        nonfinite = self.first_replica(distribution, nonfinite)

        def flags():
            return nonfinite if nonfinite.shape.rank else nonfinite_flags(grads)

        # XLA cannot print or handle strings: a compiled step is skipped and counted, not said.
        skip = None if self._is_compiled() else lambda: self._skip(flags())
        with tf.name_scope(APPLY_SCOPE):
            is_finite = tf.equal(tf.reduce_sum(nonfinite), 0.0, name=IS_FINITE)
            applied = self.apply_or_skip(distribution, is_finite, self.apply, (grads, variables), skip=skip)
            with tf.control_dependencies([applied]):
                self.update(is_finite)

    def _skip(self, flags):
        """Says why a step was skipped, once per cause; repeats of the last cause are counted.

        The line names the scale the step used and the first variables whose
        gradients were not finite. A skip at the same scale for the same
        variables as the skip before it prints nothing, except a count on
        every ``log_every``-th such repeat.
        """
        import tensorflow as tf

        names = tf.constant(self.names)
        bad = tf.boolean_mask(names, flags > 0)
        scale = tf.identity(self.state.scale)
        is_repeat, repeats = self._note_cause(scale, bad)
        every = self.settings.log_every
        is_count_due = tf.logical_and(is_repeat, tf.equal(repeats % every, 0)) if every else tf.constant(False)
        if tf.executing_eagerly():
            if not bool(is_repeat):
                logger.warning("%s", self._cause_line(scale, bad).numpy().decode())
            elif bool(is_count_due):
                logger.warning("%s", self._count_line(scale, repeats).numpy().decode())
            return

        def say():
            # One cond, not one per case: each cond costs tracing time in every guarded step.
            line = tf.where(is_repeat, self._count_line(scale, repeats), self._cause_line(scale, bad))
            tf.print(line, output_stream=_stderr())
            return tf.constant(True)

        tf.cond(tf.logical_or(tf.logical_not(is_repeat), is_count_due), say, lambda: tf.constant(False))

    def _note_cause(self, scale, bad):
        """Records this skip's cause; returns (whether it is the last skip's, repeats of it so far)."""
        import tensorflow as tf

        last = self.state.last_skip
        cause = tf.strings.to_hash_bucket_fast(tf.strings.reduce_join(bad, separator="\n"), CAUSE_BUCKETS)
        is_repeat = tf.logical_and(tf.equal(last.cause.read_value(), cause),
                                   tf.equal(last.scale.read_value(), scale))
        repeats = tf.where(is_repeat, last.repeats.read_value() + 1, tf.constant(0, tf.int64))
        with tf.control_dependencies([is_repeat, repeats]):
            last.scale.assign(scale)
            last.cause.assign(cause)
            last.repeats.assign(repeats)
        return is_repeat, repeats

    def _cause_line(self, scale, bad):
        import tensorflow as tf

        shown = tf.strings.reduce_join(bad[:NAMES_IN_SKIP_LINE], separator=", ")
        more = tf.size(bad) - tf.minimum(tf.size(bad), NAMES_IN_SKIP_LINE)
        hint = " " + OVERFLOW_HINT if self.names_overflow_finder else ""
        return tf.strings.join([
            tf.strings.format("amp-rewrite: loss scale {}: step skipped, gradients not finite for "
                              "{} of {} variables: ", (scale, tf.size(bad), len(self.names))),
            shown, tf.where(more > 0, tf.strings.format(" and {} more", more), ""), "." + hint])

    def _count_line(self, scale, repeats):
        import tensorflow as tf

        return tf.strings.format("amp-rewrite: loss scale {}: {} more steps skipped for the same "
                                 "variables as the last skip line; {} skipped in all.",
                                 (scale, repeats, self.state.skipped_steps.read_value() + 1))

    def _is_compiled(self) -> bool:
        """Inside an XLA-compiled function, which cannot print or handle strings."""
        import tensorflow as tf

        return tf_internals.is_in_xla_context(tf.compat.v1.get_default_graph())


def _stderr():
    import sys

    return sys.stderr
