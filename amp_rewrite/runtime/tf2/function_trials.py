"""A tracing hook's step trials: which ``tf.function`` steps are tried, and their float32 bodies.

Which functions: each function the hook swapped, and each function whose
graph calls swapped bodies (Keras 3's train function, which runs the
rewritten one-step function inside its graph and is the one called
eagerly). A function that is never called eagerly (the one-step function
Keras 3 calls in a graph) never runs its trial; its caller's decides.

Each gets a :class:`~amp_rewrite.runtime.tf2.function_trial.FunctionTrial`
over two states of it: the half one (the rewritten body, or for a function
calling rewritten bodies its graph as traced) and the float32 one (the
traced body; where the traced graph calls rewritten bodies, rebuilt to call
their traced ones, as :func:`~amp_rewrite.runtime.tf2.concrete.reload_calling`
does for a fallback; under loss scaling, rebuilt without it, since the tape
and the optimizer built the scaling into the traced body:
:mod:`amp_rewrite.runtime.loss_scale.unscaled`). A function whose float32
body cannot be built runs its rewrite untried, and one INFO line says why.
In a multi-worker job, a step that runs collective ops takes each decision
with the job's other workers (:mod:`~amp_rewrite.runtime.tf2.job_rounds`),
and its verdict is neither read from nor written to this host's cache.

What the trials decide goes into the tuning cache and one INFO line per
function (:mod:`~amp_rewrite.runtime.tf2.function_verdicts`); a function
decided from the cache is checked again once in a while
(:mod:`~amp_rewrite.runtime.tf2.recheck`). The trials know their hook's table
of swaps, never the hook.
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
from amp_rewrite.runtime.job import Job, first_collective
from amp_rewrite.runtime.loss_scale.unscaled import unscaled_function
from amp_rewrite.runtime.tf2.calls import CallStep, called_name, function_name
from amp_rewrite.runtime.tf2.function_trial import FunctionTrial
from amp_rewrite.runtime.tf2.function_verdicts import FunctionVerdicts
from amp_rewrite.runtime.tf2.job_rounds import JobRounds
from amp_rewrite.runtime.tf2.recheck import Recheck, Rechecks
from amp_rewrite.runtime.tf2.step_mixing import Mixing, Profiler, StepRegions, part_of, profile_body, state_calling
from amp_rewrite.runtime.tf2.swap_records import LOGGER_NAME, SwapRecord, SwapTable
from amp_rewrite.tune.trial import FLOAT32, HALF, MixedVerdict, StepVerdict, Timer, mixed_verdict_of

logger = logging.getLogger(LOGGER_NAME)


class FunctionTrials:
    """A tracing hook's step trials: which functions get one, and their float32 state.

    What the trials decide is kept by :attr:`verdicts` (the cache, the keys
    and the lines), and a function decided from the cache is checked again by
    :attr:`rechecks`.

    Attributes:
        swapped: the hook's swapped functions (its own table).
        config: returns the rewrite configuration (read at first use: the target chosen, the device type).
        timer: runs one call of a body and times it (:data:`~amp_rewrite.tune.trial.Timer`; tests give their own).
        profiler: runs one call of a body profiled (:data:`~amp_rewrite.runtime.tf2.step_mixing.Profiler`;
            tests give their own; by default :meth:`profile_call`); None: no step is profiled, and pure
            verdicts are final.
        verdicts: the cache, the keys and the lines
            (:class:`~amp_rewrite.runtime.tf2.function_verdicts.FunctionVerdicts`).
        rechecks: the re-checks of functions decided from the cache
            (:class:`~amp_rewrite.runtime.tf2.recheck.Rechecks`).
        trials: the trials made, held weakly (a settled one goes with its function's reference to it).
        job: returns the multi-worker job this process is a worker of, or None
            (:class:`~amp_rewrite.runtime.job.Job`): a step running collective ops is decided with the
            job's other workers, and never from this host's cache.
        job_trials: how many trials of steps decided with the job were made (each one's number).
    """

    def __init__(self, swapped: SwapTable, *, config: Callable[[], Config], cache_dir: str | None = None,
                 timer: Timer | None = None, job: Callable[[], Job | None] = lambda: None,
                 is_measuring_again: bool = False):
        self.swapped = swapped
        self.config = config
        self.job = job
        self.job_trials = 0
        self.timer = timer or self.time_call
        self.profiler: Profiler | None = self.profile_call
        self.verdicts = FunctionVerdicts(config=config, cache_dir=cache_dir, is_measuring_again=is_measuring_again)
        self.trials: weakref.WeakSet[FunctionTrial] = weakref.WeakSet()
        self.rechecks = Rechecks(self.verdicts, swapped, float32_state=self._float32_state,
                                 timer=lambda: self.timer, trials=self.trials)

    @property
    def target(self) -> str:
        return self.verdicts.target

    @property
    def device_type(self) -> str:
        return self.verdicts.device_type

    @property
    def decisions(self) -> list[tuple[str, StepVerdict | MixedVerdict, weakref.ref]]:
        """Each function decided in this process, oldest first (:attr:`FunctionVerdicts.decisions
        <amp_rewrite.runtime.tf2.function_verdicts.FunctionVerdicts.decisions>`)."""
        return self.verdicts.decisions

    def is_deterministic(self) -> bool:
        """Whether op determinism is on: then no timing decides (the cache or the lists do)."""
        return self.verdicts.is_deterministic()

    def say_lists_decide(self, name: str) -> None:
        """The line of a function that would be tried, under op determinism: the op lists decide."""
        self.verdicts.say_lists_decide(name)

    def recheck_of(self, concrete_function, verdict: StepVerdict) -> Recheck:
        """The :class:`~amp_rewrite.runtime.tf2.recheck.Recheck` of a just-traced function decided from the cache."""
        return self.rechecks.of(concrete_function, verdict)

    def is_rechecking(self) -> bool:
        """Whether a function decided from the cache is checked again (not under op determinism)."""
        return self.rechecks.is_on()

    def cached_verdict(self, concrete_function) -> StepVerdict | None:
        """The verdict an earlier trial of this just-traced function's step left, or None (always, when measuring
        again).

        Said in one line, unless that trial kept a mixed body
        (:meth:`was_mixed`): :meth:`keep_mixed` says that one.
        """
        if self.verdicts.is_measuring_again:
            return None
        try:
            state = tf_internals.concrete_function_state(concrete_function)
            if self._job_of(state) is not None:
                return None  # this host's times are not the job's: its workers decide together, in the trial
            key = self.verdicts.key(state)
        except Exception as exc:  # noqa: BLE001 - its trial makes the key again, where a failure falls back
            logger.debug("amp-rewrite: tf.function %s: no step key: %s", function_name(concrete_function), exc)
            return None
        verdict = self.verdicts.cached(key)
        if verdict is not None and not self.verdicts.was_mixed(key):
            self.verdicts.say(function_name(concrete_function), verdict, concrete_function)
        return verdict

    def was_mixed(self, concrete_function) -> bool:
        """Whether an earlier trial of this just-traced function's step kept a mixed body."""
        return self.verdicts.was_mixed(self.verdicts.key(tf_internals.concrete_function_state(concrete_function)))

    def keep_mixed(self, concrete_function, verdict: StepVerdict) -> None:
        """Runs a just-traced function (swapped, or calling swapped bodies) in the mixed body an earlier
        trial kept, rebuilt from the cached region times; where that fails, as ``verdict`` says."""
        name = function_name(concrete_function)
        record = self.swapped.record_of(concrete_function)
        traced = record.traced_state if record is not None else tf_internals.concrete_function_state(concrete_function)
        key = self.verdicts.key(traced)
        try:
            regions = self._regions(record, traced)
            found = regions.mixed_from_cache(self.verdicts.cache, key, is_half_step=verdict.is_half)
            if found is None:
                raise ValueError("the cache holds no times of these regions")
            choice, timing = found
            state = regions.mixed_state(concrete_function, traced, choice)
        except Exception as exc:  # noqa: BLE001 - the pure verdict stands
            logger.debug("amp-rewrite: tf.function %s: the mixed body was not rebuilt: %s", name, exc)
            if not verdict.is_half:
                self.swapped.restore(concrete_function)
                self.keep_float32(concrete_function)
            self.verdicts.say(name, verdict, concrete_function)
            return
        call = tf_internals.call_override(concrete_function)
        tf_internals.set_concrete_function_state(concrete_function, state)
        if call is not None:
            tf_internals.override_call(concrete_function, call)
        mixed = mixed_verdict_of(timing, verdict, len(choice.half), len(choice.times))
        self.verdicts.say(name, mixed, concrete_function)

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
        if verdict is not None and prepare is not None and not self.verdicts.is_deterministic():
            check = self.rechecks.of(concrete_function, verdict, key_state=state, name=name)
            check.prepare = prepare
            tf_internals.override_call(concrete_function, check)

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
        self.rechecks.forget()

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
            self.verdicts.say_untried(record.report.name, exc)
            return then
        if check is not None:
            return self.rechecks.trial(concrete_function, check, states)
        return self._trial(concrete_function, record.report.name, states, self.verdicts.key(traced), then,
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
            self.verdicts.say_untried(name, exc)
            return then
        if check is not None:
            return self.rechecks.trial(concrete_function, check, states)
        return self._trial(concrete_function, name, states, self.verdicts.key(state), then, on_float32=lambda cf: None)

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
            if rounds is None:  # a job's verdict is not this host's alone: neither read from nor written to its cache
                self.verdicts.keep(key, verdict, name)
            self.verdicts.say(name, verdict, cf, unmixed=unmixed)

        mixing = None
        if self.profiler is not None:
            mixing = Mixing(lambda: self._regions(record, traced), cache=lambda: self.verdicts.cache,
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
