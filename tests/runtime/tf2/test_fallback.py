"""TF2: a rewritten function whose skipped steps show that no loss scale helps runs float32 from the next call.

No scale helps when the loss itself was not finite in two skipped steps in a
row (the forward pass overflows half, as ``X @ w`` does here); one such step
is a bad batch, skipped like any other. Gradients that overflow with a finite loss halve the scale first, down
to its floor of 1. Custom loops, tf_keras ``fit``, and Keras 3 ``fit``, whose
train function calls the rewritten one-step function inside its own graph.
"""

import logging

import numpy as np
import pytest
import tensorflow as tf
from fixtures.harness import Script, run_scripts

from amp_rewrite import runtime
from amp_rewrite.errors import RuntimeRewriteError
from amp_rewrite.runtime.settings import LossScaleSettings, RuntimeSettings

# x @ w = 4 * 300 * 300 = 360000: beyond float16 whatever the loss scale; fine in float32.
X = np.full((8, 4), 300.0, np.float32)
STEPS = 8
SKIPPED = 2  # the losses of the first two steps are not finite: no scale helps
LOSS_NOT_FINITE = "their loss itself was not finite"


def custom_loop(steps, *, is_nested=False):
    """``steps`` calls of a tf.function train step (Keras SGD on one variable): (losses, final w).

    With ``is_nested`` each call goes through an outer tf.function that calls the step in its graph.
    """
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

    call = tf.function(lambda: step()) if is_nested else step
    return [float(call()) for _ in range(steps)], w.numpy()


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


@pytest.mark.parametrize("is_nested", [False, True])
def test_custom_loop_ends_with_float32_loss(amp_runtime, caplog, is_nested):
    float32_losses, float32_w = custom_loop(STEPS - SKIPPED, is_nested=is_nested)
    amp_runtime(float16_from_scale_4())
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        losses, w = custom_loop(STEPS, is_nested=is_nested)
    assert not any(np.isfinite(losses[:SKIPPED]))  # half: x @ w overflows
    np.testing.assert_allclose(losses[SKIPPED:], float32_losses, rtol=1e-6)
    np.testing.assert_allclose(w, float32_w, rtol=1e-6)
    assert not np.allclose(w, 300.0)  # the float32 steps trained
    fallback = [m for m in warnings_of(caplog) if "runs in float32 from the next call" in m]
    assert len(fallback) == 1 and LOSS_NOT_FINITE in fallback[0], warnings_of(caplog)


def gradient_overflow_loop(steps):
    """Steps whose loss is finite but whose weight gradient overflows float16 at every scale: (losses, w).

    Forward: x @ w = 300 * 4 * 0.001 = 1.2. Backward: the gradient of the sum
    of squares w.r.t. w sums 2 * 1.2 * 300 over 256 rows: 184320 > 65504.
    """
    import keras

    w = tf.Variable(np.full((4, 3), 0.001, np.float32))
    optimizer = keras.optimizers.SGD(1e-9)
    x = tf.constant(np.full((256, 4), 300.0, np.float32))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(tf.matmul(x, w)))
        optimizer.apply_gradients(zip(tape.gradient(loss, [w]), [w]))
        return loss

    return [float(step()) for _ in range(steps)], w.numpy()


def test_gradients_that_overflow_with_a_finite_loss_walk_the_scale_down_first(amp_runtime, caplog):
    float32_losses, float32_w = gradient_overflow_loop(STEPS - 3)
    amp_runtime(float16_from_scale_4())
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        losses, w = gradient_overflow_loop(STEPS)
    assert all(np.isfinite(losses))
    np.testing.assert_allclose(w, float32_w, rtol=1e-6)  # three skips (scales 4, 2, 1), then float32
    state = runtime.current_runtime().loss_scaling.state()
    assert int(state.skipped_steps.numpy()) == 3 and float(state.scale.numpy()) == 1.0
    fallback = [m for m in warnings_of(caplog) if "runs in float32 from the next call" in m]
    assert len(fallback) == 1 and "floor of 1" in fallback[0], warnings_of(caplog)


def test_one_bad_batch_is_skipped_and_keeps_the_rewrite(amp_runtime, caplog):
    """A non-finite loss once (a bad batch) halves the scale; the next steps train in half."""
    import keras

    amp_runtime(float16_from_scale_4())
    w = tf.Variable(np.full((4, 3), 0.01, np.float32))
    optimizer = keras.optimizers.SGD(1e-3)

    @tf.function
    def step(multiplier):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(tf.ones((8, 4)), w))) * multiplier
        optimizer.apply_gradients(zip(tape.gradient(loss, [w]), [w]))
        return loss

    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        losses = [float(step(tf.constant(m))) for m in (1.0, float("inf"), 1.0, 1.0)]
    assert np.isfinite(losses[0]) and not np.isfinite(losses[1]) and all(np.isfinite(losses[2:]))
    assert int(optimizer.iterations) == 3
    assert not [m for m in warnings_of(caplog) if "runs in float32" in m], warnings_of(caplog)
    ops = step.get_concrete_function(tf.TensorSpec([])).graph.get_operations()
    assert any(op.type == "MatMul" and op.get_attr("T") == tf.float16 for op in ops)


def test_tf_keras_fit_train_function_falls_back_keeping_values(amp_runtime, caplog):
    float32_kernel = tf_keras_fit(STEPS - SKIPPED)
    amp_runtime(float16_from_scale_4())
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        kernel = tf_keras_fit(STEPS)
    np.testing.assert_allclose(kernel, float32_kernel, rtol=1e-6)
    assert not np.allclose(kernel, 300.0)
    fallback = [m for m in warnings_of(caplog) if "runs in float32 from the next call" in m]
    assert len(fallback) == 1 and LOSS_NOT_FINITE in fallback[0], warnings_of(caplog)


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
    with pytest.raises(RuntimeRewriteError, match=LOSS_NOT_FINITE):
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


# --- Keras 3 fit: the train function calls the rewritten one-step function in its graph -------


def keras3_model(steps_per_execution=1, jit_compile=False):
    """One bias-free Dense, weights 300 (x @ w overflows half), SGD."""
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(
        3, use_bias=False, kernel_initializer=keras.initializers.Constant(300.0))])
    model.compile(optimizer=keras.optimizers.SGD(1e-10), loss="mse", jit_compile=jit_compile,
                  steps_per_execution=steps_per_execution)
    return model


def keras3_fit(model, batches):
    """One epoch of ``fit`` on ``batches`` equal batches of ``X``; the epoch's mean loss."""
    x = np.concatenate([X] * batches)
    history = model.fit(x, np.zeros((len(x), 3), np.float32), batch_size=len(X), epochs=1, shuffle=False,
                        verbose=0)
    return history.history["loss"][0]


def keras3_train_on_batch(model):
    """One step's loss (Keras before 3.13 reports the running mean since the last reset instead)."""
    model.reset_metrics()
    return model.train_on_batch(X, np.zeros((len(X), 3), np.float32), return_dict=True)["loss"]


def fallback_warnings(caplog):
    return [m for m in warnings_of(caplog) if "runs in float32 from the next call" in m]


@pytest.mark.parametrize("steps_per_execution, skipped", [
    (1, SKIPPED),
    (2, 2),  # both steps of the first call
    (3, 3),  # 4, 2, 1 in the first call
])
def test_keras3_fit_runs_float32_from_the_next_call(amp_runtime, caplog, steps_per_execution, skipped):
    float32_model = keras3_model(steps_per_execution)
    keras3_fit(float32_model, STEPS - skipped)
    amp_runtime(float16_from_scale_4())
    model = keras3_model(steps_per_execution)
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        keras3_fit(model, STEPS)
    kernel, float32_kernel = model.get_weights()[0], float32_model.get_weights()[0]
    np.testing.assert_allclose(kernel, float32_kernel, rtol=1e-6)
    assert not np.allclose(kernel, 300.0)  # the float32 steps trained
    # skipped steps do not count: the iterations are the float32 steps'
    assert int(model.optimizer.iterations) == int(float32_model.optimizer.iterations) == STEPS - skipped
    fallback = fallback_warnings(caplog)
    assert len(fallback) == 1 and LOSS_NOT_FINITE in fallback[0], warnings_of(caplog)


def test_keras3_later_fit_and_train_on_batch_stay_float32(amp_runtime, caplog):
    float32_model = keras3_model()
    float32_losses = [keras3_fit(float32_model, STEPS - SKIPPED), keras3_fit(float32_model, STEPS),
                      keras3_train_on_batch(float32_model), keras3_fit(float32_model, 2)]
    amp_runtime(float16_from_scale_4())
    model = keras3_model()
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        # its first steps overflowed, and are left out of its mean loss
        losses = [keras3_fit(model, STEPS), keras3_fit(model, STEPS), keras3_train_on_batch(model),
                  keras3_fit(model, 2)]
    np.testing.assert_allclose(losses, float32_losses, rtol=1e-6)
    np.testing.assert_allclose(model.get_weights()[0], float32_model.get_weights()[0], rtol=1e-6)
    assert len(fallback_warnings(caplog)) == 1, warnings_of(caplog)


def test_keras3_train_on_batch_falls_back_and_fit_follows(amp_runtime, caplog):
    # train_on_batch calls the one-step function itself; fit's train function then calls its traced body.
    float32_model = keras3_model()
    float32_losses = [keras3_train_on_batch(float32_model) for _ in range(2)]
    float32_losses.append(keras3_fit(float32_model, STEPS))
    amp_runtime(float16_from_scale_4())
    model = keras3_model()
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        skipped = [keras3_train_on_batch(model) for _ in range(SKIPPED)]
        losses = [keras3_train_on_batch(model) for _ in range(2)]
        losses.append(keras3_fit(model, STEPS))
    assert not any(np.isfinite(skipped))
    np.testing.assert_allclose(losses, float32_losses, rtol=1e-6)
    assert len(fallback_warnings(caplog)) == 1, warnings_of(caplog)


def test_keras3_fit_strict_mode_raises(amp_runtime):
    amp_runtime(float16_from_scale_4(is_strict=True))
    with pytest.raises(RuntimeRewriteError, match=LOSS_NOT_FINITE):
        keras3_fit(keras3_model(), STEPS)


def test_keras3_evaluate_and_predict_fall_back_with_fit(amp_runtime, caplog):
    """The forward pass that overflowed in training is the one evaluation and prediction run: float32 too."""
    small = np.full((8, 4), 0.05, np.float32)  # x @ w = 60: fine in half, but the model's forward pass is not
    float32_model = keras3_model()
    keras3_fit(float32_model, STEPS - SKIPPED)
    float32_loss = float32_model.evaluate(small, np.zeros((8, 3)), verbose=0)
    float32_prediction = float32_model.predict(small, verbose=0)
    amp_runtime(float16_from_scale_4())
    model = keras3_model()
    with caplog.at_level(logging.INFO, logger="amp_rewrite"):
        keras3_fit(model, STEPS)
        loss = model.evaluate(small, np.zeros((8, 3)), verbose=0)
        prediction = model.predict(small, verbose=0)
    np.testing.assert_allclose(prediction, float32_prediction, rtol=1e-6)
    np.testing.assert_allclose(loss, float32_loss, rtol=1e-6)
    assert len(fallback_warnings(caplog)) == 1, warnings_of(caplog)
    assert any("computes with weights whose forward pass overflowed half" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_keras3_xla_fit_is_not_watched(amp_runtime, caplog):
    # A requested target rewrites XLA-compiled functions, but their skips record no scale: no fallback.
    amp_runtime(float16_from_scale_4())
    model = keras3_model(jit_compile=True)
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        loss = keras3_fit(model, STEPS)
    assert loss == 0.0  # every step skipped, and left out of the mean loss: Keras's mean of no step
    np.testing.assert_array_equal(model.get_weights()[0], 300.0)
    assert int(model.optimizer.iterations) == 0
    assert not fallback_warnings(caplog), warnings_of(caplog)


def test_keras3_fit_under_mirrored_strategy_falls_back(tmp_path):
    fp32, amp = run_scripts(
        Script("keras3_overflow_fit.py", ["--mirrored", "--batches", f"{STEPS - SKIPPED},{STEPS}"],
               tmp_path / "fp32.json"),
        Script("keras3_overflow_fit.py", ["--mirrored", "--batches", f"{STEPS},{STEPS}"], tmp_path / "amp.json",
               amp=True, env={"AMP_LOSS_SCALE_INIT": "4"}))
    fp32, amp = fp32.check(), amp.check()
    assert amp.result["iterations"] == fp32.result["iterations"] == 2 * STEPS - SKIPPED
    # the skipped steps are left out of the epoch's mean loss, as they were out of the updates
    np.testing.assert_allclose(amp.result["losses"], fp32.result["losses"], rtol=1e-6)
    np.testing.assert_allclose(amp.result["kernel"], fp32.result["kernel"], rtol=1e-6)
    assert amp.stderr.count("runs in float32 from the next call") == 1, amp.stderr[-3000:]


# --- what runs with the weights of a function that fell back --------------------------------


def validated_fit(flavour, batches):
    """One epoch of ``fit`` with validation on ``X``, then evaluate and predict: (loss, val_loss, eval, prediction)."""
    if flavour == "tf_keras":
        import tf_keras as keras
    else:
        import keras
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(
        3, use_bias=False, kernel_initializer=keras.initializers.Constant(300.0))])
    model.compile(optimizer=keras.optimizers.SGD(1e-10), loss="mse")
    zeros = np.zeros((len(X), 3), np.float32)
    history = model.fit(np.concatenate([X] * batches), np.concatenate([zeros] * batches), batch_size=len(X),
                        epochs=1, shuffle=False, verbose=0, validation_data=(X, zeros))
    return (history.history["loss"][0], history.history["val_loss"][0], model.evaluate(X, zeros, verbose=0),
            model.predict(X, verbose=0))


@pytest.mark.parametrize("flavour", ["keras3", "tf_keras"])
def test_validation_evaluation_and_prediction_fall_back_with_training(amp_runtime, caplog, flavour):
    """Training overflows in its forward pass: validation, evaluate and predict run float32 with it.

    The epoch's loss is the mean of the steps that counted: the two skipped
    steps are left out, as they were out of the updates, so it equals the
    float32 epoch of the other batches.
    """
    expected = validated_fit(flavour, STEPS - SKIPPED)
    amp_runtime(float16_from_scale_4())
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        found = validated_fit(flavour, STEPS)
    assert np.isfinite(found[0]) and np.isfinite(found[1])
    for value, float32_value in zip(found, expected):
        np.testing.assert_allclose(value, float32_value, rtol=1e-6)
    assert len(fallback_warnings(caplog)) == 1, warnings_of(caplog)


def test_an_evaluation_rewritten_before_the_fallback_falls_back_with_it(amp_runtime, caplog):
    """Keras 3 evaluate traced in half before training overflowed: its functions get float32 bodies."""
    small = np.full((8, 4), 0.05, np.float32)
    float32_model = keras3_model()
    keras3_fit(float32_model, STEPS - SKIPPED)
    float32_loss = float32_model.evaluate(X, np.zeros((8, 3)), verbose=0)
    amp_runtime(float16_from_scale_4())
    model = keras3_model()
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        half_loss = model.evaluate(small, np.zeros((8, 3)), verbose=0)
        keras3_fit(model, STEPS)
        loss = model.evaluate(X, np.zeros((8, 3)), verbose=0)
    assert np.isfinite(half_loss)
    np.testing.assert_allclose(loss, float32_loss, rtol=1e-6)
    messages = warnings_of(caplog)
    assert any("computes with weights whose forward pass overflowed half" in m for m in messages), messages


def test_gradients_that_overflow_keep_evaluation_in_half(amp_runtime, caplog):
    """A fallback at the scale's floor (the loss was finite) leaves the forward pass, and evaluation, in half."""
    import keras

    amp_runtime(RuntimeSettings(target="float16", loss_scale=LossScaleSettings(initial_scale=1.0)))
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(
        3, use_bias=False, kernel_initializer=keras.initializers.Constant(1.0))])
    # the loss (its mean) is finite; its gradient, scaled by 1e6 in half, is not
    model.compile(optimizer=keras.optimizers.SGD(1e-10), loss=lambda y, p: tf.reduce_mean(p) * 1e6)
    x = np.full((8, 4), 1.0, np.float32)
    with caplog.at_level(logging.INFO, logger="amp_rewrite"):
        model.fit(x, np.zeros((8, 3)), batch_size=8, epochs=1, verbose=0)
        model.evaluate(x, np.zeros((8, 3)), verbose=0)
    messages = [r.getMessage() for r in caplog.records]
    fallback = fallback_warnings(caplog)
    assert len(fallback) == 1 and LOSS_NOT_FINITE not in fallback[0], messages  # a skip at the floor
    assert not any("computes with weights whose forward pass" in m for m in messages), messages
    fell_back_at = messages.index(fallback[0])
    assert any("converted" in m and "float16" in m for m in messages[fell_back_at:]), messages  # evaluate's
