"""TF2: a step whose half regions differ in speed runs mixed, when a trial confirms the mixed step is faster.

The timer and the profiler are the test's: each profiled call gives the op
times the test says, each timed call the seconds it says, so every branch
is decided here on any machine. One test reads a real profile, to check
that the names the profiler gives find their regions.
"""

import logging

import numpy as np
import pytest
import tensorflow as tf
from helpers import two_region_step

from amp_rewrite import runtime, tf_internals
from amp_rewrite.runtime.settings import RuntimeSettings
from amp_rewrite.runtime.tf2 import step_mixing, tracing
from amp_rewrite.runtime.tf2.step_mixing import MIXED
from amp_rewrite.tune.trial import CALLS, FLOAT32, HALF

TRACING_LOGGER = "amp_rewrite.runtime.tf2.tracing"
#: Op milliseconds of the two MatMuls in each profiled body: ``fast`` wins in half, ``slow`` loses.
OP_MS = {HALF: {"fast": 1.0, "slow": 6.0}, FLOAT32: {"fast": 3.0, "slow": 4.0}}


class Clock:
    """The test's timer and profiler; counts the calls of each."""

    def __init__(self, seconds: dict[str, float], op_ms=None, prefix: str = ""):
        self.seconds = seconds
        self.op_ms = OP_MS if op_ms is None else op_ms
        self.prefix = prefix
        self.timed: list[str] = []
        self.profiled: list[str] = []

    def timer(self, body, call):
        self.timed.append(body)
        return call(), self.seconds[body]

    def profiler(self, body, call):
        self.profiled.append(body)
        return call(), {self.prefix + name: ms / 1e3 for name, ms in self.op_ms[body].items()}


def start(amp_runtime, tmp_path, clock: Clock):
    amp_runtime(RuntimeSettings(target="bfloat16", is_timing_steps=True, tune_cache_dir=str(tmp_path)))
    trials = runtime.current_runtime().tracing.trials
    trials.timer, trials.profiler = clock.timer, clock.profiler


def training_loop():
    """A step with two MatMuls, ``fast`` and ``slow``, that an Exp (float32) parts into two half regions."""
    return two_region_step()


def running_dtypes(concrete_function) -> dict[str, int]:
    fdef = tf_internals.concrete_function_state(concrete_function)["_inference_function"].definition
    return {node.name: node.attr["T"].type for node in fdef.node_def if "T" in node.attr}


def lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == TRACING_LOGGER]


ALL_CALLS = CALLS + 2 + 5  # the pure trial, one profiled call of each body, the confirming trial


def test_a_region_that_wins_inside_a_step_that_loses_runs_half_alone(amp_runtime, tmp_path, caplog):
    reference = training_loop()
    float32_losses = [float(reference()) for _ in range(ALL_CALLS + 2)]
    clock = Clock({HALF: 0.012, FLOAT32: 0.010, MIXED: 0.008})
    start(amp_runtime, tmp_path, clock)
    step = training_loop()
    with caplog.at_level(logging.INFO, TRACING_LOGGER):
        losses = [float(step()) for _ in range(ALL_CALLS + 2)]
    cf = step.get_concrete_function()
    types = running_dtypes(cf)
    assert types["fast"] == tf.bfloat16 and types["slow"] == tf.float32
    assert tf_internals.call_override(cf) is None  # the trials are over and left nothing behind
    assert clock.profiled == [HALF, FLOAT32]
    assert clock.timed[CALLS - 1:] == [MIXED, MIXED, FLOAT32, FLOAT32, MIXED]  # after the guard's call
    [line] = [line for line in lines(caplog) if "half regions" in line]
    assert line.startswith("amp-rewrite: tf.function step runs 1 of ")
    assert "the step ran 8.0 ms with 1 of" in line
    assert line.endswith("half regions in bfloat16 and 10.0 ms in float32 on this CPU (1.25x); in bfloat16 alone "
                         "it ran 12.0 ms")
    [(name, is_half, why)] = tracing.step_decisions()
    assert (name, is_half) == ("step", True) and why in line
    np.testing.assert_allclose(losses, float32_losses, rtol=0.02, atol=1e-4)


def test_a_second_run_rebuilds_the_mixed_step_from_the_cache(amp_runtime, tmp_path, caplog):
    start(amp_runtime, tmp_path, Clock({HALF: 0.012, FLOAT32: 0.010, MIXED: 0.008}))
    step = training_loop()
    for _ in range(ALL_CALLS):
        step()
    runtime.disable()
    clock = Clock({})  # read by nothing: a timed or profiled call fails the test with a KeyError
    start(amp_runtime, tmp_path, clock)
    again = training_loop()
    with caplog.at_level(logging.INFO, TRACING_LOGGER):
        for _ in range(3):
            again()
    types = running_dtypes(again.get_concrete_function())
    assert types["fast"] == tf.bfloat16 and types["slow"] == tf.float32
    assert clock.timed == clock.profiled == []
    [line] = [line for line in lines(caplog) if "half regions" in line]
    [cache_file] = tmp_path.glob("tune-*.json")
    assert line.endswith(f"measured before, read from the cache {cache_file}") and "runs 1 of" in line


def test_a_mixed_step_no_faster_than_the_better_pure_step_is_dropped(amp_runtime, tmp_path, caplog):
    clock = Clock({HALF: 0.012, FLOAT32: 0.010, MIXED: 0.0099})
    start(amp_runtime, tmp_path, clock)
    step = training_loop()
    with caplog.at_level(logging.INFO, TRACING_LOGGER):
        for _ in range(ALL_CALLS + 1):
            step()
    types = running_dtypes(step.get_concrete_function())
    assert types["fast"] == types["slow"] == tf.float32
    [line] = [line for line in lines(caplog) if "stays float32" in line]
    assert line.endswith("on this CPU; with 1 of " + line.split("with 1 of ")[1].split(" half")[0]
                         + " half regions in bfloat16 it ran 9.9 ms")


@pytest.mark.parametrize("op_ms, why", [
    ({HALF: {"fast": 1.0, "slow": 1.0}, FLOAT32: {"fast": 3.0, "slow": 3.0}}, "every region wins: half as a whole"),
    ({HALF: {"fast": 2.9, "slow": 6.0}, FLOAT32: {"fast": 3.0, "slow": 4.0}}, "no region wins by the margin"),
])
def test_profiles_that_propose_no_mixed_step_leave_the_pure_verdict(amp_runtime, tmp_path, caplog, op_ms, why):
    is_half = op_ms[HALF]["slow"] < op_ms[FLOAT32]["slow"]
    seconds = {HALF: 0.006, FLOAT32: 0.010} if is_half else {HALF: 0.012, FLOAT32: 0.010}
    clock = Clock(seconds, op_ms)
    start(amp_runtime, tmp_path, clock)
    step = training_loop()
    with caplog.at_level(logging.INFO, TRACING_LOGGER):
        for _ in range(CALLS + 4):
            step()
    assert clock.profiled == [HALF, FLOAT32], why
    assert MIXED not in clock.timed
    assert not [line for line in lines(caplog) if "half regions" in line]
    dtype = tf.bfloat16 if is_half else tf.float32
    assert running_dtypes(step.get_concrete_function())["slow"] == dtype


def keras3_fit():
    """A Keras 3 ``fit`` of Dense ``fast``, an Exp, and Dense ``slow``, 20 batches; the epoch's loss."""
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(32, name="fast"),
                              keras.layers.Activation("exponential"), keras.layers.Dense(4, name="slow")])
    model.compile(optimizer="sgd", loss="mse")
    x = np.random.default_rng(0).normal(0, 0.1, (16 * 20, 32)).astype(np.float32)
    return model.fit(x, np.zeros((len(x), 4), np.float32), batch_size=16, epochs=1, shuffle=False,
                     verbose=0).history["loss"]


def forward_matmul_dtypes(caller) -> dict[str, int]:
    """The dtype of the forward MatMuls of ``fast`` and ``slow`` in the bodies ``caller`` runs now."""
    called = tf_internals.graph_functions(tf_internals.graph_in_state(tf_internals.concrete_function_state(caller)))
    kinds = {}
    for function in called.values():
        for node in function.definition.node_def:
            for layer in ("fast", "slow"):
                if node.op == "MatMul" and f"/{layer}" in node.name and "gradient" not in node.name:
                    kinds[layer] = node.attr["T"].type
    return kinds


def train_function():
    [caller] = [function() for name, _, function in runtime.current_runtime().tracing.trials.decisions
                if "step_on_iterator" in name]
    return caller


def test_keras3_fit_mixes_the_one_step_body_its_train_function_calls(amp_runtime, tmp_path, caplog):
    """The profiler names the one-step function's nodes behind the train function's call of it."""
    float32_loss = keras3_fit()
    clock = MatMulClock({HALF: 0.012, FLOAT32: 0.010, MIXED: 0.008})
    start(amp_runtime, tmp_path, clock)
    with caplog.at_level(logging.INFO, TRACING_LOGGER):
        loss = keras3_fit()
    assert clock.profiled == [HALF, FLOAT32], lines(caplog)
    [line] = [line for line in lines(caplog) if "half regions" in line]
    assert "step_on_iterator runs 1 of" in line, lines(caplog)
    assert forward_matmul_dtypes(train_function()) == {"fast": tf.bfloat16, "slow": tf.float32}
    np.testing.assert_allclose(loss, float32_loss, rtol=0.02)


def test_keras3_fit_in_a_second_run_gets_its_mixed_bodies_from_the_cache(amp_runtime, tmp_path, caplog):
    start(amp_runtime, tmp_path, MatMulClock({HALF: 0.012, FLOAT32: 0.010, MIXED: 0.008}))
    keras3_fit()
    runtime.disable()
    clock = Clock({})  # read by nothing: a timed or profiled call fails the test with a KeyError
    start(amp_runtime, tmp_path, clock)
    with caplog.at_level(logging.INFO, TRACING_LOGGER):
        keras3_fit()
    assert clock.timed == clock.profiled == []
    [line] = [line for line in lines(caplog) if "half regions" in line]
    [cache_file] = tmp_path.glob("tune-*.json")
    assert "step_on_iterator runs 1 of" in line and line.endswith(f"measured before, read from the cache {cache_file}")
    assert forward_matmul_dtypes(train_function()) == {"fast": tf.bfloat16, "slow": tf.float32}


class MatMulClock(Clock):
    """Profiles that name the forward MatMuls of the layers ``fast`` and ``slow`` as Keras 3 does."""

    def profiler(self, body, call):
        self.profiled.append(body)
        outputs = call()
        names = {}
        for _, record in runtime.current_runtime().tracing.swapped.items():
            for fdef in record.rewritten.result.graph_def.library.function:
                for node in fdef.node_def:
                    for layer in ("fast", "slow"):
                        if node.op == "MatMul" and f"/{layer}" in node.name and "gradient" not in node.name:
                            names[f"StatefulPartitionedCall/{node.name}"] = OP_MS[body][layer] / 1e3
        return outputs, names


def test_a_real_profile_finds_every_region_of_the_step(amp_runtime, tmp_path):
    """Not a timing: the names TensorFlow's profiler gives the executed nodes reach the rewrite's regions."""
    amp_runtime(RuntimeSettings(target="bfloat16", tune_cache_dir=str(tmp_path)))
    step = training_loop()
    step()
    cf = step.get_concrete_function()
    record = tracing.record_of(cf)
    regions = step_mixing.StepRegions.of([step_mixing.part_of(record)], cf.graph, "bfloat16")
    assert regions.can_mix
    _, half_ops = step_mixing.profile_body(HALF, lambda: step())
    tf_internals.set_concrete_function_state(cf, record.traced_state)
    _, float32_ops = step_mixing.profile_body(FLOAT32, lambda: step())
    times, _ = regions.propose(half_ops, float32_ops, is_half_step=False)
    heavy = [t for t in times if dict(t.region.ops).get("MatMul")]
    assert heavy and all(t.half > 0 and t.float32 > 0 for t in heavy), [(t.region.nodes, t.half, t.float32)
                                                                       for t in times]


def test_a_step_far_slower_in_half_is_not_profiled(amp_runtime, tmp_path):
    clock = Clock({HALF: 0.030, FLOAT32: 0.010, MIXED: 0.001})
    start(amp_runtime, tmp_path, clock)
    step = training_loop()
    for _ in range(CALLS + 3):
        step()
    assert clock.profiled == [] and MIXED not in clock.timed
    assert running_dtypes(step.get_concrete_function())["fast"] == tf.float32


NO_KERNELS = "TensorFlow's profiler recorded no GPU kernel (it reads them through CUPTI)"


def test_on_a_gpu_a_profile_without_kernel_times_keeps_the_pure_verdict_and_says_why(amp_runtime, tmp_path, caplog,
                                                                                    monkeypatch):
    """A GPU op's event on the host is its launch, not its time: without the kernels no region is chosen.

    The device is said to be a GPU, and the profiler is the real one: on this
    CPU its trace holds no GPU kernel, as on a GPU where CUPTI is missing.
    """
    clock = Clock({HALF: 0.005, FLOAT32: 0.010})
    start(amp_runtime, tmp_path, clock)
    trials = runtime.current_runtime().tracing.trials
    monkeypatch.setattr(type(trials.verdicts), "device_type", property(lambda self: "GPU"))  # the trials ask it too
    trials.profiler = trials.profile_call
    step = training_loop()
    with caplog.at_level(logging.INFO, TRACING_LOGGER):
        for _ in range(CALLS + 3):
            step()
    assert MIXED not in clock.timed
    assert running_dtypes(step.get_concrete_function())["slow"] == tf.bfloat16  # the pure verdict: half
    assert ("amp-rewrite: tf.function step runs in bfloat16: the step ran 5.0 ms in bfloat16 and 10.0 ms in "
            f"float32 on this GPU (2.00x); no mixed body: {NO_KERNELS}") in lines(caplog)
    [(_, is_half, why)] = tracing.step_decisions()
    assert is_half and "no mixed body" not in why  # what scripts read is the verdict's reason alone


@pytest.mark.gpu
def test_gpu_profile_finds_every_region_of_the_step_in_kernel_time(amp_runtime, tmp_path):
    amp_runtime(RuntimeSettings(target="auto", tune_cache_dir=str(tmp_path)))
    step = training_loop()
    step()
    cf = step.get_concrete_function()
    record = tracing.record_of(cf)
    regions = step_mixing.StepRegions.of([step_mixing.part_of(record)], cf.graph, "float16")
    assert regions.can_mix
    _, half_ops = step_mixing.profile_body(HALF, lambda: step(), "GPU")
    tf_internals.set_concrete_function_state(cf, record.traced_state)
    _, float32_ops = step_mixing.profile_body(FLOAT32, lambda: step(), "GPU")
    assert isinstance(half_ops, dict) and isinstance(float32_ops, dict), (half_ops, float32_ops)
    times, _ = regions.propose(half_ops, float32_ops, is_half_step=False)
    heavy = [t for t in times if dict(t.region.ops).get("MatMul")]
    assert heavy and all(t.half > 0 and t.float32 > 0 for t in heavy), [(t.region.nodes, t.half, t.float32)
                                                                       for t in times]


@pytest.mark.gpu
def test_gpu_trial_profiles_both_bodies_and_caches_each_regions_kernel_times(amp_runtime, tmp_path, caplog):
    """The real profiler on the GPU: the step's regions get kernel times, and no line says they could not.

    The test's timer makes the step worth profiling, whatever so small a step costs in float16 here.
    """
    import json

    amp_runtime(RuntimeSettings(target="auto", is_timing_steps=True, tune_cache_dir=str(tmp_path)))
    runtime.current_runtime().tracing.trials.timer = Clock({HALF: 0.012, FLOAT32: 0.010, MIXED: 0.011}).timer
    step = training_loop()
    with caplog.at_level(logging.INFO, TRACING_LOGGER):
        for _ in range(CALLS + 2):
            step()
    decided = [line for line in lines(caplog) if line.startswith("amp-rewrite: tf.function step ")]
    assert len(decided) == 1 and "on this GPU" in decided[0] and "no mixed body" not in decided[0], lines(caplog)
    [cache] = tmp_path.glob("tune-*.json")
    regions = {key: value for key, value in json.loads(cache.read_text())["entries"].items() if " region " in key}
    timed = [value for value in regions.values() if value["float32"] > 0 and value["half"] > 0]
    assert len(regions) >= 2 and len(timed) >= 2, regions
