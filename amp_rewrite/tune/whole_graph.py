"""``amp-rewrite --tune``: the rewritten graph is kept only where it ran faster than float32 here.

The op lists guess which ops are faster in half; whether the graph is depends
on the device, the shapes and what the kernel library makes of the whole
graph. So after the rewrite, :func:`decide` runs the float32 graph and the
rewritten graph in TF1 sessions on the same feeds, the way the runtime tries
a step (:mod:`amp_rewrite.tune.trial`, through
:class:`amp_rewrite.tune.graph_sessions.GraphSessions`): an untimed warm-up of
each, then four steps of each in the order half, float32, float32, half, ...;
the best step of each counts, and half wins only when its best is at least
:data:`~amp_rewrite.tune.trial.MARGIN` below float32's. Otherwise the result
holds the float32 graph unchanged, and says why.

The two best times are cached in the tuning cache (:mod:`amp_rewrite.tune.cache`)
under :func:`~amp_rewrite.tune.keys.graph_key`, a digest of both graphs,
the feeds' shapes, the fetches and the rewrite's settings: a second run
measures nothing and writes the same bytes. Only a verdict clear of the
noise is cached (:attr:`~amp_rewrite.tune.trial.StepVerdict.is_clear`, and
the mixed graph's trial where one ran); another is used once and measured
again by the next run. A graph that cannot be timed (no feeds can be made, a step
fails, no GPU for a GPU rewrite) keeps the lists' rewrite, with the reason.

Then a choice finer than the whole graph: one profiled step of each pure
graph gives every node's op time, :mod:`amp_rewrite.tune.step_regions`
proposes which of the rewrite's half regions to keep float32 (those that
ran slower in half), the graph is rewritten with them kept float32
(``Config.keep_float32``), and the mixed graph is kept only when another
interleaved trial finds it :data:`~amp_rewrite.tune.trial.MARGIN` faster than
the better pure graph. Its times are cached beside the graph's.

The graphs are reached through :class:`~amp_rewrite.tune.graph_sessions.StepRunner`
(``runner``): one step of a body and its seconds, and one profiled step with
each node's op seconds (a runner without ``profile`` decides the whole graph only).
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
from amp_rewrite.tune import keys
from amp_rewrite.tune.cache import Timing, TuneCache
from amp_rewrite.tune.graph_sessions import GraphSessions, StepRunner
from amp_rewrite.tune.keys import graph_key
from amp_rewrite.tune.trial import (
    FLOAT32,
    HALF,
    MixedVerdict,
    StepVerdict,
    confirmation,
    is_worth_mixing,
    mixed_verdict_of,
    run_calls,
    run_trial,
    verdict_of,
)

logger = logging.getLogger(__name__)

#: What :func:`decide` decided: the rewrite is kept, float32 is kept, some regions of the rewrite are kept
#: float32 (a mixed step), or nothing was timed (the lists decide).
RUNS_IN_HALF, STAYS_FLOAT32, RUNS_MIXED, NOT_TIMED = "half", "float32", "mixed", "not timed"

RunnerFactory = Callable[..., StepRunner]
#: The clock the steps are timed by when none is given (tests replace it).
CLOCK: Callable[[], float] = time.perf_counter


@dataclass(frozen=True)
class GraphDecision:
    """What ``--tune`` decided for a graph, and why.

    Attributes:
        outcome: :data:`RUNS_IN_HALF`, :data:`STAYS_FLOAT32` or :data:`NOT_TIMED`.
        reason: ``the graph ran 449 ms in bfloat16 and 373 ms in float32 on this CPU``, or why nothing was timed.
        verdict: the trial's (or the cache's) verdict of the whole graph; None when nothing was timed.
        mixed: the verdict of the trial of a mixed graph, where one was tried
            (:class:`~amp_rewrite.tune.trial.MixedVerdict`); None where none was.
    """

    outcome: str
    reason: str
    verdict: StepVerdict | None = None
    mixed: MixedVerdict | None = None

    def line(self, target: str) -> str:
        """The one line said to the user: ``stays float32: the graph ran ...``."""
        if self.outcome == RUNS_IN_HALF:
            return f"runs in {target}: {self.reason}"
        if self.outcome == STAYS_FLOAT32:
            return f"stays float32: {self.reason}"
        if self.outcome == RUNS_MIXED:
            return f"runs mixed: {self.reason}"
        return f"keeps the op lists' rewrite, not timed: {self.reason}"

    def as_dict(self, target: str) -> dict:
        """The report's ``tuning`` section."""
        found: dict[str, Any] = {"decision": self.outcome, "reason": self.reason, "line": self.line(target)}
        if self.verdict is not None:
            found.update(half_seconds=self.verdict.half_seconds, float32_seconds=self.verdict.float32_seconds,
                         is_cached=self.verdict.is_cached)
        if self.mixed is not None:
            found.update(mixed_seconds=self.mixed.mixed_seconds, better_pure_seconds=self.mixed.pure_seconds,
                         half_regions=self.mixed.half_regions, regions=self.mixed.regions)
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
        runner: makes the :class:`~amp_rewrite.tune.graph_sessions.StepRunner`
            (``runner({"half": ..., "float32": ...}, feeds=, fetches=, init_op=, timer=)``);
            None: :class:`~amp_rewrite.tune.graph_sessions.GraphSessions`.
        timer: the clock the runner reads; None: :data:`CLOCK`.

    Returns:
        ``result`` with :attr:`~amp_rewrite.pipeline.RewriteResult.tuning` set;
        its ``graph_def`` is ``original`` itself when float32 stays; for a
        mixed graph that won its trial, the rewrite of ``original`` with the
        losing regions kept float32.
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
    key = graph_key(original, result.graph_def, feeds=feeds, fetches=fetches, settings=keys.rewrite_settings(config))
    trials = _Trials(runner or GraphSessions, original, result.graph_def, feeds=feeds, fetches=fetches,
                     init_op=init_op, timer=timer or CLOCK)
    try:
        cached = cache.get(key)
        if cached is not None:
            verdict = verdict_of(cached, is_cached=True, source=str(cache.path))
        else:
            try:
                verdict = trials.whole()
            except Exception as exc:  # noqa: BLE001 - a graph that does not run keeps the lists' rewrite
                why = first_line(exc, with_type=not isinstance(exc, AmpRewriteError))
                return _with(result, GraphDecision(NOT_TIMED, f"it could not be run: {why}"), original)
        try:
            mixed, mixed_result = _mixed(original, result, verdict, key=key, cache=cache, trials=trials)
        except Exception as exc:  # noqa: BLE001 - the whole graph's verdict stands
            logger.warning("amp-rewrite: tuning: no mixed graph tried: %s", first_line(exc, with_type=True))
            mixed, mixed_result = None, None
        if cached is None and verdict.is_clear and (mixed is None or mixed.is_clear):
            cache.put(key, dataclasses.replace(verdict.timing(), what=f"graph, {target}"))
    finally:
        trials.close()
        cache.save()
    device = config.device_type or "CPU"
    if mixed is not None and mixed_result is not None and mixed.is_mixed:
        reason = mixed.reason(target, device, subject="the graph")
        return _with(mixed_result, GraphDecision(RUNS_MIXED, reason, verdict, mixed), original)
    reason = (mixed.reason(target, device, subject="the graph") if mixed is not None
              else verdict.reason(target, device, subject="the graph"))
    return _with(result, GraphDecision(RUNS_IN_HALF if verdict.is_half else STAYS_FLOAT32, reason, verdict, mixed),
                 original)


def tuned_rewrite(graph_def, *, fetches=None, target: str | None = None, config=None,
                  feeds: Mapping[str, Any] | None = None, init_op: str | None = None, seed: int = 0,
                  cache: TuneCache | None = None, runner: RunnerFactory | None = None,
                  timer: Callable[[], float] | None = None):
    """:func:`amp_rewrite.rewrite`, then ``decide``: the rewrite only if it runs faster here, else float32.

    ``graph_def`` is never modified; the result's ``tuning`` says what was
    decided and why, and its ``graph_def`` is ``graph_def`` itself when
    float32 stays. The other arguments are those of ``decide`` (in
    ``amp_rewrite.tune.whole_graph``).
    """
    from amp_rewrite.pipeline import rewrite

    result = rewrite(graph_def, fetches=fetches, target=target, config=config)
    return decide(graph_def, result, feeds=feeds, fetches=fetches, init_op=init_op, seed=seed, cache=cache,
                  runner=runner, timer=timer)


def cache_for(config) -> TuneCache:
    """The tuning cache of this device and TensorFlow, in ``config.tune_cache_dir`` or the user's cache."""
    from amp_rewrite.tune.cache import cache_here, first_gpu_name

    if config.device_type == "GPU" and first_gpu_name() is None:
        raise _NotTimed("the rewrite is for a GPU and there is none here to time it on")
    return cache_here(config.tune_cache_dir, config.device_type or "CPU")


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


class _Trials:
    """The runners of one decision: the pure graphs' (kept open from the trial to the profile), the mixed one's."""

    def __init__(self, make: RunnerFactory, original, rewritten, *, feeds, fetches, init_op, timer):
        self.make, self.original, self.rewritten = make, original, rewritten
        self.options = {"feeds": feeds, "fetches": fetches, "init_op": init_op, "timer": timer}
        self._pure: StepRunner | None = None

    @property
    def pure(self) -> StepRunner:
        """The float32 graph and the rewritten one, each ready to step."""
        if self._pure is None:
            self._pure = self.make({HALF: self.rewritten, FLOAT32: self.original}, **self.options)
        return self._pure

    def whole(self) -> StepVerdict:
        """The trial of the rewritten graph against the float32 graph."""
        verdict, _ = run_trial(self.pure.step)
        logger.info("tuning: timed the graph: %.1f ms in half, %.1f ms in float32 (best of each)",
                    verdict.half_seconds * 1e3, verdict.float32_seconds * 1e3)
        return verdict

    def profiles(self) -> tuple[dict[str, float], dict[str, float]] | None:
        """Each node's op seconds in one profiled step of the rewritten and of the float32 graph; None: no profiler,
        or a profile without times (a line says why)."""
        profile = getattr(self.pure, "profile", None)
        if profile is None:
            return None
        half, float32 = profile(HALF), profile(FLOAT32)
        for found in (half, float32):
            if isinstance(found, str):
                logger.info("tuning: no mixed graph: %s", found)
                return None
        return half, float32

    def mixed(self, mixed_graph, best_graph) -> StepVerdict:
        """The verdict of a mixed graph (``half``) against the better pure graph (``float32``) in their trial.

        The trial is the runtime's confirmation (:func:`~amp_rewrite.tune.trial.confirmation`):
        the mixed graph runs once untimed, then two mirrored pairs.
        """
        runner = self.make({HALF: mixed_graph, FLOAT32: best_graph}, **self.options)
        try:
            verdict = run_calls(runner.step, confirmation()).verdict()
        finally:
            runner.close()
        assert verdict is not None, "a confirmation times each graph twice"
        return verdict

    def close(self) -> None:
        if self._pure is not None:
            self._pure.close()
            self._pure = None


def _mixed(original, result, verdict: StepVerdict, *, key: str, cache: TuneCache, trials: _Trials):
    """The verdict of a mixed graph's trial and the mixed rewrite; ``(None, None)`` where none was proposed.

    The regions' op times come from one profiled step of each pure graph
    (:mod:`amp_rewrite.tune.step_regions` chooses from them); the mixed graph,
    the rewrite with the regions that ran slower in half kept float32, is
    then timed against the better pure graph, and wins only by
    :data:`~amp_rewrite.tune.trial.MARGIN`. The profile's times and the
    trial's are cached beside the graph's, so a second run makes the same
    choice without running anything.
    """
    from amp_rewrite.pipeline import rewrite
    from amp_rewrite.tune import step_regions

    if not is_worth_mixing(verdict):
        return None, None
    regions = step_regions.half_regions(result.graph_def, result.casts)
    if len(regions) < 2:
        return None, None
    found = step_regions.remembered(cache, key, regions)
    if found is not None:
        times, totals = found
    else:
        profiles = trials.profiles()
        if profiles is None:
            return None, None
        half_ops, float32_ops = profiles
        names = step_regions.ExecutedNames(regions, step_regions.call_names(result.graph_def))
        times = step_regions.region_times(regions, names, half_ops, float32_ops)
        totals = Timing(float32=sum(float32_ops.values()), half=sum(half_ops.values()))
        step_regions.remember(cache, key, times, totals)
    choice = step_regions.choose(times, half_total=totals.half, float32_total=totals.float32,
                                 is_half_step=verdict.is_half)
    if choice is None:
        return None, None
    config = result.config
    kept = choice.keep_float32(config.target, [f.signature.name for f in original.library.function])
    mixed = rewrite(original, config=dataclasses.replace(
        config, keep_float32=tuple(config.keep_float32) + tuple(sorted(kept.items()))))
    timing = cache.get(key + keys.MIXED_KEY)
    confirmed = None
    if timing is None:
        confirmed = trials.mixed(mixed.graph_def, result.graph_def if verdict.is_half else original)
        timing = confirmed.timing()
        if confirmed.is_clear:
            cache.put(key + keys.MIXED_KEY, timing)
    mixed_verdict = mixed_verdict_of(timing, verdict, len(choice.half), len(regions), confirmed=confirmed)
    logger.info("tuning: a mixed graph (%d of %d half regions half) ran %.1f ms against %.1f ms", len(choice.half),
                len(regions), timing.half * 1e3, timing.float32 * 1e3)
    return mixed_verdict, mixed


def _with(result, decision: GraphDecision, original):
    """``result`` carrying ``decision``, holding ``original`` as its graph when float32 stays."""
    logger.info("tuning: the graph %s", decision.line(result.config.target))
    if decision.outcome == STAYS_FLOAT32:
        return dataclasses.replace(result, graph_def=original, tuning=decision)
    return dataclasses.replace(result, tuning=decision)
