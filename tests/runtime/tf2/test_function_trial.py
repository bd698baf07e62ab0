"""TF2: a rewritten function's first calls alternate its half and float32 bodies, and the faster one stays.

The timer is the test's: each timed call takes what the test says its body
takes, so each verdict is decided here, on any machine. One test runs the
real clock on a model too small for half to win anywhere.
"""

import logging
from collections import Counter

import numpy as np
import pytest
import tensorflow as tf
from helpers import HALF_TYPES

from amp_rewrite import runtime, tf_internals
from amp_rewrite.graph.facts import called_functions
from amp_rewrite.runtime.settings import RuntimeSettings
from amp_rewrite.runtime.tf2 import tracing
from amp_rewrite.tune.trial import CALLS, FLOAT32, HALF, schedule

TRACING_LOGGER = "amp_rewrite.runtime.tf2.tracing"


def timer_of(seconds: dict[str, float]):
    """A timer under which every call of a body on trial takes the seconds the test gives that body."""

    def timer(body, call):
        return call(), seconds[body]

    return timer


def start(amp_runtime, tmp_path, seconds: dict[str, float] | None = None):
    """The runtime in forced bfloat16 with step trials, a cache in ``tmp_path``, and the test's timer."""
    amp_runtime(RuntimeSettings(target="bfloat16", is_timing_steps=True, tune_cache_dir=str(tmp_path)))
    if seconds is not None:
        runtime.current_runtime().tracing.trials.timer = timer_of(seconds)


def training_loop():
    """A tf.function training step (two MatMuls, SGD on one variable) and its variable."""
    w = tf.Variable(np.linspace(-0.2, 0.2, 64 * 64, dtype=np.float32).reshape(64, 64))
    x = tf.constant(np.linspace(0.0, 1.0, 16 * 64, dtype=np.float32).reshape(16, 64))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(tf.nn.relu(tf.matmul(x, w)), w)))
        w.assign_sub(0.01 * tape.gradient(loss, w))
        return loss

    return step, w


def half_ops(concrete_function) -> list[str]:
    """The ops of the body the function runs now that compute in bfloat16."""
    fdef = tf_internals.concrete_function_state(concrete_function)["_inference_function"].definition
    return [node.op for node in fdef.node_def if any(a.type == tf.bfloat16 for a in node.attr.values())]


def lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == TRACING_LOGGER]


def test_half_that_runs_faster_is_kept(amp_runtime, tmp_path, caplog):
    start(amp_runtime, tmp_path, {HALF: 0.005, FLOAT32: 0.010})
    step, _ = training_loop()
    with caplog.at_level(logging.INFO, TRACING_LOGGER):
        losses = [float(step()) for _ in range(CALLS + 2)]
    cf = step.get_concrete_function()
    assert "MatMul" in half_ops(cf)
    assert tf_internals.call_override(cf) is None  # the trial is over and left nothing behind
    assert "amp-rewrite: tf.function step runs in bfloat16: the step ran 5.0 ms in bfloat16 and 10.0 ms in " \
           "float32 on this CPU (2.00x)" in lines(caplog)
    assert tracing.step_decisions() == [("step", True, "the step ran 5.0 ms in bfloat16 and 10.0 ms in float32 "
                                                       "on this CPU (2.00x)")]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]


def test_half_that_runs_slower_gives_the_step_its_float32_body(amp_runtime, tmp_path, caplog):
    float32_step, float32_w = training_loop()
    float32_losses = [float(float32_step()) for _ in range(CALLS + 2)]
    start(amp_runtime, tmp_path, {HALF: 0.012, FLOAT32: 0.010})
    step, w = training_loop()
    with caplog.at_level(logging.INFO, TRACING_LOGGER):
        losses = [float(step()) for _ in range(CALLS + 2)]
    cf = step.get_concrete_function()
    assert half_ops(cf) == [] and cf not in runtime.current_runtime().tracing.swapped
    assert tf_internals.call_override(cf) is None
    assert "amp-rewrite: tf.function step stays float32: the step ran 12.0 ms in bfloat16 and 10.0 ms in " \
           "float32 on this CPU" in lines(caplog)
    # every call trained: the half ones within bfloat16's precision, the float32 ones after them exactly so
    np.testing.assert_allclose(losses, float32_losses, rtol=0.02, atol=1e-4)
    np.testing.assert_allclose(w.numpy(), float32_w.numpy(), rtol=0.02, atol=1e-3)


def test_a_second_run_decides_from_the_cache_before_the_first_call(amp_runtime, tmp_path, caplog):
    start(amp_runtime, tmp_path, {HALF: 0.012, FLOAT32: 0.010})
    step, _ = training_loop()
    for _ in range(CALLS):
        step()
    runtime.disable()
    start(amp_runtime, tmp_path, {HALF: 0.001, FLOAT32: 0.010})  # this clock is never read
    again, _ = training_loop()
    with caplog.at_level(logging.INFO, TRACING_LOGGER):
        again()
    cf = again.get_concrete_function()
    assert half_ops(cf) == [] and tf_internals.call_override(cf) is None
    assert not runtime.current_runtime().tracing.swapped  # not even rewritten
    assert lines(caplog) == ["amp-rewrite: tf.function step stays float32: the step ran 12.0 ms in bfloat16 and "
                             "10.0 ms in float32 on this CPU; measured before, read from the cache"]


def test_settings_made_in_code_and_tune_0_time_nothing(amp_runtime, tmp_path):
    assert not RuntimeSettings().is_timing_steps
    assert RuntimeSettings.from_env({}).is_timing_steps
    assert not RuntimeSettings.from_env({"AMP_REWRITE_TUNE": "0"}).is_timing_steps
    assert RuntimeSettings.from_env({"AMP_REWRITE_TUNE": "1"}).is_timing_steps
    amp_runtime(RuntimeSettings(target="bfloat16", tune_cache_dir=str(tmp_path)))
    step, _ = training_loop()
    for _ in range(3):
        step()
    assert "MatMul" in half_ops(step.get_concrete_function())
    assert runtime.current_runtime().tracing.trials is None and not list(tmp_path.iterdir())


def keras3_fit(epochs: int, **fit):
    """A small Keras 3 CNN trained by ``fit`` on seeded data, 12 batches of 16 an epoch; the epochs' losses."""
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((12, 12, 3)), keras.layers.Conv2D(8, 3, activation="relu"),
                              keras.layers.Flatten(), keras.layers.Dense(4)])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x, y = rng.random((192, 12, 12, 3), np.float32), rng.integers(0, 4, 192)
    return model.fit(x, y, batch_size=16, epochs=epochs, shuffle=False, verbose=0, **fit).history["loss"]


def test_keras3_fit_whose_half_step_loses_runs_float32_bodies(amp_runtime, tmp_path, caplog):
    """Keras 3 calls its rewritten one-step function inside the train function: the caller is tried."""
    float32_losses = keras3_fit(2)
    start(amp_runtime, tmp_path, {HALF: 0.030, FLOAT32: 0.020})
    with caplog.at_level(logging.INFO, TRACING_LOGGER):
        losses = keras3_fit(2)
    decided = [line for line in lines(caplog) if "stays float32" in line]
    assert len(decided) == 1 and "step_on_iterator stays float32: the step ran 30.0 ms" in decided[0], lines(caplog)
    decisions = runtime.current_runtime().tracing.trials.decisions
    [caller] = [function() for name, _, function in decisions if "step_on_iterator" in name]
    assert tf_internals.call_override(caller) is None
    # its body now calls the one-step function's traced body (rebuilt, so named apart)
    assert "_float32_" in tf_internals.concrete_function_state(caller)["_inference_function"].name.decode()
    np.testing.assert_allclose(losses, float32_losses, rtol=0.02)


def test_keras3_fit_in_a_second_run_gets_its_float32_bodies_from_the_cache(amp_runtime, tmp_path, caplog):
    """The train function decided float32 before: it runs float32 bodies from its first call, nothing timed."""
    start(amp_runtime, tmp_path, {HALF: 0.030, FLOAT32: 0.020})
    keras3_fit(1)
    runtime.disable()
    float32_losses = keras3_fit(2)
    start(amp_runtime, tmp_path, {HALF: 0.001, FLOAT32: 0.020})  # never read: nothing is timed
    with caplog.at_level(logging.INFO, TRACING_LOGGER):
        losses = keras3_fit(2)
    decided = [line for line in lines(caplog) if "stays float32" in line]
    assert decided and all(line.endswith("measured before, read from the cache") for line in decided), lines(caplog)
    assert not [line for line in lines(caplog) if "runs in bfloat16" in line]
    [caller] = [function() for name, _, function in runtime.current_runtime().tracing.trials.decisions
                if "step_on_iterator" in name][:1]
    assert "_float32_" in tf_internals.concrete_function_state(caller)["_inference_function"].name.decode()
    np.testing.assert_allclose(losses, float32_losses, rtol=1e-6)  # float32 from the first step


@pytest.mark.parametrize("is_half", [True, False])
def test_keras3_fit_keeps_the_verdict_of_its_train_function(amp_runtime, tmp_path, caplog, is_half):
    seconds = {HALF: 0.010, FLOAT32: 0.020} if is_half else {HALF: 0.020, FLOAT32: 0.010}
    start(amp_runtime, tmp_path, seconds)
    with caplog.at_level(logging.INFO, TRACING_LOGGER):
        keras3_fit(1)
    word = "runs in bfloat16" if is_half else "stays float32"
    assert [line for line in lines(caplog) if word in line], lines(caplog)


def test_a_step_too_small_for_half_to_win_runs_float32_after_its_trial(amp_runtime, tmp_path, capfd, caplog):
    """The real clock: a Dense of 20000 by 3 casts a wide input and gradient for a tiny product in half.

    Casting the batch's 160,000 inputs costs more than the product they
    feed, on any CPU: half loses by far more than a loaded machine's noise.
    """
    import keras

    amp_runtime(RuntimeSettings(target="bfloat16", is_timing_steps=True, tune_cache_dir=str(tmp_path),
                                profile_after=CALLS + 2))
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((20000,)), keras.layers.Dense(3)])
    model.compile(optimizer="sgd", loss="mse")
    x = np.ones((8 * (CALLS + 6), 20000), np.float32)
    with caplog.at_level(logging.INFO, TRACING_LOGGER):
        model.fit(x, np.zeros((len(x), 3), np.float32), batch_size=8, epochs=1, verbose=0)
    decided = [line for line in lines(caplog) if "stays float32: the step ran" in line]
    assert len(decided) == 1, lines(caplog)
    profile = capfd.readouterr().err
    rows = [line.split() for line in profile.splitlines() if line.startswith("  ") and "%" in line]
    assert rows and not [row for row in rows if "bfloat16" in row], profile[-3000:]  # float32 kernels ran


def scaled_training_loop():
    """``training_loop``'s step applied by a Keras 3 SGD (which the runtime guards under float16)."""
    import keras

    w = tf.Variable(np.linspace(-0.2, 0.2, 64 * 64, dtype=np.float32).reshape(64, 64))
    x = tf.constant(np.linspace(0.0, 1.0, 16 * 64, dtype=np.float32).reshape(16, 64))
    optimizer = keras.optimizers.SGD(0.01)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(tf.nn.relu(tf.matmul(x, w)), w)))
        optimizer.apply(tape.gradient(loss, [w]), [w])
        return loss

    return step, w


def executed_ops(call) -> Counter:
    """The op types one ``call()`` ran, counted, from TensorFlow's profiler (after its optimizations and pruning)."""
    import tempfile
    from pathlib import Path

    from amp_rewrite.runtime.profile import op_events

    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        try:
            call()
        finally:
            tf.profiler.experimental.stop()
        return Counter(op for _, op, _ in op_events(Path(logdir).rglob("*.xplane.pb")))


def half_nodes_run_by(concrete_function) -> list[str]:
    """The nodes of the body the function runs now, and of the functions it calls, that compute in half."""
    state = tf_internals.concrete_function_state(concrete_function)
    library = {name: f.definition for name, f in
               tf_internals.graph_functions(tf_internals.graph_in_state(state)).items()}
    found, pending, seen = [], [state["_inference_function"].definition], set()
    while pending:
        fdef = pending.pop()
        if fdef.signature.name in seen:
            continue
        seen.add(fdef.signature.name)
        for node in fdef.node_def:
            if any(value.type in HALF_TYPES or set(value.list.type) & set(HALF_TYPES) for value in node.attr.values()):
                found.append(f"{fdef.signature.name}::{node.name}")
            pending += [library[name] for name in called_functions(node, library)]
    return found


# The loss scaling's ops: the unscaling, the finiteness checks (of the loss and of each gradient), the guard.
SCALING_OPS = {"MulNoNan", "IsFinite", "If", "StatelessIf", "Switch"}


def test_a_float16_step_that_stays_float32_runs_without_its_loss_scaling(amp_runtime, tmp_path, caplog):
    """The traced body scales the loss and checks every gradient: its float32 variant does neither."""
    amp_runtime(RuntimeSettings(target="float16", is_timing_steps=True, tune_cache_dir=str(tmp_path)))
    hook = runtime.current_runtime().tracing
    hook.trials.timer = timer_of({HALF: 0.012, FLOAT32: 0.010})
    step, w = scaled_training_loop()
    good_steps = []
    with caplog.at_level(logging.INFO, TRACING_LOGGER):
        losses = []
        for _ in range(CALLS + 4):
            losses.append(float(step()))
            good_steps.append(int(runtime.current_runtime().loss_scaling.state().good_steps.numpy()))
        after_trial = w.numpy()
        losses += [float(step()) for _ in range(3)]
    cf = step.get_concrete_function()
    assert "amp-rewrite: tf.function step stays float32" in "\n".join(lines(caplog))
    assert tf_internals.call_override(cf) is None and cf not in hook.swapped
    ops = executed_ops(step)
    assert any("MatMul" in op for op in ops) and not set(ops) & SCALING_OPS, ops
    # only a half call moves the loss-scale state: the float32 ones leave it where the last half one did
    halves = [call == HALF for call in schedule()] + [False] * 4
    assert good_steps == list(np.cumsum(halves))
    # the float32 steps go on from the weights the trial left, as a plain float32 step would
    runtime.disable()
    plain_step, plain_w = scaled_training_loop()
    plain_w.assign(after_trial)  # SGD keeps no state of its own
    np.testing.assert_allclose(losses[-3:], [float(plain_step()) for _ in range(3)], rtol=1e-6)
    assert executed_ops(plain_step) == ops  # the float32 step the script would run without amp-rewrite


def test_keras3_fit_under_float16_that_stays_float32_calls_a_one_step_body_without_loss_scaling(amp_runtime, tmp_path,
                                                                                                caplog):
    float32_losses = keras3_fit(2)
    amp_runtime(RuntimeSettings(target="float16", is_timing_steps=True, tune_cache_dir=str(tmp_path)))
    runtime.current_runtime().tracing.trials.timer = timer_of({HALF: 0.030, FLOAT32: 0.020})
    with caplog.at_level(logging.INFO, TRACING_LOGGER):
        losses = keras3_fit(2)
    decisions = runtime.current_runtime().tracing.trials.decisions
    [caller] = [function() for name, verdict, function in decisions if "step_on_iterator" in name]
    assert not [verdict for _, verdict, _ in decisions if verdict.is_half], lines(caplog)
    iterator = iter(tf.data.Dataset.from_tensors((tf.zeros([16, 12, 12, 3]), tf.zeros([16], tf.int64))))
    ops = executed_ops(lambda: caller(iterator))
    assert any("Conv2D" in op for op in ops) and not set(ops) & SCALING_OPS, ops
    assert half_nodes_run_by(caller) == []
    np.testing.assert_allclose(losses, float32_losses, rtol=0.02)


def test_a_function_whose_float32_body_cannot_be_built_runs_half_untried_and_says_so(amp_runtime, tmp_path, caplog,
                                                                                    monkeypatch):
    from amp_rewrite.runtime.tf2 import function_trial

    def broken(fdef):
        raise ValueError("no float32 body here")

    monkeypatch.setattr(function_trial, "unscaled_function", broken)
    start(amp_runtime, tmp_path)
    runtime.current_runtime().tracing.trials.timer = lambda body, call: pytest.fail("a call was timed")
    step, _ = training_loop()
    with caplog.at_level(logging.INFO, TRACING_LOGGER):
        losses = [float(step()) for _ in range(CALLS + 2)]
    assert "MatMul" in half_ops(step.get_concrete_function())
    assert "amp-rewrite: tf.function step runs in bfloat16, not tried: its float32 body could not be built: " \
           "ValueError: no float32 body here" in lines(caplog)
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
