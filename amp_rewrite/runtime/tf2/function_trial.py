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
user's training on the same variables, so no work is wasted. After
:data:`~amp_rewrite.tune.trial.CALLS` calls the verdict keeps one state for
good and one INFO line says which and why (``amp-rewrite: tf.function
one_step_on_data stays float32: the step ran 449 ms in bfloat16 and 373 ms
in float32 on this CPU``).

The two best times go into the tuning cache under the step's key
(:func:`~amp_rewrite.tune.trial.step_key`: the traced graph's ops and the
input signature), so the same function traced in a later run is decided
before its first call, with nothing measured.

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
import time
import weakref
from collections.abc import Callable
from typing import Any

from amp_rewrite import tf_internals
from amp_rewrite.config import Config
from amp_rewrite.errors import NO_MESSAGE, first_line
from amp_rewrite.runtime.loss_scale.unscaled import unscaled_function
from amp_rewrite.runtime.tf2.calls import CallStep, called_name, function_name
from amp_rewrite.runtime.tf2.step_mixing import MIXED, Mixing, Profiler, StepRegions, part_of, state_calling
from amp_rewrite.runtime.tf2.swap_records import LOGGER_NAME, SwapRecord, SwapTable
from amp_rewrite.tune import keys
from amp_rewrite.tune.cache import TuneCache
from amp_rewrite.tune.trial import (
    FLOAT32,
    HALF,
    MARGIN,
    MixedVerdict,
    StepVerdict,
    Timer,
    TrialSchedule,
    confirmation,
    is_worth_mixing,
    mixed_verdict_of,
    verdict_of,
)

logger = logging.getLogger(LOGGER_NAME)


class FunctionTrial:
    """The ``_call_flat`` of a function on trial: runs each call in the body the schedule names, and times it.

    Three phases, each on real calls: the trial of the two pure bodies; when
    the step has half regions to choose among, one profiled call of each
    (:mod:`~amp_rewrite.runtime.tf2.step_mixing`); when the profiles propose
    a mixed body, the trial confirming it against the better pure one.

    Attributes:
        function_ref: the ConcreteFunction on trial, held weakly.
        name: its name, for the INFO line.
        states: ``half``, ``float32`` (and once built, ``mixed``) → the function's state running that body.
        trial: the schedule, times and verdict (:class:`~amp_rewrite.tune.trial.TrialSchedule`).
        on_verdict: called once with the function and the verdict, after the state is kept.
        then: the floor watch that takes the trial's place when half wins; None: nothing.
        timer: runs one call of a body and says how long it took (:data:`~amp_rewrite.tune.trial.Timer`).
        mixing: what profiles the pure bodies and makes the mixed one; None: the pure verdict is final.
    """

    def __init__(self, concrete_function, name: str, states: dict[str, dict], *,
                 on_verdict: Callable[[Any, Any], None], then: CallStep | None, timer: Timer,
                 mixing: Mixing | None = None):
        self.function_ref = weakref.ref(concrete_function)
        self.name = name
        self.states = states
        self.trial = TrialSchedule()
        self.on_verdict = on_verdict
        self.then = then
        self.timer = timer
        self.mixing = mixing
        self.verdict: StepVerdict | None = None
        self.profiles: dict[str, dict[str, float]] = {}
        self.confirmation: TrialSchedule | None = None

    # The first-call guard runs the first call itself (a half one) and hands its bookkeeping here.

    def before_call(self, concrete_function):
        return self.then.before_call(concrete_function) if self.then is not None else None

    def after_call(self, concrete_function, start) -> None:
        if self.then is not None:
            self.then.after_call(concrete_function, start)
        if self.is_on_trial(concrete_function):
            self.trial.record(HALF, None)  # untimed: the guard's call, the first of the half body

    def __call__(self, tensor_inputs, captured_inputs):
        import tensorflow as tf

        cf: Any = self.function_ref()
        if not tf.executing_eagerly():
            return tf_internals.call_concrete_function(cf, tensor_inputs, captured_inputs)  # builds a call
        body = self.next_body()
        self._use(cf, body)
        start = self.before_call(cf)

        def call():
            return tf_internals.call_concrete_function(cf, tensor_inputs, captured_inputs)

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
            self.verdict = verdict
            if self.mixing is None or not is_worth_mixing(verdict) or not self.mixing.can_mix():
                self.settle(cf, verdict)
        elif self.confirmation is None:
            if seconds is None:  # no profile: the pure verdict stands
                self.settle(cf, self.verdict)
                return
            self.profiles[body] = seconds
            if len(self.profiles) == 2:
                self._propose(cf)
        else:
            self.confirmation.record(HALF if body == MIXED else FLOAT32, seconds)
            timing = self.confirmation.verdict()
            if timing is not None:
                assert self.mixing is not None
                self.settle(cf, self.mixing.verdict(self.verdict, timing.timing()))

    def _propose(self, cf) -> None:
        """The profiles' proposal: a mixed body to confirm, or the pure verdict for good."""
        assert self.verdict is not None and self.mixing is not None
        state = self.mixing.propose(cf, self.states, self.verdict, self.profiles[HALF], self.profiles[FLOAT32])
        if state is None:
            self.settle(cf, self.verdict)
            return
        self.states[MIXED] = state
        self.confirmation = confirmation()

    def _better_pure(self) -> str:
        return HALF if self.verdict is not None and self.verdict.is_half else FLOAT32

    def is_on_trial(self, concrete_function) -> bool:
        return tf_internals.call_override(concrete_function) is self

    def settle(self, concrete_function, verdict) -> None:
        """Keeps the body the verdict chose, with the floor watch after a half one; then ``on_verdict``."""
        mixed = getattr(verdict, "is_mixed", False)
        body = MIXED if mixed else HALF if verdict.is_half else FLOAT32
        tf_internals.set_concrete_function_state(concrete_function, self.states[body])
        if verdict.is_half and self.then is not None:
            tf_internals.override_call(concrete_function, self.then)
        self.on_verdict(concrete_function, verdict)

    def _use(self, concrete_function, body: str) -> None:
        tf_internals.set_concrete_function_state(concrete_function, {**self.states[body], "_call_flat": self})


class FunctionTrials:
    """A tracing hook's step trials: which functions get one, their float32 state, the cache, the lines.

    Attributes:
        swapped: the hook's swapped functions (its own table).
        config: returns the rewrite configuration (read at first use: the target chosen, the device type).
        cache_dir: where the tuning cache lives (None: the user's cache directory).
        timer: runs one call of a body and times it (:data:`~amp_rewrite.tune.trial.Timer`; tests give their own).
        profiler: runs one call of a body profiled (:data:`~amp_rewrite.runtime.tf2.step_mixing.Profiler`;
            tests give their own); None: no step is profiled, and pure verdicts are final.
        decisions: each function decided in this process, oldest first: its name, verdict (a
            :class:`~amp_rewrite.tune.trial.MixedVerdict` for a step that tried a mixed body), and the
            function (held weakly).
        trials: the trials made, held weakly (a settled one goes with its function's reference to it).
    """

    def __init__(self, swapped: SwapTable, *, config: Callable[[], Config], cache_dir: str | None = None,
                 timer: Timer | None = None):
        from amp_rewrite.runtime.tf2.step_mixing import profile_body

        self.swapped = swapped
        self.config = config
        self.cache_dir = cache_dir
        self.timer = timer or self.time_call
        self.profiler: Profiler | None = profile_body
        self.decisions: list[tuple[str, StepVerdict | MixedVerdict, weakref.ref]] = []
        self.trials: weakref.WeakSet[FunctionTrial] = weakref.WeakSet()
        self._cache: TuneCache | None = None
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

    def cached_verdict(self, concrete_function) -> StepVerdict | None:
        """The verdict an earlier trial of this just-traced function's step left, or None.

        Said in one line, unless that trial kept a mixed body
        (:meth:`was_mixed`): :meth:`keep_mixed` says that one.
        """
        key = self._key(tf_internals.concrete_function_state(concrete_function))
        verdict = self._cached(key)
        if verdict is not None and not self._was_mixed(key):
            self._say(function_name(concrete_function), verdict, concrete_function)
        return verdict

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

    def keep_float32(self, concrete_function) -> None:
        """Runs a just-traced function in float32 without a rewrite: as traced, its calls of swapped bodies
        sent to their traced ones."""
        state = tf_internals.concrete_function_state(concrete_function)
        try:
            float32 = self._float32_state(concrete_function, state)
        except Exception as exc:  # noqa: BLE001 - as traced, it runs float32 still
            logger.info("amp-rewrite: tf.function %s runs as traced: its float32 body could not be built: %s",
                        function_name(concrete_function), first_line(exc, with_type=True, if_empty=NO_MESSAGE))
            return
        tf_internals.set_concrete_function_state(concrete_function, float32)

    def forget(self) -> None:
        """Ends the trials still running (the hook is going): each function keeps the body it has."""
        for trial in list(self.trials):
            cf = trial.function_ref()
            if cf is not None and trial.is_on_trial(cf):
                tf_internals.set_concrete_function_state(cf, trial.states[HALF])
        self.trials.clear()

    def for_swapped(self, concrete_function, record: SwapRecord, then: CallStep | None) -> CallStep | None:
        """The trial of a function just swapped, which follows its first-call guard; ``then`` after it.

        Where its float32 body cannot be built, ``then`` alone, and an INFO line says why.
        """
        traced = record.traced_state
        try:
            states = {HALF: tf_internals.concrete_function_state(concrete_function),
                      FLOAT32: self._float32_state(concrete_function, traced)}
        except Exception as exc:  # noqa: BLE001 - the rewrite runs, untried
            self._say_untried(record.report.name, exc)
            return then
        return self._trial(concrete_function, record.report.name, states, self._key(traced), then,
                           on_float32=self._forgetting_swap(states[FLOAT32]), record=record)

    def for_caller(self, concrete_function, then: CallStep | None = None):
        """What runs a function whose graph calls swapped bodies after its first call: a trial, or ``then``."""
        state = tf_internals.concrete_function_state(concrete_function)
        if not self._swapped_callees(state):
            return then
        name = function_name(concrete_function)
        try:
            states = {HALF: state, FLOAT32: self._float32_state(concrete_function, state)}
        except Exception as exc:  # noqa: BLE001 - the rewritten bodies run, untried
            self._say_untried(name, exc)
            return then
        return self._trial(concrete_function, name, states, self._key(state), then, on_float32=lambda cf: None)

    def _forgetting_swap(self, float32_state: dict) -> Callable[[Any], None]:
        """After a float32 verdict: the swap's record goes, and the function keeps ``float32_state``.

        That state is the traced one where the step has no loss scaling; else the traced one without it.
        """
        def on_float32(concrete_function) -> None:
            self.swapped.restore(concrete_function)
            tf_internals.set_concrete_function_state(concrete_function, float32_state)

        return on_float32

    # --- the trial --------------------------------------------------------

    def _trial(self, concrete_function, name: str, states: dict, key: str, then, *, on_float32,
               record: SwapRecord | None = None) -> FunctionTrial:
        def on_verdict(cf, verdict: StepVerdict | MixedVerdict) -> None:
            if not verdict.is_half:
                on_float32(cf)
            self._remember(key, verdict.pure if isinstance(verdict, MixedVerdict) else verdict)
            self._say(name, verdict, cf)

        mixing = None
        if self.profiler is not None:
            traced = record.traced_state if record is not None else states[HALF]
            mixing = Mixing(lambda: self._regions(record, traced), cache=lambda: self.cache,
                            key=key, profiler=lambda body, call: self.profiler(body, call),  # type: ignore[misc]
                            traced_state=traced)
        trial = FunctionTrial(concrete_function, name, states, on_verdict=on_verdict, then=then,
                              timer=lambda body, call: self.timer(body, call), mixing=mixing)
        self.trials.add(trial)
        return trial

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
            inputs = [(t.dtype.name, tuple(t.shape.as_list()) if t.shape.rank is not None else ())
                      for t in graph.inputs]
            key = self._keys[body] = keys.step_key([*functions, body.definition], inputs)
        return key

    def _cached(self, key: str) -> StepVerdict | None:
        """The verdict of the times the cache holds for ``key`` (this process's trials put theirs there too)."""
        timing = self.cache.get(key)
        return verdict_of(timing, is_cached=True) if timing is not None else None

    def _was_mixed(self, key: str) -> bool:
        timing = self.cache.get(key + keys.MIXED_KEY)
        return timing is not None and timing.half <= (1.0 - MARGIN) * timing.float32

    def _remember(self, key: str, verdict: StepVerdict) -> None:
        self.cache.put(key, verdict.timing())
        self.cache.save()

    def _say_untried(self, name: str, exc: Exception) -> None:
        logger.info("amp-rewrite: tf.function %s runs in %s, not tried: its float32 body could not be built: %s",
                    name, self.target, first_line(exc, with_type=True, if_empty=NO_MESSAGE))

    def _say(self, name: str, verdict: StepVerdict | MixedVerdict, concrete_function) -> None:
        self.decisions.append((name, verdict, weakref.ref(concrete_function)))
        reason = verdict.reason(self.target, self.device_type)
        if isinstance(verdict, MixedVerdict) and verdict.is_mixed:
            logger.info("amp-rewrite: tf.function %s runs %d of %d half regions in %s: %s", name,
                        verdict.half_regions, verdict.regions, self.target, reason)
        elif verdict.is_half:
            logger.info("amp-rewrite: tf.function %s runs in %s: %s", name, self.target, reason)
        else:
            logger.info("amp-rewrite: tf.function %s stays float32: %s", name, reason)
