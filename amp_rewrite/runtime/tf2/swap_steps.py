"""Swapping a rewritten body into one traced ConcreteFunction, as named steps.

A tracing hook (:class:`~amp_rewrite.runtime.tf2.tracing.TracingHook`) hands
each function it rewrites to :func:`swap_in`, which runs the steps in order,
as :func:`amp_rewrite.pipeline.paint` runs its rules. Each step is
``step(tools, swap)``: the hook's :class:`SwapTools`, read only, then the
:class:`Swap` it fills in, the one value it changes, with the traced function
when its name says so. :data:`REWRITE_STEPS` run first:

1. ``check_loss_scaling``: a warning if gradients the function scales reach no guarded apply;
2. ``find_guarded_apply``: whether the function applies an optimizer through the guard;
3. ``rewrite_body``: the rewritten function, loaded beside the traced one.

When the rewrite changed nothing, there is nothing to swap in and the
function runs as traced. Otherwise :data:`SWAP_STEPS` follow:

4. ``keep_traced_state``: the traced state, and the state of the rewritten function to run;
5. ``make_record``: the report and the record of the swap;
6. ``swap_state``: the traced function runs the rewritten body from its next call;
7. ``guard_first_call``: its first eager call checks that the rewritten body runs;
8. ``watch_profile``: with ``AMP_REWRITE_PROFILE``, one later call is profiled;
9. ``log_swap``: one INFO line with the numbers (and one more for an inference-only swap).

:func:`swap_in` returns the record; the hook adds it to its tables, where
the call shows it. A step that fails raises to the hook, which leaves the
function as traced with a warning (or raises, in strict mode).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from amp_rewrite import tf_internals
from amp_rewrite.config import Config
from amp_rewrite.runtime.tf2 import concrete
from amp_rewrite.runtime.tf2.concrete import RewrittenFunction
from amp_rewrite.runtime.tf2.swap_records import LOGGER_NAME, FunctionReport, SwapRecord

if TYPE_CHECKING:
    from amp_rewrite.runtime.loss_scale.tf2_state import TF2LossScaling
    from amp_rewrite.runtime.profile import FunctionProfiles
    from amp_rewrite.runtime.tf2.fallback import FloorFallback
    from amp_rewrite.runtime.tf2.first_call_guard import FirstCallGuards
    from amp_rewrite.runtime.tf2.function_trials import FunctionTrials

logger = logging.getLogger(LOGGER_NAME)


@dataclass(frozen=True)
class SwapTools:
    """What the steps use of the hook that runs them; they change none of it.

    Attributes:
        loss_scaling: the runtime's TF2 loss scaling; None: nothing is checked, probed or watched.
        fallback: the hook's fallback to float32 (its floor watch, its guarded applies).
        profiles: with ``AMP_REWRITE_PROFILE``, what profiles a later call; else None.
        first_calls: the hook's first-call guards, which make the guard of a swapped function.
        trials: the hook's step trials (:mod:`~amp_rewrite.runtime.tf2.function_trials`); None: no step is timed.
    """

    loss_scaling: TF2LossScaling | None
    fallback: FloorFallback
    profiles: FunctionProfiles | None
    first_calls: FirstCallGuards
    trials: FunctionTrials | None = None


@dataclass
class Swap:
    """One traced function on its way to running rewritten: given by the hook, then filled in by the steps.

    Attributes:
        concrete_function: the traced ConcreteFunction.
        name: its name, for reports and log lines.
        config: the rewrite's configuration.
        is_explicit: traced by :func:`amp_rewrite.function`, not by the runtime.
        calls_guarded: its graph calls the rewritten body of a function holding a guarded apply.
        is_timed: its first eager calls alternate the rewritten and the traced body, and the faster stays.
        check: decided from the cache, its :class:`~amp_rewrite.runtime.tf2.recheck.Recheck`, which runs
            its calls after the first (and with ``is_timed``, its first re-check is the trial); None: none.
        start: when the swap began (``time.perf_counter``).
        is_guarded: whether the loss-scale floor is watched after its first call.
        rewritten: the rewritten function (``rewrite_body``).
        traced_state: the traced function's state (``keep_traced_state``).
        new_state: the rewritten function's state to run (``keep_traced_state``).
        record: the swap's record (``make_record``).
    """

    concrete_function: Any
    name: str
    config: Config
    is_explicit: bool
    calls_guarded: bool
    is_timed: bool = False
    check: Any = None
    start: float = field(default_factory=time.perf_counter)
    is_guarded: bool = False
    rewritten: RewrittenFunction = field(init=False, repr=False)
    traced_state: dict = field(init=False, repr=False)
    new_state: dict = field(init=False, repr=False)
    record: SwapRecord = field(init=False, repr=False)


def swap_in(tools: SwapTools, swap: Swap) -> SwapRecord | None:
    """Runs the steps on ``swap``; returns its record, or None when the rewrite changed nothing."""
    for step in REWRITE_STEPS:
        step(tools, swap)
    if swap.rewritten.concrete_function is None:
        logger.debug("tf.function %s: nothing to run in %s", swap.name, swap.config.target)
        return None
    for step in SWAP_STEPS:
        step(tools, swap)
    return swap.record


# --- the steps, in the order they run ----------------------------------------


def check_loss_scaling(tools: SwapTools, swap: Swap) -> None:
    """Warns (once) when gradients the function scales reach no guarded apply: their overflows are not skipped."""
    if tools.loss_scaling is not None:
        tools.loss_scaling.check_traced(swap.concrete_function.graph, swap.name)


def find_guarded_apply(tools: SwapTools, swap: Swap) -> None:
    """Sets ``is_guarded``: the function applies a guarded optimizer, itself or through a function it calls.

    XLA-compiled functions record no skip cause, so a skip there says nothing about the floor.
    """
    cf = swap.concrete_function
    swap.is_guarded = not tf_internals.is_xla_compiled(cf.function_def) and (
        swap.calls_guarded or tools.fallback.has_guarded_apply(cf.graph))


def rewrite_body(tools: SwapTools, swap: Swap) -> None:
    """Sets ``rewritten``: the function rewritten and loaded (the traced one is not changed)."""
    extra: dict[str, Any] = {}
    if tools.loss_scaling is not None and tools.loss_scaling.is_finding_overflow:
        extra["is_probing_overflow"] = True
    swap.rewritten = concrete.rewrite_concrete(swap.concrete_function, swap.config, **extra)


def keep_traced_state(tools: SwapTools, swap: Swap) -> None:
    """Sets ``traced_state`` (taking over its graph collection) and ``new_state``, the rewritten state to run.

    With custom gradients, calls under a tape, and calls from another
    function's trace, keep the traced (float32) forward and backward functions.
    """
    swap.traced_state = tf_internals.concrete_function_state(swap.concrete_function)
    tf_internals.take_over_graph_collection(swap.traced_state)
    rewritten = swap.rewritten
    swap.new_state = tf_internals.runnable_state(tf_internals.concrete_function_state(rewritten.concrete_function),
                                                 inference_only=rewritten.has_custom_gradients)


def make_record(tools: SwapTools, swap: Swap) -> None:
    """Sets ``record``: the report (the time so far is the rewrite's and the reload's) and the states."""
    rewritten = swap.rewritten
    report = FunctionReport(name=swap.name, summary=_summary(rewritten.result),
                            nodes_total=rewritten.result.nodes_total,
                            seconds=time.perf_counter() - swap.start,
                            rewrite_seconds=rewritten.result.seconds, is_explicit=swap.is_explicit,
                            is_inference_only=rewritten.has_custom_gradients)
    swap.record = SwapRecord(report, swap.traced_state, rewritten)


def swap_state(tools: SwapTools, swap: Swap) -> None:
    """Changes the traced function: from its next call it runs the rewritten body, with its own signature."""
    tf_internals.set_concrete_function_state(swap.concrete_function, {**swap.traced_state, **swap.new_state})


def guard_first_call(tools: SwapTools, swap: Swap) -> None:
    """Changes the traced function's ``_call_flat``: its first eager call checks the rewritten body.

    The guard (:mod:`~amp_rewrite.runtime.tf2.first_call_guard`) then steps
    aside; a guarded function gets the loss-scale floor watch in its place. A
    timed function gets its step trial first (:mod:`~amp_rewrite.runtime.tf2.function_trial`),
    which hands over to the watch when half wins. A function decided from the
    cache gets its re-check's counter, which runs the watch inside it.
    """
    cf = swap.concrete_function
    then = tools.fallback.floor_watch(cf) if swap.is_guarded else None
    if swap.check is not None:
        swap.check.watch, then = then, swap.check
    if swap.is_timed and tools.trials is not None:
        then = tools.trials.for_swapped(cf, swap.record, then, check=swap.check)
    tf_internals.override_call(cf, tools.first_calls.for_swapped(cf, swap.record, then))


def watch_profile(tools: SwapTools, swap: Swap) -> None:
    """With ``AMP_REWRITE_PROFILE``, counts the function's calls to profile one (:mod:`amp_rewrite.runtime.profile`)."""
    if tools.profiles is not None:
        tools.profiles.watch(swap.concrete_function)


def log_swap(tools: SwapTools, swap: Swap) -> None:
    """One INFO line with the rewrite's numbers; one more when calls under a tape run float32."""
    report = swap.record.report
    logger.info("amp-rewrite: tf.function %s: %s (rewrite %.3f s, reload %.3f s)", swap.name,
                report.summary, report.rewrite_seconds, report.seconds - report.rewrite_seconds)
    if report.is_inference_only:
        logger.info("amp-rewrite: tf.function %s: calls under a GradientTape run it in float32, "
                    "since the gradient would reach the custom gradient of %s", swap.name,
                    swap.rewritten.custom_gradient_ops[0])


Step = Callable[[SwapTools, Swap], None]

REWRITE_STEPS: tuple[Step, ...] = (check_loss_scaling, find_guarded_apply, rewrite_body)
SWAP_STEPS: tuple[Step, ...] = (keep_traced_state, make_record, swap_state, guard_first_call, watch_profile,
                                log_swap)
STEPS: tuple[Step, ...] = REWRITE_STEPS + SWAP_STEPS


def _summary(result) -> str:
    """The rewrite's numbers, without the FLOP share (which would build every body again)."""
    return result.summary(with_flops=False)
