"""Dynamic loss scaling for TF2 training loops: GradientTape in, optimizer apply out.

With the runtime enabled for a float16 target (its ``loss_scaling`` is then a
:class:`~amp_rewrite.runtime.loss_scale.tf2_state.TF2LossScaling`),
two places change, so every loop built from them is scaled without code changes:

- ``tf.GradientTape.gradient(loss, variables)`` (one float loss, trainable
  variables only) back-propagates from
  ``loss * scale`` (by seeding the gradient of ``loss`` with the scale, so the
  forward computation is unchanged) and returns gradients divided by the scale
  again, in float32. The caller sees true gradients: clipping, logging and
  ``tf.debugging`` checks between ``gradient`` and ``apply`` work as in float32.
- The ``apply`` of Keras 3 optimizers (``apply_gradients``, ``fit`` and custom
  ``train_step`` all end there, so ``Model.compile`` is not changed and the
  model keeps the optimizer it was given) and ``apply_gradients`` of tf_keras
  optimizers apply the update only when every gradient is finite. A skipped step changes
  no variable, slot or iteration count (a rewritten body puts back the
  moving statistics and metrics it wrote besides:
  :func:`~amp_rewrite.runtime.loss_scale.step_writes.restore_in_body`);
  it halves the scale (never below 1)
  and prints a line naming the first variables whose gradients were not
  finite. A skip for the same cause as the one before (the same scale and
  the same variables: a loss that stays NaN at the floor of 1, or the scale
  growing back to where it overflowed) is counted instead, with a line
  every ``log_every`` such repeats. After ``growth_interval`` finite steps
  the scale doubles. Under a ``tf.distribute`` strategy the count of
  non-finite gradients is all-reduced first, so all replicas take one
  decision.

The scale is one set of float32/int64 variables per process (one
:class:`~amp_rewrite.runtime.loss_scale.tf2_state.ProcessState` per
installation), read by
every tape and updated by every guarded apply. Each guarded optimizer tracks it as the checkpoint dependency
``amp_loss_scale``, so ``tf.train.Checkpoint`` saves it with the optimizer and
restores it (also when the restore came first: TensorFlow defers it). A
checkpoint without it leaves the initial scale; a checkpoint with it restores
into a run without the runtime, which ignores it.

Nobody is scaled twice: a loss returned by ``scale_loss`` (Keras 3, also with a
fixed ``loss_scale_factor``) or ``get_scaled_loss`` (tf_keras) is
differentiated as given, and ``LossScaleOptimizer``s (Keras 3 and tf_keras),
the optimizers they wrap and optimizers with a ``loss_scale_factor`` are left
to Keras.

Not covered, with one warning: gradients from a scaled tape that reach no
guarded apply (legacy tf_keras ``OptimizerV2``, hand-written
``var.assign_sub``): their values are right, but a step whose gradients
overflow is not skipped.

The algorithm (state, schedule, guard) is TF1's, in
:mod:`amp_rewrite.runtime.loss_scale.core`; what differs is how it hooks in.
This module installs the patches. :mod:`~amp_rewrite.runtime.loss_scale.tf2_state`
holds what the patches share (the settings, the state and the step
contexts), one object the runtime keeps and each patch is given.
:mod:`~amp_rewrite.runtime.loss_scale.tf2_tape` patches the tape,
:mod:`~amp_rewrite.runtime.loss_scale.tf2_keras_optimizers` the Keras optimizers, and
:mod:`~amp_rewrite.runtime.loss_scale.tf2_guarded_apply` guards their apply.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import _amp_rewrite_import_hook as import_hook
from amp_rewrite.runtime.ledger import Ledger, bound
from amp_rewrite.runtime.loss_scale import tf2_keras_optimizers, tf2_tape
from amp_rewrite.runtime.loss_scale.tf2_keras_optimizers import KERAS3_MODULE, TF_KERAS_MODULE
from amp_rewrite.runtime.loss_scale.tf2_state import LEDGER_NAME, TF2LossScaling

__all__ = ["LEDGER_NAME", "TF2LossScaling", "install"]


def install(scaling: TF2LossScaling, ledger: Ledger, *,
            stop_tracing: Callable[[], None] = lambda: None) -> None:
    """Patches the tape now and Keras' optimizers once their modules are imported, all sharing ``scaling``.

    The runtime makes ``scaling`` first (its settings, and the records where
    the patches note what they learn about optimizers) and gives it to its
    tracing hook too. ``stop_tracing`` is called when Keras lacks a part its
    guarded apply needs, at once when Keras is imported already: new traces
    must then run float32 rather than apply steps whose scaled gradients
    overflowed (the runtime passes its tracing hook's
    :meth:`~amp_rewrite.runtime.tf2.tracing.TracingHook.uninstall`).

    Every change goes into ``ledger``, which undoes it on
    :func:`amp_rewrite.disable`: the methods are restored, and ``scaling``
    is marked uninstalled (its variables stay with the optimizers that
    track them; the next installation starts afresh).
    """
    import tensorflow as tf

    with ledger.lock:
        ledger.record(LEDGER_NAME, "the loss-scale settings and state", scaling.uninstall)
        tape = tf.GradientTape
        ledger.install(LEDGER_NAME, tape, "gradient", bound(tf2_tape.scaled_gradient, scaling))
        ledger.install(LEDGER_NAME, tape, "jacobian", bound(tf2_tape.unscaled_inside, scaling))
        ledger.install(LEDGER_NAME, tape, "batch_jacobian", bound(tf2_tape.unscaled_inside, scaling))
        ledger.record(LEDGER_NAME, f"import hooks on {KERAS3_MODULE} and {TF_KERAS_MODULE}",
                      _remove_keras_hooks)
        for module, patch in ((KERAS3_MODULE, tf2_keras_optimizers.patch_keras3),
                              (TF_KERAS_MODULE, tf2_keras_optimizers.patch_tf_keras)):
            import_hook.after_import(functools.partial(patch, ledger=ledger, scaling=scaling,
                                                       stop_tracing=stop_tracing),
                                     owner=import_hook.RUNTIME, name=module,
                                     is_strict=lambda: scaling.is_strict)


def _remove_keras_hooks() -> None:
    for module in (KERAS3_MODULE, TF_KERAS_MODULE):
        import_hook.remove(owner=import_hook.RUNTIME, name=module)
