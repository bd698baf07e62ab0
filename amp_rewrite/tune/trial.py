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

A verdict is cached only when it is clear of the noise (:attr:`StepVerdict.is_clear`):
the mirrored schedule splits into two halves, each a balanced trial of its
own (half, float32, float32, half), and each half's best calls give a
verdict by the same margin. Where the two agree, measuring again gave the
same answer, which is what a cache assumes of a verdict; where they differ,
the machine's load changed during the trial by more than the gap between
the bodies (a neighbour's job starting), and the run keeps its verdict but
a later run measures again. A near tie is where the halves disagree most,
and there measuring again costs least. Both halves agreeing implies the
whole trial's verdict, since the best of each body is the better of its two
halves' bests.

A load that lasts the whole trial can still slow one body more than the
other (half kernels that share the cores worse, say). So a cached verdict
is checked again during a long run (:func:`recheck`): every
:data:`RECHECK_EVERY` calls of the step, a short trial of five real calls
times the two bodies again, and a clear disagreement switches the step and
updates the cache (:func:`rechecked`).

Under op determinism (``tf.config.experimental.enable_op_determinism``) no
timing decides: the lists do, or a cached verdict, so two runs of a script
with the same cache run the same precision.
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

#: A step decided from the cache is timed again every this many of its calls (:func:`recheck`). A re-check is
#: five calls, three of them of the body the cache did not choose: at this interval it costs at most three
#: calls of the slower body in a thousand, 0.3% of a step's calls, while a verdict the cache got wrong costs
#: every call until it is found.
RECHECK_EVERY = 1000

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

    Attributes:
        is_half: half's best call saved :data:`MARGIN` of float32's.
        half_seconds, float32_seconds: the best call of each body.
        is_cached: read from the tuning cache, not measured in this run.
        halves: the best times of each half of the trial (:meth:`TrialSchedule.halves`); empty for a verdict
            read from the cache or given its times.
        is_clear: the halves gave the same verdict (always, for a verdict not measured by halves); only a
            clear verdict is cached.
        source: the cache file a cached verdict came from.
        where: where the times were measured when not on this device alone (``the slowest of
            2 workers`` for a multi-worker job's verdict).
    """

    is_half: bool
    half_seconds: float
    float32_seconds: float
    is_cached: bool = False
    where: str = ""
    halves: tuple[Timing, ...] = ()
    is_clear: bool = True
    source: str = ""

    def reason(self, target: str, device_type: str, *, subject: str = "the step") -> str:
        """``the step ran 449 ms in bfloat16 and 373 ms in float32 on this CPU`` (with the speed-up when half won).

        ``subject`` names what ran (``the graph`` for a whole GraphDef). A
        cached verdict ends with the file it came from, one that was not clear
        enough to cache with the two halves' speed-ups.
        """
        where = self.where or (f"this {device_type}" if device_type else "this machine")
        text = (f"{subject} ran {in_ms(self.half_seconds)} in {target} and {in_ms(self.float32_seconds)} in "
                f"float32 on {where}")
        if self.is_half and self.half_seconds > 0:
            text += f" ({self.float32_seconds / self.half_seconds:.2f}x)"
        elif not self.is_half and (1.0 - MARGIN) * self.float32_seconds < self.half_seconds < self.float32_seconds:
            text += f", less than the {MARGIN:.0%} that half must save"
        return text + self.provenance()

    def provenance(self) -> str:
        """What the reason ends with: where a cached verdict came from, or why a measured one is not cached."""
        if self.is_cached:
            return "; measured before, read from the cache" + (f" {self.source}" if self.source else "")
        if not self.is_clear:
            return f"; not clear enough to keep ({_halves_text(self.halves)}): a later run measures again"
        return ""

    def timing(self) -> Timing:
        return Timing(float32=self.float32_seconds, half=self.half_seconds)


def _halves_text(halves: tuple[Timing, ...]) -> str:
    if len(halves) != 2:
        return "a body had too few timed calls"
    first, second = (f"{h.float32 / max(h.half, 1e-12):.2f}x" for h in halves)
    return f"{first} in the trial's first half, {second} in its second"


def is_worth_mixing(verdict: StepVerdict) -> bool:
    """Whether a step's regions are worth a profile: its half body was within :data:`MIXING_LIMIT` of float32's."""
    return verdict.half_seconds <= MIXING_LIMIT * verdict.float32_seconds


def verdict_of(timing: Timing, *, is_cached: bool = False, halves: tuple[Timing, ...] | None = None,
               source: str = "") -> StepVerdict:
    """The verdict two best times give; with ``halves`` (each half's best times), clear only where they agree."""
    is_half = is_faster(timing)
    is_clear = halves is None or (len(halves) == 2 and all(is_faster(half) == is_half for half in halves))
    return StepVerdict(is_half, timing.half, timing.float32, is_cached=is_cached, halves=tuple(halves or ()),
                       is_clear=is_clear, source=source)


def is_faster(timing: Timing) -> bool:
    """Whether ``half`` saved :data:`MARGIN` of ``float32``'s time."""
    return timing.half <= (1.0 - MARGIN) * timing.float32


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

    def skip(self, body: str) -> None:
        """One call of ``body`` finished whose time says nothing of a step (the loss scale skipped its update).

        It is not timed, and a pair (``body``, then the other) is added at the
        schedule's end: each body still gets its timed calls, and the calls go
        on alternating, so while half steps skip, float32 steps between them
        still train.
        """
        self.order += [body, FLOAT32 if body == HALF else HALF]
        self.calls += 1

    def verdict(self) -> StepVerdict | None:
        """Half or float32, by the best times (clear where both halves agree); None while the trial runs or a
        body has no timed call."""
        if not self.is_done or not self.times[HALF] or not self.times[FLOAT32]:
            return None
        return verdict_of(Timing(float32=min(self.times[FLOAT32]), half=min(self.times[HALF])),
                          halves=self.halves())

    def halves(self) -> tuple[Timing, ...]:
        """The best times of the trial's first half and of its second; empty where a body has one timed call.

        Each body's timed calls split in two in the order they ran: the
        schedule's first two mirrored pairs (half, float32, float32, half) and
        its last two; a confirmation's first pair and its second.
        """
        split = {body: len(times) // 2 for body, times in self.times.items()}
        if min(split.values()) < 1:
            return ()
        return tuple(Timing(float32=min(part(self.times[FLOAT32], split[FLOAT32])),
                            half=min(part(self.times[HALF], split[HALF])))
                     for part in (lambda times, n: times[:n], lambda times, n: times[n:]))


def confirmation() -> TrialSchedule:
    """The trial of a mixed step (``half`` here) against the better pure one (``float32`` here).

    The mixed body runs once untimed (the better pure body is warm already),
    then two mirrored pairs: five calls.
    """
    return TrialSchedule(order=[HALF, HALF, FLOAT32, FLOAT32, HALF], untimed=1)


def recheck(cached: StepVerdict) -> TrialSchedule:
    """The trial checking a cached verdict again, after :data:`RECHECK_EVERY` calls of its step.

    The body the cache did not choose is cold: it runs once untimed, then
    two mirrored pairs around two calls of the chosen body (as a
    confirmation: five real calls). Its verdict is read as any trial's,
    halves included (:func:`rechecked`).
    """
    other, chosen = (FLOAT32, HALF) if cached.is_half else (HALF, FLOAT32)
    return TrialSchedule(order=[other, other, chosen, chosen, other], untimed=1)


def rechecked(cached: StepVerdict, trial: TrialSchedule) -> StepVerdict | None:
    """The re-check's verdict where it clearly disagrees with ``cached`` (the step switches), else None.

    Clearly: both pairs of the re-check chose the other body, by :data:`MARGIN`.
    A re-check that agrees, or is not clear, leaves the cached verdict.
    """
    found = trial.verdict()
    if found is None or not found.is_clear or found.is_half == cached.is_half:
        return None
    return found


def switch_line(cached: StepVerdict, found: StepVerdict, target: str, device_type: str, *, calls: int) -> str:
    """Why a step decided from the cache switches, after the words that name it.

    ``now runs in bfloat16: checked again after 1000 calls, the step ran 5.0
    ms in bfloat16 and 10.0 ms in float32 on this CPU (2.00x); the cache
    FILE had it stay float32 (12.0 ms in bfloat16, 10.0 ms in float32) and
    holds the new times``.
    """
    now = f"now runs in {target}" if found.is_half else "now stays float32"
    was = f"run in {target}" if cached.is_half else "stay float32"
    where = f"the cache {cached.source}" if cached.source else "the cache"
    return (f"{now}: checked again after {calls} calls, {found.reason(target, device_type)}; {where} had it {was} "
            f"({in_ms(cached.half_seconds)} in {target}, {in_ms(cached.float32_seconds)} in float32) and holds the new "
            f"times")


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
    halves: tuple[Timing, ...] = ()
    is_clear: bool = True

    @property
    def is_settled(self) -> bool:
        """Whether every trial that decided the step was clear of the noise (only then is it cached)."""
        return self.is_clear and self.pure.is_clear

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
                    f"{in_ms(self.mixed_seconds)}{self._unclear()}")
        pure, other = ((target, self.pure.float32_seconds) if self.pure.is_half
                       else (FLOAT32, self.pure.half_seconds))
        other_name = FLOAT32 if self.pure.is_half else target
        text = (f"{subject} ran {in_ms(self.mixed_seconds)} with {regions} and {in_ms(self.pure_seconds)} in {pure} on "
                f"{where} ({self.pure_seconds / max(self.mixed_seconds, 1e-12):.2f}x); in {other_name} alone it ran "
                f"{in_ms(other)}")
        return text + self.pure.provenance() + self._unclear()

    def _unclear(self) -> str:
        if self.is_clear:
            return ""
        return (f"; the mixed body's trial was not clear enough to keep ({_halves_text(self.halves)}): a later "
                f"run measures again")

    def timing(self) -> Timing:
        return Timing(float32=self.pure_seconds, half=self.mixed_seconds)


def mixed_verdict_of(timing: Timing, pure: StepVerdict, half_regions: int, regions: int, *,
                     confirmed: StepVerdict | None = None) -> MixedVerdict:
    """The verdict two best times of the confirming trial give (the pure body's as ``float32``).

    ``confirmed`` is that trial's own verdict, whose halves say whether it is clear; None for times read
    from the cache.
    """
    is_mixed = is_faster(timing)
    if confirmed is None:
        return MixedVerdict(is_mixed, timing.half, timing.float32, pure, half_regions, regions)
    return MixedVerdict(is_mixed, timing.half, timing.float32, pure, half_regions, regions,
                        halves=confirmed.halves, is_clear=confirmed.is_clear)


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


def in_ms(seconds: float) -> str:
    """``449 ms``, ``20.4 ms``: seconds as the lines write them."""
    milliseconds = seconds * 1000.0
    return f"{milliseconds:.1f} ms" if milliseconds < 100 else f"{milliseconds:.0f} ms"
