"""A rewritten ``tf.function`` keeps half only where its real calls ran faster in half here.

The schedule and the verdict are :mod:`amp_rewrite.tune.trial`'; this module
runs them on a ConcreteFunction. A function on trial gets a
:class:`FunctionTrial` as its ``_call_flat``, holding two states of it: the
half one (the rewritten body, or for a function calling rewritten bodies
its graph as traced) and the float32 one (the traced body; where the traced
graph calls rewritten bodies, rebuilt to call their traced ones, as
:func:`~amp_rewrite.runtime.tf2.concrete.reload_calling` does for a
fallback; under loss scaling, rebuilt without it, since the tape and the
optimizer built the scaling into the traced body:
:mod:`amp_rewrite.runtime.loss_scale.unscaled`). Each eager call runs the body the schedule names and is timed
(the device synchronised first, on a GPU); both are real steps of the
user's training on the same variables, so no work is wasted. Calls from
several threads take turns, and each runs in a copy of the function holding
its body's state, so the function itself changes only once, at the
verdict. After
:data:`~amp_rewrite.tune.trial.CALLS` calls the verdict keeps one state for
good and one INFO line says which and why (``amp-rewrite: tf.function
one_step_on_data stays float32: the step ran 449 ms in bfloat16 and 373 ms
in float32 on this CPU``).

The two best times go into the tuning cache under the step's key
(:func:`~amp_rewrite.tune.keys.step_key`: the traced graph's ops, the
input signature with the captured variables' shapes, and the rewrite's
settings), so the same function traced in a later run is decided before
its first call, with nothing measured; a verdict whose trial's halves
disagreed is not cached (:attr:`~amp_rewrite.tune.trial.StepVerdict.is_clear`).
A function decided from the cache gets a :class:`Recheck` as its
``_call_flat``: every :data:`~amp_rewrite.tune.trial.RECHECK_EVERY` calls it
times the two bodies again in a short trial, and a clear disagreement
switches the function and updates the cache. Under op determinism nothing
is timed: the cache or the lists decide.

In a multi-worker job, a step that runs collective ops takes each decision
with the job's other workers (:mod:`~amp_rewrite.runtime.tf2.job_rounds`),
and its verdict is neither read from nor written to this host's cache.

Which functions: each function the hook swapped, and each function whose
graph calls swapped bodies (Keras 3's train function, which runs the
rewritten one-step function inside its graph and is the one called
eagerly). A function that is never called eagerly (the one-step function
Keras 3 calls in a graph) never runs its trial; its caller's decides.

It composes with the other ``_call_flat`` wrappers: the first-call guard
checks the first call (a half one, the trial's first warm-up) and hands over
to the trial; the trial hands each call's bookkeeping to the loss-scale
floor watch under float16 (``then``), which takes its place when half
wins. A fallback to float32 during the trial (the floor watch's) ends it.
The trials know their hook's table of swaps, never the hook. A function
whose float32 body cannot be built runs its rewrite untried, and one INFO
line says why.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from amp_rewrite import tf_internals
from amp_rewrite.config import Config
from amp_rewrite.errors import NO_MESSAGE, first_line
from amp_rewrite.runtime.job import Job, first_collective
from amp_rewrite.runtime.loss_scale.unscaled import unscaled_function
from amp_rewrite.runtime.tf2.calls import CallStep, called_name, function_name
from amp_rewrite.runtime.tf2.job_rounds import JobRounds
from amp_rewrite.runtime.tf2.step_mixing import (
    MIXED,
    Mixing,
    Profiler,
    StepRegions,
    part_of,
    profile_body,
    state_calling,
)
from amp_rewrite.runtime.tf2.swap_records import LOGGER_NAME, SwapRecord, SwapTable
from amp_rewrite.tune import keys
from amp_rewrite.tune.cache import TuneCache
from amp_rewrite.tune.trial import (
    FLOAT32,
    HALF,
    MARGIN,
    RECHECK_EVERY,
    MixedVerdict,
    StepVerdict,
    Timer,
    TrialSchedule,
    confirmation,
    is_worth_mixing,
    mixed_verdict_of,
    recheck,
    rechecked,
    switch_line,
    verdict_of,
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
        if self.then is not None:
            self.then.after_call(cf, start)
        if self.is_on_trial(cf):  # a fallback during the call ends the trial
            self._record(cf, body, seconds)
        return outputs

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


class Recheck:
    """The ``_call_flat`` of a function decided from the cache: every :data:`~amp_rewrite.tune.trial.RECHECK_EVERY`
    eager calls, it starts a re-check (a :class:`FunctionTrial` checking the verdict, which hands back here).

    Attributes:
        function_ref: the function, held weakly.
        name, key: its name, for the lines, and its step key, for the cache.
        verdict: the verdict it runs by: the cache's, or a re-check's that switched it.
        start: sets the re-check's trial as the function's ``_call_flat``; False where none can be made.
        watch: the loss-scale floor watch, which runs the function's calls while it runs half; None: none.
        calls: eager calls since the verdict or the last re-check.
        states: the two bodies' states, once made (a later re-check uses them again).
        record: the swap record a float32 verdict took out of the hook's table (a half one puts it back).
        prepare: for a function the cache kept float32 without a rewrite, what rewrites it and sets the first
            re-check going as a trial would start (the hook's); None: the states are made from the function.
    """

    def __init__(self, concrete_function, name: str, key: str, verdict: StepVerdict,
                 start: Callable[[Any, Recheck], bool], states: dict[str, dict] | None = None):
        self.function_ref = weakref.ref(concrete_function)
        self.name = name
        self.key = key
        self.verdict = verdict
        self.start = start
        self.watch: CallStep | None = None
        self.calls = 0
        self.states = states
        self.record: SwapRecord | None = None
        self.prepare: Callable[[Any, Recheck], bool] | None = None

    def __call__(self, tensor_inputs, captured_inputs):
        import tensorflow as tf

        cf: Any = self.function_ref()
        if tf.executing_eagerly():
            self.calls += 1
            if self.calls >= RECHECK_EVERY:
                self.calls = 0
                if self.start(cf, self):
                    return tf_internals.call_override(cf)(tensor_inputs, captured_inputs)
            if self.is_watching():
                return self.watch(tensor_inputs, captured_inputs)  # type: ignore[misc]
        return tf_internals.call_concrete_function(cf, tensor_inputs, captured_inputs)

    # The first-call guard and a re-check's trial run their calls themselves and hand the watch its bookkeeping,
    # whichever body runs, as around a trial's calls.

    def before_call(self, concrete_function):
        return self.watch.before_call(concrete_function) if self.watch is not None else None

    def after_call(self, concrete_function, start) -> None:
        if self.watch is not None:
            self.watch.after_call(concrete_function, start)

    def is_watching(self) -> bool:
        """Whether the floor watch runs the calls (a half body's)."""
        return self.watch is not None and self.verdict.is_half


class FunctionTrials:
    """A tracing hook's step trials: which functions get one, their float32 state, the cache, the lines.

    Attributes:
        swapped: the hook's swapped functions (its own table).
        config: returns the rewrite configuration (read at first use: the target chosen, the device type).
        cache_dir: where the tuning cache lives (None: the user's cache directory).
        timer: runs one call of a body and times it (:data:`~amp_rewrite.tune.trial.Timer`; tests give their own).
        profiler: runs one call of a body profiled (:data:`~amp_rewrite.runtime.tf2.step_mixing.Profiler`;
            tests give their own; by default :meth:`profile_call`); None: no step is profiled, and pure
            verdicts are final.
        decisions: each function decided in this process, oldest first: its name, verdict (a
            :class:`~amp_rewrite.tune.trial.MixedVerdict` for a step that tried a mixed body), and the
            function (held weakly); a re-check that switched a function adds its new verdict.
        trials: the trials made, held weakly (a settled one goes with its function's reference to it).
        job: returns the multi-worker job this process is a worker of, or None
            (:class:`~amp_rewrite.runtime.job.Job`): a step running collective ops is decided with the
            job's other workers, and never from this host's cache.
        job_trials: how many trials of steps decided with the job were made (each one's number).
        rechecks: the :class:`Recheck` of each function decided from the cache, held weakly.
        is_measuring_again: the cache is not read: every step is tried, and its verdict replaces the cached one
            (``AMP_REWRITE_TUNE=again``).
    """

    def __init__(self, swapped: SwapTable, *, config: Callable[[], Config], cache_dir: str | None = None,
                 timer: Timer | None = None, job: Callable[[], Job | None] = lambda: None,
                 is_measuring_again: bool = False):
        self.swapped = swapped
        self.config = config
        self.job = job
        self.job_trials = 0
        self.cache_dir = cache_dir
        self.timer = timer or self.time_call
        self.profiler: Profiler | None = self.profile_call
        self.is_measuring_again = is_measuring_again
        self.decisions: list[tuple[str, StepVerdict | MixedVerdict, weakref.ref]] = []
        self.trials: weakref.WeakSet[FunctionTrial] = weakref.WeakSet()
        self.rechecks: weakref.WeakSet[Recheck] = weakref.WeakSet()
        self._cache: TuneCache | None = None
        self._settings: str | None = None
        self._said_lists: set[str] = set()
        # traced body (an AtomicFunction) → its step key: a large step's key costs a tenth of a second
        self._keys: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    @property
    def target(self) -> str:
        return self.config().target

    @property
    def device_type(self) -> str:
        return self.config().device_type or "CPU"

    @property
    def cache(self) -> TuneCache:
        """The tuning cache of this device and TensorFlow (made at first use)."""
        if self._cache is None:
            from amp_rewrite.tune.cache import cache_here

            self._cache = cache_here(self.cache_dir, self.device_type)
        return self._cache

    @property
    def settings(self) -> str:
        """How the runtime rewrites, for the step keys (:func:`~amp_rewrite.tune.keys.rewrite_settings`)."""
        if self._settings is None:
            self._settings = keys.rewrite_settings(self.config())
        return self._settings

    def is_deterministic(self) -> bool:
        """Whether op determinism is on: then no timing decides (the cache or the lists do)."""
        return tf_internals.is_op_determinism_enabled()

    def cached_verdict(self, concrete_function) -> StepVerdict | None:
        """The verdict an earlier trial of this just-traced function's step left, or None (always, when measuring
        again).

        Said in one line, unless that trial kept a mixed body
        (:meth:`was_mixed`): :meth:`keep_mixed` says that one.
        """
        if self.is_measuring_again:
            return None
        try:
            state = tf_internals.concrete_function_state(concrete_function)
            if self._job_of(state) is not None:
                return None  # this host's times are not the job's: its workers decide together, in the trial
            key = self._key(state)
        except Exception as exc:  # noqa: BLE001 - its trial makes the key again, where a failure falls back
            logger.debug("amp-rewrite: tf.function %s: no step key: %s", function_name(concrete_function), exc)
            return None
        verdict = self._cached(key)
        if verdict is not None and not self._was_mixed(key):
            self._say(function_name(concrete_function), verdict, concrete_function)
        return verdict

    def say_lists_decide(self, name: str) -> None:
        """The line of a function that would be tried, under op determinism: the op lists decide (once per name:
        Keras traces its one-step function more than once)."""
        if name in self._said_lists:
            return
        self._said_lists.add(name)
        logger.info("amp-rewrite: tf.function %s runs in %s as the op lists say: op determinism is on, so no timing "
                    "decides, and the tuning cache holds no verdict of this step", name, self.target)

    def was_mixed(self, concrete_function) -> bool:
        """Whether an earlier trial of this just-traced function's step kept a mixed body."""
        return self._was_mixed(self._key(tf_internals.concrete_function_state(concrete_function)))

    def keep_mixed(self, concrete_function, verdict: StepVerdict) -> None:
        """Runs a just-traced function (swapped, or calling swapped bodies) in the mixed body an earlier
        trial kept, rebuilt from the cached region times; where that fails, as ``verdict`` says."""
        name = function_name(concrete_function)
        record = self.swapped.record_of(concrete_function)
        traced = record.traced_state if record is not None else tf_internals.concrete_function_state(concrete_function)
        key = self._key(traced)
        try:
            regions = self._regions(record, traced)
            found = regions.mixed_from_cache(self.cache, key, is_half_step=verdict.is_half)
            if found is None:
                raise ValueError("the cache holds no times of these regions")
            choice, timing = found
            state = regions.mixed_state(concrete_function, traced, choice)
        except Exception as exc:  # noqa: BLE001 - the pure verdict stands
            logger.debug("amp-rewrite: tf.function %s: the mixed body was not rebuilt: %s", name, exc)
            if not verdict.is_half:
                self.swapped.restore(concrete_function)
                self.keep_float32(concrete_function)
            self._say(name, verdict, concrete_function)
            return
        call = tf_internals.call_override(concrete_function)
        tf_internals.set_concrete_function_state(concrete_function, state)
        if call is not None:
            tf_internals.override_call(concrete_function, call)
        mixed = mixed_verdict_of(timing, verdict, len(choice.half), len(choice.times))
        self._say(name, mixed, concrete_function)

    def keep_float32(self, concrete_function, verdict: StepVerdict | None = None,
                     prepare: Callable[[Any, Recheck], bool] | None = None) -> None:
        """Runs a just-traced function in float32 without a rewrite: as traced, its calls of swapped bodies
        sent to their traced ones.

        With the cached ``verdict`` that says so, a :class:`Recheck` follows
        (not under op determinism); its first re-check needs the half body,
        which ``prepare`` makes as a trial would, and sets that re-check going.
        """
        state = tf_internals.concrete_function_state(concrete_function)
        name = function_name(concrete_function)
        try:
            float32 = self._float32_state(concrete_function, state)
        except Exception as exc:  # noqa: BLE001 - as traced, it runs float32 still
            logger.info("amp-rewrite: tf.function %s runs as traced: its float32 body could not be built: %s",
                        name, first_line(exc, with_type=True, if_empty=NO_MESSAGE))
            return
        tf_internals.set_concrete_function_state(concrete_function, float32)
        if verdict is not None and prepare is not None and not self.is_deterministic():
            check = self.recheck_of(concrete_function, verdict, key_state=state, name=name)
            check.prepare = prepare
            tf_internals.override_call(concrete_function, check)

    def recheck_of(self, concrete_function, verdict: StepVerdict, *, key_state: dict | None = None,
                   name: str | None = None) -> Recheck:
        """The :class:`Recheck` of a just-traced function decided from the cache (``key_state`` and ``name``: its
        traced state and name, when it runs another state already)."""
        state = key_state if key_state is not None else tf_internals.concrete_function_state(concrete_function)
        check = Recheck(concrete_function, name or function_name(concrete_function), self._key(state), verdict,
                        self._start_recheck)
        self.rechecks.add(check)
        return check

    def is_rechecking(self) -> bool:
        """Whether a function decided from the cache gets a :class:`Recheck` (not under op determinism)."""
        return not self.is_deterministic()

    def forget(self) -> None:
        """Ends the trials still running (the hook is going): each function keeps the body it has, and no
        function is checked again."""
        for trial in list(self.trials):
            cf = trial.function_ref()
            with trial.lock:
                if cf is not None and trial.is_on_trial(cf):
                    trial.is_over = True
                    tf_internals.drop_call_override(cf)  # it held one body all through the trial
        self.trials.clear()
        for check in list(self.rechecks):
            cf = check.function_ref()
            if cf is not None and tf_internals.call_override(cf) is check:
                tf_internals.drop_call_override(cf)
        self.rechecks.clear()

    def for_swapped(self, concrete_function, record: SwapRecord, then: CallStep | None,
                    check: Recheck | None = None) -> CallStep | None:
        """The trial of a function just swapped, which follows its first-call guard; ``then`` after it.

        With ``check`` (a function the cache kept float32, swapped for its
        first re-check), the re-check's trial, ``then`` being that check.
        Where its float32 body cannot be built, ``then`` alone, and an INFO
        line says why.
        """
        traced = record.traced_state
        try:
            states = {HALF: tf_internals.concrete_function_state(concrete_function),
                      FLOAT32: self._float32_state(concrete_function, traced)}
        except Exception as exc:  # noqa: BLE001 - the rewrite runs, untried
            self._say_untried(record.report.name, exc)
            return then
        if check is not None:
            return self._recheck_trial(concrete_function, check, states)
        return self._trial(concrete_function, record.report.name, states, self._key(traced), then,
                           on_float32=self._forgetting_swap(states[FLOAT32]), record=record)

    def for_caller(self, concrete_function, then: CallStep | None = None, check: Recheck | None = None):
        """What runs a function whose graph calls swapped bodies after its first call: a trial (``check``'s
        re-check, where given), or ``then``."""
        state = tf_internals.concrete_function_state(concrete_function)
        if not self._swapped_callees(state):
            return then
        name = function_name(concrete_function)
        try:
            states = {HALF: state, FLOAT32: self._float32_state(concrete_function, state)}
        except Exception as exc:  # noqa: BLE001 - the rewritten bodies run, untried
            self._say_untried(name, exc)
            return then
        if check is not None:
            return self._recheck_trial(concrete_function, check, states)
        return self._trial(concrete_function, name, states, self._key(state), then, on_float32=lambda cf: None)

    def _forgetting_swap(self, float32_state: dict) -> Callable[[Any], None]:
        """After a float32 verdict: the swap's record goes, and the function keeps ``float32_state``.

        That state is the traced one where the step has no loss scaling; else the traced one without it.
        """
        def on_float32(concrete_function) -> None:
            self.swapped.restore(concrete_function)
            tf_internals.set_concrete_function_state(concrete_function, float32_state)

        return on_float32

    def is_caller(self, concrete_function) -> bool:
        """Whether the function's graph calls swapped bodies."""
        return bool(self._swapped_callees(tf_internals.concrete_function_state(concrete_function)))

    # --- the trial --------------------------------------------------------

    def _trial(self, concrete_function, name: str, states: dict, key: str, then, *, on_float32,
               record: SwapRecord | None = None) -> FunctionTrial:
        traced = record.traced_state if record is not None else states[HALF]
        job = self._job_of(traced)
        rounds = None
        if job is not None:
            rounds = JobRounds(job, self.job_trials, name)
            self.job_trials += 1

        def on_verdict(cf, verdict: StepVerdict | MixedVerdict, unmixed: str | None) -> None:
            if not verdict.is_half:
                on_float32(cf)
            if rounds is not None:
                pass  # a job's verdict is not this host's alone: neither read from nor written to its cache
            elif verdict.is_settled if isinstance(verdict, MixedVerdict) else verdict.is_clear:
                self._remember(key, verdict.pure if isinstance(verdict, MixedVerdict) else verdict, name)
            elif self.is_measuring_again:
                self.cache.discard(key)  # the verdict measured again is not clear: the old one is not kept either
                self.cache.save()
            self._say(name, verdict, cf, unmixed=unmixed)

        mixing = None
        if self.profiler is not None:
            mixing = Mixing(lambda: self._regions(record, traced), cache=lambda: self.cache,
                            key=key, profiler=lambda body, call: self.profiler(body, call),  # type: ignore[misc]
                            traced_state=traced)
        trial = FunctionTrial(concrete_function, name, states, on_verdict=on_verdict, then=then,
                              timer=lambda body, call: self.timer(body, call), mixing=mixing, rounds=rounds)
        self.trials.add(trial)
        return trial

    def _job_of(self, state: dict) -> Job | None:
        """The multi-worker job to decide the step of ``state`` with: the job, where the step runs collective ops.

        Every worker must run such a step's collectives in the same body; a
        step without any (one that only the chief runs, say) is each worker's own.
        """
        job = self.job()
        graph = tf_internals.graph_in_state(state)
        if job is None or graph is None:
            return None
        op_types = [op.type for op in graph.get_operations()]
        op_types += [node.op for function in tf_internals.graph_functions(graph).values()
                     for node in function.definition.node_def]
        return job if first_collective(op_types) is not None else None

    # --- re-checks ----------------------------------------------------------

    def _start_recheck(self, concrete_function, check: Recheck) -> bool:
        """Sets a re-check's trial as the function's ``_call_flat``; False where none starts (op determinism)."""
        if concrete_function is None or self.is_deterministic():
            return False
        if check.states is None and check.prepare is not None:
            return check.prepare(concrete_function, check)  # a float32 verdict: the half body is made first
        try:
            states = check.states or self._states_now(concrete_function)
        except Exception as exc:  # noqa: BLE001 - the cached verdict stands
            logger.debug("amp-rewrite: tf.function %s is not checked again: %s", check.name, exc)
            return False
        tf_internals.override_call(concrete_function, self._recheck_trial(concrete_function, check, states))
        return True

    def _states_now(self, concrete_function) -> dict[str, dict]:
        """The bodies of a function running half: as it runs now (rewritten, or calling rewritten bodies), and
        float32."""
        state = tf_internals.concrete_function_state(concrete_function)
        state.pop("_call_flat", None)
        record = self.swapped.record_of(concrete_function)
        return {HALF: state, FLOAT32: self._float32_state(concrete_function,
                                                          record.traced_state if record is not None else state)}

    def _recheck_trial(self, concrete_function, check: Recheck, states: dict[str, dict]) -> FunctionTrial:
        check.states = states
        trial = FunctionTrial(concrete_function, check.name, states,
                              on_verdict=lambda cf, verdict, _: self._rechecked(cf, check, verdict), then=check,
                              timer=lambda body, call: self.timer(body, call), cached=check.verdict)
        self.trials.add(trial)
        return trial

    def _rechecked(self, concrete_function, check: Recheck, verdict: StepVerdict) -> None:
        """After a re-check: the hook's table follows the body kept; a switch goes into the cache and one line."""
        record = self.swapped.record_of(concrete_function) or check.record
        if record is not None and verdict.is_half:
            self.swapped[concrete_function], check.record = record, None
        elif record is not None:
            self.swapped.pop(concrete_function, None)
            check.record = record
        if verdict is check.verdict:
            logger.debug("amp-rewrite: tf.function %s checked again after %d calls: the cached verdict stands",
                         check.name, RECHECK_EVERY)
            return
        self._remember(check.key, verdict, check.name)
        self.decisions.append((check.name, verdict, weakref.ref(concrete_function)))
        logger.info("amp-rewrite: tf.function %s %s", check.name,
                    switch_line(check.verdict, verdict, self.target, self.device_type, calls=RECHECK_EVERY))
        check.verdict = replace(verdict, is_cached=True, source=str(self.cache.path))

    def _regions(self, record: SwapRecord | None, traced: dict) -> StepRegions:
        """The half regions of the step: its own rewrite's (``record``), or those of the swapped bodies it calls."""
        if record is not None:
            parts = [part_of(record)]
        else:
            called = set(tf_internals.graph_functions(tf_internals.graph_in_state(traced)))
            parts = [part_of(callee_record, callee) for callee, callee_record in list(self.swapped.items())
                     if called_name(callee) in called]
        return StepRegions.of(parts, tf_internals.graph_in_state(traced), self.target)

    def _float32_state(self, concrete_function, traced_state: dict) -> dict:
        """The traced state without loss scaling, with the calls of swapped bodies sent to their traced ones
        (without loss scaling too) where it makes any (:mod:`amp_rewrite.runtime.loss_scale.unscaled`)."""
        replacements = {name: state_calling(callee, record.traced_state, {},
                                            transform=unscaled_function)["_inference_function"]
                        for name, (callee, record) in self._swapped_callees(traced_state).items()}
        return state_calling(concrete_function, traced_state, replacements, transform=unscaled_function)

    def _swapped_callees(self, state: dict) -> dict[str, tuple[Any, SwapRecord]]:
        """The swapped bodies the graph of ``state`` calls: the name its calls give → the callee and its record."""
        graph = tf_internals.graph_in_state(state)
        called = set(tf_internals.graph_functions(graph)) if graph is not None else set()
        return {called_name(cf): (cf, record) for cf, record in list(self.swapped.items())
                if called_name(cf) in called}

    def profile_call(self, body: str, call: Callable[[], Any]):
        """Runs ``call`` profiled: each executed node's seconds (its kernels' on a GPU), or why there are none."""
        return profile_body(body, call, self.device_type)

    def time_call(self, body: str, call: Callable[[], Any]) -> tuple[Any, float]:
        """Runs ``call`` and returns its outputs and its seconds, the device's queue included on a GPU."""
        began = time.perf_counter()
        outputs = call()
        if self.device_type == "GPU":
            import tensorflow as tf

            tf.test.experimental.sync_devices()
        return outputs, time.perf_counter() - began

    # --- the cache and the lines ------------------------------------------

    def _key(self, state: dict) -> str:
        """The step key of the function whose state is ``state`` (:func:`~amp_rewrite.tune.trial.step_key`)."""
        body = state["_inference_function"]
        key = self._keys.get(body)
        if key is None:
            graph = tf_internals.graph_in_state(state)
            functions = [f.definition for f in tf_internals.graph_functions(graph).values()]
            inputs = [_input_text(tensor) for tensor in graph.inputs]
            key = self._keys[body] = keys.step_key([*functions, body.definition], inputs, settings=self.settings)
        return key

    def _cached(self, key: str) -> StepVerdict | None:
        """The verdict of the times the cache holds for ``key`` (this process's trials put theirs there too)."""
        timing = self.cache.get(key)
        return verdict_of(timing, is_cached=True, source=str(self.cache.path)) if timing is not None else None

    def _was_mixed(self, key: str) -> bool:
        timing = self.cache.get(key + keys.MIXED_KEY)
        return timing is not None and timing.half <= (1.0 - MARGIN) * timing.float32

    def _remember(self, key: str, verdict: StepVerdict, name: str) -> None:
        self.cache.put(key, replace(verdict.timing(), what=f"tf.function {name}, {self.target}"))
        self.cache.save()

    def _say_untried(self, name: str, exc: Exception) -> None:
        logger.info("amp-rewrite: tf.function %s runs in %s, not tried: its float32 body could not be built: %s",
                    name, self.target, first_line(exc, with_type=True, if_empty=NO_MESSAGE))

    def _say(self, name: str, verdict: StepVerdict | MixedVerdict, concrete_function, *,
             unmixed: str | None = None) -> None:
        self.decisions.append((name, verdict, weakref.ref(concrete_function)))
        reason = verdict.reason(self.target, self.device_type)
        if unmixed:
            reason += f"; no mixed body: {unmixed}"
        if getattr(verdict, "is_cached", False) or getattr(getattr(verdict, "pure", None), "is_cached", False):
            if self.is_deterministic():
                reason += "; op determinism is on, so it is not checked again"
        if isinstance(verdict, MixedVerdict) and verdict.is_mixed:
            logger.info("amp-rewrite: tf.function %s runs %d of %d half regions in %s: %s", name,
                        verdict.half_regions, verdict.regions, self.target, reason)
        elif verdict.is_half:
            logger.info("amp-rewrite: tf.function %s runs in %s: %s", name, self.target, reason)
        else:
            logger.info("amp-rewrite: tf.function %s stays float32: %s", name, reason)


def _input_text(tensor) -> tuple[str, tuple]:
    """An input of a step's graph as its key takes it: dtype and shape; a captured variable's handle with the
    variable's dtype and shape (:func:`~amp_rewrite.tune.keys.resource_input`)."""
    shape = tuple(tensor.shape.as_list()) if tensor.shape.rank is not None else ()
    dtype = tensor.dtype.name
    if dtype == "resource":
        dtype = keys.resource_input(tf_internals.resource_handle_types(tensor))
    return dtype, shape
