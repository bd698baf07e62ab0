"""Training in float16 with loss scaling, on a GPU: a TF1 session, Keras 3 ``fit``, tf_keras ``fit``, a tape loop.

Each style trains the same small classifier (32 features, 64 hidden units,
4 classes) from three seeds in float32, then from the first seed under
the runtime. The half run's losses must be finite and end within the
float32 runs' seed-to-seed spread of the float32 run from the same seed
(:func:`assert_within_seed_spread`): a difference that large is what
another initialisation makes anyway, and a rewrite that trains worse than
that has failed.

- The TF1 session sums its loss over the batch, so at the first scales
  (2**15, ...) the half gradients of the hidden layer's weights exceed
  float16's 65504: those steps are skipped and the scale halves each time
  (the CPU version of this check: ``tests/runtime/tf1/test_overflow.py``).
- The TF2 styles multiply their loss by :data:`TINY` and SGD's learning rate
  by its inverse (so float32 trains as without): unscaled, the half
  gradients underflow to zero and nothing is learnt, which is what the CPU
  test :func:`test_half_without_loss_scaling_fails_the_seed_spread` shows
  the check catches.

The tests marked ``gpu`` run with the target chosen for the machine (``auto``:
float16 where TensorFlow sees a GPU), against float32 runs with TF32 off; their
CPU variants force float16, on the same code.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from helpers import float32_as_float32, tf1

from amp_rewrite import runtime
from amp_rewrite.runtime.loss_scale import tf1_optimizer
from amp_rewrite.runtime.settings import LossScaleSettings, RuntimeSettings

FEATURES, HIDDEN, CLASSES, EXAMPLES, BATCH = 32, 64, 4, 256, 64
SEEDS = (0, 1, 2)
TINY = 1e-6
LEARNING_RATE = 0.5 / TINY
SESSION_STEPS, EPOCHS = 40, 10
GPU_SETTINGS = RuntimeSettings(target="auto")
CPU_SETTINGS = RuntimeSettings(target="float16")


def data():
    """A fixed, learnable problem: the class a random linear teacher gives each example."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(EXAMPLES, FEATURES)).astype(np.float32)
    y = np.argmax(x @ rng.normal(size=(FEATURES, CLASSES)), axis=1).astype(np.int32)
    return x, y


def assert_within_seed_spread(half: list[float], float32_by_seed: list[list[float]], *, last: int = 3) -> None:
    """The half run (from the first seed) is finite and its last losses end within float32's seed-to-seed spread.

    Args:
        half: the half run's losses, step by step (or epoch by epoch).
        float32_by_seed: the float32 runs' losses, the first from the half run's seed.
        last: how many final losses are averaged on each side.
    """
    assert np.all(np.isfinite(half)), half
    finals = np.array([np.mean(run[-last:]) for run in float32_by_seed])
    spread = float(finals.max() - finals.min())
    assert spread > 0, finals
    ended = float(np.mean(half[-last:]))
    assert abs(ended - finals[0]) <= spread, (
        f"half ends at {ended:.4f}, float32 from the same seed at {finals[0]:.4f}: further apart than float32's "
        f"seeds ({finals.round(4).tolist()}, spread {spread:.4f})")


def assert_runs_float16(choice_reason_has: str) -> None:
    choice = runtime.target_choice()
    assert choice is not None and choice.target == "float16", choice
    assert choice_reason_has in choice.reason, choice


# --- a TF1 session whose first scales overflow ---------------------------------------------------


def session_training(seed: int) -> tuple[list[float], list[float]]:
    """Adam on the summed cross-entropy in a TF1 session; the losses, and ``[scale, skipped]`` (empty in float32)."""
    x_value, y_value = data()
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(seed)
        x = tf1.placeholder(tf.float32, [EXAMPLES, FEATURES], name="x")
        y = tf1.placeholder(tf.int32, [EXAMPLES], name="y")
        w1 = tf1.get_variable("w1", [FEATURES, HIDDEN], initializer=tf1.initializers.glorot_uniform())
        w2 = tf1.get_variable("w2", [HIDDEN, CLASSES], initializer=tf1.initializers.glorot_uniform())
        logits = tf.matmul(tf.nn.relu(tf.matmul(x, w1, name="hidden")), w2, name="logits")
        # summed over 256 examples: the gradients of w1 and w2 are 256 times those of the mean
        loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits), name="loss")
        train = tf1.train.AdamOptimizer(1e-2).minimize(loss)
        init = tf1.global_variables_initializer()
    losses = []
    with tf1.Session(graph=graph) as session:
        session.run(init)
        for _ in range(SESSION_STEPS):
            _, value = session.run([train, loss], {x: x_value, y: y_value})
            losses.append(float(value) / EXAMPLES)
        state = graph.get_collection(tf1_optimizer.STATE_COLLECTION)
        scale = [float(session.run(state[0])), float(session.run(state[2]))] if state else []
    return losses, scale


def check_session_overflow(amp_runtime, settings: RuntimeSettings) -> None:
    with float32_as_float32():
        float32 = [session_training(seed)[0] for seed in SEEDS]
    amp_runtime(settings)
    half, (scale, skipped) = session_training(SEEDS[0])
    skipped = int(skipped)
    assert skipped >= 1, "the first scale did not overflow: the check would test nothing"
    assert scale == 2.0 ** 15 / 2.0 ** skipped  # halved at each skipped step, not grown in 40 steps
    # the skipped steps are the first ones, and changed no weight: the same loss until one is taken
    np.testing.assert_allclose(half[:skipped + 1], half[0], rtol=1e-6)
    assert half[skipped + 1] < half[0]
    # a skipped step is no update: compare after as many updates on each side
    assert_within_seed_spread(half[skipped:], [run[:len(run) - skipped] for run in float32])


@pytest.mark.gpu
def test_gpu_session_step_skips_the_overflowing_scales_and_trains_as_float32_does(amp_runtime):
    check_session_overflow(amp_runtime, GPU_SETTINGS)
    assert_runs_float16("GPU")


def test_session_step_skips_the_overflowing_scales_and_trains_as_float32_does_in_forced_float16(amp_runtime):
    check_session_overflow(amp_runtime, CPU_SETTINGS)


# --- TF2: Keras 3 fit, tf_keras fit, a GradientTape loop ---------------------------------------------


def classifier(keras, seed: int):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(HIDDEN, activation="relu"),
                             keras.layers.Dense(CLASSES)])


def tiny_loss(keras):
    """Cross-entropy times TINY: unscaled, its float16 gradients underflow."""
    cross_entropy = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return lambda y, logits: cross_entropy(y, logits) * TINY


def fit(keras, seed: int) -> list[float]:
    """``fit`` for EPOCHS epochs; the epochs' mean losses, without TINY."""
    model = classifier(keras, seed)
    model.compile(optimizer=keras.optimizers.SGD(LEARNING_RATE), loss=tiny_loss(keras))
    x, y = data()
    history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    return [loss / TINY for loss in history.history["loss"]]


def keras3_fit(seed: int) -> list[float]:
    import keras

    return fit(keras, seed)


def tf_keras_fit(seed: int) -> list[float]:
    import tf_keras

    return fit(tf_keras, seed)


def tape_loop(seed: int) -> list[float]:
    """A ``tf.function`` step with a GradientTape and Keras 3's SGD; each step's loss, without TINY."""
    import keras

    model = classifier(keras, seed)
    optimizer = keras.optimizers.SGD(LEARNING_RATE)
    loss_of = tiny_loss(keras)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_of(y, model(x, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    x, y = data()
    batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat(EPOCHS)
    return [float(step(a, b)) / TINY for a, b in batches]


STYLES = {"keras3_fit": keras3_fit, "tf_keras_fit": tf_keras_fit, "tape_loop": tape_loop}


def check_tf2_style(amp_runtime, train, settings: RuntimeSettings) -> None:
    with float32_as_float32():
        float32 = [train(seed) for seed in SEEDS]
    amp_runtime(settings)
    half = train(SEEDS[0])
    scaling = runtime.loss_scaling()
    assert scaling is not None and float(scaling.state().scale.numpy()) >= 2.0 ** 10  # scaled, by much
    assert half != float32[0][:len(half)]  # the half math really ran
    assert_within_seed_spread(half, float32)


@pytest.mark.gpu
@pytest.mark.parametrize("style", list(STYLES))
def test_gpu_float16_training_ends_within_float32s_seed_spread(amp_runtime, style):
    check_tf2_style(amp_runtime, STYLES[style], GPU_SETTINGS)
    assert_runs_float16("GPU")


def test_forced_float16_tape_loop_ends_within_float32s_seed_spread(amp_runtime):
    check_tf2_style(amp_runtime, tape_loop, CPU_SETTINGS)


def test_half_without_loss_scaling_fails_the_seed_spread(amp_runtime):
    """The check can fail: a fixed scale of 1 leaves TINY's gradients at zero in float16, and nothing is learnt."""
    float32 = [tape_loop(seed) for seed in SEEDS]
    amp_runtime(RuntimeSettings(target="float16", loss_scale=LossScaleSettings(is_dynamic=False, initial_scale=1.0)))
    unscaled = tape_loop(SEEDS[0])
    with pytest.raises(AssertionError, match="further apart than float32's seeds"):
        assert_within_seed_spread(unscaled, float32)
