"""A Keras sigmoid autoencoder whose units saturate, trained with ``fit`` under the runtime, ends where float32 does.

Weights and biases drawn with a standard deviation of 1 saturate most
units from the first step. Rounded to bfloat16 a saturated Sigmoid is
exactly 1, where its gradient ``y(1 - y)`` is 0, so with the op lists alone
those units never learn and the loss stalls above float32's. The painting
keeps each Sigmoid and its ``SigmoidGrad`` float32 in the training step
(:mod:`amp_rewrite.paint.saturation`), and every MatMul stays half.
"""

import numpy as np
import pytest

from amp_rewrite.paint import rules
from amp_rewrite.runtime.settings import RuntimeSettings

SIZES, SAMPLES, BATCH, EPOCHS = (256, 64, 32, 64, 256), 512, 32, 30


def patterns():
    """SAMPLES sparse patterns in [0, 1]: eight prototypes with noise."""
    r = np.random.default_rng(0)
    prototypes = (r.random((8, SIZES[0])) < 0.3) * r.uniform(0.5, 1, (8, SIZES[0]))
    noisy = prototypes[r.integers(0, 8, SAMPLES)] + r.normal(0, 0.05, (SAMPLES, SIZES[0]))
    return np.clip(noisy, 0, 1).astype(np.float32)


def fit() -> list[float]:
    """The loss of each epoch of the autoencoder's ``fit``, from the same seed."""
    import keras

    keras.utils.set_random_seed(1)
    dense = [keras.layers.Dense(units, activation="sigmoid",
                                kernel_initializer=keras.initializers.RandomNormal(stddev=1.0),
                                bias_initializer=keras.initializers.RandomNormal(stddev=1.0)) for units in SIZES[1:]]
    model = keras.Sequential([keras.Input((SIZES[0],)), *dense])
    model.compile(optimizer=keras.optimizers.RMSprop(0.01), loss="mse", jit_compile=False)
    x = patterns()
    return model.fit(x, x, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0).history["loss"]


def half_ops(op_types) -> dict[str, set[str]]:
    """Per op type among ``op_types``, the dtypes its nodes run in, over the functions the runtime rewrote."""
    from amp_rewrite.runtime.tf2 import tracing

    found: dict[str, set[str]] = {}
    for concrete_function, _ in tracing.swapped():
        for op in concrete_function.graph.get_operations():
            if op.type in op_types:
                found.setdefault(op.type, set()).add(op.get_attr("T").name)
    return found


@pytest.mark.slow
def test_a_saturating_keras_autoencoder_trains_in_bfloat16_to_float32s_loss(amp_runtime, monkeypatch):
    float32 = fit()
    amp_runtime(RuntimeSettings(target="bfloat16"))
    ours = fit()
    ops = half_ops({"MatMul", "Sigmoid", "SigmoidGrad"})
    monkeypatch.setattr(rules, "ROOT_RULES", tuple(r for r in rules.ROOT_RULES
                                                   if r is not rules.keep_saturating_activations_float32))
    amp_runtime(RuntimeSettings(target="bfloat16"))
    lists = fit()
    assert ops == {"MatMul": {"bfloat16"}, "Sigmoid": {"float32"}, "SigmoidGrad": {"float32"}}, ops
    assert abs(ours[-1] / float32[-1] - 1) < 0.05, (ours, float32)
    assert lists[-1] / float32[-1] > 1.08, (lists, float32)  # the lists alone stall
