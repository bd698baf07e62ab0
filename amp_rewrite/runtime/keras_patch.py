"""Training loops under the runtime: dynamic loss scaling for Keras and GradientTape.

Keras ``fit``, a custom ``train_step`` and a hand-written TF2 loop all end in
``GradientTape.gradient`` and an optimizer's ``apply``; the runtime scales
there (:mod:`amp_rewrite.runtime.tf2_loss_scale`), so ``Model.compile`` is not
changed and the model keeps the optimizer it was given. The compiled train
function is a ``tf.function``, so the graph it runs is the rewritten one
(:mod:`amp_rewrite.runtime.tf_function`).
"""

from __future__ import annotations

from amp_rewrite.runtime.settings import RuntimeSettings


def install(settings: RuntimeSettings | None = None) -> None:
    """Scales the loss of every training loop, if the runtime's target wants it."""
    from amp_rewrite.runtime import tf2_loss_scale

    tf2_loss_scale.install(settings if settings is not None else RuntimeSettings())


def uninstall() -> None:
    """Restores the tape and the optimizers; their loss-scale state stays tracked."""
    from amp_rewrite.runtime import tf2_loss_scale

    tf2_loss_scale.uninstall()


def is_patched() -> bool:
    from amp_rewrite.runtime import tf2_loss_scale

    return tf2_loss_scale.settings() is not None
