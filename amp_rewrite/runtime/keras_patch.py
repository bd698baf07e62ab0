"""Training loops under the runtime: dynamic loss scaling for Keras and GradientTape.

Keras ``fit``, a custom ``train_step`` and a hand-written TF2 loop all end in
``GradientTape.gradient`` and an optimizer's ``apply``; the runtime scales
there (:mod:`amp_rewrite.runtime.tf2_loss_scale`), so ``Model.compile`` is not
changed and the model keeps the optimizer it was given. The compiled train
function is a ``tf.function``, so the graph it runs is the rewritten one
(:mod:`amp_rewrite.runtime.tf_function`).
"""

from __future__ import annotations

from amp_rewrite.runtime.ledger import LEDGER


def is_patched() -> bool:
    """Whether training loops are loss-scaled now (the runtime's float16 target wants it)."""
    from amp_rewrite.runtime import tf2_loss_scale

    return bool(LEDGER.installed(tf2_loss_scale.LEDGER_NAME))
