"""TF2: a rewritten function whose steps are skipped at the loss-scale floor runs float32 from the next call."""

import logging

import numpy as np
import pytest
import tensorflow as tf

from amp_rewrite.errors import RuntimeRewriteError
from amp_rewrite.runtime.settings import LossScaleSettings, RuntimeSettings

# x @ w = 4 * 300 * 300 = 360000: beyond float16 whatever the loss scale; fine in float32.
X = np.full((8, 4), 300.0, np.float32)
STEPS = 8
SKIPPED = 3  # at scales 4 and 2, then at the floor of 1


def custom_loop(steps):
    """``steps`` calls of a tf.function train step (Keras SGD on one variable): (losses, final w)."""
    import keras

    w = tf.Variable(np.full((4, 3), 300.0, np.float32))
    optimizer = keras.optimizers.SGD(1e-10)
    x = tf.constant(X)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(x, w)))
        grads = tape.gradient(loss, [w])
        optimizer.apply_gradients(zip(grads, [w]))
        return loss

    return [float(step()) for _ in range(steps)], w.numpy()


def tf_keras_fit(batches):
    """A tf_keras ``fit`` of one bias-free Dense on ``batches`` equal batches; returns its kernel."""
    import tf_keras

    tf_keras.utils.set_random_seed(0)
    model = tf_keras.Sequential([tf_keras.layers.Dense(
        3, use_bias=False, kernel_initializer=tf_keras.initializers.Constant(300.0), input_shape=(4,))])
    model.compile(optimizer=tf_keras.optimizers.SGD(1e-10), loss="mse")
    x = np.concatenate([X] * batches)
    model.fit(x, np.zeros((len(x), 3), np.float32), batch_size=len(X), epochs=1, shuffle=False, verbose=0)
    return model.get_weights()[0]


def float16_from_scale_4(**fields):
    return RuntimeSettings(target="float16", loss_scale=LossScaleSettings(initial_scale=4.0), **fields)


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_custom_loop_ends_with_float32_loss(amp_runtime, caplog):
    float32_losses, float32_w = custom_loop(STEPS - SKIPPED)
    amp_runtime(float16_from_scale_4())
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        losses, w = custom_loop(STEPS)
    assert not any(np.isfinite(losses[:SKIPPED]))  # half: x @ w overflows
    np.testing.assert_allclose(losses[SKIPPED:], float32_losses, rtol=1e-6)
    np.testing.assert_allclose(w, float32_w, rtol=1e-6)
    assert not np.allclose(w, 300.0)  # the float32 steps trained
    fallback = [m for m in warnings_of(caplog) if "runs in float32 from the next call" in m]
    assert len(fallback) == 1 and "floor of 1" in fallback[0], warnings_of(caplog)


def test_tf_keras_fit_train_function_falls_back_keeping_values(amp_runtime, caplog):
    float32_kernel = tf_keras_fit(STEPS - SKIPPED)
    amp_runtime(float16_from_scale_4())
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        kernel = tf_keras_fit(STEPS)
    np.testing.assert_allclose(kernel, float32_kernel, rtol=1e-6)
    assert not np.allclose(kernel, 300.0)
    fallback = [m for m in warnings_of(caplog) if "runs in float32 from the next call" in m]
    assert len(fallback) == 1 and "floor of 1" in fallback[0], warnings_of(caplog)


def test_steps_that_recover_keep_the_rewrite(amp_runtime, caplog):
    import keras

    amp_runtime(RuntimeSettings(target="float16"))
    w = tf.Variable(np.full((4, 3), 0.01, np.float32))
    optimizer = keras.optimizers.SGD(1e-3)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(tf.ones((64, 4)), w)))
        optimizer.apply_gradients(zip(tape.gradient(loss, [w]), [w]))
        return loss

    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        for _ in range(4):
            step()
    assert not [m for m in warnings_of(caplog) if "runs in float32" in m]
    ops = step.get_concrete_function().graph.get_operations()
    assert any(op.type == "MatMul" and op.get_attr("T") == tf.float16 for op in ops)


def test_strict_mode_raises(amp_runtime):
    amp_runtime(float16_from_scale_4(is_strict=True))
    with pytest.raises(RuntimeRewriteError, match="floor of 1"):
        custom_loop(STEPS)


def test_a_fixed_scale_of_one_keeps_skipping_in_half(amp_runtime, caplog):
    amp_runtime(RuntimeSettings(target="float16", loss_scale=LossScaleSettings(is_dynamic=False, initial_scale=1.0)))
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        losses, w = custom_loop(4)
    assert not any(np.isfinite(losses))
    np.testing.assert_array_equal(w, 300.0)
    assert not [m for m in warnings_of(caplog) if "runs in float32" in m]


def test_a_skip_at_the_floor_on_the_first_call_falls_back_every_trace(amp_runtime, caplog):
    # The optimizer creates its variables in the first call, so the function is traced
    # twice; the second trace must run float32 too.
    float32_losses, float32_w = custom_loop(3)
    amp_runtime(RuntimeSettings(target="float16", loss_scale=LossScaleSettings(initial_scale=1.0)))
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        losses, w = custom_loop(4)
    assert not np.isfinite(losses[0])
    np.testing.assert_allclose(losses[1:], float32_losses, rtol=1e-6)
    np.testing.assert_allclose(w, float32_w, rtol=1e-6)
    assert len([m for m in warnings_of(caplog) if "runs in float32 from the next call" in m]) == 1
