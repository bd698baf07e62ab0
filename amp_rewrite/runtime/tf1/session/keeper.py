"""Which shadow a patched session runs on, and the plans made on it.

A :class:`ShadowKeeper` has its session's
:class:`~amp_rewrite.runtime.tf1.shadow_graph.ShadowGraph` built, grown, or
replaced by a float32 copy, and keeps what is made on one shadow (plans,
fast calls, partial-run handles) in step with it; its
:class:`~amp_rewrite.runtime.tf1.session.fallback.FallbackState` says which graph
runs. Running a call is :class:`~amp_rewrite.runtime.tf1.session.runner.ShadowRunner`'s work.

With step trials on (``RuntimeSettings.is_timing_steps``), a new plan that
runs half ops gets a trial against its float32 copy
(:mod:`~amp_rewrite.runtime.tf1.session.session_trial`); the keeper holds the
trials running on the current shadow and makes the winner the key's plan.
Trials and verdicts are kept per step (fetches and feeds), not per graph
version: ops added to the graph never change what a step runs, so a script
adding a summary between two steps neither restarts a trial nor imports
another float32 copy. A step decided from the cache keeps its re-check
here; the runner counts the runs of its plan (``RunPlan.recheck_at``) and
:meth:`ShadowKeeper.start_recheck` makes it the step's trial when they
are due.
"""

from __future__ import annotations

import logging
import threading

from amp_rewrite import tf_internals
from amp_rewrite.errors import RuntimeRewriteError
from amp_rewrite.graph.facts import node_name
from amp_rewrite.pipeline import rewrite
from amp_rewrite.runtime.core import Runtime
from amp_rewrite.runtime.tf1.session.fallback import FallbackState, error_line
from amp_rewrite.runtime.tf1.session.fast_calls import FastCalls
from amp_rewrite.runtime.tf1.session.plans import PlanKey, RunPlan, StepId, make_plan
from amp_rewrite.runtime.tf1.session.session_trial import SessionTrial, SessionTrials, step_name, trials_of
from amp_rewrite.runtime.tf1.shadow_graph import ShadowGraph, ShadowState
from amp_rewrite.tune.trial import HALF, RECHECK_EVERY

# One logger for the whole package: its lines keep the name they have always had.
logger = logging.getLogger(__package__)

# Rewrites of one session's graph (the first included) before later ops run as added.
MAX_REWRITES = 8


class ShadowKeeper:
    """Keeps one session's shadow current: builds, grows and plans on it, falls back from it.

    Attributes:
        shadow: the :class:`ShadowGraph`.
        fallback: which graph runs (:class:`FallbackState`).
        plans: per :class:`PlanKey`, the call's :class:`RunPlan` on the current shadow.
        calls: the :class:`FastCalls` resolved on the current shadow.
        partial_handles: the partial-run handles made on the current shadow.
        fetched, fed: names of the nodes fetched and fed so far (the shadow keeps them).
        has_run: the rewritten graph ran a step (its variables hold trained values).
        trials: per :data:`StepId`, the step trial running on the current shadow.
        decided: per :data:`StepId`, the plan a verdict (or the lack of a trial) chose on the current shadow.
        rechecks: per :data:`StepId` decided from the cache, its next re-check (a trial not yet started).
        step_trials: the runtime's :class:`SessionTrials`; None when steps are not timed.
    """

    def __init__(self, graph, runtime: Runtime, target: str = "", config=None):
        self.graph = graph
        self.settings = runtime.settings
        self.records = runtime.objects
        self.lock = threading.RLock()
        self.shadow = ShadowGraph(graph, runtime, target, config)
        self.fallback = FallbackState()
        self.plans: dict[PlanKey, RunPlan] = {}
        self.calls = FastCalls()
        self.partial_handles: dict = {}
        self.fetched: set[str] = set()
        self.fed: set[str] = set()
        self.has_run = False
        self.trials: dict[StepId, SessionTrial] = {}
        self.decided: dict[StepId, RunPlan] = {}
        self.rechecks: dict[StepId, SessionTrial] = {}
        self.step_trials: SessionTrials | None = trials_of(runtime)
        self._stopped_rewriting = False

    # --- planning --------------------------------------------------------

    def new_plan(self, key: PlanKey, *, is_tried: bool = True) -> RunPlan | None:
        """A new :class:`RunPlan` for ``key``, the shadow built or grown first; None on the script's graph.

        With ``is_tried`` (not for partial runs) and step trials on, a plan
        running half ops gets a trial, or the plan a cached verdict chose.
        """
        with self.lock:
            if self.fallback.runs_script_graph:
                return None
            self.fetched.update(node_name(n) for n in key.fetches)
            self.fed.update(node_name(n) for n in key.feeds)
            try:
                if self.shadow.graph is None:
                    self._build()
                elif self.graph.version != self.shadow.version:
                    self._grow()
                plan = make_plan(self.graph, self.shadow.graph, key,
                                 reports=self.records.loss_scale_reports.get(self.graph, ()),
                                 is_probing=self.settings.is_finding_overflow)
                self.shadow.initialise_loss_scale_state()
            except Exception as exc:
                reason = f"rewrite failed: {error_line(exc)}"
                if self.settings.is_strict:
                    raise RuntimeRewriteError(reason) from exc
                if not self.fallback.is_rewritten:
                    raise
                self.fall_back_keeping_values(reason)
                return self.new_plan(key)
            if is_tried and self.step_trials is not None and self.fallback.is_rewritten:
                plan = self._tried(key, plan)
            self.plans[key] = plan
            return plan

    def _tried(self, key: PlanKey, plan: RunPlan) -> RunPlan:
        """The plan the step runs first: ``plan``, on trial where it gets one, or the plan the cache chose."""
        assert self.step_trials is not None
        step = key.step
        if step in self.trials:
            return plan  # the step's trial goes on at this graph version
        decided = self.decided.get(step)
        if decided is not None:
            return decided
        try:
            plan, trial = self.step_trials.plan(self.graph, self.shadow.graph, key, plan)
        except Exception as exc:
            reason = f"its float32 copy could not be made: {error_line(exc)}"
            if self.settings.is_strict:
                raise RuntimeRewriteError(f"no step trial: {reason}") from exc
            self.step_trials.say_untried(step_name(key), reason)
            trial = None
        if trial is not None and trial.cached is not None:  # decided from the cache: checked again later
            self._recheck_later(step, trial)
        elif trial is not None:
            self.trials[step] = trial
        else:
            self.decided[step] = plan
        return plan

    def _recheck_later(self, step, check: SessionTrial) -> None:
        self.rechecks[step] = check
        plan = self.decided[step] = check.chosen
        plan.recheck_at = plan.runs + RECHECK_EVERY

    def start_recheck(self, plan: RunPlan) -> None:
        """The step running ``plan`` is due its re-check: from its next run, its trial runs (on the general path)."""
        with self.lock:
            plan.recheck_at = None
            step = next((step for step, check in self.rechecks.items() if check.chosen is plan), None)
            if step is None or step in self.trials or self.step_trials is None:
                return
            check = self.rechecks.pop(step)
            if tf_internals.is_op_determinism_enabled():
                return
            try:
                self.step_trials.recheck_plans(self.graph, self.shadow.graph, check)
            except Exception as exc:
                if self.settings.is_strict:
                    raise RuntimeRewriteError(f"no re-check: {error_line(exc)}") from exc
                logger.debug("amp-rewrite: no re-check of session step %s: %s", check.name, error_line(exc))
                return
            self.trials[step] = check
            self.calls = FastCalls()  # a resolved call would bypass the trial

    def record_trial(self, key: PlanKey, trial: SessionTrial, body: str, seconds: float | None, *,
                     skipped: bool = False) -> None:
        """One run of a step on trial finished; once all ran, the winner is the key's plan for good.

        A run whose step the loss scale ``skipped`` applied no update and cost less than a step: it is not timed,
        and its variant runs once more (:meth:`~amp_rewrite.tune.trial.TrialSchedule.skip`). Each skip halves the
        scale; a skip at its floor falls back to float32, which starts a shadow without trials.
        """
        assert self.step_trials is not None
        step = key.step
        with self.lock:
            if self.trials.get(step) is not trial:
                return  # a new shadow started meanwhile
            if skipped:
                trial.trial.skip(body)
            else:
                trial.trial.record(body, seconds)
            if not trial.trial.is_done:
                return
            del self.trials[step]
            if trial.cached is not None:
                self._recheck_later(step, self.step_trials.settle_recheck(trial))
                self.plans[key] = self.decided[step]
                return
            verdict = trial.trial.verdict()
            # without a verdict (a variant was never timed) the rewritten plan stays
            plan = self.step_trials.settle(trial, verdict) if verdict is not None else trial.plans[HALF]
            self.plans[key] = self.decided[step] = plan

    def _build(self) -> None:
        """Has the whole graph rewritten into a new shadow, which starts without plans."""
        result, target_reason = self.shadow.build(self.fetched, self.fed, rewrite)
        self._start_afresh()
        logger.info("amp-rewrite: %s%s (%s)", "rewrote again: " if self.shadow.rewrites > 1 else "",
                    result.summary(), target_reason)

    def _grow(self) -> None:
        """Takes in the ops added since the last import: a new rewrite when they convert.

        A script that builds ops inside its training loop would pay a whole
        rewrite every step: after :data:`MAX_REWRITES`, new ops run as added.
        """
        if self.fallback.is_rewritten and self.shadow.new_ops_convert():
            if self.shadow.rewrites < MAX_REWRITES:
                self._build()
                return
            if not self._stopped_rewriting:
                self._stopped_rewriting = True
                logger.info("amp-rewrite: the graph keeps growing after %d rewrites; "
                            "ops added from now on run in float32", MAX_REWRITES)
        self.shadow.extend()

    # --- falling back ----------------------------------------------------

    def run_failed(self, exc: BaseException, retry):
        """The rewritten graph failed to run a call: ``retry()`` it in float32.

        It runs in a float32 copy of the script's graph holding the shadow's
        variable values. If that fails too, the error is the script's (a bad
        feed, say): it is raised as it was and the rewrite stays. Otherwise the
        session runs the float32 copy from now on (strict mode raises instead
        and keeps the rewritten shadow as it was).
        """
        reason = f"the rewritten graph failed to run: {error_line(exc)}"
        with self.lock:
            try:
                float32 = self._float32_copy()
            except Exception:
                raise exc from None
            saved, saved_plans = self.shadow.state(), self.plans
            saved_trials = (self.trials, self.decided, self.rechecks)
            self._use_shadow(float32)
            self.fallback.try_float32(reason)  # a failure now is the script's, not the rewrite's
            try:
                result = retry()
            except Exception:
                self._keep_rewrite(float32, saved, saved_plans)
                self.trials, self.decided, self.rechecks = saved_trials
                raise exc from None
            if self.settings.is_strict:
                self._keep_rewrite(float32, saved, saved_plans)
                raise RuntimeRewriteError(reason) from exc
            if saved.session is not None:
                saved.session.close()
            self.fallback.fall_back(reason, keeps_values=True)
            return result

    def fall_back_keeping_values(self, reason: str) -> None:
        """Falls back to a float32 copy of the script's graph holding the shadow's values."""
        with self.lock:
            try:
                float32 = self._float32_copy()
            except Exception as exc:
                logger.debug("no float32 copy: %s", exc)
                self.fallback.fall_back(reason, keeps_values=False)
                self.shadow.discard()
                self.plans.clear()
                self.trials, self.decided, self.rechecks = {}, {}, {}
                self.calls = FastCalls()
                return
            self.shadow.close()
            self._use_shadow(float32)
            self.fallback.fall_back(reason, keeps_values=True)

    def _float32_copy(self) -> ShadowState:
        return self.shadow.float32_copy(has_run=self.has_run)

    def _keep_rewrite(self, float32: ShadowState, saved: ShadowState, saved_plans) -> None:
        """Drops the float32 copy a failed retry ran in: the rewritten shadow is current again."""
        float32.session.close()
        self._use_shadow(saved, saved_plans)
        self.fallback.keep_rewrite()

    def _use_shadow(self, state: ShadowState, plans=None) -> None:
        """Makes a shadow current, with its plans; fast calls start afresh."""
        self.shadow.use(state)
        self._start_afresh(plans)

    def _start_afresh(self, plans=None) -> None:
        """Plans, fast calls and partial runs are made on one shadow: a new one starts without them."""
        self.plans = {} if plans is None else plans
        self.trials, self.decided, self.rechecks = {}, {}, {}
        self.calls = FastCalls()
        self.partial_handles.clear()

    def close(self) -> None:
        with self.lock:
            self.shadow.close()
