"""Dynamic loss scaling for every ``tf.compat.v1.train.Optimizer``.

With the runtime enabled, :func:`scaled_compute_gradients` and
:func:`guarded_apply_gradients` replace the base class's methods
(``minimize`` calls both). Guarantees:

- ``compute_gradients`` back-propagates from ``loss * scale`` (by seeding the
  gradient of the loss with the scale, so the forward graph is unchanged) and
  returns gradients divided by the scale again: what the caller sees, clips or
  logs between compute and apply are the true gradients.
- ``apply_gradients`` applies the update only when every gradient is finite.
  A skipped step changes no variable, slot or ``global_step``; it halves the
  scale (never below 1) and counts the skip. After ``growth_interval``
  consecutive finite steps the scale doubles. The state update is plain
  arithmetic on three variables, no control flow.
- Under a ``tf.distribute`` strategy the count of non-finite gradients is
  all-reduced over the replicas first, so every replica (and worker) takes the
  same decision; the strategy's own gradient all-reduce runs inside the
  taken branch on all of them alike.
- The state lives in non-trainable float32/int64 resource variables under
  ``amp_loss_scale/`` in :data:`STATE_COLLECTION` and ``GLOBAL_VARIABLES``, so
  the default Saver saves it. Slots are created before the guarded branch, so
  checkpoint keys are those of the float32 script.
- An optimizer wrapped by TensorFlow's ``MixedPrecisionLossScaleOptimizer`` is
  left to that wrapper (:func:`mark_scaled_elsewhere`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from amp_rewrite import tf_internals
from amp_rewrite.runtime.settings import LossScaleSettings

logger = logging.getLogger(__name__)

STATE_COLLECTION = "amp_loss_scale"
# Reports hang on the graph object, not in a collection: export_meta_graph
# (every Saver.save) would warn that it cannot serialise them.
REPORTS_ATTR = "_amp_rewrite_loss_scale_reports"
SCOPE = "amp_loss_scale"
MAX_SCALE = 2.0 ** 24
SCALED_ELSEWHERE_ATTR = "_amp_rewrite_loss_scaled_elsewhere"


@dataclass(frozen=True)
class LossScaleState:
    """The loss-scale variables of one graph: scale, finite steps in a row, skipped steps."""

    scale: Any
    good_steps: Any
    skipped_steps: Any


@dataclass(frozen=True)
class Report:
    """A tensor ``[scale, skipped_steps, good_steps]`` read after the guarded update ``op``."""

    op: Any
    tensor: Any


def mark_scaled_elsewhere(optimizer) -> None:
    """Marks an optimizer whose loss scaling its wrapper already does."""
    setattr(optimizer, SCALED_ELSEWHERE_ATTR, True)


def is_scaled_elsewhere(optimizer) -> bool:
    return bool(getattr(optimizer, SCALED_ELSEWHERE_ATTR, False))


def state_for_graph(settings: LossScaleSettings) -> LossScaleState:
    """The current graph's loss-scale state; created on first use (once per graph)."""
    import tensorflow as tf

    with tf.init_scope():
        found = tf.compat.v1.get_default_graph().get_collection(STATE_COLLECTION)
    if found:
        return LossScaleState(*found[:3])
    if tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context():
        return tf.distribute.get_replica_context().merge_call(
            lambda _strategy: _create_state(settings))
    return _create_state(settings)


def _create_state(settings: LossScaleSettings) -> LossScaleState:
    import tensorflow as tf

    collections = [tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, STATE_COLLECTION]

    def variable(value, name, dtype):
        return tf.compat.v1.Variable(value, name=name, dtype=dtype, trainable=False,
                                     collections=collections, use_resource=True)

    with tf.init_scope(), tf.compat.v1.name_scope(SCOPE + "/"):
        state = LossScaleState(
            scale=variable(float(settings.initial_scale), "scale", tf.float32),
            good_steps=variable(0, "good_steps", tf.int64),
            skipped_steps=variable(0, "skipped_steps", tf.int64),
        )
    logger.debug("created the loss-scale state, initial scale %s", settings.initial_scale)
    return state


def scaled_compute_gradients(original, settings: LossScaleSettings, optimizer, loss,
                             *args, **kwargs):
    """``Optimizer.compute_gradients`` on the scaled loss, returning unscaled gradients."""
    import tensorflow as tf

    if callable(loss) or tf.executing_eagerly() or is_scaled_elsewhere(optimizer):
        return original(optimizer, loss, *args, **kwargs)
    positional, kwargs = list(args), dict(kwargs)
    user_grad_loss = _pop_argument(positional, kwargs, "grad_loss", position=5)
    state = state_for_graph(settings)
    scale = tf.cast(state.scale, loss.dtype)
    if user_grad_loss is None:
        grad_loss = tf.fill(tf.shape(loss), scale)
    else:
        grad_loss = tf.math.multiply_no_nan(user_grad_loss, scale)
    grads_and_vars = original(optimizer, loss, *positional, grad_loss=grad_loss, **kwargs)
    inverse = tf.math.divide_no_nan(tf.ones_like(state.scale), state.scale)
    return [(unscale(g, inverse), v) for g, v in grads_and_vars]


def _pop_argument(args: list, kwargs: dict, name: str, *, position: int):
    """Removes one argument given by keyword or at ``position`` (after ``loss``)."""
    if name in kwargs:
        return kwargs.pop(name)
    if len(args) > position:
        value = args[position]
        del args[position:]
        return value
    return None


def unscale(grad, inverse):
    """``grad / scale`` with an op on no op list, so the division is not retyped.

    ``inverse`` is ``1 / scale`` (float32); it is cast to the gradient's dtype.
    Dense tensors and ``IndexedSlices`` both work; None stays None.
    """
    import tensorflow as tf

    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):
        values = tf.math.multiply_no_nan(grad.values, tf.cast(inverse, grad.values.dtype))
        return tf.IndexedSlices(values, grad.indices, grad.dense_shape)
    return tf.math.multiply_no_nan(grad, tf.cast(inverse, grad.dtype))


def guarded_apply_gradients(original, settings: LossScaleSettings, optimizer,
                            grads_and_vars, global_step=None, name=None, **kwargs):
    """``Optimizer.apply_gradients`` that skips the step when a gradient is not finite."""
    import tensorflow as tf

    if tf.executing_eagerly() or is_scaled_elsewhere(optimizer) or kwargs:
        return original(optimizer, grads_and_vars, global_step, name, **kwargs)
    grads_and_vars = tuple(grads_and_vars)
    state = state_for_graph(settings)
    nonfinite = count_nonfinite([g for g, _ in grads_and_vars])
    guarded = _GuardedApply(original, optimizer, global_step, name, state, settings)
    if tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context():
        context = tf.distribute.get_replica_context()
        total = context.all_reduce(tf.distribute.ReduceOp.SUM, nonfinite)
        # Through merge_call, so that the gradients arrive as per-replica values.
        return context.merge_call(guarded.build, args=(grads_and_vars, total))
    return guarded.build(None, grads_and_vars, nonfinite)


def count_nonfinite(grads) -> object:
    """A float32 scalar: how many of ``grads`` hold an inf or NaN."""
    import tensorflow as tf

    if all(grad is None for grad in grads):
        return tf.constant(0.0)
    return tf.reduce_sum(nonfinite_flags(grads))


def nonfinite_flags(grads) -> object:
    """A float32 vector, one entry per gradient: 1 where it holds an inf or NaN (0 for None)."""
    import tensorflow as tf

    flags = []
    for grad in grads:
        if grad is None:
            flags.append(tf.constant(False))
            continue
        values = grad.values if isinstance(grad, tf.IndexedSlices) else grad
        flags.append(tf.logical_not(tf.reduce_all(tf.math.is_finite(values))))
    return tf.cast(tf.stack(flags), tf.float32)


class _GuardedApply:
    """Builds, in cross-replica context, ``cond(finite, apply, skip)`` and the state update."""

    def __init__(self, original, optimizer, global_step, name, state, settings):
        self.original = original
        self.optimizer = optimizer
        self.global_step = global_step
        self.name = name
        self.state = state
        self.settings = settings

    def build(self, distribution, grads_and_vars, nonfinite):
        import tensorflow as tf

        if distribution is not None:
            # Every replica's copy holds the same all-reduced count.
            nonfinite = distribution.experimental_local_results(nonfinite)[0]
        var_list = [v for g, v in grads_and_vars if g is not None]
        with tf.init_scope():
            tf_internals.create_slots(self.optimizer, var_list)  # outside the branch: same names as float32
        train_ops = tf.compat.v1.get_collection_ref(tf.compat.v1.GraphKeys.TRAIN_OP)
        already = len(train_ops)
        with tf.compat.v1.name_scope(SCOPE + "_apply"):
            is_finite = tf.equal(nonfinite, 0.0, name="is_finite")
            applied = tf.cond(is_finite, lambda: self._apply(distribution, grads_and_vars),
                              lambda: tf.constant(False), name="maybe_apply")
            update = update_state(self.state, is_finite, self.settings)
        step = tf.group(applied, update, name=self.name or self.optimizer.get_name())
        del train_ops[already:]
        train_ops.append(step)
        _add_report(self.state, step)
        return step

    def _apply(self, distribution, grads_and_vars):
        import tensorflow as tf

        args = (self.optimizer, grads_and_vars, self.global_step, self.name)
        if distribution is None:
            ops = [self.original(*args)]
        else:
            per_replica = distribution.extended.call_for_each_replica(self.original, args=args)
            ops = distribution.experimental_local_results(per_replica)
        with tf.control_dependencies(ops):
            return tf.constant(True)


def update_state(state: LossScaleState, is_finite, settings: LossScaleSettings):
    """The op that moves ``state`` one step along :func:`next_scale_state`."""
    import tensorflow as tf

    scale, good, skipped = next_scale_state(state, is_finite, settings)
    return tf.group(state.scale.assign(scale), state.good_steps.assign(good),
                    state.skipped_steps.assign(skipped), name="update_loss_scale")


def next_scale_state(state, is_finite, settings: LossScaleSettings):
    """One step of the schedule: ×2 after ``growth_interval`` finite steps, ÷2 (floor 1) on a skip.

    ``state`` is anything with ``scale``, ``good_steps`` and ``skipped_steps``
    variables (the TF1 graph's or the TF2 process-wide one). Returns the new
    (scale, good_steps, skipped_steps) tensors; the caller assigns them.
    """
    import tensorflow as tf

    finite = tf.cast(is_finite, tf.float32)
    finite_int = tf.cast(is_finite, tf.int64)
    scale = tf.convert_to_tensor(state.scale)
    good = (tf.convert_to_tensor(state.good_steps) + 1) * finite_int
    if settings.is_dynamic:
        grow_int = tf.cast(good >= settings.growth_interval, tf.int64)
        grow = tf.cast(grow_int, tf.float32)
        grown = tf.minimum(scale * 2.0, MAX_SCALE)
        shrunk = tf.maximum(scale * 0.5, 1.0)
        new_scale = finite * (grow * grown + (1.0 - grow) * scale) + (1.0 - finite) * shrunk
        good = good * (1 - grow_int)
    else:
        new_scale = scale
    skipped = tf.convert_to_tensor(state.skipped_steps) + (1 - finite_int)
    return new_scale, good, skipped


def _add_report(state: LossScaleState, step) -> None:
    import tensorflow as tf

    with tf.control_dependencies([step]), tf.compat.v1.name_scope(SCOPE + "/"):
        tensor = tf.stack([tf.identity(state.scale),
                           tf.cast(tf.identity(state.skipped_steps), tf.float32),
                           tf.cast(tf.identity(state.good_steps), tf.float32)], name="report")
    graph = tensor.graph
    setattr(graph, REPORTS_ATTR, [*reports_of(graph), Report(step, tensor)])


def reports_of(graph) -> list[Report]:
    """The loss-scale reports of the guarded steps built in ``graph``."""
    return list(getattr(graph, REPORTS_ATTR, ()))
