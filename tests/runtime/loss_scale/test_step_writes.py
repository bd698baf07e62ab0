"""A skipped float16 step leaves the variables it wrote as they were: moving statistics and metrics.

A model with a batch norm and an AUC metric trains under the runtime in
float16. Its first steps are skipped because the first loss scale is so
large that the gradients overflow (they are skipped until the halved scale
fits), or because the input makes the forward pass overflow half (then the
batch norm's moving statistics of that step are inf or NaN). Either way the
moving mean and variance, the AUC's confusion counts and the loss mean must
hold what the steps that were applied wrote: those of a float32 run of
only those steps (the learning rate is 0, so every applied step sees the
same batch). Keras 3 ``fit`` (also several steps a call, and under
MirroredStrategy), a custom GradientTape loop, and a TF1 session whose
batch norm's ``UPDATE_OPS`` run before ``minimize``.
"""

import numpy as np
import pytest
import tensorflow as tf
from fixtures.harness import Script, run_scripts
from helpers import tf1, v1_control_flow

from amp_rewrite import runtime
from amp_rewrite.runtime.loss_scale.core import SCOPE
from amp_rewrite.runtime.settings import LossScaleSettings, RuntimeSettings

BATCH, WIDTH, THRESHOLDS = 32, 8, 20
STEPS = 6
OVERFLOWING_INPUT = 1e5  # x @ w reaches ~1e5 per unit: beyond float16 at any loss scale


def float16_from(scale: float) -> RuntimeSettings:
    return RuntimeSettings(target="float16", loss_scale=LossScaleSettings(initial_scale=scale))


def batch(factor: float = 1.0):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, WIDTH)).astype(np.float32)
    return x * np.float32(factor), (x[:, :1] > 0).astype(np.float32)


def skipped_so_far() -> int:
    return int(runtime.loss_scaling().state().skipped_steps.numpy())


# --- Keras 3 -----------------------------------------------------------------------------------


def keras3_model(steps_per_execution: int = 1):
    """Dense, BatchNormalization, Dense, SGD with a learning rate of 0, and an AUC metric."""
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((WIDTH,)), keras.layers.Dense(16), keras.layers.BatchNormalization(),
                              keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="binary_crossentropy", jit_compile=False,
                  metrics=[keras.metrics.AUC(num_thresholds=THRESHOLDS, name="auc")],
                  steps_per_execution=steps_per_execution)
    return model


def keras3_fit(model, steps: int, factor: float = 1.0) -> None:
    x, y = batch(factor)
    model.fit(np.concatenate([x] * steps), np.concatenate([y] * steps), batch_size=BATCH, epochs=1,
              shuffle=False, verbose=0)


def keras3_state(model) -> dict[str, np.ndarray]:
    """The batch norm's moving statistics and every metric variable (the AUC's counts, the loss mean's)."""
    bn = model.layers[1]
    state = {"moving_mean": bn.moving_mean.numpy(), "moving_variance": bn.moving_variance.numpy()}
    state.update({v.name: np.asarray(v.numpy()) for v in model.metrics_variables})
    return state


def assert_counts_applied_steps(state: dict, applied: int) -> None:
    """Each applied step counted each example once per threshold, and the loss mean each example once."""
    counts = sum(state[name] for name in ("true_positives", "false_positives", "true_negatives", "false_negatives"))
    np.testing.assert_array_equal(counts, np.full(THRESHOLDS, BATCH * applied, np.float32))
    assert float(state["count"]) == BATCH * applied


def assert_like_float32(state: dict, float32_state: dict) -> None:
    for name in ("moving_mean", "moving_variance"):
        np.testing.assert_allclose(state[name], float32_state[name], rtol=1e-2, atol=1e-4, err_msg=name)


@pytest.mark.parametrize("steps_per_execution", [1, 4])
def test_keras3_fit_keeps_only_what_the_applied_steps_wrote(amp_runtime, steps_per_execution):
    amp_runtime(float16_from(2.0 ** 20))
    model = keras3_model(steps_per_execution)
    keras3_fit(model, STEPS)
    skipped = skipped_so_far()
    assert 0 < skipped < STEPS
    runtime.disable()
    float32_model = keras3_model()
    keras3_fit(float32_model, STEPS - skipped)
    state = keras3_state(model)
    assert_counts_applied_steps(state, STEPS - skipped)
    assert_like_float32(state, keras3_state(float32_model))
    assert int(model.optimizer.iterations) == STEPS - skipped


def test_keras3_fit_keeps_no_inf_from_a_forward_pass_that_overflowed(amp_runtime):
    amp_runtime(float16_from(4.0))
    model = keras3_model()
    initial = keras3_state(model)
    keras3_fit(model, 1, factor=OVERFLOWING_INPUT)
    assert skipped_so_far() == 1
    after_skip = keras3_state(model)
    for name, value in initial.items():
        np.testing.assert_array_equal(after_skip[name], value, err_msg=name)
    keras3_fit(model, 2)  # a finite batch: applied, and written as usual
    runtime.disable()
    float32_model = keras3_model()
    keras3_fit(float32_model, 2)
    state = keras3_state(model)
    assert all(np.all(np.isfinite(value)) for value in state.values()), state
    assert_counts_applied_steps(state, 2)
    assert_like_float32(state, keras3_state(float32_model))


def test_keras3_fit_under_mirrored_strategy_keeps_only_what_the_applied_steps_wrote(tmp_path):
    (amp,) = run_scripts(Script("keras3_batch_norm_fit.py", ["--mirrored", "--batches", STEPS], tmp_path / "amp.json",
                                amp=True, env={"AMP_LOSS_SCALE_INIT": str(2 ** 20)}))
    skipped = amp.check().result["skipped"]
    assert 0 < skipped < STEPS
    (fp32,) = run_scripts(Script("keras3_batch_norm_fit.py", ["--mirrored", "--batches", STEPS - skipped],
                                 tmp_path / "fp32.json"))
    state = {name: np.asarray(value, np.float32) for name, value in amp.result.items()}
    assert_counts_applied_steps(state, STEPS - skipped)
    assert_like_float32(state, {name: np.asarray(value) for name, value in fp32.check().result.items()})
    assert amp.result["iterations"] == STEPS - skipped


def test_tf_keras_fit_puts_back_its_assign_add_and_assign_sub_writes(amp_runtime):
    # tf_keras' batch norm updates with assign_sub and its metrics with assign_add, in place unless a read holds
    # the buffer: the snapshot must survive them.
    import tf_keras

    amp_runtime(float16_from(4.0))
    tf_keras.utils.set_random_seed(0)
    model = tf_keras.Sequential([tf_keras.layers.Dense(16, input_shape=(WIDTH,)), tf_keras.layers.BatchNormalization(),
                                 tf_keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer=tf_keras.optimizers.SGD(0.0), loss="binary_crossentropy",
                  metrics=[tf_keras.metrics.AUC(num_thresholds=THRESHOLDS)])
    x, y = batch(OVERFLOWING_INPUT)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    assert skipped_so_far() == 1
    bn = model.layers[1]
    np.testing.assert_array_equal(bn.moving_mean.numpy(), 0.0)
    np.testing.assert_array_equal(bn.moving_variance.numpy(), 1.0)
    for variable in (v for metric in model.metrics for v in metric.variables):
        np.testing.assert_array_equal(variable.numpy(), 0.0, err_msg=variable.name)


# --- a custom GradientTape loop ----------------------------------------------------------------------


def custom_loop(steps: int):
    """A tf.function step: the model's forward pass, the optimizer, then an AUC, a float average of the
    loss and an integer step count written by hand. Returns the state after ``steps`` steps."""
    import keras

    model = keras3_model()
    optimizer = keras.optimizers.SGD(0.0)
    auc = keras.metrics.AUC(num_thresholds=THRESHOLDS)
    average = tf.Variable(0.0, trainable=False)
    count = tf.Variable(0, dtype=tf.int64, trainable=False)
    x, y = batch()

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            prediction = model(x, training=True)
            loss = tf.reduce_mean(keras.losses.binary_crossentropy(y, prediction))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        auc.update_state(y, prediction)
        average.assign(0.5 * average + 0.5 * loss)
        count.assign_add(1)

    for _ in range(steps):
        step()
    bn = model.layers[1]
    return {"moving_mean": bn.moving_mean.numpy(), "moving_variance": bn.moving_variance.numpy(),
            "average": average.numpy(), "count": int(count.numpy()),
            **{v.name: v.numpy() for v in auc.variables}}


def test_a_custom_loop_keeps_only_what_the_applied_steps_wrote(amp_runtime):
    amp_runtime(float16_from(2.0 ** 20))
    state = custom_loop(STEPS)
    skipped = skipped_so_far()
    assert 0 < skipped < STEPS
    runtime.disable()
    float32_state = custom_loop(STEPS - skipped)
    assert_like_float32(state, float32_state)
    counts = sum(state[name] for name in ("true_positives", "false_positives", "true_negatives", "false_negatives"))
    np.testing.assert_array_equal(counts, np.full(THRESHOLDS, BATCH * (STEPS - skipped), np.float32))
    np.testing.assert_allclose(state["average"], float32_state["average"], rtol=1e-2)
    assert state["count"] == STEPS  # an integer counter is no statistic: it counts the skipped steps too


# --- TF1: the batch norm's UPDATE_OPS run before minimize --------------------------------------------


def tf1_batch_norm_training(steps: int, *, fused: bool, factor: float = 1.0) -> dict[str, np.ndarray]:
    """``steps`` steps of x @ w, a v1 batch norm (tf_keras' legacy layer) and a Dense, the norm's
    ``UPDATE_OPS`` a control dependency of ``minimize``; the moving statistics after them."""
    from tf_keras.api._v1.keras.__internal__.legacy.layers import batch_normalization

    x_value, y_value = batch(factor)
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [BATCH, WIDTH], name="x")
        w = tf1.get_variable("w", [WIDTH, 16], initializer=tf1.initializers.random_normal(seed=1))
        v = tf1.get_variable("v", [16, 1], initializer=tf1.initializers.random_normal(seed=2))
        normalised = batch_normalization(tf.matmul(x, w), training=True, fused=fused, name="bn")
        loss = tf.reduce_mean(tf.square(tf.matmul(normalised, v) - y_value))
        with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
            train = tf1.train.GradientDescentOptimizer(0.0).minimize(loss)
        variables = {v.name: v for v in tf1.global_variables()}
        statistics = {name: variables[f"bn/{name}:0"] for name in ("moving_mean", "moving_variance")}
        skipped = variables.get(f"{SCOPE}/skipped_steps:0")
        init = tf1.global_variables_initializer()
    with tf1.Session(graph=graph) as session:
        session.run(init)
        for _ in range(steps):
            session.run(train, {x: x_value})
        return {**session.run(statistics), "skipped": 0 if skipped is None else int(session.run(skipped))}


@pytest.mark.parametrize("fused", [False, True])
def test_a_tf1_session_keeps_only_what_the_applied_steps_wrote(amp_runtime, fused):
    amp_runtime(float16_from(2.0 ** 16))
    state = tf1_batch_norm_training(STEPS, fused=fused)
    assert 0 < state["skipped"] < STEPS
    runtime.disable()
    assert_like_float32(state, tf1_batch_norm_training(STEPS - state["skipped"], fused=fused))


@pytest.mark.parametrize("fused", [False, True])
def test_a_tf1_session_keeps_no_inf_from_a_forward_pass_that_overflowed(amp_runtime, fused):
    amp_runtime(float16_from(4.0))
    state = tf1_batch_norm_training(1, fused=fused, factor=OVERFLOWING_INPUT)
    assert state["skipped"] == 1
    np.testing.assert_array_equal(state["moving_mean"], 0.0)
    np.testing.assert_array_equal(state["moving_variance"], 1.0)


WEIGHTS = np.random.default_rng(1).standard_normal((WIDTH, 16)).astype(np.float32)


def test_a_tf1_reference_variable_is_copied_before_its_update_and_put_back(amp_runtime):
    # A reference variable's update writes in place: the snapshot must be a copy, not a read of its buffer.
    amp_runtime(float16_from(4.0))
    x_value, _ = batch()
    with v1_control_flow():  # the optimizer's reference updates cannot run in a functional cond
        graph = tf.Graph()
        with graph.as_default():
            x = tf1.placeholder(tf.float32, [BATCH, WIDTH], name="x")
            w = tf1.Variable(WEIGHTS, use_resource=False)
            moving_mean = tf1.Variable(np.zeros(16, np.float32), trainable=False, use_resource=False)
            h = tf.matmul(x, w)
            mean = tf.reduce_mean(h, axis=0)
            update = tf1.assign_sub(moving_mean, (moving_mean - mean) * 0.1)
            with tf.control_dependencies([update]):
                train = tf1.train.GradientDescentOptimizer(0.0).minimize(tf.reduce_mean(tf.square(h - mean)))
            init = tf1.global_variables_initializer()
        with tf1.Session(graph=graph) as session:
            session.run(init)
            session.run(train, {x: x_value * np.float32(OVERFLOWING_INPUT)})
            after_skip = session.run(moving_mean)
            session.run(train, {x: x_value})
            after_step = session.run(moving_mean)
    np.testing.assert_array_equal(after_skip, 0.0)
    np.testing.assert_allclose(after_step, 0.1 * (x_value @ WEIGHTS).mean(axis=0), rtol=1e-2, atol=1e-3)
