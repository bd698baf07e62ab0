"""TF2 loss scaling at the tape: ``GradientTape.gradient`` of a loss, scaled and unscaled again.

``gradient(loss, variables)`` (one float loss, trainable variables only)
back-propagates from ``loss * scale`` (:func:`~amp_rewrite.runtime.loss_scale.core.seed_gradient`)
and returns the gradients divided by the scale again, so the caller sees true
gradients. Jacobians, gradients with respect to tensors and losses Keras
scaled itself are left as they are. The patches are given the installed
:class:`~amp_rewrite.runtime.loss_scale.tf2_state.TF2LossScaling`.
"""

from __future__ import annotations

import contextlib

from amp_rewrite import tf_internals
from amp_rewrite.runtime.loss_scale.core import (
    SEED_SCOPE,
    UPDATE_SCOPE,
    count_non_finite_losses,
    inverse_of,
    is_finite_loss,
    is_grouped,
    seed_gradient,
    unscale_all,
)
from amp_rewrite.runtime.loss_scale.tf2_state import TF2LossScaling


def unscaled_inside(original, scaling: TF2LossScaling, tape, *args, **kwargs):
    """``jacobian``/``batch_jacobian``: they call ``gradient`` per row, are not a loss and are never scaled."""
    with scaling.unscaled():
        return original(tape, *args, **kwargs)


def scaled_gradient(original, scaling: TF2LossScaling, tape, target, sources, output_gradients=None,
                    *args, **kwargs):
    """``GradientTape.gradient`` of ``target * scale``, returned divided by the scale."""
    if not _is_scalable(scaling, target, sources):
        return original(tape, target, sources, output_gradients, *args, **kwargs)
    import tensorflow as tf

    loss_scale = scaling.state()
    with _not_recorded(tape):
        with tf.name_scope(SEED_SCOPE):  # a read a float32 step leaves out
            scale = tf.identity(loss_scale.scale)
        given = None if output_gradients is None else tf.convert_to_tensor(output_gradients)
        output_gradients = seed_gradient(target, scale, given)
    grads = original(tape, target, sources, output_gradients, *args, **kwargs)
    with _not_recorded(tape):
        inverse = inverse_of(scale)
        flat = unscale_all(tf.nest.flatten(grads), inverse, grouped=is_grouped(scaling.loss_scale))
        grads = tf.nest.pack_sequence_as(grads, flat)
        losses = loss_scale.last_skip.non_finite_losses
        with tf.name_scope(UPDATE_SCOPE):  # state a float32 step leaves alone
            losses.assign(count_non_finite_losses(losses, is_finite_loss(target)))
    scaling.note_scaled_gradient()
    return grads


def _not_recorded(tape):
    """The tape must not record the scaling: it is not part of the user's function."""
    return tape.stop_recording() if tf_internals.tape_is_recording(tape) else contextlib.nullcontext()


def _is_scalable(scaling: TF2LossScaling, target, sources) -> bool:
    """A training step's gradient: of one float loss, with respect to trainable variables only.

    Gradients with respect to tensors (saliency, gradient penalties, an outer
    tape's analysis) are left unscaled: nothing would skip a step whose
    scaled gradient overflowed.
    """
    import tensorflow as tf

    if scaling.is_unscaled():
        return False
    if not isinstance(target, (tf.Tensor, tf.Variable)) or not target.dtype.is_floating:
        return False
    flat = tf.nest.flatten(sources)
    if not flat or not all(getattr(s, "trainable", False) and hasattr(s, "assign") for s in flat):
        return False
    return not scaling.is_scaled_loss(target)
