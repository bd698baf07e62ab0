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
from amp_rewrite.errors import UsageError
from amp_rewrite.graph.facts import called_functions
from amp_rewrite.runtime.settings import RuntimeSettings
from amp_rewrite.runtime.tf2 import tracing
from amp_rewrite.runtime.tf2.recheck import Recheck
from amp_rewrite.tune.cache import Timing, read_file
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


def test_a_step_is_on_trial_until_its_verdict(amp_runtime, tmp_path):
    start(amp_runtime, tmp_path, {HALF: 0.005, FLOAT32: 0.010})
    step, _ = training_loop()
    assert tracing.steps_on_trial() == []
    on_trial = []
    for _ in range(CALLS + 2):
        step()
        on_trial.append(tracing.steps_on_trial())
    assert on_trial[0] == ["step"] and on_trial[-1] == []
    first_free = on_trial.index([])
    assert all(names == ["step"] for names in on_trial[:first_free]) and not any(on_trial[first_free:])
    assert tracing.step_decisions()[0][:2] == ("step", True)


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
    assert half_ops(cf) == [] and isinstance(tf_internals.call_override(cf), Recheck)  # counts calls to check again
    assert not runtime.current_runtime().tracing.swapped  # not even rewritten
    [cache_file] = tmp_path.glob("tune-*.json")
    assert lines(caplog) == ["amp-rewrite: tf.function step stays float32: the step ran 12.0 ms in bfloat16 and "
                             f"10.0 ms in float32 on this CPU; measured before, read from the cache {cache_file}"]


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
    [cache_file] = tmp_path.glob("tune-*.json")
    assert decided and all(line.endswith(f"measured before, read from the cache {cache_file}") for line in decided), \
        lines(caplog)
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


def test_the_real_clock_decides_and_the_kernels_after_the_verdict_are_the_verdicts(amp_runtime, tmp_path, capfd,
                                                                                      caplog):
    """The real clock, end to end: a Dense of 20000 by 3 casts a wide input and gradient for a tiny product.

    Casting the batch's 160,000 inputs costs more than the product they feed,
    so on an idle machine half loses; on a loaded one either verdict can be
    what the clock saw. Whichever it was, it is said once, and the profiled
    step after it ran that verdict's kernels.
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
    decided = [line for line in lines(caplog) if ": the step ran " in line]
    assert len(decided) == 1, lines(caplog)
    is_half = " runs in bfloat16: " in decided[0]
    assert is_half or " stays float32: " in decided[0], decided
    profile = capfd.readouterr().err
    rows = [line.split() for line in profile.splitlines() if line.startswith("  ") and "%" in line]
    assert rows, profile[-3000:]
    assert bool([row for row in rows if "bfloat16" in row]) == is_half, (decided, profile[-3000:])


class ThreadedClock:
    """A timer that sleeps before each call it times, so that calls from other threads would overlap it.

    It notes each call's body, when it began and ended, and which body the outputs came from.
    """

    def __init__(self, seconds: dict[str, float], which_body):
        self.seconds = seconds
        self.which_body = which_body
        self.calls: list[tuple[str, float, float, str]] = []

    def timer(self, body, call):
        import time

        began = time.perf_counter()
        time.sleep(0.02)  # another thread gets the interpreter here
        outputs = call()
        self.calls.append((body, began, time.perf_counter(), self.which_body(outputs)))
        return outputs, self.seconds[body]


def test_calls_from_several_threads_during_the_trial_each_run_one_whole_body(amp_runtime, tmp_path):
    """Eight threads call one function from its first call on: each call runs the body the schedule names, alone."""
    import threading

    rng = np.random.default_rng(0)
    w_value = rng.normal(0, 1, (64, 64)).astype(np.float32)
    x_value = rng.normal(0, 1, (8, 64)).astype(np.float32)
    float32_product = x_value @ w_value
    bfloat16 = tf.bfloat16.as_numpy_dtype
    half_product = x_value.astype(bfloat16).astype(np.float32) @ w_value.astype(bfloat16).astype(np.float32)

    def which_body(outputs) -> str:
        """``float32`` or ``half`` by the outputs' rounding (the inputs rounded to bfloat16 or not)."""
        value = outputs.numpy() if hasattr(outputs, "numpy") else np.asarray(outputs)
        if np.allclose(value, float32_product, rtol=1e-5, atol=1e-5):
            return FLOAT32
        return HALF if np.allclose(value, half_product, rtol=2e-2, atol=2e-2) else "neither"

    assert not np.allclose(half_product, float32_product, rtol=1e-5, atol=1e-5)  # the bodies can be told apart
    clock = ThreadedClock({HALF: 0.005, FLOAT32: 0.010}, which_body)
    amp_runtime(RuntimeSettings(target="bfloat16", is_timing_steps=True, tune_cache_dir=str(tmp_path)))
    trials = runtime.current_runtime().tracing.trials
    trials.timer, trials.profiler = clock.timer, None
    w, x = tf.Variable(w_value), tf.constant(x_value)

    @tf.function
    def product():
        return tf.matmul(x, w)

    cf = product.get_concrete_function()  # traced (and swapped) before the threads start
    barrier = threading.Barrier(8)
    seen: list[str] = []

    def serve():
        barrier.wait()
        for _ in range(4):
            seen.append(which_body(product()))

    threads = [threading.Thread(target=serve) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    bodies = [body for body, _, _, _ in clock.calls]
    # the schedule in order, from the first call the first-call guard did not run
    assert bodies in (schedule(), schedule()[1:]), bodies
    assert [ran for _, _, _, ran in clock.calls] == bodies  # each call ran the body the timer was told
    spans = sorted((began, ended) for _, began, ended, _ in clock.calls)
    assert all(ended <= next_began for (_, ended), (next_began, _) in zip(spans, spans[1:]))  # one at a time
    assert len(seen) == 32 and set(seen) <= {HALF, FLOAT32}
    assert tf_internals.call_override(cf) is None  # decided: later calls take no lock
    assert which_body(product()) == HALF and tracing.step_decisions()[0][:2] == ("product", True)
# --- what a cached verdict applies to ---------------------------------------------


def mlp_loop(width: int):
    """A tf.function training step of an MLP 64 → ``width`` → 1 (SGD): the same graph, whatever the width."""
    rng = np.random.default_rng(0)
    w1 = tf.Variable(rng.normal(0, 0.1, (64, width)).astype(np.float32))
    w2 = tf.Variable(rng.normal(0, 0.1, (width, 1)).astype(np.float32))
    x = tf.constant(rng.random((16, 64), np.float32))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(tf.nn.relu(tf.matmul(x, w1)), w2)))
        g1, g2 = tape.gradient(loss, [w1, w2])
        w1.assign_sub(0.01 * g1)
        w2.assign_sub(0.01 * g2)
        return loss

    return step


def decide(amp_runtime, tmp_path, step, seconds, calls=CALLS, **fields):
    """Starts the runtime with the test's timer, runs ``step`` ``calls`` times; the runtime after."""
    amp_runtime(RuntimeSettings(target="bfloat16", is_timing_steps=True, tune_cache_dir=str(tmp_path), **fields))
    trials = runtime.current_runtime().tracing.trials
    trials.timer = timer_of(seconds)
    trials.profiler = None  # the pure verdict is final
    for _ in range(calls):
        step()
    return runtime.current_runtime()


def test_the_same_model_of_another_width_is_not_given_the_cached_verdict(amp_runtime, tmp_path, caplog):
    """A variable's handle is a scalar input: the key holds what it holds, so the wide model is tried."""
    decide(amp_runtime, tmp_path, mlp_loop(16), {HALF: 0.012, FLOAT32: 0.010})
    runtime.disable()
    wide = mlp_loop(2048)
    with caplog.at_level(logging.INFO, TRACING_LOGGER):
        decide(amp_runtime, tmp_path, wide, {HALF: 0.005, FLOAT32: 0.010})
    assert [line for line in lines(caplog) if "tf.function step " in line] == [
        "amp-rewrite: tf.function step runs in bfloat16: the step ran 5.0 ms in bfloat16 and 10.0 ms in float32 on "
        "this CPU (2.00x)"]
    assert "MatMul" in half_ops(wide.get_concrete_function())


def test_an_edited_op_list_is_tried_again(amp_runtime, tmp_path, caplog, monkeypatch):
    decide(amp_runtime, tmp_path, mlp_loop(16), {HALF: 0.012, FLOAT32: 0.010})
    runtime.disable()
    monkeypatch.setenv("TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_DENYLIST_ADD", "Cumprod")
    with caplog.at_level(logging.INFO, TRACING_LOGGER):
        decide(amp_runtime, tmp_path, mlp_loop(16), {HALF: 0.005, FLOAT32: 0.010})
    assert "amp-rewrite: tf.function step runs in bfloat16: the step ran 5.0 ms in bfloat16 and 10.0 ms in float32 " \
           "on this CPU (2.00x)" in lines(caplog)


def cached_steps(tmp_path) -> dict[str, Timing]:
    """The verdicts in the tuning cache in ``tmp_path``, by key."""
    [path] = tmp_path.glob("tune-*.json")
    return {key: timing for key, timing in read_file(path).entries.items() if key.startswith("step ")}


def test_tune_again_measures_a_cached_step_again_and_replaces_its_verdict(amp_runtime, tmp_path, caplog):
    assert RuntimeSettings.from_env({"AMP_REWRITE_TUNE": "again"}).is_measuring_again
    assert RuntimeSettings.from_env({"AMP_REWRITE_TUNE": " Again "}).is_timing_steps
    assert not RuntimeSettings.from_env({"AMP_REWRITE_TUNE": "1"}).is_measuring_again
    with pytest.raises(UsageError, match="AMP_REWRITE_TUNE='sometimes': use 1 .*, 0, or again"):
        RuntimeSettings.from_env({"AMP_REWRITE_TUNE": "sometimes"})
    decide(amp_runtime, tmp_path, mlp_loop(16), {HALF: 0.012, FLOAT32: 0.010})
    runtime.disable()
    step = mlp_loop(16)
    with caplog.at_level(logging.INFO, TRACING_LOGGER):
        decide(amp_runtime, tmp_path, step, {HALF: 0.005, FLOAT32: 0.010}, is_measuring_again=True)
    assert "amp-rewrite: tf.function step runs in bfloat16: the step ran 5.0 ms in bfloat16 and 10.0 ms in float32 " \
           "on this CPU (2.00x)" in lines(caplog)
    assert [(t.half, t.float32, t.what) for t in cached_steps(tmp_path).values()] == [
        (0.005, 0.010, "tf.function step, bfloat16")]


# --- verdicts at the noise's edge --------------------------------------------------


def timer_of_calls(seconds: dict[str, list[float]]):
    """A timer giving each body's calls the test's seconds in turn (the last one from then on)."""
    left = {body: list(values) for body, values in seconds.items()}

    def timer(body, call):
        values = left[body]
        return call(), values.pop(0) if len(values) > 1 else values[0]

    return timer


def test_a_verdict_whose_halves_disagree_is_used_but_not_cached(amp_runtime, tmp_path, caplog):
    """Half ran twice as fast in the trial's first half, and slower in its second (a neighbour's job started)."""
    # The first half call is the first-call guard's and not timed; float32's first is its warm-up.
    noisy = {HALF: [0.005, 0.005, 0.013, 0.013], FLOAT32: [0.010]}
    step = mlp_loop(16)
    amp_runtime(RuntimeSettings(target="bfloat16", is_timing_steps=True, tune_cache_dir=str(tmp_path)))
    trials = runtime.current_runtime().tracing.trials
    trials.timer, trials.profiler = timer_of_calls(noisy), None
    with caplog.at_level(logging.INFO, TRACING_LOGGER):
        for _ in range(CALLS):
            step()
    assert lines(caplog)[-1] == (
        "amp-rewrite: tf.function step runs in bfloat16: the step ran 5.0 ms in bfloat16 and 10.0 ms in float32 on "
        "this CPU (2.00x); not clear enough to keep (2.00x in the trial's first half, 0.77x in its second): a later "
        "run measures again")
    assert "MatMul" in half_ops(step.get_concrete_function())  # this run keeps its verdict
    assert not list(tmp_path.glob("tune-*.json"))
    runtime.disable()
    caplog.clear()
    with caplog.at_level(logging.INFO, TRACING_LOGGER):
        decide(amp_runtime, tmp_path, mlp_loop(16), {HALF: 0.012, FLOAT32: 0.010})  # measured again
    assert lines(caplog)[-1] == ("amp-rewrite: tf.function step stays float32: the step ran 12.0 ms in bfloat16 and "
                                 "10.0 ms in float32 on this CPU")
    assert [(t.half, t.float32) for t in cached_steps(tmp_path).values()] == [(0.012, 0.010)]


# --- a cached verdict checked again ------------------------------------------------

EVERY = 4  # calls between re-checks in these tests (RECHECK_EVERY in a run)


@pytest.fixture
def recheck_often(monkeypatch):
    from amp_rewrite.runtime.tf2 import recheck

    monkeypatch.setattr(recheck, "RECHECK_EVERY", EVERY)


def test_a_cached_float32_verdict_that_a_recheck_clearly_contradicts_switches_to_half(
        amp_runtime, tmp_path, caplog, recheck_often):
    decide(amp_runtime, tmp_path, mlp_loop(16), {HALF: 0.012, FLOAT32: 0.010})
    runtime.disable()
    step = mlp_loop(16)
    with caplog.at_level(logging.INFO, TRACING_LOGGER):
        hook = decide(amp_runtime, tmp_path, step, {HALF: 0.005, FLOAT32: 0.010}, calls=EVERY - 1).tracing
        cf = step.get_concrete_function()
        assert half_ops(cf) == [] and not hook.swapped  # decided from the cache, not rewritten
        losses = [float(step()) for _ in range(6)]  # the re-check: half (untimed), half, float32, float32, half
    [cache_file] = tmp_path.glob("tune-*.json")
    assert lines(caplog)[-1] == (
        f"amp-rewrite: tf.function step now runs in bfloat16: checked again after {EVERY} calls, the step ran 5.0 ms "
        "in bfloat16 and 10.0 ms in float32 on this CPU (2.00x); the cache "
        f"{cache_file} had it stay float32 (12.0 ms in bfloat16, 10.0 ms in float32) and holds the new times")
    assert "MatMul" in half_ops(cf) and cf in hook.swapped
    assert isinstance(tf_internals.call_override(cf), Recheck)  # and counts towards the next re-check
    assert [(t.half, t.float32) for t in cached_steps(tmp_path).values()] == [(0.005, 0.010)]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]  # every call trained


def test_a_cached_half_verdict_that_a_recheck_clearly_contradicts_switches_to_float32(
        amp_runtime, tmp_path, caplog, recheck_often):
    decide(amp_runtime, tmp_path, mlp_loop(16), {HALF: 0.005, FLOAT32: 0.010})
    runtime.disable()
    step = mlp_loop(16)
    with caplog.at_level(logging.INFO, TRACING_LOGGER):
        hook = decide(amp_runtime, tmp_path, step, {HALF: 0.012, FLOAT32: 0.010}, calls=EVERY + 5).tracing
    cf = step.get_concrete_function()
    assert lines(caplog)[-1].startswith(
        f"amp-rewrite: tf.function step now stays float32: checked again after {EVERY} calls, the step ran 12.0 ms "
        "in bfloat16 and 10.0 ms in float32 on this CPU; the cache ")
    assert half_ops(cf) == [] and cf not in hook.swapped
    assert [(t.half, t.float32) for t in cached_steps(tmp_path).values()] == [(0.012, 0.010)]
    hook.trials.timer = timer_of({HALF: 0.005, FLOAT32: 0.010})
    with caplog.at_level(logging.INFO, TRACING_LOGGER):
        for _ in range(EVERY + 5):  # the next re-check finds half faster again: it switches back
            step()
    assert "MatMul" in half_ops(cf) and cf in hook.swapped
    assert "now runs in bfloat16: checked again" in lines(caplog)[-1]


@pytest.mark.parametrize("seconds", [{HALF: [0.0115], FLOAT32: [0.010]},  # agrees: float32 is faster
                                     {HALF: [0.005, 0.013], FLOAT32: [0.010]}])  # its two pairs disagree
def test_a_recheck_that_agrees_or_is_not_clear_leaves_the_verdict(amp_runtime, tmp_path, caplog, recheck_often,
                                                                  seconds):
    decide(amp_runtime, tmp_path, mlp_loop(16), {HALF: 0.012, FLOAT32: 0.010})
    runtime.disable()
    step = mlp_loop(16)
    amp_runtime(RuntimeSettings(target="bfloat16", is_timing_steps=True, tune_cache_dir=str(tmp_path)))
    trials = runtime.current_runtime().tracing.trials
    timed, times = [], timer_of_calls(seconds)

    def timer(body, call):
        timed.append(body)
        return times(body, call)

    trials.timer, trials.profiler = timer, None
    with caplog.at_level(logging.INFO, TRACING_LOGGER):
        for _ in range(EVERY - 1 + 5):
            step()
    assert timed == [HALF, FLOAT32, FLOAT32, HALF]  # the re-check ran (its first call is the first-call guard's)
    assert not [line for line in lines(caplog) if "now " in line]
    cf = step.get_concrete_function()
    assert half_ops(cf) == [] and isinstance(tf_internals.call_override(cf), Recheck)
    assert [(t.half, t.float32) for t in cached_steps(tmp_path).values()] == [(0.012, 0.010)]


def test_keras3_fit_whose_cached_float32_verdict_a_recheck_contradicts_runs_half_bodies(
        amp_runtime, tmp_path, caplog, recheck_often):
    """The train function (a caller of the rewritten one-step function) kept its float32 bodies from the cache."""
    start(amp_runtime, tmp_path, {HALF: 0.030, FLOAT32: 0.020})
    keras3_fit(1)
    runtime.disable()
    start(amp_runtime, tmp_path, {HALF: 0.010, FLOAT32: 0.020})
    runtime.current_runtime().tracing.trials.profiler = None
    with caplog.at_level(logging.INFO, TRACING_LOGGER):
        losses = keras3_fit(1)
    switched = [line for line in lines(caplog) if "now runs in bfloat16" in line]
    assert len(switched) == 1 and "step_on_iterator now runs in bfloat16: checked again after 4 calls, the step " \
        "ran 10.0 ms in bfloat16 and 20.0 ms in float32" in switched[0], lines(caplog)
    [(name, verdict, _)] = runtime.current_runtime().tracing.trials.decisions[-1:]
    assert "step_on_iterator" in name and verdict.is_half
    assert [(t.half, t.float32) for t in cached_steps(tmp_path).values()] == [(0.010, 0.020)]
    assert np.all(np.isfinite(losses))


@pytest.fixture
def op_determinism():
    """``tf.config.experimental.enable_op_determinism()`` for one test."""
    from tensorflow.python.framework import config

    tf.config.experimental.enable_op_determinism()
    yield
    config.disable_op_determinism()


def test_under_op_determinism_the_lists_decide_and_nothing_is_timed(amp_runtime, tmp_path, caplog, op_determinism):
    step = mlp_loop(16)
    with caplog.at_level(logging.INFO, TRACING_LOGGER):
        decide(amp_runtime, tmp_path, step, {})  # a timed call fails the test with a KeyError
    cf = step.get_concrete_function()
    assert "MatMul" in half_ops(cf) and tf_internals.call_override(cf) is None
    assert lines(caplog)[-1] == ("amp-rewrite: tf.function step runs in bfloat16 as the op lists say: op determinism "
                                 "is on, so no timing decides, and the tuning cache holds no verdict of this step")
    assert not list(tmp_path.iterdir())


def test_under_op_determinism_a_cached_verdict_decides_and_is_not_checked_again(
        amp_runtime, tmp_path, caplog, recheck_often, op_determinism):
    from tensorflow.python.framework import config

    config.disable_op_determinism()
    decide(amp_runtime, tmp_path, mlp_loop(16), {HALF: 0.012, FLOAT32: 0.010})
    runtime.disable()
    tf.config.experimental.enable_op_determinism()
    step = mlp_loop(16)
    with caplog.at_level(logging.INFO, TRACING_LOGGER):
        decide(amp_runtime, tmp_path, step, {}, calls=3 * EVERY)  # nothing is timed
    [cache_file] = tmp_path.glob("tune-*.json")
    assert lines(caplog) == [
        "amp-rewrite: tf.function step stays float32: the step ran 12.0 ms in bfloat16 and 10.0 ms in float32 on "
        f"this CPU; measured before, read from the cache {cache_file}; op determinism is on, so it is not checked "
        "again"]
    cf = step.get_concrete_function()
    assert half_ops(cf) == [] and tf_internals.call_override(cf) is None


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


def test_a_step_the_loss_scale_skipped_is_not_timed_for_the_trial(amp_runtime, tmp_path, caplog):
    """A skipped step applies no update, so it costs less than a step: timed, it would make half look faster.

    The first scale (2^24) overflows float16, so the first half calls skip
    while it halves. The test's timer gives a call 1 ms when its step skipped
    (the loss-scale state says so after the call), else the body's time:
    half 12 ms, float32 10 ms. Counted, the skipped calls would make half
    win; not counted, float32 stays, and half ran as many timed calls as
    float32 once the scale was low enough, the calls alternating meanwhile.
    """
    from amp_rewrite.runtime.settings import LossScaleSettings

    amp_runtime(RuntimeSettings(target="float16", is_timing_steps=True, tune_cache_dir=str(tmp_path),
                                loss_scale=LossScaleSettings(initial_scale=2.0**24)))
    hook = runtime.current_runtime().tracing
    scaling = runtime.current_runtime().loss_scaling
    calls = []

    def timer(body, call):
        before = int(scaling.state().skipped_steps.numpy()) if scaling.has_state() else 0
        outputs = call()
        skipped = scaling.has_state() and int(scaling.state().skipped_steps.numpy()) > before
        calls.append((body, skipped))
        return outputs, 0.001 if skipped else {HALF: 0.012, FLOAT32: 0.010}[body]

    hook.trials.timer = timer
    step, w = scaled_training_loop()
    with caplog.at_level(logging.INFO, TRACING_LOGGER):
        for _ in range(6 * CALLS):
            step()
    skipped_calls = [body for body, skipped in calls if skipped]
    assert len(skipped_calls) >= 2 and set(skipped_calls) == {HALF}, calls
    decided = [line for line in lines(caplog) if line.startswith("amp-rewrite: tf.function step ")]
    assert decided == ["amp-rewrite: tf.function step stays float32: the step ran 12.0 ms in float16 and 10.0 ms in "
                       "float32 on this CPU"], decided
    # Each skip added a pair (half, float32) to the schedule; half's warm-up is the first call's, untimed.
    counted = [body for body, skipped in calls if not skipped]
    assert (counted.count(HALF), counted.count(FLOAT32)) == (CALLS // 2 - 1, CALLS // 2 + len(skipped_calls)), calls
    # the calls went on alternating: float32 steps trained between the skipped half ones
    assert [body for body, _ in calls[:4]] == [FLOAT32, HALF, FLOAT32, FLOAT32], calls


class EverySkipWatch:
    """A loss-scale floor watch stand-in under which every call's step skipped."""

    def before_call(self, concrete_function):
        return 0

    def after_call(self, concrete_function, start):
        pass

    def skipped_since(self, start):
        return True


@pytest.mark.parametrize("in_a_job", [False, True])
def test_a_skipped_call_adds_a_pair_to_the_schedule_except_in_a_job(in_a_job):
    """A job's workers must keep their trials' calls in step, so there a skipped call is timed as any."""
    from amp_rewrite.runtime.tf2.function_trial import FunctionTrial

    step, _ = training_loop()
    step()
    cf = step.get_concrete_function()
    state = tf_internals.concrete_function_state(cf)
    trial = FunctionTrial(cf, "step", {HALF: state, FLOAT32: state}, on_verdict=lambda *_: None,
                          then=EverySkipWatch(), timer=timer_of({HALF: 0.005, FLOAT32: 0.010}),
                          rounds=object() if in_a_job else None)  # three calls: the job is never asked
    for _ in range(3):
        trial([], cf.captured_inputs)
    assert trial.trial.calls == 3
    if in_a_job:
        assert len(trial.trial.order) == CALLS and trial.trial.times == {HALF: [0.005], FLOAT32: []}
    else:
        assert trial.trial.order[CALLS:] == [HALF, FLOAT32, FLOAT32, HALF, HALF, FLOAT32]
        assert trial.trial.times == {HALF: [], FLOAT32: []}


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
    from amp_rewrite.runtime.tf2 import function_trials

    def broken(fdef):
        raise ValueError("no float32 body here")

    monkeypatch.setattr(function_trials, "unscaled_function", broken)
    start(amp_runtime, tmp_path)
    runtime.current_runtime().tracing.trials.timer = lambda body, call: pytest.fail("a call was timed")
    step, _ = training_loop()
    with caplog.at_level(logging.INFO, TRACING_LOGGER):
        losses = [float(step()) for _ in range(CALLS + 2)]
    assert "MatMul" in half_ops(step.get_concrete_function())
    assert "amp-rewrite: tf.function step runs in bfloat16, not tried: its float32 body could not be built: " \
           "ValueError: no float32 body here" in lines(caplog)
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
