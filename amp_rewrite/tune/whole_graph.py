"""``amp-rewrite --tune``: the rewritten graph is kept only where it ran faster than float32 here.

The op lists guess which ops are faster in half; whether the graph is depends
on the device, the shapes and what the kernel library makes of the whole
graph. So after the rewrite, :func:`decide` runs the float32 graph and the
rewritten graph in TF1 sessions on the same feeds, the way the runtime tries
a step (:mod:`amp_rewrite.tune.steps`, through
:class:`amp_rewrite.tune.graph_steps.SessionSteps`): an untimed warm-up of
each, then four steps of each in the order half, float32, float32, half, ...;
the best step of each counts, and half wins only when its best is at least
:data:`~amp_rewrite.tune.steps.MARGIN` below float32's. Otherwise the result
holds the float32 graph unchanged, and says why.

The two best times are cached in the tuning cache (:mod:`amp_rewrite.tune.cache`)
under :func:`~amp_rewrite.tune.graph_steps.graph_key`, a digest of both graphs,
the feeds' shapes and the fetches: a second run measures nothing and writes
the same bytes. A graph that cannot be timed (no feeds can be made, a step
fails, no GPU for a GPU rewrite) keeps the lists' rewrite, with the reason.

The graphs are reached through :class:`~amp_rewrite.tune.graph_steps.StepRunner`
(``runner``): one step of a body and its seconds, and one profiled step with
each node's op seconds, which a choice finer than the whole graph (some
regions float32, the rest half) can be built on.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from amp_rewrite.errors import AmpRewriteError, first_line
from amp_rewrite.graph.facts import fetchable_sinks
from amp_rewrite.tune.cache import TuneCache
from amp_rewrite.tune.graph_steps import SessionSteps, StepRunner, graph_key, run_trial
from amp_rewrite.tune.steps import FLOAT32, HALF, StepVerdict, verdict_of

logger = logging.getLogger(__name__)

#: What :func:`decide` decided: the rewrite is kept, float32 is kept, or nothing was timed (the lists decide).
RUNS_IN_HALF, STAYS_FLOAT32, NOT_TIMED = "half", "float32", "not timed"

RunnerFactory = Callable[..., StepRunner]
#: The clock the steps are timed by when none is given (tests replace it).
CLOCK: Callable[[], float] = time.perf_counter


@dataclass(frozen=True)
class GraphDecision:
    """What ``--tune`` decided for a graph, and why.

    Attributes:
        outcome: :data:`RUNS_IN_HALF`, :data:`STAYS_FLOAT32` or :data:`NOT_TIMED`.
        reason: ``the graph ran 449 ms in bfloat16 and 373 ms in float32 on this CPU``, or why nothing was timed.
        verdict: the trial's (or the cache's) verdict; None when nothing was timed.
    """

    outcome: str
    reason: str
    verdict: StepVerdict | None = None

    def line(self, target: str) -> str:
        """The one line said to the user: ``stays float32: the graph ran ...``."""
        if self.outcome == RUNS_IN_HALF:
            return f"runs in {target}: {self.reason}"
        if self.outcome == STAYS_FLOAT32:
            return f"stays float32: {self.reason}"
        return f"keeps the op lists' rewrite, not timed: {self.reason}"

    def as_dict(self, target: str) -> dict:
        """The report's ``tuning`` section."""
        found: dict[str, Any] = {"decision": self.outcome, "reason": self.reason, "line": self.line(target)}
        if self.verdict is not None:
            found.update(half_seconds=self.verdict.half_seconds, float32_seconds=self.verdict.float32_seconds,
                         is_cached=self.verdict.is_cached)
        return found


def decide(original, result, *, feeds: Mapping[str, Any] | None = None, fetches: Sequence[str] | None = None,
           init_op: str | None = None, seed: int = 0, cache: TuneCache | None = None,
           runner: RunnerFactory | None = None, timer: Callable[[], float] | None = None):
    """``result`` (a rewrite of ``original``) kept if it ran faster than ``original`` here, else ``original``.

    Args:
        original: the float32 GraphDef (not modified).
        result: its :class:`~amp_rewrite.pipeline.RewriteResult`.
        feeds: placeholder or tensor name → array; None draws random ones for
            every placeholder (``seed``), unknown dimensions ``config.tune_batch``.
        fetches: what each step runs; None: the config's fetches, else every node without consumers.
        init_op: a node run once in each session first; None: a node named ``init``, if there is one.
        cache: the tuning cache; None: the one of this device and TensorFlow in ``config.tune_cache_dir``.
        runner: makes the :class:`~amp_rewrite.tune.graph_steps.StepRunner`
            (``runner({"half": ..., "float32": ...}, feeds=, fetches=, init_op=, timer=)``);
            None: :class:`~amp_rewrite.tune.graph_steps.SessionSteps`.
        timer: the clock the runner reads; None: :data:`CLOCK`.

    Returns:
        ``result`` with :attr:`~amp_rewrite.pipeline.RewriteResult.tuning` set;
        its ``graph_def`` is ``original`` itself when float32 stays.
    """
    config = result.config
    target = config.target
    if not result.converted:
        return _with(result, GraphDecision(NOT_TIMED, f"nothing was rewritten to {target}"), original)
    fetches = tuple(fetches or config.fetches or sorted(fetchable_sinks(original)))
    if init_op is None and any(node.name == "init" for node in original.node):
        init_op = "init"
    try:
        feeds = dict(feeds) if feeds is not None else _random_feeds(original, seed=seed, batch=config.tune_batch)
        cache = cache if cache is not None else cache_for(config)
    except _NotTimed as exc:
        return _with(result, GraphDecision(NOT_TIMED, str(exc)), original)
    key = graph_key(original, result.graph_def, feeds=feeds, fetches=fetches)
    cached = cache.get(key)
    if cached is not None:
        verdict = verdict_of(cached, is_cached=True)
    else:
        try:
            verdict = _trial(runner or SessionSteps, original, result.graph_def, feeds=feeds, fetches=fetches,
                             init_op=init_op, timer=timer or CLOCK)
        except Exception as exc:  # noqa: BLE001 - a graph that does not run keeps the lists' rewrite
            why = first_line(exc, with_type=not isinstance(exc, AmpRewriteError))
            return _with(result, GraphDecision(NOT_TIMED, f"it could not be run: {why}"), original)
        cache.put(key, verdict.timing())
        cache.save()
    reason = verdict.reason(target, config.device_type or "CPU", subject="the graph")
    return _with(result, GraphDecision(RUNS_IN_HALF if verdict.is_half else STAYS_FLOAT32, reason, verdict),
                 original)


def tuned_rewrite(graph_def, *, fetches=None, target: str | None = None, config=None,
                  feeds: Mapping[str, Any] | None = None, init_op: str | None = None, seed: int = 0,
                  cache: TuneCache | None = None, runner: RunnerFactory | None = None,
                  timer: Callable[[], float] | None = None):
    """:func:`amp_rewrite.rewrite`, then :func:`decide`: the rewrite only if it runs faster here, else float32.

    ``graph_def`` is never modified; the result's ``tuning`` says what was
    decided and why, and its ``graph_def`` is ``graph_def`` itself when
    float32 stays. The other arguments are :func:`decide`'s.
    """
    from amp_rewrite.pipeline import rewrite

    result = rewrite(graph_def, fetches=fetches, target=target, config=config)
    return decide(graph_def, result, feeds=feeds, fetches=fetches, init_op=init_op, seed=seed, cache=cache,
                  runner=runner, timer=timer)


def cache_for(config) -> TuneCache:
    """The tuning cache of this device and TensorFlow, in ``config.tune_cache_dir`` or the user's cache."""
    import tensorflow as tf

    from amp_rewrite.tune.cache import default_cache_dir, device_description

    gpu_name = None
    if config.device_type == "GPU":
        gpus = tf.config.list_physical_devices("GPU")
        if not gpus:
            raise _NotTimed("the rewrite is for a GPU and there is none here to time it on")
        gpu_name = str(tf.config.experimental.get_device_details(gpus[0]).get("device_name", "unknown"))
    return TuneCache(config.tune_cache_dir or default_cache_dir(), tensorflow=tf.__version__,
                     device=device_description(config.device_type or "CPU", gpu_name=gpu_name))


class _NotTimed(Exception):
    """Why the graph cannot be timed here (the lists' rewrite stays)."""


def _random_feeds(graph_def, *, seed: int, batch: int) -> dict:
    from amp_rewrite.validate import ValidationError, random_feeds

    if not batch:
        unknown = next((n.name for n in graph_def.node if n.op == "Placeholder"
                        and any(d.size < 0 for d in n.attr["shape"].shape.dim)), None)
        if unknown is not None:
            raise _NotTimed(f"placeholder {unknown} has an unknown dimension and the tuning batch is 0 "
                            "(give --tune-batch N or --inputs FEEDS.npz)")
    try:
        return random_feeds(graph_def, seed=seed, batch=batch or 1)
    except ValidationError as exc:
        raise _NotTimed(f"no inputs can be drawn for it: {first_line(exc)}") from None


def _trial(runner: RunnerFactory, original, rewritten, *, feeds, fetches, init_op, timer) -> StepVerdict:
    steps = runner({HALF: rewritten, FLOAT32: original}, feeds=feeds, fetches=fetches, init_op=init_op, timer=timer)
    try:
        verdict, _ = run_trial(steps.step)
    finally:
        steps.close()
    logger.info("tuning: timed the graph: %.1f ms in half, %.1f ms in float32 (best of each)",
                verdict.half_seconds * 1e3, verdict.float32_seconds * 1e3)
    return verdict


def _with(result, decision: GraphDecision, original):
    """``result`` carrying ``decision``, holding ``original`` as its graph when float32 stays."""
    logger.info("tuning: the graph %s", decision.line(result.config.target))
    if decision.outcome == STAYS_FLOAT32:
        return dataclasses.replace(result, graph_def=original, tuning=decision)
    return dataclasses.replace(result, tuning=decision)
