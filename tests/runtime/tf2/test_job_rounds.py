"""TF2: in a multi-worker job, a step that runs collective ops keeps the body its workers decided together.

This process is worker 1 of a two-worker job whose key-value store is the
test's; a thread plays the chief (worker 0), answering each of the trial's
questions with times of its own. The two timers disagree, and the body this
worker keeps is the job's, never the one its own times (or its own cache)
would choose. The timers and the profiler are the test's, so every branch is
decided here on any machine.
"""

import json
import logging
import threading

import numpy as np
import tensorflow as tf
from helpers import KeyValueStore, two_region_step

from amp_rewrite import runtime, tf_internals
from amp_rewrite.runtime.job import Job
from amp_rewrite.runtime.settings import RuntimeSettings
from amp_rewrite.runtime.tf2 import tracing
from amp_rewrite.runtime.tf2.job_rounds import JobRounds
from amp_rewrite.runtime.tf2.step_mixing import MIXED
from amp_rewrite.tune import step_regions
from amp_rewrite.tune.cache import Timing
from amp_rewrite.tune.step_regions import RegionTimes
from amp_rewrite.tune.trial import CALLS, FLOAT32, HALF, MARGIN, StepVerdict

TRACING_LOGGER = "amp_rewrite.runtime.tf2.tracing"
CHIEF, WORKER1 = ("worker", 0), ("worker", 1)
TWO = (CHIEF, WORKER1)
WAIT = 20.0  # never reached: both workers answer at once
#: Op milliseconds of the step's two MatMuls in each profiled body, on this worker: ``fast`` wins in half.
OP_MS = {HALF: {"fast": 1.0, "slow": 6.0}, FLOAT32: {"fast": 3.0, "slow": 4.0}}


class Clock:
    """This worker's timer and profiler; notes the bodies timed and profiled."""

    def __init__(self, seconds: dict[str, float]):
        self.seconds = seconds
        self.timed: list[str] = []
        self.profiled: list[str] = []

    def timer(self, body, call):
        self.timed.append(body)
        return call(), self.seconds[body]

    def profiler(self, body, call):
        self.profiled.append(body)
        return call(), {name: ms / 1e3 for name, ms in OP_MS[body].items()}


class Chief(threading.Thread):
    """Worker 0: answers the first trial's questions with its own best calls and region times.

    Its regions run the other way round from this worker's: a region that won
    in half here took three times its float32 time there, and one that lost
    here took a third of its half time in float32 there.
    """

    def __init__(self, store, pure: Timing, mixed: Timing | None = None):
        super().__init__()
        self.store, self.pure, self.mixed = store, pure, mixed
        self.answers: list = []

    def run(self):
        rounds = JobRounds(Job(TWO, CHIEF, self.store, WAIT), 0, "step")
        verdict, profiles = rounds.pure(StepVerdict(False, self.pure.half, self.pure.float32), True)
        self.answers.append(verdict)
        if not profiles:
            return
        theirs = json.loads(self.store.read("amp_rewrite/step/0/regions/worker/1", 2 * WAIT))["times"]
        own = [RegionTimes(None, 3 * f, f) if h <= (1 - MARGIN) * f else RegionTimes(None, h, 3 * h)
               for h, f in theirs]
        summed = rounds.regions((own, Timing(float32=sum(t.float32 for t in own), half=sum(t.half for t in own))))
        self.answers.append(summed)
        choice = step_regions.choose(summed[0], half_total=summed[1].half, float32_total=summed[1].float32,
                                     is_half_step=verdict.is_half)
        if rounds.built(choice is not None):
            self.answers.append(rounds.mixed(self.mixed, verdict, choice))


def start(amp_runtime, tmp_path, clock: Clock, store=None):
    """The runtime in forced bfloat16 with step trials and the test's clock; in a job with ``store``."""
    amp_runtime(RuntimeSettings(target="bfloat16", is_timing_steps=True, tune_cache_dir=str(tmp_path)))
    active = runtime.current_runtime()
    active.tracing.trials.timer, active.tracing.trials.profiler = clock.timer, clock.profiler
    if store is not None:
        active.job = Job(TWO, WORKER1, store, WAIT)


def collective_step():
    """A step of two MatMuls, ``fast`` and ``slow``, in two half regions, and an all-reduce of its loss."""
    return two_region_step(all_reduce=True)


def running_dtypes(concrete_function) -> dict[str, int]:
    fdef = tf_internals.concrete_function_state(concrete_function)["_inference_function"].definition
    return {node.name: node.attr["T"].type for node in fdef.node_def if "T" in node.attr}


def lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == TRACING_LOGGER]


def test_the_job_keeps_float32_where_this_workers_own_timer_and_cache_chose_half(amp_runtime, tmp_path, caplog):
    half_wins = Clock({HALF: 0.005, FLOAT32: 0.010})
    start(amp_runtime, tmp_path, half_wins)
    alone = collective_step()
    for _ in range(CALLS + 1):
        alone()
    assert running_dtypes(alone.get_concrete_function())["fast"] == tf.bfloat16  # alone, half won
    cached = sorted(path.read_bytes() for path in tmp_path.iterdir())
    runtime.disable()

    store, clock = KeyValueStore(), Clock({HALF: 0.005, FLOAT32: 0.010})
    start(amp_runtime, tmp_path, clock, store)
    chief = Chief(store, Timing(float32=0.010, half=0.020))
    chief.start()
    step = collective_step()
    with caplog.at_level(logging.INFO, TRACING_LOGGER):
        for _ in range(CALLS + 2):
            step()
    chief.join(timeout=2 * WAIT)
    cf = step.get_concrete_function()
    assert running_dtypes(cf)["fast"] == tf.float32 and tf_internals.call_override(cf) is None
    assert len(clock.timed) == CALLS - 1 and clock.profiled == []  # tried again: the cache did not decide
    reason = "the step ran 20.0 ms in bfloat16 and 10.0 ms in float32 on the slowest of 2 workers"
    assert f"amp-rewrite: tf.function step stays float32: {reason}" in lines(caplog)
    assert tracing.step_decisions() == [("step", False, reason)]
    [job_verdict] = chief.answers
    assert not job_verdict.is_half and job_verdict.reason("bfloat16", "CPU") == reason
    assert sorted(path.read_bytes() for path in tmp_path.iterdir()) == cached  # the job's verdict is not cached


def test_the_job_mixes_the_regions_that_won_on_all_its_workers_together(amp_runtime, tmp_path, caplog):
    """Alone, this worker would keep ``fast`` half; the regions' times summed over the job keep ``slow`` half."""
    store, clock = KeyValueStore(), Clock({HALF: 0.012, FLOAT32: 0.010, MIXED: 0.008})
    start(amp_runtime, tmp_path, clock, store)
    chief = Chief(store, Timing(float32=0.010, half=0.012), mixed=Timing(float32=0.010, half=0.009))
    chief.start()
    step = collective_step()
    with caplog.at_level(logging.INFO, TRACING_LOGGER):
        for _ in range(CALLS + 2 + 5 + 1):
            step()
    chief.join(timeout=2 * WAIT)
    types = running_dtypes(step.get_concrete_function())
    assert types["slow"] == tf.bfloat16 and types["fast"] == tf.float32
    assert clock.profiled == [HALF, FLOAT32]
    assert clock.timed[CALLS - 1:] == [MIXED, MIXED, FLOAT32, FLOAT32, MIXED]
    [line] = [line for line in lines(caplog) if "half regions" in line]
    assert "the step ran 9.0 ms with 1 of" in line and line.endswith(
        "half regions in bfloat16 and 10.0 ms in float32 on the slowest of 2 workers (1.11x); in bfloat16 alone "
        "it ran 12.0 ms")
    verdict, summed, mixed = chief.answers
    assert mixed.is_mixed
    # fast: 1 + 9 ms in half, 3 + 3 in float32; slow: 6 + 6 in half, 4 + 18 in float32
    np.testing.assert_allclose(sorted((t.half, t.float32) for t in summed[0]), [(0.010, 0.006), (0.012, 0.022)])


def test_a_step_without_collective_ops_is_each_workers_own(amp_runtime, tmp_path, caplog):
    """A step only this worker runs (no collective) decides alone, asking the job nothing."""
    store, clock = KeyValueStore(), Clock({HALF: 0.005, FLOAT32: 0.010})
    start(amp_runtime, tmp_path, clock, store)
    w = tf.Variable(np.ones((8, 8), np.float32))

    @tf.function
    def local():
        return tf.matmul(w, w)

    for _ in range(CALLS + 1):
        local()
    assert store.values == {}
    assert tracing.step_decisions()[0][:2] == ("local", True)


def test_a_worker_that_hears_no_chief_keeps_float32_and_says_why(amp_runtime, tmp_path, caplog):
    """Its answer is written first, so a chief that comes later follows it: float32 is the safe one."""
    store, clock = KeyValueStore(), Clock({HALF: 0.005, FLOAT32: 0.010})
    start(amp_runtime, tmp_path, clock)
    runtime.current_runtime().job = Job(TWO, WORKER1, store, 0.2)
    step = collective_step()
    with caplog.at_level(logging.INFO, TRACING_LOGGER):
        for _ in range(CALLS + 1):
            step()
    assert running_dtypes(step.get_concrete_function())["fast"] == tf.float32
    assert ("amp-rewrite: tf.function step stays float32: the step ran 5.0 ms in bfloat16 and 10.0 ms in float32 on "
            "worker 1, which heard no decision from the chief (worker 0) within 0.4 s") in lines(caplog)
    late = JobRounds(Job(TWO, CHIEF, store, 0.2), 0, "step").pure(StepVerdict(True, 0.001, 0.010), True)
    assert not late[0].is_half and not late[1]
