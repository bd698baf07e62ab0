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
    confirmation,
    is_worth_mixing,
    recheck,
    rechecked,
    schedule,
    switch_line,
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
    if is_cached:
        found = verdict_of(Timing(float32=float32, half=half), is_cached=True, source="/c/tune-1.json").reason(
            "bfloat16", "CPU")
        assert found.endswith("; measured before, read from the cache /c/tune-1.json")


def test_a_step_far_slower_in_half_is_not_worth_a_profile():
    """On a CPU without fast half kernels every region loses: no profiled half call is spent finding that out."""
    assert is_worth_mixing(verdict_of(Timing(float32=1.0, half=1.2)))
    assert is_worth_mixing(verdict_of(Timing(float32=1.0, half=0.5)))
    assert not is_worth_mixing(verdict_of(Timing(float32=1.0, half=MIXING_LIMIT + 0.01)))


def test_a_verdict_whose_halves_agree_is_clear():
    trial = TrialSchedule()
    # order: half, float32, float32, half (first half), half, float32, float32, half (second half)
    run(trial, {HALF: [9.0, 0.50, 0.55, 0.52, 0.60], FLOAT32: [9.0, 1.0, 0.9, 1.1, 0.95]})
    verdict = trial.verdict()
    assert verdict.is_half and verdict.is_clear
    assert verdict.halves == (Timing(float32=0.9, half=0.50), Timing(float32=0.95, half=0.52))
    assert "not clear" not in verdict.reason("bfloat16", "CPU")


def test_a_verdict_whose_halves_disagree_is_not_clear_and_says_so():
    """A neighbour's job starting mid-trial slows the second half: the first half says half, the second float32."""
    trial = TrialSchedule()
    run(trial, {HALF: [9.0, 0.50, 0.52, 1.30, 1.25], FLOAT32: [9.0, 1.0, 0.98, 0.70, 0.72]})
    verdict = trial.verdict()
    assert verdict.is_half  # the best of each body still decides this run
    assert not verdict.is_clear
    assert verdict.reason("bfloat16", "CPU") == (
        "the step ran 500 ms in bfloat16 and 700 ms in float32 on this CPU (1.40x); not clear enough to keep "
        "(1.96x in the trial's first half, 0.56x in its second): a later run measures again")


def test_a_near_tie_that_the_halves_split_is_not_clear():
    trial = TrialSchedule()
    run(trial, {HALF: [9.0, 0.94, 0.99, 0.97, 0.98], FLOAT32: [9.0, 1.0, 1.0, 1.0, 1.0]})
    verdict = trial.verdict()
    assert verdict.is_half and not verdict.is_clear  # 1.06x, then 1.03x: within the margin


def test_a_body_with_one_timed_call_gives_no_clear_verdict():
    trial = TrialSchedule()
    while not trial.is_done:
        body = trial.next_body()
        trial.record(body, None if body == FLOAT32 and trial.times[FLOAT32] else 1.0)
    verdict = trial.verdict()
    assert verdict is not None and verdict.halves == () and not verdict.is_clear
    assert "a body had too few timed calls" in verdict.reason("bfloat16", "CPU")


def test_a_confirmation_is_clear_where_its_two_pairs_agree():
    agree, split = confirmation(), confirmation()
    run(agree, {HALF: [9.0, 0.5, 0.6], FLOAT32: [1.0, 0.9]})
    run(split, {HALF: [9.0, 0.5, 1.2], FLOAT32: [1.0, 0.9]})
    assert agree.verdict().is_clear and not split.verdict().is_clear


@pytest.mark.parametrize("is_half", [True, False])
def test_a_recheck_runs_the_other_body_cold_first_then_two_mirrored_pairs(is_half):
    cached = verdict_of(Timing(float32=1.0, half=0.5 if is_half else 1.5), is_cached=True)
    other, chosen = (FLOAT32, HALF) if is_half else (HALF, FLOAT32)
    trial = recheck(cached)
    assert trial.order == [other, other, chosen, chosen, other] and trial.untimed == 1


def test_a_recheck_switches_only_on_a_clear_disagreement():
    cached = verdict_of(Timing(float32=1.0, half=1.2), is_cached=True, source="/c/tune-1.json")  # stays float32
    clear, split, agrees = recheck(cached), recheck(cached), recheck(cached)
    run(clear, {HALF: [9.0, 0.5, 0.52], FLOAT32: [1.0, 1.01]})
    run(split, {HALF: [9.0, 0.5, 1.3], FLOAT32: [1.0, 1.01]})
    run(agrees, {HALF: [9.0, 1.2, 1.1], FLOAT32: [1.0, 1.01]})
    found = rechecked(cached, clear)
    assert found is not None and found.is_half and (found.half_seconds, found.float32_seconds) == (0.5, 1.0)
    assert rechecked(cached, split) is None and rechecked(cached, agrees) is None
    assert switch_line(cached, found, "bfloat16", "CPU", calls=1000) == (
        "now runs in bfloat16: checked again after 1000 calls, the step ran 500 ms in bfloat16 and 1000 ms in "
        "float32 on this CPU (2.00x); the cache /c/tune-1.json had it stay float32 (1200 ms in bfloat16, 1000 ms in "
        "float32) and holds the new times")
