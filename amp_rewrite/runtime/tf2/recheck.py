"""A function decided from the tuning cache is checked again, once in a while, during a long run.

A cached verdict was measured in another run, under that run's load. A load
that lasted a whole trial can have slowed one body more than the other, and
nothing in the later run would see it. So a function decided from the cache
gets a :class:`Recheck` as its ``_call_flat``: it counts the eager calls,
and every :data:`~amp_rewrite.tune.trial.RECHECK_EVERY` of them starts a
short trial of the two bodies (:func:`~amp_rewrite.tune.trial.recheck`'s
five calls, in a :class:`~amp_rewrite.runtime.tf2.function_trial.FunctionTrial`
whose ``cached`` is the verdict), which hands the calls back to it after.
Only a clear disagreement switches the function: the cache then holds the
new times, and one INFO line says so. :class:`Rechecks` makes them, starts
their trials and keeps the hook's table in step with the body kept. Under
op determinism nothing is timed, so nothing is checked again.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from amp_rewrite import tf_internals
from amp_rewrite.runtime.tf2.calls import CallStep, function_name
from amp_rewrite.runtime.tf2.function_trial import FunctionTrial
from amp_rewrite.runtime.tf2.function_verdicts import FunctionVerdicts
from amp_rewrite.runtime.tf2.swap_records import LOGGER_NAME, SwapRecord, SwapTable
from amp_rewrite.tune.trial import FLOAT32, HALF, RECHECK_EVERY, StepVerdict, Timer

logger = logging.getLogger(LOGGER_NAME)


class Recheck:
    """The ``_call_flat`` of a function decided from the cache: every :data:`~amp_rewrite.tune.trial.RECHECK_EVERY`
    eager calls, it starts a re-check (a :class:`~amp_rewrite.runtime.tf2.function_trial.FunctionTrial`
    checking the verdict, which hands back here).

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

    def skipped_since(self, start) -> bool:
        return self.watch is not None and self.watch.skipped_since(start)

    def is_watching(self) -> bool:
        """Whether the floor watch runs the calls (a half body's)."""
        return self.watch is not None and self.verdict.is_half


class Rechecks:
    """The re-checks of a hook's functions decided from the cache.

    Attributes:
        verdicts: the hook's trials' cache and lines.
        swapped: the hook's swapped functions (its own table), which follows the body a re-check keeps.
        float32_state: ``(function, traced_state)`` → the function's float32 state (the trials').
        timer: times one call of a body (the trials' :data:`~amp_rewrite.tune.trial.Timer`, read at each call).
        trials: where each re-check's trial goes (the trials' own set, which :meth:`forget` and theirs end).
        checks: each :class:`Recheck` made, held weakly.
    """

    def __init__(self, verdicts: FunctionVerdicts, swapped: SwapTable, *,
                 float32_state: Callable[[Any, dict], dict], timer: Callable[[], Timer],
                 trials: weakref.WeakSet[FunctionTrial]):
        self.verdicts = verdicts
        self.swapped = swapped
        self.float32_state = float32_state
        self.timer = timer
        self.trials = trials
        self.checks: weakref.WeakSet[Recheck] = weakref.WeakSet()

    def is_on(self) -> bool:
        """Whether a function decided from the cache gets a :class:`Recheck` (not under op determinism)."""
        return not self.verdicts.is_deterministic()

    def of(self, concrete_function, verdict: StepVerdict, *, key_state: dict | None = None,
           name: str | None = None) -> Recheck:
        """The :class:`Recheck` of a just-traced function decided from the cache (``key_state`` and ``name``: its
        traced state and name, when it runs another state already)."""
        state = key_state if key_state is not None else tf_internals.concrete_function_state(concrete_function)
        check = Recheck(concrete_function, name or function_name(concrete_function), self.verdicts.key(state),
                        verdict, self.start)
        self.checks.add(check)
        return check

    def start(self, concrete_function, check: Recheck) -> bool:
        """Sets a re-check's trial as the function's ``_call_flat``; False where none starts (op determinism)."""
        if concrete_function is None or self.verdicts.is_deterministic():
            return False
        if check.states is None and check.prepare is not None:
            return check.prepare(concrete_function, check)  # a float32 verdict: the half body is made first
        try:
            states = check.states or self._states_now(concrete_function)
        except Exception as exc:  # noqa: BLE001 - the cached verdict stands
            logger.debug("amp-rewrite: tf.function %s is not checked again: %s", check.name, exc)
            return False
        tf_internals.override_call(concrete_function, self.trial(concrete_function, check, states))
        return True

    def trial(self, concrete_function, check: Recheck, states: dict[str, dict]) -> FunctionTrial:
        """The trial of ``check``'s re-check, over the two bodies ``states``, handing the calls back to it after."""
        check.states = states
        trial = FunctionTrial(concrete_function, check.name, states,
                              on_verdict=lambda cf, verdict, _: self._rechecked(cf, check, verdict), then=check,
                              timer=lambda body, call: self.timer()(body, call), cached=check.verdict)
        self.trials.add(trial)
        return trial

    def forget(self) -> None:
        """No function is checked again (the hook is going): each keeps the body it has."""
        for check in list(self.checks):
            cf = check.function_ref()
            if cf is not None and tf_internals.call_override(cf) is check:
                tf_internals.drop_call_override(cf)
        self.checks.clear()

    def _states_now(self, concrete_function) -> dict[str, dict]:
        """The bodies of a function running half: as it runs now (rewritten, or calling rewritten bodies), and
        float32."""
        state = tf_internals.concrete_function_state(concrete_function)
        state.pop("_call_flat", None)
        record = self.swapped.record_of(concrete_function)
        return {HALF: state, FLOAT32: self.float32_state(concrete_function,
                                                         record.traced_state if record is not None else state)}

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
        self.verdicts.remember(check.key, verdict, check.name)
        self.verdicts.say_switch(check.name, check.verdict, verdict, concrete_function, calls=RECHECK_EVERY)
        check.verdict = replace(verdict, is_cached=True, source=str(self.verdicts.cache.path))
