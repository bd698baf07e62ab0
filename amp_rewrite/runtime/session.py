"""Sessions that run the rewritten graph while the script keeps its own.

Each patched ``Session`` gets a :class:`ShadowRunner` on its first ``run``.
The runner has a :class:`~amp_rewrite.runtime.shadow_graph.ShadowGraph`
rewrite the session's graph (preserving the fetches and feeds seen so far
and every node without consumers) and import the result into a shadow
``tf.Graph`` (node names are preserved); it runs everything in the shadow's
``Session`` from then on, so variables live there. Guarantees:

- ``sess.graph`` is the script's graph; fetched values come back in the dtype
  the script built (half values are cast back on the host); any tensor the
  script could feed can be fed (the value is cast to the shadow's dtype).
- Ops the script adds later that the target's allow list converts (a model
  built, or grown, after the first ``run``) make the runner rewrite the whole
  graph again into a new shadow; every initialised variable is copied into
  it by name, other state (iterators, queues, tables) starts afresh.
- Other ops added later (summaries, a Saver) are imported as they are
  (float32), with a Cast back to the script's dtype wherever they read a
  tensor that became half.
- Loss-scale variables the script's initialiser did not cover (it ran before
  the optimizer existed, or initialised an explicit list) are initialised
  when a plan first needs them.
- Each (graph version, fetches, feeds) gets one :class:`RunPlan`, built once.
  A call whose fetches are tensors/ops (alone, or a list or tuple of them)
  and whose feeds are tensors of numpy values also gets a :class:`_FastCall`
  on its second run, keyed by the identity of those objects: later such calls
  skip TensorFlow's fetch mapping and feed parsing and run a callable made
  once in the shadow session.
- ``make_callable``, the raw callables Keras uses, and partial runs go to the
  shadow graph too.
- If the rewrite, or any run of the rewritten graph, fails, a warning names
  the reason and the session runs the script's float32 graph from then on,
  with the variable values the shadow held; with ``AMP_REWRITE_STRICT=1`` a
  :class:`RuntimeRewriteError` is raised. An error that the float32 graph
  raises too (a bad feed, say), or that is how scripts stop (the end of the
  input), reaches the script unchanged and keeps the rewrite.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from amp_rewrite import tf_internals
from amp_rewrite.errors import RuntimeRewriteError, first_line
from amp_rewrite.graph_facts import node_name
from amp_rewrite.pipeline import rewrite
from amp_rewrite.runtime import loss_scale, overflow_probe
from amp_rewrite.runtime.settings import RuntimeSettings
from amp_rewrite.runtime.shadow_graph import CAST_BACK_SUFFIX as CAST_BACK_SUFFIX  # re-exported
from amp_rewrite.runtime.shadow_graph import SHADOW_ATTR, ShadowGraph

logger = logging.getLogger(__name__)

RUNNER_ATTR = "_amp_rewrite_runner"
SESSION_ARGS_ATTR = "_amp_rewrite_session_args"
# Rewrites of one session's graph (the first included) before later ops run as added.
MAX_REWRITES = 8
# Errors a script meets in float32 as well: never blamed on the rewrite.
SCRIPT_ERRORS = ("OutOfRangeError", "CancelledError", "AbortedError", "UnavailableError",
                 "DeadlineExceededError")


@dataclass
class RunPlan:
    """How one kind of ``run`` call maps onto the shadow graph.

    Attributes:
        fetches: shadow elements to fetch: the script's, then loss-scale reports.
        fetch_dtypes: per script fetch, the numpy dtype to cast back to, or None.
        feeds: per fed tensor name, the shadow tensor and the dtype to feed it in (or None).
        reports: how many loss-scale report tensors follow the script's fetches.
        runs: how many times the general path ran it (a call is resolved from the second).
        has_probe: the last fetch is the overflow probe (``AMP_REWRITE_FIND_OVERFLOW=1``).
    """

    fetches: list
    fetch_dtypes: list
    feeds: dict
    reports: int = 0
    runs: int = 0
    has_probe: bool = False


@dataclass
class _FastCall:
    """One kind of plain ``run`` call, resolved once: what is left per call is the values.

    Attributes:
        keep: the script's fetch and feed objects; held, so that the ids in
            this call's key stay theirs.
        version: the script graph's version the plan was made for.
        plan: the call's :class:`RunPlan`.
        session: the shadow session the call was resolved in.
        run: that session's callable for the step: feed values in, fetched values out.
        feeds: per fed tensor, in feed order: (numpy dtype, dims or None).
        results: per script fetch: (index into the fetched values or -1 for an
            op, numpy dtype to cast back to or None).
        reports: indices of the loss-scale report values.
        kind: ``list`` or ``tuple`` for a sequence of fetches, None for one.
    """

    keep: tuple
    version: int
    plan: RunPlan
    session: Any
    run: object
    feeds: list
    results: list
    reports: list
    kind: type | None


# Fast calls kept per runner; the cache starts afresh beyond this (fetch or feed
# objects made anew on every call would otherwise grow it without end).
MAX_FAST_CALLS = 256


@dataclass
class _LossScaleLog:
    """What the loss-scale reports said so far, and which warnings they have had.

    Attributes:
        every: an INFO line every this many steps with reports (0: only on skips).
        steps: steps whose reports were recorded.
        skipped, scales: per report, the last skipped-step count and loss scale.
        at_floor: reports already warned about at scale 1.
    """

    every: int = 0
    steps: int = 0
    skipped: dict = field(default_factory=dict)
    scales: dict = field(default_factory=dict)
    at_floor: set = field(default_factory=set)

    def record(self, reports) -> str | None:
        """Logs what one step's (scale, skipped, good steps) reports say.

        Returns why half arithmetic cannot train this graph, the first time
        a step is skipped with the loss scale already at its floor of 1:
        then no scale helps, and the caller falls back to float32.
        """
        if not len(reports):
            return None
        self.steps += 1
        hopeless = None
        for index, (scale, skipped, _good) in enumerate(reports):
            before = self.skipped.get(index, 0.0)
            self.skipped[index] = skipped
            was_at_floor = self.scales.get(index, 2.0) <= 1.0
            self.scales[index] = scale
            if skipped > before and was_at_floor and index in self.at_floor:
                # Said once below; a NaN loss would otherwise warn on every step.
                logger.debug("amp-rewrite: step skipped at loss scale 1, %d steps skipped so far", skipped)
            elif skipped > before and was_at_floor:
                self.at_floor.add(index)
                hopeless = (f"a step was skipped with the loss scale at its floor of 1 ({skipped:g} skipped in "
                            "all): the gradients are not finite even unscaled, so no scale helps; the loss "
                            "itself is not finite, or an op overflows in half whatever the scale (keep such "
                            "an op float32 with TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_DENYLIST_ADD)")
            elif skipped > before:
                self.at_floor.discard(index)
                logger.warning("amp-rewrite: step skipped, gradients not finite; "
                               "loss scale now %g, %d steps skipped so far", scale, skipped)
            elif self.every and self.steps % self.every == 0:
                logger.info("amp-rewrite: loss scale %g, %d steps skipped so far", scale, skipped)
        return hopeless


class ShadowRunner:
    """Runs one session's steps on its :class:`ShadowGraph`; falls back to float32.

    It owns what running needs: a :class:`RunPlan` per kind of call and a
    :class:`_FastCall` per plain call, the fetches and feeds seen so far (the
    shadow keeps them), partial-run handles, the loss-scale log and the
    fallback state. It asks the shadow to be built, grown or replaced by a
    float32 copy; the shadow graph itself is :attr:`shadow`'s.
    """

    def __init__(self, session, settings: RuntimeSettings):
        self.graph = session.graph
        target, config = getattr(session, SESSION_ARGS_ATTR, ("", None))
        self.settings = settings
        self.lock = threading.RLock()
        self.shadow = ShadowGraph(self.graph, settings, target, config)
        self.plans: dict = {}
        self.fallback_reason: str | None = None
        self.has_run = False
        self.fetched: set[str] = set()
        self.fed: set[str] = set()
        self.partial_handles: dict = {}
        self._calls: dict = {}
        self._stopped_rewriting = False
        self._log = _LossScaleLog(every=settings.loss_scale.log_every)
        if settings.profile_after is not None:
            from amp_rewrite.runtime.profile import watch_session

            watch_session(self, settings.profile_after)

    @property
    def shadow_graph(self):
        return self.shadow.graph

    @property
    def shadow_session(self):
        return self.shadow.session

    @property
    def rewrites(self) -> int:
        return self.shadow.rewrites

    @property
    def result(self):
        """The last rewrite's :class:`~amp_rewrite.pipeline.RewriteResult`."""
        return self.shadow.result

    # --- running ---------------------------------------------------------

    def run(self, original_run, session, fetches, feed_dict=None, options=None, run_metadata=None):
        """``Session.run`` on the shadow graph; the float32 graph after a fallback."""
        if self.fallback_reason is not None and self.shadow.session is None:
            return original_run(session, fetches, feed_dict, options, run_metadata)
        if options is None and run_metadata is None:
            call = self._calls.get(_call_key(fetches, feed_dict))
            if call is not None and call.version == self.graph.version and \
                    not tf_internals.session_is_closed(call.session):
                feeds = _fast_feeds(call, feed_dict)
                if feeds is not None:
                    return self._run_fast(call, feeds, original_run, session, fetches, feed_dict)
        flat = _flat_fetch_names(self.graph, fetches)
        mapper: Any = None if flat is not None else _fetch_mapper(self.graph, fetches)
        fetch_names = flat if flat is not None else tuple(e.name for e in mapper.unique_fetches())
        feeds = _flatten_feeds(self.graph, feed_dict)
        feed_names = tuple(name for name, _ in feeds)
        key = (self.graph.version, fetch_names, feed_names)
        plan = self.plans.get(key) or self._plan(key, fetch_names, list(feed_names))
        if plan is None:
            return original_run(session, fetches, feed_dict, options, run_metadata)
        shadow_feeds = {plan.feeds[name][0]: _to_shadow(value, plan.feeds[name][1])
                        for name, value in feeds}
        try:
            values = self.shadow.session.run(plan.fetches, shadow_feeds, options, run_metadata)
        except Exception as exc:
            if self.fallback_reason is not None or type(exc).__name__ in SCRIPT_ERRORS:
                raise
            return self._run_failed(exc, original_run, session, fetches, feed_dict, options,
                                    run_metadata)
        self.has_run = True
        plan.runs += 1
        if flat is not None and plan.runs >= 2 and key[0] == self.graph.version:
            self._remember_call(fetches, feed_dict, key, plan)
        return self._results(plan, mapper, fetches, values)

    def _run_fast(self, call, feeds, original_run, session, fetches, feed_dict):
        try:
            # _do_call names the failing node in the error, as run() does.
            values = tf_internals.run_session_callable(call.session, call.run, *feeds)
        except Exception as exc:
            if self.fallback_reason is not None or type(exc).__name__ in SCRIPT_ERRORS:
                raise
            return self._run_failed(exc, original_run, session, fetches, feed_dict, None, None)
        self.has_run = True
        if call.reports:
            self._record_loss_scale([values[i] for i in call.reports])
        results = [None if i < 0 else values[i] if dtype is None
                   else np.asarray(values[i]).astype(dtype)
                   for i, dtype in call.results]
        if call.kind is None:
            return results[0]
        return results if call.kind is list else tuple(results)

    def _remember_call(self, fetches, feed_dict, key, plan) -> None:
        """Resolves a plain call once into a :class:`_FastCall`; leaves others to the general path."""
        call_key = _call_key(fetches, feed_dict)
        known = self._calls.get(call_key)
        if known is not None and known.version == key[0]:
            return  # resolved already: this call's values needed the general path
        if plan.has_probe:
            return  # the probe's line is logged by the general path
        feed_keys = tuple(feed_dict) if feed_dict else ()
        if set(key[1]) & set(key[2]) or not all(_is_plain_tensor(f, self.graph) for f in feed_keys):
            return  # a fetch that is fed comes back from the feed, which only run() knows
        shadow_session = self.shadow.session
        if not all(hasattr(shadow_session, name) for name in
                   ("_closed", "_do_call", "_make_callable_from_options")):
            return
        try:
            call = _resolve_call(shadow_session, fetches, feed_keys, key, plan)
        except Exception as exc:  # an unexpected TensorFlow: the general path still works
            logger.debug("no fast path for this run: %s", exc)
            return
        if len(self._calls) >= MAX_FAST_CALLS:
            self._calls.clear()
        self._calls[call_key] = call

    def _results(self, plan, mapper, fetches, values):
        n_script = len(plan.fetch_dtypes)
        if plan.has_probe and values[-1]:
            logger.warning("%s", values[-1].decode())
        self._record_loss_scale(values[n_script:n_script + plan.reports])
        results = [_to_script(v, d) for v, d in zip(values[:n_script], plan.fetch_dtypes)]
        if mapper is not None:
            return mapper.build_results(results)
        return _flat_results(fetches, results)

    def _record_loss_scale(self, reports) -> None:
        """Logs the step's loss-scale reports; if half cannot train, the next step runs float32, same values."""
        hopeless = self._log.record(reports)
        if hopeless is None or self.fallback_reason is not None:
            return
        if self.settings.is_strict:
            raise RuntimeRewriteError(hopeless)
        with self.lock:
            self._fall_back_keeping_values(hopeless)

    def _run_failed(self, exc, original_run, session, fetches, feed_dict, options,
                    run_metadata):
        """The rewritten graph failed to run: try the same call in float32.

        It runs in a float32 copy of the script's graph holding the shadow's
        variable values. If that fails too, the error is the script's (a bad
        feed, say): it is raised as it was and the rewrite stays. Otherwise the
        session runs the float32 copy from now on (strict mode raises instead
        and keeps the rewritten shadow as it was).
        """
        reason = f"the rewritten graph failed to run: {_error_line(exc)}"
        with self.lock:
            try:
                float32 = self._float32_copy()
            except Exception:
                raise exc from None
            saved = (self.shadow.state(), self.plans)
            self._use_shadow(float32)
            self.fallback_reason = reason  # a failure now is the script's, not the rewrite's
            try:
                result = self.run(original_run, session, fetches, feed_dict, options,
                                  run_metadata)
            except Exception:
                self._discard_float32(float32, saved)
                raise exc from None
            if self.settings.is_strict:
                self._discard_float32(float32, saved)
                raise RuntimeRewriteError(reason) from exc
            saved_session = saved[0][1]
            if saved_session is not None:
                saved_session.close()
            self._fall_back(reason, keep_shadow=True)
            return result

    def _float32_copy(self) -> tuple:
        return self.shadow.float32_copy(has_run=self.has_run)

    def _use_shadow(self, state, plans=None) -> None:
        """Makes a shadow :meth:`ShadowGraph.state` current, with its plans; fast calls start afresh."""
        self.shadow.use(*state)
        self._start_afresh(plans)

    def _start_afresh(self, plans=None) -> None:
        """Plans, fast calls and partial runs are made on one shadow: a new one starts without them."""
        self.plans = {} if plans is None else plans
        self._calls = {}
        self.partial_handles.clear()

    def _discard_float32(self, float32, saved) -> None:
        float32[1].close()
        self._use_shadow(*saved)
        self.fallback_reason = None

    def partial_run_setup(self, original_setup, session, fetches, feeds):
        """``Session.partial_run_setup`` on the shadow graph; remembers the handle's plan."""
        if self.fallback_reason is None or self.shadow.session is not None:
            fetch_names = _element_names(self.graph, fetches)
            feed_names = _element_names(self.graph, feeds or [])
            plan = self._plan((self.graph.version, fetch_names, feed_names), fetch_names, feed_names)
            if plan is not None:
                n_script = len(plan.fetch_dtypes)
                handle = self.shadow.session.partial_run_setup(plan.fetches[:n_script],
                                                               [t for t, _ in plan.feeds.values()])
                self.partial_handles[handle] = True
                return handle
        return original_setup(session, fetches, feeds)

    def partial_run(self, original_partial_run, session, handle, fetches, feed_dict=None):
        """``Session.partial_run`` of a handle made on the shadow graph."""
        if handle not in self.partial_handles:
            return original_partial_run(session, handle, fetches, feed_dict)
        mapper = _fetch_mapper(self.graph, fetches)
        fetch_names = tuple(e.name for e in mapper.unique_fetches())
        shadow_graph = self.shadow.graph
        shadow_fetches = [shadow_graph.as_graph_element(n) for n in fetch_names]
        changes = [_dtype_change(self.graph.as_graph_element(n), e)
                   for n, e in zip(fetch_names, shadow_fetches)]
        feeds = {}
        for name, value in _flatten_feeds(self.graph, feed_dict):
            shadow_tensor = shadow_graph.get_tensor_by_name(name)
            change = _dtype_change(self.graph.get_tensor_by_name(name), shadow_tensor)
            feeds[shadow_tensor] = _to_shadow(value, change)
        values = self.shadow.session.partial_run(handle, shadow_fetches, feeds)
        return mapper.build_results([_to_script(v, c) for v, c in zip(values, changes)])

    def close(self) -> None:
        with self.lock:
            self.shadow.close()

    # --- planning --------------------------------------------------------

    def _plan(self, key, fetch_names, feed_names):
        with self.lock:
            if self.fallback_reason is not None and self.shadow.session is None:
                return None
            self.fetched.update(node_name(n) for n in fetch_names)
            self.fed.update(node_name(n) for n in feed_names)
            try:
                if self.shadow.graph is None:
                    self._build()
                elif self.graph.version != self.shadow.version:
                    self._grow()
                plan = _make_plan(self.graph, self.shadow.graph, fetch_names, feed_names,
                                  is_probing=self.settings.is_finding_overflow)
                self.shadow.initialise_loss_scale_state()
            except Exception as exc:
                reason = f"rewrite failed: {_error_line(exc)}"
                if self.settings.is_strict:
                    raise RuntimeRewriteError(reason) from exc
                if self.fallback_reason is not None:
                    raise
                self._fall_back_keeping_values(reason)
                return self._plan(key, fetch_names, feed_names)
            self.plans[key] = plan
            return plan

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
        if self.fallback_reason is None and self.shadow.new_ops_convert():
            if self.shadow.rewrites < MAX_REWRITES:
                self._build()
                return
            if not self._stopped_rewriting:
                self._stopped_rewriting = True
                logger.info("amp-rewrite: the graph keeps growing after %d rewrites; "
                            "ops added from now on run in float32", MAX_REWRITES)
        self.shadow.extend()

    # --- falling back ----------------------------------------------------

    def _fall_back_keeping_values(self, reason: str) -> None:
        """Falls back to a float32 copy of the script's graph holding the shadow's values."""
        try:
            float32 = self._float32_copy()
        except Exception as exc:
            logger.debug("no float32 copy: %s", exc)
            self._fall_back(reason)
            return
        self.shadow.close()
        self._use_shadow(float32)
        self._fall_back(reason, keep_shadow=True)

    def _fall_back(self, reason: str, *, keep_shadow: bool = False) -> None:
        """Runs float32 from now on: the script's session, or (``keep_shadow``) a float32 shadow."""
        self.fallback_reason = reason
        logger.warning("amp-rewrite: running the float32 graph: %s", reason)
        if not keep_shadow:
            self.shadow.discard()
            self.plans.clear()
            self._calls = {}


# --- session patches -------------------------------------------------------

def runner_for(session, settings: RuntimeSettings) -> ShadowRunner | None:
    """The session's runner, created on first use; None for shadow sessions."""
    if getattr(session, SHADOW_ATTR, False):
        return None
    runner = getattr(session, RUNNER_ATTR, None)
    if runner is None:
        runner = ShadowRunner(session, settings)
        setattr(session, RUNNER_ATTR, runner)
    return runner


def patched_init(original, session, target="", graph=None, config=None, *args, **kwargs):
    setattr(session, SESSION_ARGS_ATTR, (target, config))
    return original(session, target, graph, config, *args, **kwargs)


def patched_run(original, settings, session, fetches, feed_dict=None, options=None,
                run_metadata=None):
    runner = runner_for(session, settings)
    if runner is None:
        return original(session, fetches, feed_dict, options, run_metadata)
    return runner.run(original, session, fetches, feed_dict, options, run_metadata)


def patched_make_callable(original, settings, session, fetches, feed_list=None,
                          accept_options=False):
    """A callable that goes through ``run``, so it runs the shadow graph too."""
    if getattr(session, SHADOW_ATTR, False):
        return original(session, fetches, feed_list, accept_options)
    feed_list = list(feed_list or [])

    def call(*args, options=None, run_metadata=None):
        if len(args) != len(feed_list):
            raise TypeError(f"expected {len(feed_list)} feeds, got {len(args)}")
        if not accept_options and (options is not None or run_metadata is not None):
            raise TypeError("this callable was made without accept_options=True")
        return session.run(fetches, dict(zip(feed_list, args)), options, run_metadata)

    return call


def patched_make_callable_from_options(original, settings, session, callable_options):
    """The raw-callable API (used by Keras in graph mode), routed through ``run``."""
    if getattr(session, SHADOW_ATTR, False):
        return original(session, callable_options)
    if callable_options.tensor_connection:
        logger.warning("amp-rewrite: a callable with tensor connections runs the float32 graph")
        return original(session, callable_options)
    fetches = list(callable_options.fetch)
    targets = list(callable_options.target)
    feeds = list(callable_options.feed)

    def call(*args, run_metadata=None):
        values = session.run(fetches + targets, dict(zip(feeds, args)), None, run_metadata)
        return values[:len(fetches)]

    return call


def patched_partial_run_setup(original, settings, session, fetches, feeds=None):
    runner = runner_for(session, settings)
    if runner is None:
        return original(session, fetches, feeds)
    return runner.partial_run_setup(original, session, fetches, feeds)


def patched_partial_run(original, settings, session, handle, fetches, feed_dict=None):
    runner = runner_for(session, settings)
    if runner is None:
        return original(session, handle, fetches, feed_dict)
    return runner.partial_run(original, session, handle, fetches, feed_dict)


def patched_close(original, session):
    runner = getattr(session, RUNNER_ATTR, None)
    if runner is not None:
        runner.close()
    return original(session)


# --- helpers ---------------------------------------------------------------

def _make_plan(graph, shadow, fetch_names, feed_names, *, is_probing: bool = False) -> RunPlan:
    """The :class:`RunPlan` of a call to ``graph`` with these fetches and feeds, on its ``shadow``.

    With ``is_probing``, a training step (one with loss-scale reports) also
    fetches the overflow probe of the half ops it runs.
    """
    fetches, fetch_dtypes = [], []
    for name in fetch_names:
        original = graph.as_graph_element(name)
        element = shadow.as_graph_element(name)
        fetches.append(element)
        fetch_dtypes.append(_dtype_change(original, element))
    feeds = {}
    for name in feed_names:
        element = shadow.get_tensor_by_name(name)
        feeds[name] = (element, _dtype_change(graph.get_tensor_by_name(name), element))
    reports = _reports_for(graph, fetch_names)
    fetches += [shadow.get_tensor_by_name(report.tensor.name) for report in reports]
    probe = overflow_probe.session_probe(shadow, _ancestors(fetches)) if is_probing and reports else None
    if probe is not None:
        fetches.append(probe)
    return RunPlan(fetches, fetch_dtypes, feeds, len(reports), has_probe=probe is not None)


def _reports_for(graph, fetch_names):
    """The loss-scale reports whose guarded update this run executes anyway."""
    reports = loss_scale.reports_of(graph)
    if not reports:
        return []
    wanted = {report.op.name: report for report in reports}
    found = []
    for op in _ancestors(graph.as_graph_element(n) for n in fetch_names):
        if op.name in wanted:
            found.append(wanted[op.name])
    return found


def _call_key(fetches, feed_dict) -> tuple:
    """The identity of a call's fetch elements and feed keys (not of a container the script may change)."""
    kind = type(fetches)
    if kind is list or kind is tuple:
        fetch_key: object = (kind, *map(id, fetches))
    else:
        fetch_key = id(fetches)
    return fetch_key, tuple(map(id, feed_dict)) if feed_dict else ()


def _resolve_call(shadow_session, fetches, feed_keys, key, plan) -> _FastCall:
    import tensorflow as tf
    from tensorflow.core.protobuf import config_pb2

    kind = type(fetches) if type(fetches) in (list, tuple) else None
    options = config_pb2.CallableOptions()
    tensor_index, op_names = {}, set()

    def index_of(element):
        if isinstance(element, tf.Operation):
            if element.name not in op_names:
                op_names.add(element.name)
                options.target.append(element.name)
            return -1
        if element.name not in tensor_index:
            tensor_index[element.name] = len(options.fetch)
            options.fetch.append(element.name)
        return tensor_index[element.name]

    n_script = len(plan.fetch_dtypes)
    results = [(index_of(element), None if change is None else change[0].as_numpy_dtype)
               for element, change in zip(plan.fetches[:n_script], plan.fetch_dtypes)]
    reports = [index_of(element) for element in plan.fetches[n_script:]]
    feeds = []
    for name in key[2]:
        shadow_tensor, _ = plan.feeds[name]
        if not shadow_tensor.graph.is_feedable(shadow_tensor):
            raise ValueError(f"{name} may not be fed")
        shape = shadow_tensor.shape
        dims = None if shape.rank is None else tuple(shape.as_list())
        feeds.append((shadow_tensor.dtype.as_numpy_dtype, dims))
        options.feed.append(name)
    run = tf_internals.make_callable_from_options(shadow_session, options)
    keep = (tuple(fetches) if kind else (fetches,), feed_keys)
    return _FastCall(keep, key[0], plan, shadow_session, run, feeds, results, reports, kind)


# Feed values the fast path converts as ``Session.run`` would; others (Python
# ints, whose range run() checks, tensor handles, nested lists) take the general path.
_FAST_FEED_TYPES = (np.ndarray, np.generic, float, bool)


def _fast_feeds(call, feed_dict):
    """The shadow feed values of a fast call, or None when a value needs ``Session.run``'s checks."""
    if not feed_dict:
        return ()
    feeds = []
    for (dtype, dims), value in zip(call.feeds, feed_dict.values()):
        if not isinstance(value, _FAST_FEED_TYPES):
            return None
        try:
            value = np.asarray(value, dtype)
        except (TypeError, ValueError, OverflowError):
            return None  # run() raises its own error
        if dims is not None and not _shape_fits(dims, value.shape):
            return None  # run() raises its own error
        feeds.append(value)
    return feeds


def _shape_fits(dims, shape) -> bool:
    if len(dims) != len(shape):
        return False
    for want, have in zip(dims, shape):
        if want is not None and want != have:
            return False
    return True


def _fetch_mapper(graph, fetches):
    with graph.as_default():
        return tf_internals.fetch_mapper(fetches)


def _element_names(graph, elements) -> tuple:
    """Names of every tensor or op a fetch or feed structure names."""
    return tuple(e.name for e in _fetch_mapper(graph, elements).unique_fetches())


def _flat_fetch_names(graph, fetches):
    """Names of a Tensor/Operation or a plain list/tuple of them from ``graph``, else None.

    The common case skips TensorFlow's general fetch mapper, which costs as much
    as the rest of the per-step work.
    """
    import tensorflow as tf

    kinds = (tf.Tensor, tf.Operation)
    if isinstance(fetches, kinds):
        items = (fetches,)
    elif type(fetches) in (list, tuple) and all(isinstance(f, kinds) for f in fetches):
        items = fetches
    else:
        return None
    if any(item.graph is not graph for item in items):
        return None  # let TensorFlow's mapper raise its error
    return tuple(item.name for item in items)


def _flat_results(fetches, values):
    if type(fetches) is list:
        return values
    if type(fetches) is tuple:
        return tuple(values)
    return values[0]


def _flatten_feeds(graph, feed_dict) -> list:
    """(tensor name, value) per fed tensor, expanding sparse and other composite keys."""
    if not feed_dict:
        return []
    out = []
    if all(_is_plain_tensor(feed, graph) for feed in feed_dict):
        return [(feed.name, value) for feed, value in feed_dict.items()]
    for feed, value in tf_internals.flatten_feed_dict(feed_dict).items():
        for subfeed, subvalue in _expand_feed(feed, value):
            tensor = graph.as_graph_element(subfeed, allow_tensor=True, allow_operation=False)
            out.append((tensor.name, subvalue))
    return out


def _is_plain_tensor(feed, graph) -> bool:
    import tensorflow as tf

    return isinstance(feed, tf.Tensor) and feed.graph is graph


def _expand_feed(feed, value):
    for feed_type, _, expand, _ in tf_internals.feed_expansions():
        if isinstance(feed, feed_type):
            return expand(feed, value)
    raise TypeError(f"{feed} in argument `feed_dict` has invalid type {type(feed).__name__!r}")


def _dtype_change(original, shadow):
    """(script dtype, shadow dtype) when a tensor became another type, else None."""
    if not hasattr(original, "dtype"):
        return None
    want, have = original.dtype.base_dtype, shadow.dtype.base_dtype
    if want == have:
        return None
    return (want, have)


def _to_script(value, change):
    """A fetched shadow value in the dtype the script built."""
    return value if change is None else np.asarray(value).astype(change[0].as_numpy_dtype)


def _to_shadow(value, change):
    """A fed value in the dtype of the shadow tensor it feeds."""
    return value if change is None else np.asarray(value, dtype=change[1].as_numpy_dtype)


def _ancestors(elements):
    """Every op the given tensors/ops depend on, through data and control edges."""
    stack = [getattr(e, "op", e) for e in elements]
    seen = {}
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen[op.name] = op
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return seen.values()


# Lines of TensorFlow's error messages that say nothing about the error itself.
_BOILERPLATE = ("Graph execution error", "Detected at node", "Node:", "defined at",
                "Original stack trace")


def _error_line(exc: BaseException) -> str:
    """``Type: message``, with the line of the message that says what went wrong, and at which node."""
    message = first_line(exc, if_empty=repr(exc), skipping=_BOILERPLATE)
    node = next((line.strip()[len("Node:"):].strip().strip("'") for line in str(exc).splitlines()
                 if line.strip().startswith("Node:")), None)
    line = message if node is None or node in message else f"{message} (node {node})"
    return f"{type(exc).__name__}: {line}"
