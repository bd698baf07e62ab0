"""The mixed body of a step on trial: its half regions that ran faster in half stay half, the rest float32.

After a step trial's verdict (:mod:`~amp_rewrite.runtime.tf2.function_trial`),
one real call of the half body and one of the float32 body run under
TensorFlow's profiler. :class:`StepRegions` holds the half regions of every
rewritten body the step runs (the function's own rewrite, or for a function
calling rewritten bodies, theirs: Keras 3's train function calls its
one-step function) and reads their op times off the two profiles
(:mod:`amp_rewrite.tune.step_regions`): on a CPU each node's op time, on
a GPU its kernels' time, since there a node's op event only launches its
kernels (:func:`~amp_rewrite.tune.step_stats.traced_op_seconds`). A profile
that gives no times (on a GPU: a trace whose kernels name no op) leaves the
pure verdict, and its INFO line says why. Where those times propose a mixed
step, it rewrites the bodies again with the losing regions kept float32
(``Config.keep_float32``), and builds the function's mixed state: for the
function itself, its traced state running the mixed body; for a caller,
its traced graph loaded again with the calls of the changed bodies sent to
their mixed ones. The trial then times the mixed step against the better
pure one before it keeps it.

Every region's two op times, the profiled steps' totals and the confirming
trial's best times go into the tuning cache under the step's key, so a
later run rebuilds the same mixed body from the same rewrite without
measuring (:meth:`StepRegions.mixed_from_cache`).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from amp_rewrite import tf_internals
from amp_rewrite.runtime.tf2.calls import called_name
from amp_rewrite.runtime.tf2.swap_records import LOGGER_NAME, SwapRecord
from amp_rewrite.tune import keys, step_regions
from amp_rewrite.tune.cache import Timing, TuneCache
from amp_rewrite.tune.step_regions import ExecutedNames, Region, RegionChoice, RegionTimes
from amp_rewrite.tune.trial import MixedVerdict, StepVerdict, mixed_verdict_of

logger = logging.getLogger(LOGGER_NAME)

MIXED = "mixed"
#: ``(body, call)`` → ``(outputs, op seconds per executed node)``; in place of the seconds, why there are none
#: (or None: no profile was taken).
Profiler = Callable[[str, Callable[[], Any]], tuple[Any, "dict[str, float] | str | None"]]


@dataclass(frozen=True)
class RegionPart:
    """The regions one rewritten body gives a step.

    Attributes:
        callee: the swapped function whose body it is, held weakly; None: the function on trial itself.
        record: that function's swap record (its traced state and its rewrite).
        regions: the half regions of its rewrite.
        originals: the names of the functions its rewrite read (``keep_float32`` names functions by them).
    """

    callee: weakref.ref | None
    record: SwapRecord
    regions: tuple[Region, ...]
    originals: frozenset[str]


def part_of(record: SwapRecord, callee=None) -> RegionPart:
    """The :class:`RegionPart` of a swapped function (``callee``, or the function on trial when None)."""
    result = record.rewritten.result  # type: ignore[attr-defined]
    regions = step_regions.half_regions(result.graph_def, result.casts)
    traced_graph = tf_internals.graph_in_state(record.traced_state)
    originals = set(tf_internals.graph_functions(traced_graph)) if traced_graph is not None else set()
    originals.add(_text(record.traced_state["_inference_function"].name))
    return RegionPart(weakref.ref(callee) if callee is not None else None, record, tuple(regions),
                      frozenset(originals))


class StepRegions:
    """The half regions of one step across the rewritten bodies it runs, and the mixed body they propose.

    Args:
        parts: each rewritten body's :class:`RegionPart`.
        call_names: the call nodes' names the profiler puts before an inlined node's name.
        target: the half type, for the reasons.
    """

    def __init__(self, parts: list[RegionPart], call_names: set[str], target: str):
        self.parts = parts
        self.target = target
        self.regions = [region for part in parts for region in part.regions]
        self.names = ExecutedNames(self.regions, call_names)

    @classmethod
    def of(cls, parts: list[RegionPart], graph, target: str) -> StepRegions:
        """The regions of ``parts``, in a step whose function graph is ``graph`` (it names the outer calls)."""
        calls: set[str] = set()
        for part in parts:
            calls |= step_regions.call_names(part.record.rewritten.result.graph_def)  # type: ignore[attr-defined]
        if graph is not None:
            calls |= {op.name for op in graph.get_operations() if op.type in _CALL_OPS}
        return cls(parts, calls, target)

    @property
    def can_mix(self) -> bool:
        """Whether a mixed body could differ from both pure ones (two regions at least)."""
        return len(self.regions) >= 2

    def propose(self, half_ops: Mapping[str, float], float32_ops: Mapping[str, float], *, is_half_step: bool
                ) -> tuple[list[RegionTimes], RegionChoice | None]:
        """Each region's op times in the two profiles, and the mixed step they propose (or None)."""
        times = step_regions.region_times(self.regions, self.names, half_ops, float32_ops)
        choice = step_regions.choose(times, half_total=sum(half_ops.values()),
                                     float32_total=sum(float32_ops.values()), is_half_step=is_half_step)
        return times, choice

    def mixed_from_cache(self, cache: TuneCache, key: str, *, is_half_step: bool
                         ) -> tuple[RegionChoice, Timing] | None:
        """The mixed step an earlier run chose and confirmed for this step (its choice and trial), or None."""
        confirmed = cache.get(key + keys.MIXED_KEY)
        found = step_regions.remembered(cache, key, self.regions)
        if confirmed is None or found is None:
            return None
        times, totals = found
        choice = step_regions.choose(times, half_total=totals.half, float32_total=totals.float32,
                                     is_half_step=is_half_step)
        return (choice, confirmed) if choice is not None else None

    def mixed_state(self, concrete_function, traced_state: dict, choice: RegionChoice) -> dict:
        """The state of ``concrete_function`` running the mixed body ``choice`` describes.

        Args:
            concrete_function: the function on trial.
            traced_state: its traced state (for a caller, the one calling the half bodies).
            choice: the regions kept half; the others are rewritten float32.
        """
        keep = self._keep_sets(choice)
        own = [part for part in self.parts if part.callee is None]
        if own:
            rewritten = _rewrite_keeping(concrete_function, own[0].record, keep[0])
            return {**own[0].record.traced_state, **_runnable(rewritten)}
        replacements = {}
        for part, kept in zip(self.parts, keep):
            callee = part.callee() if part.callee is not None else None
            if not kept or callee is None:
                continue
            rewritten = _rewrite_keeping(callee, part.record, kept)
            replacements[called_name(callee)] = _runnable(rewritten)["_inference_function"]
        return state_calling(concrete_function, traced_state, replacements)

    def _keep_sets(self, choice: RegionChoice) -> list[dict[str, str]]:
        """Per part, the nodes its rewrite keeps float32 in the mixed body."""
        keep: list[dict[str, str]] = []
        start = 0
        for part in self.parts:
            count = len(part.regions)
            sub = RegionChoice(choice.times[start:start + count],
                               frozenset(i - start for i in choice.half if start <= i < start + count),
                               choice.predicted, choice.half_total, choice.float32_total)
            keep.append(sub.keep_float32(self.target, part.originals))
            start += count
        return keep


class Mixing:
    """One trial's mixing: profiles the pure bodies, proposes and builds the mixed one, and judges it.

    Args:
        regions: makes the step's :class:`StepRegions` (at first use: a step whose pure verdict is
            final never needs them).
        cache: the tuning cache, where the region times and the confirming trial go.
        key: the step's key in it.
        profiler: runs one call profiled (:data:`Profiler`).
        traced_state: the state the mixed body is built from (for a caller: its graph calling half bodies).
    """

    def __init__(self, regions: Callable[[], StepRegions], *, cache: Callable[[], TuneCache], key: str,
                 profiler: Profiler, traced_state: dict):
        self._regions_of = regions
        self._regions: StepRegions | None = None
        self.cache = cache
        self.key = key
        self.profiler = profiler
        self.traced_state = traced_state
        self.choice: RegionChoice | None = None

    @property
    def regions(self) -> StepRegions:
        if self._regions is None:
            self._regions = self._regions_of()
        return self._regions

    def can_mix(self) -> bool:
        """Whether the step has regions to choose among (else its pure verdict is final)."""
        try:
            return self.regions.can_mix
        except Exception as exc:  # noqa: BLE001 - the pure verdict stands
            logger.debug("amp-rewrite: the step's half regions could not be read: %s", exc)
            return False

    def propose(self, concrete_function, states: dict, verdict: StepVerdict, half_ops: dict[str, float],
                float32_ops: dict[str, float]) -> dict | None:
        """The mixed body's state where the profiles propose one (its times cached either way), else None."""
        times, totals = self.times(half_ops, float32_ops)
        cache = self.cache()
        step_regions.remember(cache, self.key, times, totals)
        cache.save()
        return self.mixed_state(concrete_function, times, totals, is_half_step=verdict.is_half)

    def times(self, half_ops: dict[str, float], float32_ops: dict[str, float]) -> tuple[list[RegionTimes], Timing]:
        """Each region's op times in the two profiles, and the profiles' totals (half's as ``half``)."""
        regions = self.regions
        times = step_regions.region_times(regions.regions, regions.names, half_ops, float32_ops)
        return times, Timing(float32=sum(float32_ops.values()), half=sum(half_ops.values()))

    def mixed_state(self, concrete_function, times: list[RegionTimes], totals: Timing, *,
                    is_half_step: bool) -> dict | None:
        """The state of the mixed body these region times choose; None when they choose none, or it failed."""
        choice = step_regions.choose(times, half_total=totals.half, float32_total=totals.float32,
                                     is_half_step=is_half_step)
        if choice is None:
            return None
        try:
            state = self.regions.mixed_state(concrete_function, self.traced_state, choice)
        except Exception as exc:  # noqa: BLE001 - the pure verdict stands
            logger.debug("amp-rewrite: the mixed body could not be built: %s", exc)
            return None
        self.choice = choice
        return state

    def verdict(self, pure: StepVerdict, confirmed: StepVerdict) -> MixedVerdict:
        """The confirming trial's verdict (``confirmed``: the mixed body as ``half``, the better pure one as
        ``float32``); cached where its halves agree."""
        assert self.choice is not None
        verdict = mixed_verdict_of(confirmed.timing(), pure, len(self.choice.half), len(self.choice.times),
                                   confirmed=confirmed)
        if confirmed.is_clear:
            cache = self.cache()
            cache.put(self.key + keys.MIXED_KEY, confirmed.timing())
            cache.save()
        return verdict


def state_calling(concrete_function, traced_state: dict, replacements: Mapping[str, Any], *,
                  transform: Callable[[Any], Any] | None = None) -> dict:
    """``traced_state`` with its graph's calls of some functions sent to others (itself where it calls none).

    Args:
        concrete_function: the function whose state it is (never changed: a copy holding the state is loaded).
        traced_state: the state to load again.
        replacements: the name a call gives → the function object to call instead.
        transform: changes the FunctionDefs of the body and its library, as
            :func:`~amp_rewrite.runtime.tf2.concrete.reload_calling` takes it; None: none.
    """
    from amp_rewrite.runtime.tf2.concrete import reload_calling

    if not replacements and transform is None:
        return traced_state
    # A copy holding the traced state: calls of the function from other threads meanwhile run its own.
    new = reload_calling(tf_internals.function_with_state(concrete_function, traced_state), replacements,
                         transform=transform)
    if new is None:
        return traced_state
    new_state = tf_internals.concrete_function_state(new)
    tf_internals.take_over_graph_collection(new_state)
    return {**traced_state, **tf_internals.runnable_state(new_state, inference_only=False)}


def _rewrite_keeping(concrete_function, record: SwapRecord, keep: Mapping[str, str]):
    """``concrete_function``'s traced body rewritten again as its record's rewrite was, ``keep`` kept float32."""
    from amp_rewrite.runtime.tf2 import concrete

    config = record.rewritten.result.config  # type: ignore[attr-defined]
    config = replace(config, keep_float32=(*config.keep_float32, *sorted(keep.items())))
    rewritten = concrete.rewrite_concrete(tf_internals.function_with_state(concrete_function, record.traced_state),
                                          config)
    if rewritten.concrete_function is None:
        raise ValueError("the mixed rewrite changed nothing")
    return rewritten


def _runnable(rewritten) -> dict:
    state = tf_internals.concrete_function_state(rewritten.concrete_function)
    tf_internals.take_over_graph_collection(state)
    return tf_internals.runnable_state(state, inference_only=rewritten.has_custom_gradients)


def profile_body(body: str, call: Callable[[], Any], device_type: str = "CPU") -> tuple[Any, dict[str, float] | str]:
    """Runs one call under TensorFlow's profiler: its kernels' times on a GPU, its ops' elsewhere, or why none
    (:func:`amp_rewrite.tune.step_stats.traced_op_seconds`)."""
    from amp_rewrite.tune.step_stats import traced_op_seconds

    return traced_op_seconds(call, device_type=device_type)


_CALL_OPS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})


def _text(name) -> str:
    return name.decode() if isinstance(name, bytes) else str(name)
