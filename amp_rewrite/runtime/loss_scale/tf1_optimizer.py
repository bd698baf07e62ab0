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
  scale (never below 1) and counts the skip. The floating variables written
  by ops the gradients depend on (a batch norm's ``UPDATE_OPS`` under
  ``control_dependencies``) get their values from before the step back
  (:func:`~amp_rewrite.runtime.loss_scale.step_writes.snapshot_writes_before`). After ``growth_interval``
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
  left to that wrapper (the runtime records it in
  :attr:`~amp_rewrite.runtime.records.ObjectRecords.scaled_elsewhere`).

The state, the schedule and the guard are those of
:mod:`amp_rewrite.runtime.loss_scale.core`, shared with TF2 loops; this module
is how TF1 hooks them in: the graph collection, the two ``Optimizer`` methods,
the step as the train op, and the report each session reads after it
(:class:`Report`, kept per graph in the runtime's records). The two patches
are bound to one :class:`TF1LossScaling`: the schedule's settings and those records.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from amp_rewrite import tf_internals
from amp_rewrite.runtime.loss_scale.core import (
    APPLY_SCOPE,
    IS_FINITE,
    SCOPE,
    GuardedStep,
    LossScaleState,
    assign_next_state,
    count_nonfinite,
    create_state,
    in_cross_replica_context,
    inverse_of,
    is_finite_loss,
    is_grouped,
    nonfinite_joined,
    seed_gradient,
    unscale_all,
)
from amp_rewrite.runtime.loss_scale.step_writes import snapshot_writes_before
from amp_rewrite.runtime.records import ObjectRecords
from amp_rewrite.runtime.settings import LossScaleSettings

# The name its lines have always carried, from before the module joined the loss-scaling package.
LOGGER_NAME = "amp_rewrite.runtime.tf1.loss_scale"
logger = logging.getLogger(LOGGER_NAME)

STATE_COLLECTION = SCOPE


@dataclass(frozen=True)
class Report:
    """A tensor ``[scale, skipped_steps, good_steps, loss_is_finite]`` read after the guarded update ``op``.

    ``loss_is_finite`` is 1 when the loss whose gradients were scaled last in
    the graph was finite (1 too when none was scaled there), else 0.
    """

    op: Any
    tensor: Any


@dataclass(frozen=True)
class TF1LossScaling:
    """What the optimizer patches are bound to: the schedule's settings, and the runtime's records.

    The records say which optimizers a wrapper scales, and keep each graph's
    reports (not in a graph collection: ``export_meta_graph``, which every
    ``Saver.save`` calls, would warn that it cannot serialise them).
    """

    settings: LossScaleSettings
    records: ObjectRecords


def state_for_graph(settings: LossScaleSettings) -> LossScaleState:
    """The current graph's loss-scale state; created on first use (once per graph)."""
    import tensorflow as tf

    with tf.init_scope():
        found = tf.compat.v1.get_default_graph().get_collection(STATE_COLLECTION)
    if found:
        return LossScaleState(*found[:3])
    return in_cross_replica_context(lambda: _create_graph_state(settings))


def _create_graph_state(settings: LossScaleSettings) -> LossScaleState:
    import tensorflow as tf

    collections = [tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, STATE_COLLECTION]

    def variable(value, name, dtype):
        return tf.compat.v1.Variable(value, name=name, dtype=dtype, trainable=False,
                                     collections=collections, use_resource=True)

    with tf.init_scope(), tf.compat.v1.name_scope(SCOPE + "/"):
        state = create_state(settings, variable)
    logger.debug("created the loss-scale state, initial scale %s", settings.initial_scale)
    return state


def scaled_compute_gradients(original, scaling: TF1LossScaling, optimizer, loss,
                             *args, **kwargs):
    """``Optimizer.compute_gradients`` on the scaled loss, returning unscaled gradients."""
    import tensorflow as tf

    if callable(loss) or tf.executing_eagerly() or optimizer in scaling.records.scaled_elsewhere:
        return original(optimizer, loss, *args, **kwargs)
    positional, kwargs = list(args), dict(kwargs)
    user_grad_loss = _pop_argument(positional, kwargs, "grad_loss", position=5)
    state = state_for_graph(scaling.settings)
    with tf.compat.v1.name_scope(SCOPE + "/"):
        scaling.records.scaled_losses[loss.graph] = is_finite_loss(loss)
    grad_loss = seed_gradient(loss, state.scale, user_grad_loss)
    grads_and_vars = original(optimizer, loss, *positional, grad_loss=grad_loss, **kwargs)
    inverse = inverse_of(state.scale)
    grads = unscale_all([g for g, _ in grads_and_vars], inverse, grouped=is_grouped(scaling.settings))
    return [(g, v) for g, (_, v) in zip(grads, grads_and_vars)]


def _pop_argument(args: list, kwargs: dict, name: str, *, position: int):
    """Removes one argument given by keyword or at ``position`` (after ``loss``)."""
    if name in kwargs:
        return kwargs.pop(name)
    if len(args) > position:
        value = args[position]
        del args[position:]
        return value
    return None


def guarded_apply_gradients(original, scaling: TF1LossScaling, optimizer,
                            grads_and_vars, global_step=None, name=None, **kwargs):
    """``Optimizer.apply_gradients`` that skips the step when a gradient is not finite."""
    import tensorflow as tf

    if tf.executing_eagerly() or optimizer in scaling.records.scaled_elsewhere or kwargs:
        return original(optimizer, grads_and_vars, global_step, name, **kwargs)
    grads_and_vars = tuple(grads_and_vars)
    state = state_for_graph(scaling.settings)
    grads = [g for g, _ in grads_and_vars]
    nonfinite = nonfinite_joined(grads) if is_grouped(scaling.settings) else count_nonfinite(grads)
    guarded = _GuardedTrainOp(original, optimizer, global_step, name, state, scaling)
    return guarded.build_for_all_replicas(nonfinite, grads_and_vars)


class _GuardedTrainOp(GuardedStep):
    """The guarded step as the optimizer's train op: slots made before the branch, a report after."""

    def __init__(self, original, optimizer, global_step, name, state, scaling: TF1LossScaling):
        super().__init__(state, scaling.settings)
        self.records = scaling.records
        self.original = original
        self.optimizer = optimizer
        self.global_step = global_step
        self.name = name

    def build(self, distribution, grads_and_vars, nonfinite):
        import tensorflow as tf

        nonfinite = self.first_replica(distribution, nonfinite)
        var_list = [v for g, v in grads_and_vars if g is not None]
        with tf.init_scope():
            tf_internals.create_slots(self.optimizer, var_list)  # outside the branch: same names as float32
        train_ops = tf.compat.v1.get_collection_ref(tf.compat.v1.GraphKeys.TRAIN_OP)
        already = len(train_ops)
        restore = snapshot_writes_before(_gradient_tensors(distribution, grads_and_vars))
        with tf.compat.v1.name_scope(APPLY_SCOPE):
            is_finite = tf.equal(nonfinite, 0.0, name=IS_FINITE)
            args = (self.optimizer, grads_and_vars, self.global_step, self.name)
            applied = self.apply_or_skip(distribution, is_finite, self.original, args, skip=restore)
            update = update_state(self.state, is_finite, self.settings)
        step = tf.group(applied, update, name=self.name or self.optimizer.get_name())
        del train_ops[already:]
        train_ops.append(step)
        _add_report(self.records, self.state, step)
        return step


def _gradient_tensors(distribution, grads_and_vars) -> list:
    """Every replica's gradient tensors (an ``IndexedSlices``' values and indices)."""
    import tensorflow as tf

    tensors = []
    for grad, _ in grads_and_vars:
        for local in ([grad] if distribution is None or grad is None else
                      distribution.experimental_local_results(grad)):
            if isinstance(local, tf.IndexedSlices):
                tensors.extend([local.values, local.indices])
            elif local is not None:
                tensors.append(local)
    return tensors


def update_state(state: LossScaleState, is_finite, settings: LossScaleSettings):
    """The op that moves ``state`` one step along the schedule (:func:`assign_next_state`)."""
    import tensorflow as tf

    return tf.group(*assign_next_state(state, is_finite, settings), name="update_loss_scale")


def _add_report(records: ObjectRecords, state: LossScaleState, step) -> None:
    import tensorflow as tf

    graph = step.graph
    loss_is_finite = records.scaled_losses.get(graph)
    with tf.control_dependencies([step]), tf.compat.v1.name_scope(SCOPE + "/"):
        tensor = tf.stack([tf.identity(state.scale),
                           tf.cast(tf.identity(state.skipped_steps), tf.float32),
                           tf.cast(tf.identity(state.good_steps), tf.float32),
                           tf.constant(1.0) if loss_is_finite is None else tf.identity(loss_is_finite)],
                          name="report")
    records.loss_scale_reports[graph] = (*records.loss_scale_reports.get(graph, ()), Report(step, tensor))
