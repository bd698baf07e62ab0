"""Masked attention trained with ``fit`` under the runtime in float16: the mask's -1e9 stays float32.

tf_keras's ``MultiHeadAttention`` adds ``(1 - mask) * -1e9`` to its scores
before the softmax; Keras 3's selects -1e9 where a position is masked. Both
are traced in float32. Cast to float16, -1e9 is -inf: a fully masked row (a
padded query position) is all -inf, its softmax NaN (0 / 0), and the loss
or the gradients with it, so the runtime would skip steps and fall back to
float32. The painting keeps the ops that read the -1e9 float32
(:mod:`amp_rewrite.paint.half_range`), and the attention's matrix products
still run in half.

A small language model: token embeddings with ``mask_zero``, one causal
self-attention layer, a layer norm and a Dense over the vocabulary, trained
for a few epochs on padded random sequences with a validation set.

In bfloat16, -1e9 is finite, but ``tf.float32.min`` (a mask value many
hand-written attentions use) rounds to -inf: a hand-written attention with
that adder trains in bfloat16 with its sum and softmax kept float32.
"""

import logging

import numpy as np
import pytest
from helpers import float32_as_float32

from amp_rewrite.runtime.settings import RuntimeSettings

VOCAB, LENGTH, WIDTH, EXAMPLES, BATCH, EPOCHS = 20, 8, 16, 64, 16, 3


def sequences():
    """Random token sequences padded with 0 after a length of 2 to LENGTH, and the next token as the label."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, VOCAB, (EXAMPLES, LENGTH))
    lengths = rng.integers(2, LENGTH + 1, EXAMPLES)
    tokens[np.arange(LENGTH)[None, :] >= lengths[:, None]] = 0
    return tokens, np.roll(tokens, -1, axis=1)


def masked_attention_model(flavour: str):
    """The model above, built with tf_keras or Keras 3 (``flavour``), the same layers in each."""
    if flavour == "tf_keras":
        import tf_keras as keras

        compile_options = {}
    else:
        import keras

        compile_options = {"jit_compile": False}
    keras.utils.set_random_seed(0)
    layers = keras.layers
    tokens = keras.Input((LENGTH,), dtype="int32")
    x = layers.Embedding(VOCAB, WIDTH, mask_zero=True)(tokens)
    attended = layers.MultiHeadAttention(num_heads=2, key_dim=8)(x, x, use_causal_mask=True)
    logits = layers.Dense(VOCAB)(layers.LayerNormalization()(x + attended))
    model = keras.Model(tokens, logits)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), **compile_options,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def fit(flavour: str):
    """The history of ``fit``: loss and val_loss per epoch."""
    x, y = sequences()
    history = masked_attention_model(flavour).fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
                                                  validation_data=(x[:BATCH], y[:BATCH]))
    return history.history


def half_and_float32_ops(op_types):
    """Per op type among ``op_types``, the dtypes its nodes run in, over the functions the runtime rewrote."""
    from amp_rewrite.runtime.tf2 import tracing

    found: dict[str, set[str]] = {}
    for concrete_function, _ in tracing.swapped():
        for op in concrete_function.graph.get_operations():
            if op.type in op_types:
                found.setdefault(op.type, set()).add(op.get_attr("T").name)
    return found


def check_masked_attention(amp_runtime, caplog, flavour: str, settings: RuntimeSettings) -> None:
    with float32_as_float32():
        float32 = fit(flavour)
    amp_runtime(settings)
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        half = fit(flavour)
        ops = half_and_float32_ops({"Einsum", "Softmax"})
    assert np.all(np.isfinite(half["loss"])) and np.all(np.isfinite(half["val_loss"])), half
    np.testing.assert_allclose(half["loss"], float32["loss"], rtol=5e-3)
    np.testing.assert_allclose(half["val_loss"], float32["val_loss"], rtol=5e-3)
    assert half["loss"] != float32["loss"]  # the half math really ran
    # no skipped step, no fallback (TensorFlow's own retracing warning counts calls across the suite)
    assert not [r.getMessage() for r in caplog.records
                if r.levelno >= logging.WARNING and r.name.startswith("amp_rewrite")]
    assert ops == {"Einsum": {"float16"}, "Softmax": {"float32"}}, ops


@pytest.mark.parametrize("flavour", ["tf_keras", "keras3"])
def test_masked_attention_trains_in_float16_with_float32_losses(amp_runtime, caplog, flavour):
    check_masked_attention(amp_runtime, caplog, flavour, RuntimeSettings(target="float16"))


@pytest.mark.gpu
@pytest.mark.parametrize("flavour", ["tf_keras", "keras3"])
def test_gpu_masked_attention_trains_in_float16_with_float32_losses(amp_runtime, caplog, flavour):
    """On a GPU the target is the machine's choice (float16), the float32 reference without TF32."""
    from amp_rewrite import runtime

    check_masked_attention(amp_runtime, caplog, flavour, RuntimeSettings(target="auto"))
    choice = runtime.target_choice()
    assert choice is not None and choice.target == "float16" and "GPU" in choice.reason, choice
# --- bfloat16: a mask adder of tf.float32.min, which a Cast to bfloat16 rounds to -inf -----------------


def float32_min_attention(steps: int):
    """``steps`` SGD steps of a hand-written attention in a tf.function, its adder ``(1 - mask) * float32.min``.

    One example's last query row is fully masked. Returns each step's loss,
    from the last step the softmax of that row, and the step (its traces live as long as it does).
    """
    import tensorflow as tf

    rng = np.random.default_rng(1)
    q = tf.constant(rng.standard_normal((2, LENGTH, WIDTH)).astype(np.float32))
    mask = np.tril(np.ones((LENGTH, LENGTH), np.float32))[None].repeat(2, axis=0)
    mask[1, -1] = 0.0
    mask = tf.constant(mask)
    wk, wv = (tf.Variable(rng.standard_normal((WIDTH, WIDTH)).astype(np.float32) * 0.3) for _ in range(2))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            scores = tf.matmul(q, tf.matmul(q, wk), transpose_b=True)
            probs = tf.nn.softmax(scores + (1.0 - mask) * tf.float32.min)
            loss = tf.reduce_mean(tf.square(tf.matmul(probs, tf.matmul(q, wv)) - 1.0))
        for w, g in zip((wk, wv), tape.gradient(loss, [wk, wv])):
            w.assign_sub(0.1 * g)
        return loss, probs[1, -1]

    results = [step() for _ in range(steps)]
    return [float(loss) for loss, _ in results], results[-1][1].numpy(), step


def test_a_float32_min_mask_trains_in_bfloat16_with_float32_losses(amp_runtime):
    float32_losses, float32_row, _ = float32_min_attention(4)
    amp_runtime(RuntimeSettings(target="bfloat16"))
    losses, row, _step = float32_min_attention(4)
    ops = half_and_float32_ops({"BatchMatMulV2", "Softmax"})
    assert np.all(np.isfinite(losses)) and np.all(np.isfinite(row)), (losses, row)
    np.testing.assert_allclose(row, float32_row, rtol=1e-6)  # the fully masked row: uniform, as in float32
    np.testing.assert_allclose(losses, float32_losses, rtol=2e-2)
    assert losses != float32_losses  # the half math really ran
    assert ops == {"BatchMatMulV2": {"bfloat16"}, "Softmax": {"float32"}}, ops
