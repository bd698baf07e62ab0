"""Runs a patched session's calls on its shadow graph.

A :class:`ShadowRunner` maps each ``run`` (through a
:class:`~amp_rewrite.runtime.tf1.session.fast_calls.FastCall`, or a
:class:`~amp_rewrite.runtime.tf1.session.plans.RunPlan`) and each partial run
onto the current shadow, converts values between the two graphs' dtypes, and
logs the loss-scale reports. A step on trial
(:mod:`~amp_rewrite.runtime.tf1.session.session_trial`) runs the variant its
schedule names, timed, on the general path. Which shadow is current, and
what a failure changes, is its
:class:`~amp_rewrite.runtime.tf1.session.keeper.ShadowKeeper`'s.
"""

from __future__ import annotations

import logging
from operator import attrgetter
from typing import Any

from amp_rewrite import tf_internals
from amp_rewrite.errors import RuntimeRewriteError
from amp_rewrite.runtime.core import Runtime
from amp_rewrite.runtime.loss_scale.tf1_session_log import LossScaleLog
from amp_rewrite.runtime.tf1.session.keeper import ShadowKeeper
from amp_rewrite.runtime.tf1.session.plans import (
    PlanKey,
    dtype_change,
    element_names,
    fetch_mapper,
    flat_fetch_names,
    flat_results,
    flatten_feeds,
    to_script,
    to_shadow,
)

# One logger for the whole package: its lines keep the name they have always had.
logger = logging.getLogger(__package__)


class ShadowRunner:
    """Runs one session's steps on its shadow graph, as its :class:`ShadowKeeper` keeps it.

    It owns what a step's values pass through: dtype conversions, the
    loss-scale log, the overflow probe's line. The keeper owns the shadow,
    the plans and fast calls made on it, and the fallback state.
    """

    def __init__(self, graph, runtime: Runtime, target: str = "", config: Any = None):
        self.graph = graph
        self.settings = settings = runtime.settings
        self.keeper = ShadowKeeper(graph, runtime, target, config)
        self._log = LossScaleLog(every=settings.loss_scale.log_every)
        if settings.profile_after is not None:
            from amp_rewrite.runtime.profile import watch_session

            watch_session(self, settings.profile_after)

    # What tests, tools and a curious script read of the session's shadow.
    shadow_graph = property(attrgetter("keeper.shadow.graph"), doc="The current shadow ``tf.Graph``.")
    shadow_session = property(attrgetter("keeper.shadow.session"), doc="The ``Session`` that runs it.")
    rewrites = property(attrgetter("keeper.shadow.rewrites"), doc="How many times the graph was rewritten.")
    result = property(attrgetter("keeper.shadow.result"),
                      doc="The last rewrite's :class:`~amp_rewrite.pipeline.RewriteResult`.")
    plans = property(attrgetter("keeper.plans"), doc="Per :class:`PlanKey`, the plan made on the current shadow.")
    fallback_reason = property(attrgetter("keeper.fallback.reason"),
                               doc="Why the session left the rewritten graph; None while it runs it.")

    # --- running ---------------------------------------------------------

    def run(self, original_run, session, fetches, feed_dict=None, options=None, run_metadata=None):
        """``Session.run`` on the shadow graph; the float32 graph after a fallback."""
        keeper = self.keeper
        if keeper.fallback.runs_script_graph:
            return original_run(session, fetches, feed_dict, options, run_metadata)
        if options is None and run_metadata is None:
            call = keeper.calls.find(fetches, feed_dict, self.graph.version)
            if call is not None:
                feeds = call.feed_values(feed_dict)
                if feeds is not None:
                    return self._run_fast(call, feeds, original_run, session, fetches, feed_dict)
        flat = flat_fetch_names(self.graph, fetches)
        mapper: Any = None if flat is not None else fetch_mapper(self.graph, fetches)
        fetch_names = flat if flat is not None else tuple(e.name for e in mapper.unique_fetches())
        feeds = flatten_feeds(self.graph, feed_dict)
        key = PlanKey(self.graph.version, fetch_names, tuple(name for name, _ in feeds))
        plan = keeper.plans.get(key) or keeper.new_plan(key)
        if plan is None:
            return original_run(session, fetches, feed_dict, options, run_metadata)
        trial = keeper.trials.get(key.step) if keeper.trials else None
        if trial is not None:
            with trial.lock:  # one run of a step on trial at a time: each in the schedule's order, timed alone
                if keeper.trials.get(key.step) is trial:
                    return self._run_on_trial(trial, key, feeds, mapper, fetches, options, run_metadata,
                                              lambda: self.run(original_run, session, fetches, feed_dict, options,
                                                               run_metadata))
            # decided (or a new shadow made) while this run waited
            return self.run(original_run, session, fetches, feed_dict, options, run_metadata)
        shadow_feeds = {plan.feeds[name].tensor: to_shadow(value, plan.feeds[name].change)
                        for name, value in feeds}
        try:
            values = keeper.shadow.session.run(plan.fetches, shadow_feeds, options, run_metadata)
        except Exception as exc:
            if not keeper.fallback.blames_rewrite(exc):
                raise
            return keeper.run_failed(exc, lambda: self.run(original_run, session, fetches, feed_dict, options,
                                                           run_metadata))
        keeper.has_run = True
        plan.runs += 1
        if flat is not None and plan.runs >= 2 and key.version == self.graph.version:
            keeper.calls.remember(self.graph, keeper.shadow.session, fetches, feed_dict, key, plan)
        if plan.recheck_at is not None and plan.runs >= plan.recheck_at:
            keeper.start_recheck(plan)
        return self._results(plan, mapper, fetches, values)

    def _run_on_trial(self, trial, key, feeds, mapper, fetches, options, run_metadata, retry):
        """One run of a step on trial: the variant its schedule names, timed, then recorded."""
        keeper = self.keeper
        assert keeper.step_trials is not None
        body = trial.trial.next_body()
        plan = trial.plans[body]
        shadow_feeds = {plan.feeds[name].tensor: to_shadow(value, plan.feeds[name].change)
                        for name, value in feeds}
        shadow_session = keeper.shadow.session
        try:
            values, seconds = keeper.step_trials.timer(
                body, lambda: shadow_session.run(plan.fetches, shadow_feeds, options, run_metadata))
        except Exception as exc:
            if not keeper.fallback.blames_rewrite(exc):
                raise
            return keeper.run_failed(exc, retry)
        keeper.has_run = True
        n_script = len(plan.fetch_dtypes)
        skipped = self._log.skips(values[n_script:n_script + plan.reports])
        keeper.record_trial(key, trial, body, seconds, skipped=skipped)
        return self._results(plan, mapper, fetches, values)

    def _run_fast(self, call, feeds, original_run, session, fetches, feed_dict):
        try:
            # _do_call names the failing node in the error, as run() does.
            values = tf_internals.run_session_callable(call.session, call.run, *feeds)
        except Exception as exc:
            if not self.keeper.fallback.blames_rewrite(exc):
                raise
            return self.keeper.run_failed(exc, lambda: self.run(original_run, session, fetches, feed_dict))
        self.keeper.has_run = True
        plan = call.plan
        plan.runs += 1
        if plan.recheck_at is not None and plan.runs >= plan.recheck_at:
            self.keeper.start_recheck(plan)
        if call.reports:
            self._record_loss_scale([values[i] for i in call.reports])
        return call.script_results(values)

    def _results(self, plan, mapper, fetches, values):
        n_script = len(plan.fetch_dtypes)
        if plan.has_probe and values[-1]:
            logger.warning("%s", values[-1].decode())
        self._record_loss_scale(values[n_script:n_script + plan.reports])
        results = [to_script(v, d) for v, d in zip(values[:n_script], plan.fetch_dtypes)]
        if mapper is not None:
            return mapper.build_results(results)
        return flat_results(fetches, results)

    def _record_loss_scale(self, reports) -> None:
        """Logs the step's loss-scale reports; if half cannot train, the next step runs float32, same values."""
        hopeless = self._log.record(reports)
        if hopeless is None or not self.keeper.fallback.is_rewritten:
            return
        if self.settings.is_strict:
            raise RuntimeRewriteError(hopeless)
        self.keeper.fall_back_keeping_values(hopeless)

    # --- partial runs ----------------------------------------------------

    def partial_run_setup(self, original_setup, session, fetches, feeds):
        """``Session.partial_run_setup`` on the shadow graph; remembers the handle's plan."""
        keeper = self.keeper
        if not keeper.fallback.runs_script_graph:
            fetch_names = element_names(self.graph, fetches)
            feed_names = element_names(self.graph, feeds or [])
            plan = keeper.new_plan(PlanKey(self.graph.version, fetch_names, feed_names), is_tried=False)
            if plan is not None:
                n_script = len(plan.fetch_dtypes)
                handle = keeper.shadow.session.partial_run_setup(
                    plan.fetches[:n_script], [feed.tensor for feed in plan.feeds.values()])
                keeper.partial_handles[handle] = True
                return handle
        return original_setup(session, fetches, feeds)

    def partial_run(self, original_partial_run, session, handle, fetches, feed_dict=None):
        """``Session.partial_run`` of a handle made on the shadow graph."""
        if handle not in self.keeper.partial_handles:
            return original_partial_run(session, handle, fetches, feed_dict)
        mapper = fetch_mapper(self.graph, fetches)
        fetch_names = tuple(e.name for e in mapper.unique_fetches())
        shadow_graph = self.keeper.shadow.graph
        shadow_fetches = [shadow_graph.as_graph_element(n) for n in fetch_names]
        changes = [dtype_change(self.graph.as_graph_element(n), e)
                   for n, e in zip(fetch_names, shadow_fetches)]
        feeds = {}
        for name, value in flatten_feeds(self.graph, feed_dict):
            shadow_tensor = shadow_graph.get_tensor_by_name(name)
            change = dtype_change(self.graph.get_tensor_by_name(name), shadow_tensor)
            feeds[shadow_tensor] = to_shadow(value, change)
        values = self.keeper.shadow.session.partial_run(handle, shadow_fetches, feeds)
        return mapper.build_results([to_script(v, c) for v, c in zip(values, changes)])

    def close(self) -> None:
        self.keeper.close()
