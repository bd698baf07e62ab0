"""Step trials time what the device does, not what the host queues: a GPU step is queued in microseconds.

A call of a ``tf.function`` on a GPU returns once its kernels are queued;
they run for milliseconds after. The TF2 trial's timer
(:meth:`~amp_rewrite.runtime.tf2.function_trials.FunctionTrials.time_call`)
synchronises the device before it reads the clock, so a verdict compares
device times. A TF1 ``Session.run`` returns once its step has finished on
the device (:func:`~amp_rewrite.tune.trial.time_call`
times it as it is). The GPU tests check both on a step of large matrix
products; the CPU tests check, with a stand-in for the device's queue, that
the TF2 timer waits for it exactly when the device is a GPU.
"""

from __future__ import annotations

import re
import time

import numpy as np
import pytest
import tensorflow as tf
from helpers import tf1

from amp_rewrite import runtime
from amp_rewrite.config import Config
from amp_rewrite.runtime.settings import RuntimeSettings
from amp_rewrite.runtime.tf2 import tracing
from amp_rewrite.runtime.tf2.function_trials import FunctionTrials
from amp_rewrite.runtime.tf2.swap_records import SwapTable
from amp_rewrite.tune.trial import CALLS, HALF, time_call

SIZE, PRODUCTS = 8192, 10  # 10 products of 8192 x 8192: 11 TFLOP, milliseconds on any GPU
STEP_TIMES = re.compile(r"ran (?P<half>[\d.]+) ms in float16 and (?P<float32>[\d.]+) ms in float32")


def products():
    """A step of PRODUCTS chained matrix products (scaled to stay finite in float16); its input."""
    a = tf.constant(np.random.default_rng(0).uniform(-1, 1, (SIZE, SIZE)).astype(np.float32))

    @tf.function
    def step():
        x = a
        for _ in range(PRODUCTS):
            x = tf.matmul(x, a) * (1.0 / 64.0)
        return tf.reduce_mean(x)

    return step


def best(call, rounds: int = 3) -> float:
    """The best of ``rounds`` timings of ``call``, each started on an idle device."""
    times = []
    for _ in range(rounds):
        tf.test.experimental.sync_devices()
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return min(times)


def queued_and_done(step) -> tuple[float, float]:
    """How long a call of ``step`` takes to return, and until the device has finished it."""
    step()
    tf.test.experimental.sync_devices()

    def done():
        step()
        tf.test.experimental.sync_devices()

    return best(step), best(done)


def trials_on(device_type: str) -> FunctionTrials:
    return FunctionTrials(SwapTable(), config=lambda: Config(device_type=device_type))


@pytest.mark.gpu
def test_gpu_trial_timer_waits_for_the_kernels_a_call_queued(amp_runtime, tmp_path):
    # Measured before the runtime starts: under it, a new step's first calls are its trial's, which wait.
    step = products()
    queued, done = queued_and_done(step)
    assert queued < 0.2 * done, f"a call returned after {queued * 1e3:.2f} ms, its kernels after {done * 1e3:.2f}"
    amp_runtime(RuntimeSettings(target="auto", is_timing_steps=True, tune_cache_dir=str(tmp_path)))
    trials = runtime.current_runtime().tracing.trials
    assert trials.device_type == "GPU"
    timed = min(trials.time_call(HALF, step)[1] for _ in range(3))
    assert timed >= 0.8 * done, f"the trial timed {timed * 1e3:.2f} ms of a {done * 1e3:.2f} ms step"


@pytest.mark.gpu
def test_gpu_trial_verdict_compares_device_times(amp_runtime, tmp_path):
    """A real trial on the GPU: both best times are the device's, milliseconds, not the microseconds of a queue."""
    float32_step = products()
    queued, done = queued_and_done(float32_step)
    amp_runtime(RuntimeSettings(target="auto", is_timing_steps=True, tune_cache_dir=str(tmp_path)))
    step = products()
    for _ in range(CALLS + 2):
        step()
    [(name, is_half, reason)] = tracing.step_decisions()
    found = STEP_TIMES.search(reason)
    assert found, reason
    half_ms, float32_ms = float(found["half"]), float(found["float32"])
    assert float32_ms >= 0.8 * done * 1e3, (reason, done)
    assert half_ms >= 10 * queued * 1e3, (reason, queued)  # float16 may well be faster, not by a queue's length
    assert is_half, reason  # tensor cores run float16 products faster than float32's (TF32 or not)


@pytest.mark.gpu
def test_gpu_session_step_is_timed_until_the_device_finished_it():
    graph = tf.Graph()
    with graph.as_default():
        # Variables, not constants: Grappler folds products of constants before the step runs, and prunes
        # stateless ops that only a fetched tf.group waits for. Writing the result is a step it must run, and
        # fetching the write brings nothing back to the host: no copy waits for the device.
        a = tf1.Variable(np.random.default_rng(0).uniform(-1, 1, (SIZE, SIZE)).astype(np.float32), use_resource=True)
        result = tf1.Variable(tf.zeros([SIZE, SIZE]), use_resource=True)
        x = a
        for _ in range(PRODUCTS):
            x = tf.matmul(x, a) * (1.0 / 64.0)
        run = result.assign(x, read_value=False)
        initialize = tf1.global_variables_initializer()
    session = tf1.Session(graph=graph)  # not made the default: synchronising the devices needs eager mode
    try:
        session.run(initialize)
        session.run(run)
        timed = min(time_call(HALF, lambda: session.run(run))[1] for _ in range(3))

        def run_and_wait():
            session.run(run)
            tf.test.experimental.sync_devices()

        done = best(run_and_wait)
    finally:
        session.close()
    assert done >= 2e-3, f"the step ran {done * 1e3:.2f} ms: its products were folded or pruned away"
    assert timed >= 0.8 * done, f"Session.run returned after {timed * 1e3:.2f} ms of a {done * 1e3:.2f} ms step"


def test_the_trial_timer_waits_for_the_device_only_on_a_gpu(monkeypatch):
    """A stand-in for the device's queue: synchronising takes 50 ms. The GPU's timer waits for it, the CPU's not."""
    waited = []

    def sync_devices():
        waited.append(True)
        time.sleep(0.05)

    monkeypatch.setattr(tf.test.experimental, "sync_devices", sync_devices)
    on_gpu = trials_on("GPU").time_call(HALF, lambda: "outputs")
    assert on_gpu[0] == "outputs" and on_gpu[1] >= 0.05 and waited == [True]
    on_cpu = trials_on("CPU").time_call(HALF, lambda: "outputs")
    assert on_cpu[1] < 0.05 and waited == [True]
