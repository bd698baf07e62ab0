"""The step decides: a step runs in half only where its real calls ran faster in half here.

The op lists guess which ops are faster in half; whether the *step* is
depends on the device, the shapes, and what the kernel library makes of the
whole graph (oneDNN fuses a convolution's filter gradient with its bias
gradient in float32 and not around a Cast; its bfloat16 kernels win on one
shape and lose on another). So the step the user runs is timed: real calls
of the rewritten body and of the float32 body alternate (both are training
steps, so nothing is wasted), and half stays only when its fastest call beat
float32's fastest by :data:`MARGIN`.

This module is that schedule and its verdict, with no TensorFlow in it; the
three places that run it only call their bodies:

- a traced ``tf.function`` (:class:`~amp_rewrite.runtime.tf2.function_trial.FunctionTrial`),
- a TF1 ``Session.run`` step (:class:`~amp_rewrite.runtime.tf1.session.session_trial.SessionTrial`),
- two GraphDefs in sessions of their own, for ``--tune``
  (:class:`~amp_rewrite.tune.graph_sessions.GraphSessions`, through :func:`run_trial`).

:class:`TrialSchedule` holds one trial's calls:

- the first call of each body is not timed (:data:`WARMUP`): it optimizes
  the graph and sets up the kernels;
- then :data:`ROUNDS` timed calls of each, in the order half, float32,
  float32, half, half, float32, ... (each pair mirrors the last), so a machine
  that slows down or speeds up during the trial favours neither;
- the best call of each counts: on a shared machine a neighbour's load only
  ever adds time, so the minimum is the stablest estimate of what a body
  costs;
- half wins only when its best is at most ``1 - MARGIN`` of float32's; a
  near tie stays float32, which keeps float32's numbers and never loses.

Ten calls in all (:data:`CALLS`). The two best times are cached under what
was timed (:mod:`amp_rewrite.tune.keys`, in the tuning cache of
:mod:`amp_rewrite.tune.cache`), so a second run measures nothing and decides
the same; a changed graph has a new key and is measured again. The same
:data:`MARGIN` decides a mixed body's confirmation and each region's choice
(:mod:`amp_rewrite.tune.step_regions`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from amp_rewrite.tune.cache import Timing

HALF, FLOAT32 = "half", "float32"
#: Half must save at least this share of the float32 step. The best of four
#: calls of the same step on a shared machine differ run to run by a few
#: percent; a choice inside that noise would flip between runs, and a near
#: tie is not worth half's precision.
MARGIN = 0.05
#: A step whose half body took more than this times its float32 body's time is not profiled for a
#: mixed body: on a CPU without fast half kernels every region loses, and its profiled half call
#: would cost several float32 steps.
MIXING_LIMIT = 1.5
#: Untimed calls of each body before the timed ones.
WARMUP = 1
#: Timed calls of each body.
ROUNDS = 4
CALLS = 2 * (WARMUP + ROUNDS)

#: ``(body, call)`` → ``(outputs, seconds)``: runs one call of a body (``half``, ``float32`` or
#: ``mixed``) and says how long it took. Each trial takes one, so tests give a clock of their own.
Timer = Callable[[str, Callable[[], Any]], tuple[Any, float]]


def schedule(warmup: int = WARMUP, rounds: int = ROUNDS) -> list[str]:
    """The bodies the trial's calls run, in order: each warm-up pair, then mirrored timed pairs."""
    order = [HALF, FLOAT32] * warmup
    for index in range(rounds):
        order += [HALF, FLOAT32] if index % 2 == 0 else [FLOAT32, HALF]
    return order


@dataclass(frozen=True)
class StepVerdict:
    """What a trial decided: half or float32, and the best time of each body in seconds.

    ``where`` says where the times were measured when not on this device alone (``the slowest of
    2 workers`` for a multi-worker job's verdict).
    """

    is_half: bool
    half_seconds: float
    float32_seconds: float
    is_cached: bool = False
    where: str = ""

    def reason(self, target: str, device_type: str, *, subject: str = "the step") -> str:
        """``the step ran 449 ms in bfloat16 and 373 ms in float32 on this CPU`` (with the speed-up when half won).

        ``subject`` names what ran (``the graph`` for a whole GraphDef).
        """
        where = self.where or (f"this {device_type}" if device_type else "this machine")
        text = (f"{subject} ran {_ms(self.half_seconds)} in {target} and {_ms(self.float32_seconds)} in "
                f"float32 on {where}")
        if self.is_half and self.half_seconds > 0:
            text += f" ({self.float32_seconds / self.half_seconds:.2f}x)"
        elif not self.is_half and (1.0 - MARGIN) * self.float32_seconds < self.half_seconds < self.float32_seconds:
            text += f", less than the {MARGIN:.0%} that half must save"
        if self.is_cached:
            text += "; measured before, read from the cache"
        return text

    def timing(self) -> Timing:
        return Timing(float32=self.float32_seconds, half=self.half_seconds)


def is_worth_mixing(verdict: StepVerdict) -> bool:
    """Whether a step's regions are worth a profile: its half body was within :data:`MIXING_LIMIT` of float32's."""
    return verdict.half_seconds <= MIXING_LIMIT * verdict.float32_seconds


def verdict_of(timing: Timing, *, is_cached: bool = False) -> StepVerdict:
    """The verdict two best times give."""
    is_half = timing.half <= (1.0 - MARGIN) * timing.float32
    return StepVerdict(is_half, timing.half, timing.float32, is_cached=is_cached)


@dataclass
class TrialSchedule:
    """The calls of one trial: which body the next runs, the times so far, and the verdict once all ran.

    A call that was not timed (the warm-ups, or a call the caller could not
    time) is recorded with ``seconds=None``.
    """

    order: list[str] = field(default_factory=schedule)
    times: dict[str, list[float]] = field(default_factory=lambda: {HALF: [], FLOAT32: []})
    calls: int = 0
    #: The first calls, which are not timed.
    untimed: int = 2 * WARMUP

    @property
    def is_done(self) -> bool:
        return self.calls >= len(self.order)

    def next_body(self) -> str:
        """The body the next call runs (half once the trial is done: the caller settles before)."""
        return self.order[self.calls] if not self.is_done else HALF

    def record(self, body: str, seconds: float | None) -> None:
        """One call of ``body`` finished; timed ones count towards the verdict after the warm-ups."""
        if self.calls >= self.untimed and seconds is not None:
            self.times[body].append(seconds)
        self.calls += 1

    def verdict(self) -> StepVerdict | None:
        """Half or float32, by the best times; None while the trial runs or a body has no timed call."""
        if not self.is_done or not self.times[HALF] or not self.times[FLOAT32]:
            return None
        return verdict_of(Timing(float32=min(self.times[FLOAT32]), half=min(self.times[HALF])))


def confirmation() -> TrialSchedule:
    """The trial of a mixed step (``half`` here) against the better pure one (``float32`` here).

    The mixed body runs once untimed (the better pure body is warm already),
    then two mirrored pairs: five calls.
    """
    return TrialSchedule(order=[HALF, HALF, FLOAT32, FLOAT32, HALF], untimed=1)


@dataclass(frozen=True)
class MixedVerdict:
    """What the trial of a mixed step decided: whether it beat the better pure step, and by how much.

    Attributes:
        is_mixed: the mixed step's best call was :data:`MARGIN` faster than the better pure step's.
        mixed_seconds, pure_seconds: the best calls in the confirming trial.
        pure: the verdict on the two pure steps.
        half_regions, regions: how many regions the mixed step keeps half, of how many.
    """

    is_mixed: bool
    mixed_seconds: float
    pure_seconds: float
    pure: StepVerdict
    half_regions: int
    regions: int

    @property
    def is_half(self) -> bool:
        """Whether the step runs half ops: mixed, or half as a whole."""
        return self.is_mixed or self.pure.is_half

    def reason(self, target: str, device_type: str, *, subject: str = "the step") -> str:
        """Why the step runs mixed, or why it runs as the pure verdict says (with what the mixed step ran).

        Mixed: ``the step ran 310 ms with 12 of 53 half regions in bfloat16
        and 373 ms in float32 on this CPU (1.20x); in bfloat16 alone it ran
        449 ms``. Not: the pure verdict's reason, then ``; with 12 of 53
        half regions in bfloat16 it ran 380 ms``. ``subject`` names what ran.
        """
        where = self.pure.where or (f"this {device_type}" if device_type else "this machine")
        regions = f"{self.half_regions} of {self.regions} half regions in {target}"
        if not self.is_mixed:
            return (f"{self.pure.reason(target, device_type, subject=subject)}; with {regions} it ran "
                    f"{_ms(self.mixed_seconds)}")
        pure, other = ((target, self.pure.float32_seconds) if self.pure.is_half
                       else (FLOAT32, self.pure.half_seconds))
        other_name = FLOAT32 if self.pure.is_half else target
        text = (f"{subject} ran {_ms(self.mixed_seconds)} with {regions} and {_ms(self.pure_seconds)} in {pure} on "
                f"{where} ({self.pure_seconds / max(self.mixed_seconds, 1e-12):.2f}x); in {other_name} alone it ran "
                f"{_ms(other)}")
        if self.pure.is_cached:
            text += "; measured before, read from the cache"
        return text

    def timing(self) -> Timing:
        return Timing(float32=self.pure_seconds, half=self.mixed_seconds)


def mixed_verdict_of(timing: Timing, pure: StepVerdict, half_regions: int, regions: int) -> MixedVerdict:
    """The verdict two best times of the confirming trial give (the pure body's as ``float32``)."""
    is_mixed = timing.half <= (1.0 - MARGIN) * timing.float32
    return MixedVerdict(is_mixed, timing.half, timing.float32, pure, half_regions, regions)


def time_call(body: str, call: Callable[[], Any]) -> tuple[Any, float]:
    """A :data:`Timer` for calls that return once the step is done (``Session.run``; a CPU's eager call)."""
    began = time.perf_counter()
    outputs = call()
    return outputs, time.perf_counter() - began


def run_trial(step: Callable[[str], float], *, warmup: int = WARMUP, rounds: int = ROUNDS
              ) -> tuple[StepVerdict, int]:
    """The verdict of one trial whose calls ``step`` runs, and the timed calls of each body.

    The calls follow :func:`schedule`; ``step`` raises to stop the trial.
    """
    trial = run_calls(step, TrialSchedule(order=schedule(warmup, rounds), untimed=2 * warmup))
    verdict = trial.verdict()
    assert verdict is not None, "a finished trial with at least one round has a verdict"
    return verdict, rounds


def run_calls(step: Callable[[str], float], trial: TrialSchedule) -> TrialSchedule:
    """``trial`` with all its calls run by ``step`` (one step of the body named, its seconds), in its order."""
    while not trial.is_done:
        body = trial.next_body()
        trial.record(body, step(body))
    return trial


def _ms(seconds: float) -> str:
    milliseconds = seconds * 1000.0
    return f"{milliseconds:.1f} ms" if milliseconds < 100 else f"{milliseconds:.0f} ms"
