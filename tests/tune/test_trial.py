"""The trial's schedule and verdict, with no TensorFlow run: times are given."""

import pytest

from amp_rewrite.tune.cache import Timing
from amp_rewrite.tune.trial import (
    CALLS,
    FLOAT32,
    HALF,
    MARGIN,
    MIXING_LIMIT,
    TrialSchedule,
    is_worth_mixing,
    schedule,
    verdict_of,
)


def test_the_schedule_warms_each_body_once_then_mirrors_each_pair():
    order = schedule()
    assert order[:2] == [HALF, FLOAT32]  # untimed: graph optimisation, kernel set-up
    assert order[2:] == [HALF, FLOAT32, FLOAT32, HALF, HALF, FLOAT32, FLOAT32, HALF]
    assert len(order) == CALLS == 10
    assert order.count(HALF) == order.count(FLOAT32)


def run(trial: TrialSchedule, times: dict[str, list[float]]) -> None:
    """Feeds the trial each body's times in the order its schedule runs them."""
    left = {body: list(values) for body, values in times.items()}
    while not trial.is_done:
        body = trial.next_body()
        trial.record(body, left[body].pop(0))


def test_half_is_kept_when_its_best_call_saves_the_margin():
    trial = TrialSchedule()
    # the warm-ups (first of each: 9.0) never count; the best timed call of each does
    run(trial, {HALF: [9.0, 0.55, 0.9, 0.6, 0.7], FLOAT32: [9.0, 1.0, 0.8, 1.2, 1.0]})
    verdict = trial.verdict()
    assert verdict.is_half and (verdict.half_seconds, verdict.float32_seconds) == (0.55, 0.8)


def test_a_near_tie_stays_float32():
    float32 = 1.0
    just_short = float32 * (1 - MARGIN) + 1e-6
    trial = TrialSchedule()
    run(trial, {HALF: [0.1, just_short] * 3, FLOAT32: [0.1, float32] * 3})
    assert not trial.verdict().is_half
    assert verdict_of(Timing(float32=float32, half=float32 * (1 - MARGIN))).is_half


def test_no_verdict_before_the_last_call_nor_without_a_timed_call_of_each():
    trial = TrialSchedule()
    for _ in range(CALLS - 1):
        trial.record(trial.next_body(), 1.0)
        assert trial.verdict() is None
    untimed = TrialSchedule()
    while not untimed.is_done:
        untimed.record(untimed.next_body(), None)
    assert untimed.verdict() is None


@pytest.mark.parametrize("half, float32, is_cached, expected", [
    (0.449, 0.373, False, "stays float32",),
    (0.0134, 0.0257, False, "half"),
    (0.0134, 0.0257, True, "half"),
])
def test_the_reason_gives_both_times_on_this_device(half, float32, is_cached, expected):
    verdict = verdict_of(Timing(float32=float32, half=half), is_cached=is_cached)
    reason = verdict.reason("bfloat16", "CPU")
    if expected == "half":
        assert verdict.is_half
        assert reason.startswith("the step ran 13.4 ms in bfloat16 and 25.7 ms in float32 on this CPU (1.92x)")
    else:
        assert not verdict.is_half
        assert reason == "the step ran 449 ms in bfloat16 and 373 ms in float32 on this CPU"
    assert reason.endswith("; measured before, read from the cache") == is_cached


def test_a_step_far_slower_in_half_is_not_worth_a_profile():
    """On a CPU without fast half kernels every region loses: no profiled half call is spent finding that out."""
    assert is_worth_mixing(verdict_of(Timing(float32=1.0, half=1.2)))
    assert is_worth_mixing(verdict_of(Timing(float32=1.0, half=0.5)))
    assert not is_worth_mixing(verdict_of(Timing(float32=1.0, half=MIXING_LIMIT + 0.01)))
