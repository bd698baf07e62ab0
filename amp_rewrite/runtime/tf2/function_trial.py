"""One rewritten ``tf.function`` on trial: its calls alternate its half and float32 bodies, and the faster stays.

The schedule and the verdict are :mod:`amp_rewrite.tune.trial`'s; this
module runs them on a ConcreteFunction. A function on trial gets a
:class:`FunctionTrial` as its ``_call_flat``, holding two states of it, the
half body and the float32 one (which the hook's trials make:
:mod:`~amp_rewrite.runtime.tf2.function_trials`). Each eager call runs the
body the schedule names and is timed (the device synchronised first, on a
GPU); both are real steps of the user's training on the same variables, so
no work is wasted. Calls from several threads take turns, and each runs in
a copy of the function holding its body's state, so the function itself
changes only once, at the verdict. After :data:`~amp_rewrite.tune.trial.CALLS`
calls the verdict keeps one state for good and one INFO line says which and
why (``amp-rewrite: tf.function one_step_on_data stays float32: the step ran
449 ms in bfloat16 and 373 ms in float32 on this CPU``). Then, for a step
with half regions to choose among, one profiled call of each body and the
trial of the mixed body they propose (:mod:`~amp_rewrite.runtime.tf2.step_mixing`);
in a multi-worker job, each decision the job's
(:mod:`~amp_rewrite.runtime.tf2.job_rounds`). A re-check of a cached verdict
(:mod:`~amp_rewrite.runtime.tf2.recheck`) is a trial too, of five calls.

It composes with the other ``_call_flat`` wrappers: the first-call guard
checks the first call (a half one, the trial's first warm-up) and hands over
to the trial; the trial hands each call's bookkeeping to the loss-scale
floor watch under float16 (``then``), which takes its place when half
wins. A fallback to float32 during the trial (the floor watch's) ends it.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

from amp_rewrite import tf_internals
from amp_rewrite.runtime.tf2.calls import CallStep
from amp_rewrite.runtime.tf2.job_rounds import JobRounds
from amp_rewrite.runtime.tf2.step_mixing import MIXED, Mixing
from amp_rewrite.runtime.tf2.swap_records import LOGGER_NAME
from amp_rewrite.tune.trial import (
    FLOAT32,
    HALF,
    MixedVerdict,
    StepVerdict,
    Timer,
    TrialSchedule,
    confirmation,
    is_worth_mixing,
    recheck,
    rechecked,
)

logger = logging.getLogger(LOGGER_NAME)


class FunctionTrial:
    """The ``_call_flat`` of a function on trial: runs each call in the body the schedule names, and times it.

    Three phases, each on real calls: the trial of the two pure bodies; when
    the step has half regions to choose among, one profiled call of each
    (:mod:`~amp_rewrite.runtime.tf2.step_mixing`); when the profiles propose
    a mixed body, the trial confirming it against the better pure one.

    Calls from several threads run one at a time (a lock held for the call),
    each in the schedule's order and timed alone. A call runs its body in a
    copy of the function holding that body's state, so the function itself
    keeps one state during the trial (the half one) and a call that reads it
    meanwhile (the first-call guard's, another thread's tracing) sees one
    whole body. The verdict changes it once; calls after it never take the lock.

    Attributes:
        function_ref: the ConcreteFunction on trial, held weakly.
        name: its name, for the INFO line.
        states: ``half``, ``float32`` (and once built, ``mixed``) → the function's state running that body.
        trial: the schedule, times and verdict (:class:`~amp_rewrite.tune.trial.TrialSchedule`).
        on_verdict: called once with the function, the verdict and why no mixed body was tried (or None),
            after the state is kept.
        then: the floor watch that takes the trial's place when half wins; None: nothing.
        timer: runs one call of a body and says how long it took (:data:`~amp_rewrite.tune.trial.Timer`).
        mixing: what profiles the pure bodies and makes the mixed one; None: the pure verdict is final.
        rounds: in a multi-worker job, where the workers take each decision together
            (:mod:`~amp_rewrite.runtime.tf2.job_rounds`); None: this process decides alone.
        cached: the cached verdict this trial checks again (:func:`~amp_rewrite.tune.trial.recheck`'s five
            calls; ``then`` is the function's :class:`Recheck`, which takes over whichever body stays); None:
            a trial of its own.
        lock: held by each call on trial.
        is_over: the verdict is kept (or the hook went).
        kept: the verdict kept; None before.
    """

    def __init__(self, concrete_function, name: str, states: dict[str, dict], *,
                 on_verdict: Callable[[Any, Any, str | None], None], then: CallStep | None, timer: Timer,
                 mixing: Mixing | None = None, rounds: JobRounds | None = None, cached: StepVerdict | None = None):
        self.function_ref = weakref.ref(concrete_function)
        self.name = name
        self.states = states
        self.cached = cached
        self.trial = TrialSchedule() if cached is None else recheck(cached)
        self.on_verdict = on_verdict
        self.then = then
        self.timer = timer
        self.mixing = mixing
        self.rounds = rounds
        self.verdict: StepVerdict | None = None
        self.profiles: dict[str, dict[str, float] | None] = {}
        self.confirmation: TrialSchedule | None = None
        self.cached = cached
        self.held = tf_internals.inference_function(concrete_function)
        self.lock = threading.RLock()
        self.is_over = False
        self.kept: StepVerdict | MixedVerdict | None = None
        self._copies: dict[str, Any] = {}

    # The first-call guard runs the first call itself (a half one) and hands its bookkeeping here.

    def before_call(self, concrete_function):
        return self.then.before_call(concrete_function) if self.then is not None else None

    def skipped_since(self, start) -> bool:
        return self.then is not None and self.then.skipped_since(start)

    def after_call(self, concrete_function, start) -> None:
        if self.then is not None:
            self.then.after_call(concrete_function, start)
        with self.lock:
            # The guard's call is the half body's first, untimed; others it ran from other threads meanwhile are
            # not the schedule's.
            if self.is_on_trial(concrete_function) and self.trial.calls == 0:
                self.trial.record(HALF, None)

    def __call__(self, tensor_inputs, captured_inputs):
        import tensorflow as tf

        cf: Any = self.function_ref()
        if not tf.executing_eagerly():
            return tf_internals.call_concrete_function(cf, tensor_inputs, captured_inputs)  # builds a call
        with self.lock:
            if self.is_on_trial(cf):
                return self._call(cf, tensor_inputs, captured_inputs)
        # Decided while this call waited: it runs what runs now. (A first call that another thread's
        # calls outlasted hands over to the trial after the verdict: the trial hands on.)
        if tf_internals.call_override(cf) is self:
            self._hand_on(cf)
        return cf._call_flat(tensor_inputs, captured_inputs)

    def _call(self, cf, tensor_inputs, captured_inputs):
        """One call of the body the schedule names, timed (or profiled), then recorded."""
        body = self.next_body()
        copy = self._copy_running(cf, body)
        start = self.before_call(cf)

        def call():
            return tf_internals.call_concrete_function(copy, tensor_inputs, captured_inputs)

        seconds: Any
        if self.verdict is not None and self.confirmation is None:
            assert self.mixing is not None
            outputs, seconds = self.mixing.profiler(body, call)  # op seconds per node, or None
        else:
            outputs, seconds = self.timer(body, call)
        skipped = self.skipped_since(start)
        if self.then is not None:
            self.then.after_call(cf, start)
        if self.is_on_trial(cf):  # a fallback during the call ends the trial
            if skipped and self.rounds is None:
                self._skip(body)
            else:  # a job's workers keep their trials' calls in step: there a skipped call is timed as any
                self._record(cf, body, seconds)
        return outputs

    def _skip(self, body: str) -> None:
        """A call whose step the loss scale skipped: it applied no update and cost less than a step, so its time
        or profile is not kept, and its body runs once more (:meth:`TrialSchedule.skip
        <amp_rewrite.tune.trial.TrialSchedule.skip>`; a profile is taken again at the next call). Each skip halves
        the scale, and a skip at its floor makes the watch fall back to float32, which ends the trial."""
        if self.verdict is None:
            self.trial.skip(body)
        elif self.confirmation is not None:
            self.confirmation.skip(HALF if body == MIXED else FLOAT32)

    def next_body(self) -> str:
        """The body the next call runs: the trial's, then each pure one profiled, then the confirmation's."""
        if self.verdict is None:
            return self.trial.next_body()
        if self.confirmation is None:
            return HALF if HALF not in self.profiles else FLOAT32
        return MIXED if self.confirmation.next_body() == HALF else self._better_pure()

    def _record(self, cf, body: str, seconds) -> None:
        if self.verdict is None:
            self.trial.record(body, seconds)
            verdict = self.trial.verdict()
            if verdict is None:
                return
            if self.cached is not None:  # a re-check: the cached verdict stands unless it clearly lost
                self.settle(cf, rechecked(self.cached, self.trial) or self.cached)
                return
            self.verdict, profiles_next = self._pure(verdict)
            if not profiles_next:
                self.settle(cf, self.verdict)
        elif self.confirmation is None:
            if not isinstance(seconds, dict):  # no times: why there are none, or None
                if self.rounds is None:  # the pure verdict stands, and its line says why
                    self.settle(cf, self.verdict, unmixed=seconds or "no profile was taken")
                    return
                seconds = None  # in a job, the other workers' times may still choose
            self.profiles[body] = seconds
            if len(self.profiles) == 2:
                self._propose(cf)
        else:
            self.confirmation.record(HALF if body == MIXED else FLOAT32, seconds)
            confirmed = self.confirmation.verdict()
            if confirmed is not None:
                assert self.mixing is not None and self.mixing.choice is not None
                if self.rounds is None:
                    self.settle(cf, self.mixing.verdict(self.verdict, confirmed))
                else:
                    self.settle(cf, self.rounds.mixed(confirmed.timing(), self.verdict, self.mixing.choice))

    def _pure(self, verdict: StepVerdict) -> tuple[StepVerdict, bool]:
        """The verdict on the pure bodies (the job's, in a job), and whether the regions are profiled next."""
        if self.rounds is not None:
            return self.rounds.pure(verdict, self.mixing is not None and self.mixing.can_mix())
        return verdict, self.mixing is not None and is_worth_mixing(verdict) and self.mixing.can_mix()

    def _propose(self, cf) -> None:
        """The profiles' proposal: a mixed body to confirm, or the pure verdict for good."""
        assert self.verdict is not None and self.mixing is not None
        half, float32 = self.profiles[HALF], self.profiles[FLOAT32]
        if self.rounds is not None:
            state = self._propose_together(cf, half, float32)
        else:
            assert half is not None and float32 is not None
            state = self.mixing.propose(cf, self.states, self.verdict, half, float32)
        if state is None:
            self.settle(cf, self.verdict)
            return
        self.states[MIXED] = state
        self.confirmation = confirmation()

    def _propose_together(self, cf, half_ops, float32_ops) -> dict | None:
        """The mixed body every worker of the job builds from the regions' times summed over the workers."""
        assert self.verdict is not None and self.mixing is not None and self.rounds is not None
        own = None
        if half_ops is not None and float32_ops is not None:
            try:
                own = self.mixing.times(half_ops, float32_ops)
            except Exception as exc:  # noqa: BLE001 - no mixed body: the pure verdict stands
                logger.debug("amp-rewrite: tf.function %s: the regions' times were not read: %s", self.name, exc)
        job = self.rounds.regions(own)
        if job is None:
            return None
        state = self.mixing.mixed_state(cf, *job, is_half_step=self.verdict.is_half)
        return state if self.rounds.built(state is not None) else None

    def _better_pure(self) -> str:
        return HALF if self.verdict is not None and self.verdict.is_half else FLOAT32

    def is_on_trial(self, concrete_function) -> bool:
        """Whether the trial still decides the calls: no verdict yet, and nothing else (a fallback) changed the body.

        The function holds one state all through the trial (the one it held when the trial began: the half
        body, or for a re-check the body its cached verdict runs), so any other state means it is over.
        """
        return not self.is_over and tf_internals.inference_function(concrete_function) is self.held

    def settle(self, concrete_function, verdict, *, unmixed: str | None = None) -> None:
        """Keeps the body the verdict chose, with the floor watch after a half one (a re-check's :class:`Recheck`
        after either); then ``on_verdict``.

        ``unmixed``: why the step's regions were not chosen among, when they were to be and could not.
        """
        mixed = getattr(verdict, "is_mixed", False)
        body = MIXED if mixed else HALF if verdict.is_half else FLOAT32
        state = dict(self.states[body])
        if self._hands_on_to_then(verdict):
            state["_call_flat"] = self.then
        self.is_over, self.kept = True, verdict
        tf_internals.set_concrete_function_state(concrete_function, state)  # one change: no call sees half of it
        self._copies.clear()
        self.on_verdict(concrete_function, verdict, unmixed)

    def _hands_on_to_then(self, verdict) -> bool:
        """Whether ``then`` runs the calls after the verdict: the floor watch after half, a re-check's check after
        either."""
        return self.then is not None and (verdict.is_half or self.cached is not None)

    def _hand_on(self, concrete_function) -> None:
        """Leaves the function's calls to what follows the trial: the floor watch after a half verdict, or none."""
        if self.kept is not None and self._hands_on_to_then(self.kept):
            tf_internals.override_call(concrete_function, self.then)
        else:
            tf_internals.drop_call_override(concrete_function)

    def _copy_running(self, concrete_function, body: str):
        """A copy of the function holding the state of ``body`` (made once a body)."""
        copy = self._copies.get(body)
        if copy is None:
            copy = self._copies[body] = tf_internals.function_with_state(concrete_function, self.states[body])
        return copy
