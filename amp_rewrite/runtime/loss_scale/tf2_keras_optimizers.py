"""TF2 loss scaling in Keras: the optimizers' apply goes through the guard.

Patched once their modules are imported (:func:`patch_keras3`,
:func:`patch_tf_keras`): the ``apply`` of Keras 3 optimizers (``apply_gradients``,
``fit`` and custom ``train_step`` all end there) and ``apply_gradients`` of
tf_keras optimizers run through :func:`~amp_rewrite.runtime.loss_scale.tf2_guarded_apply.guard_or_warn`.
Keras' own loss scaling is left alone, and nobody is scaled twice: a loss
``scale_loss``/``get_scaled_loss`` returned is differentiated as given, and
``LossScaleOptimizer``s, the optimizers they wrap and optimizers with a
``loss_scale_factor`` apply unguarded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from amp_rewrite import tf_internals
from amp_rewrite.runtime.ledger import Ledger, bound
from amp_rewrite.runtime.loss_scale import tf2_state as shared
from amp_rewrite.runtime.loss_scale.tf2_guarded_apply import guard_or_warn
from amp_rewrite.runtime.loss_scale.tf2_state import TF2LossScaling

logger = logging.getLogger(shared.LOGGER_NAME)

KERAS3_MODULE = tf_internals.KERAS3_LOSS_SCALE_MODULE
TF_KERAS_MODULE = tf_internals.TF_KERAS_LOSS_SCALE_MODULE


def patch_keras3(module, *, ledger: Ledger, scaling: TF2LossScaling, stop_tracing: Callable[[], None]) -> None:
    """Patches Keras 3's optimizers, once ``module`` (its loss-scale optimizer's) is imported.

    The patches are given ``scaling`` and entered in ``ledger``; nothing is
    patched once ``scaling`` was uninstalled.
    """
    with ledger.lock:
        if not scaling.is_installed or \
                not _has_keras_internals(tf_internals.KERAS3_OPTIMIZERS, scaling, stop_tracing):
            return
        backend, base = tf_internals.keras3_optimizer_parts()
        if backend.backend() != "tensorflow":
            return
        wrapper = module.LossScaleOptimizer
        ledger.install(shared.LEDGER_NAME, base, "apply", bound(_guarded_keras3_apply, scaling))
        ledger.install(shared.LEDGER_NAME, base, "scale_loss", bound(_marking_scale_loss, scaling))
        ledger.install(shared.LEDGER_NAME, wrapper, "scale_loss", bound(_marking_scale_loss, scaling))
        ledger.install(shared.LEDGER_NAME, wrapper, "__init__", bound(_marking_wrapper_init, scaling))
    logger.debug("patched Keras 3 optimizers")


def patch_tf_keras(module, *, ledger: Ledger, scaling: TF2LossScaling, stop_tracing: Callable[[], None]) -> None:
    """Patches tf_keras' optimizers, once ``module`` (its loss-scale optimizers') is imported.

    As :func:`patch_keras3`, with ``scaling`` and ``ledger``.
    """
    with ledger.lock:
        if not scaling.is_installed or \
                not _has_keras_internals(tf_internals.TF_KERAS_OPTIMIZERS, scaling, stop_tracing):
            return
        ledger.install(shared.LEDGER_NAME, tf_internals.tf_keras_optimizer_class(), "apply_gradients",
                       bound(_guarded_tf_keras_apply_gradients, scaling))
        for wrapper in (module.LossScaleOptimizer, module.LossScaleOptimizerV3):
            ledger.install(shared.LEDGER_NAME, wrapper, "get_scaled_loss", bound(_marking_scale_loss, scaling))
            ledger.install(shared.LEDGER_NAME, wrapper, "__init__", bound(_marking_wrapper_init, scaling))
    logger.debug("patched tf_keras optimizers")


def _has_keras_internals(capability: tf_internals.Capability, scaling: TF2LossScaling,
                         stop_tracing: Callable[[], None]) -> bool:
    """Whether Keras has what the guarded apply needs; if not, new traces run float32 (strict: raise).

    Without the guard a step whose scaled gradients overflow would be
    applied, so ``stop_tracing`` turns the tf.function hook off rather than
    train on infs.
    """
    if tf_internals.usable([capability], "tf.function traces", is_strict=scaling.is_strict):
        return True
    stop_tracing()
    return False


def _marking_scale_loss(original, scaling: TF2LossScaling, optimizer, loss, *args, **kwargs):
    """``scale_loss``/``get_scaled_loss``: a loss Keras scaled is differentiated as it is."""
    scaled = original(optimizer, loss, *args, **kwargs)
    if scaled is not loss and scaled is not None:
        scaling.note_scaled_loss(scaled)
    return scaled


def _marking_wrapper_init(original, scaling: TF2LossScaling, wrapper, *args, **kwargs):
    """A LossScaleOptimizer's inner optimizer is left to the wrapper."""
    inner = args[0] if args else kwargs.get("inner_optimizer", kwargs.get("optimizer"))
    if inner is not None:
        scaling.records.scaled_elsewhere.add(inner)
    return original(wrapper, *args, **kwargs)


def _is_exempt(scaling: TF2LossScaling, optimizer) -> bool:
    """Optimizers Keras' own loss scaling looks after, or that scale with a fixed factor."""
    if optimizer in scaling.records.scaled_elsewhere:
        return True
    if getattr(optimizer, "loss_scale_factor", None) is not None:
        return True
    kind = type(optimizer)
    return any(cls.__name__.startswith(("LossScaleOptimizer", "BaseLossScaleOptimizer"))
               for cls in kind.__mro__)


def _guarded_keras3_apply(original, scaling: TF2LossScaling, optimizer, grads, trainable_variables=None):
    """Keras 3 ``BaseOptimizer.apply`` that skips a step whose gradients are not finite."""
    if _is_exempt(scaling, optimizer):
        return original(optimizer, grads, trainable_variables)
    grads = list(grads)
    if not grads:
        return original(optimizer, grads, trainable_variables)
    if trainable_variables is None:
        variables = tf_internals.keras3_trainable_variables(optimizer)
    else:
        variables = list(trainable_variables)
        if not optimizer.built:
            # Outside the guard's branch: the slots exist whatever the first step does.
            tf_internals.build_keras3_optimizer(optimizer, variables)

    def apply(grads_, variables_):
        original(optimizer, list(grads_), list(variables_))

    if not guard_or_warn(scaling, optimizer, apply, grads, variables):
        return original(optimizer, grads, trainable_variables)


def _guarded_tf_keras_apply_gradients(original, scaling: TF2LossScaling, optimizer, grads_and_vars, *args, **kwargs):
    """tf_keras ``Optimizer.apply_gradients`` that skips a step whose gradients are not finite."""
    import tensorflow as tf

    if _is_exempt(scaling, optimizer):
        return original(optimizer, grads_and_vars, *args, **kwargs)
    grads_and_vars = list(grads_and_vars)
    if not grads_and_vars:
        return original(optimizer, grads_and_vars, *args, **kwargs)
    grads = [g for g, _ in grads_and_vars]
    variables = [v for _, v in grads_and_vars]
    with tf.init_scope():
        optimizer.build(variables)  # slots outside the guard's branch

    def apply(grads_, variables_):
        original(optimizer, list(zip(grads_, variables_)), *args, **kwargs)

    if not guard_or_warn(scaling, optimizer, apply, grads, variables):
        return original(optimizer, grads_and_vars, *args, **kwargs)
    return optimizer.iterations
