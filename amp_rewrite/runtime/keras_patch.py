"""Keras 3 under the runtime: ``Model.compile`` gives ``fit`` dynamic loss scaling.

Once ``keras.src.trainers.trainer`` is imported (at once if it already is),
``Trainer.compile`` is wrapped: after Keras compiles, the model's optimizer is
wrapped in ``keras.optimizers.LossScaleOptimizer``, as Keras itself does for
a ``mixed_float16`` policy. Keras' ``train_step`` scales the loss
(``optimizer.scale_loss``) inside its tape, and the loss-scale optimizer
unscales the gradients, skips steps whose gradients are not finite, and
adapts the scale. The compiled train function is a ``tf.function``, so the
graph it runs is the rewritten one (:mod:`amp_rewrite.runtime.tf_function`).

Only ``compile`` wraps. An optimizer used in a custom training loop is never
wrapped, and neither is one that already scales (a ``LossScaleOptimizer``, a
``loss_scale_factor``), or one compiled with ``auto_scale_loss=False``. If a
custom loop calls ``apply_gradients`` on the wrapped ``model.optimizer``
without calling ``scale_loss`` in the same step, its gradients go to the inner
optimizer unchanged, with one warning, rather than being divided by the loss
scale.

Only the TensorFlow backend is patched; the weights stay float32.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import weakref

logger = logging.getLogger(__name__)

TRAINER_MODULE = "keras.src.trainers.trainer"
WRAPPED_NAME = "loss_scale_optimizer"
ROUTED_ATTR = "_amp_rewrite_routes_unscaled"


class _Patch:
    def __init__(self):
        self.lock = threading.RLock()
        self.owner = None
        self.original = None
        self.is_armed = False


_PATCH = _Patch()


def install() -> None:
    """Patches ``Trainer.compile`` once Keras' trainer module is imported."""
    import _amp_rewrite_autoload as autoload

    with _PATCH.lock:
        _PATCH.is_armed = True
    autoload.install_post_import_hook(_patch_trainer, TRAINER_MODULE)


def uninstall() -> None:
    """Removes a pending import hook and restores ``Trainer.compile``; wrapped optimizers stay."""
    import _amp_rewrite_autoload as autoload

    with _PATCH.lock:
        _PATCH.is_armed = False
        autoload.remove_post_import_hooks(TRAINER_MODULE)
        if _PATCH.owner is not None:
            _PATCH.owner.compile = _PATCH.original
        _PATCH.owner = _PATCH.original = None


def is_patched() -> bool:
    return _PATCH.owner is not None


def _patch_trainer(module) -> None:
    with _PATCH.lock:
        if not _PATCH.is_armed or _PATCH.owner is not None:
            return
        if not hasattr(module, "Trainer"):
            logger.warning("amp-rewrite: Keras was still being imported when the runtime started; "
                           "Model.compile does not add loss scaling")
            return
        from keras.src import backend

        if backend.backend() != "tensorflow":
            logger.info("amp-rewrite: Keras runs on the %s backend; Model.compile is left alone",
                        backend.backend())
            return
        trainer = module.Trainer
        original = trainer.__dict__["compile"]
        trainer.compile = _scaling_compile(original)
        _PATCH.owner, _PATCH.original = trainer, original
    logger.debug("patched keras Trainer.compile")


def _scaling_compile(original):
    from keras.src.utils import tracking

    signature = inspect.signature(original)

    @functools.wraps(original)
    @tracking.no_automatic_dependency_tracking
    def compile(model, *args, **kwargs):
        original(model, *args, **kwargs)
        arguments = signature.bind_partial(model, *args, **kwargs).arguments
        if arguments.get("auto_scale_loss", True):
            model.optimizer = wrap_optimizer(getattr(model, "optimizer", None))

    return compile


def wrap_optimizer(optimizer):
    """``optimizer`` in a ``LossScaleOptimizer``, unless it already scales the loss."""
    from keras.src.optimizers.loss_scale_optimizer import LossScaleOptimizer

    if optimizer is None or isinstance(optimizer, LossScaleOptimizer):
        return optimizer
    if getattr(optimizer, "loss_scale_factor", None) is not None:
        logger.info("amp-rewrite: the optimizer has a fixed loss_scale_factor; no dynamic loss scaling")
        return optimizer
    wrapped = LossScaleOptimizer(optimizer, name=WRAPPED_NAME)
    _route_unscaled_updates(wrapped)
    logger.info("amp-rewrite: Model.compile wrapped %s in a LossScaleOptimizer",
                type(optimizer).__name__)
    return wrapped


def _route_unscaled_updates(wrapped) -> None:
    """Sends updates whose loss was not scaled straight to the inner optimizer.

    ``scale_loss`` marks the graph being traced (or, running eagerly, the next
    update) as scaled; ``apply`` (and so ``apply_gradients``) unscales only
    marked updates. Graphs are remembered, not consumed, so every replica of
    a distributed step sees its step's mark.
    """
    scale_loss, apply = wrapped.scale_loss, wrapped.apply
    scaled_graphs: weakref.WeakSet = weakref.WeakSet()
    eager_marks = [0]
    has_warned = [False]

    def marking_scale_loss(loss):
        graph = _graph_being_built()
        if graph is None:
            eager_marks[0] += 1
        else:
            scaled_graphs.add(graph)
        return scale_loss(loss)

    def routing_apply(grads, trainable_variables=None):
        graph = _graph_being_built()
        if graph is None and eager_marks[0] > 0:
            eager_marks[0] -= 1
            return apply(grads, trainable_variables)
        if graph is not None and graph in scaled_graphs:
            return apply(grads, trainable_variables)
        if not has_warned[0]:
            has_warned[0] = True
            logger.warning("amp-rewrite: apply_gradients without scale_loss: the gradients are "
                           "applied unscaled, without loss scaling")
        return wrapped.inner_optimizer.apply(grads, trainable_variables)

    wrapped.scale_loss = marking_scale_loss
    wrapped.apply = routing_apply
    setattr(wrapped, ROUTED_ATTR, True)


def _graph_being_built():
    """The FuncGraph being traced, or None when running eagerly."""
    from tensorflow.python.framework import ops

    graph = ops.get_default_graph()
    return graph if getattr(graph, "building_function", False) else None
