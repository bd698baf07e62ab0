"""Measured precision: keep a heavy op float32 where half is not faster on this device.

The op lists are a static guess; kernels differ by device, library version
and shape. With tuning on, :func:`amp_rewrite.paint.rules.keep_float32_where_half_is_slower`
asks a :class:`Tuner` about every heavy op (:data:`TUNED_OPS`) the lists would
paint. The tuner describes each as an :class:`OpCase` (op, attrs, input
dtypes and static shapes, and the attrs that would become half), times it
once in float32 and once in half with a Cast on each input and output the
painting would retype (:mod:`amp_rewrite.tune.timing`), and answers with a
:class:`Decision`: half only when it runs at most ``1 - MARGIN`` of the
float32 time. The Casts are counted as if every neighbour stayed float32,
the worst case; between two half ops they would not be there.

A case measured faster in half is measured a second time, and the pass
less favourable to half is kept: on a shared machine a neighbour's load can
slow the float32 runs of one pass enough to fake a win (a forward Conv2D
that bfloat16 runs 1.1x slower on an AVX2 CPU was seen painted half once),
while a real win, such as oneDNN's bfloat16 on AVX512_BF16 (about 2x), holds
in both passes. Half losing costs one pass, the common case on CPUs without
fast half.

Timings are cached on disk (:mod:`amp_rewrite.tune.cache`), so a second run
measures nothing and decides the same. A time budget per graph bounds the
first run: an op not measured within it, or one whose input shapes are not
static, keeps the lists' verdict, and its reason says so.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from amp_rewrite.errors import first_line
from amp_rewrite.graph.facts import DTYPE_NAMES
from amp_rewrite.tune import regions
from amp_rewrite.tune.cache import Timing, TuneCache
from amp_rewrite.tune.shapes import InputSpec, input_specs

logger = logging.getLogger(__name__)

TUNED_OPS = frozenset({
    "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Conv2D", "Conv2DBackpropFilter", "Conv2DBackpropInput",
    "Conv3D", "Conv3DBackpropFilter", "Conv3DBackpropFilterV2", "Conv3DBackpropInput", "Conv3DBackpropInputV2",
    "DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropFilter", "DepthwiseConv2dNativeBackpropInput",
    "Einsum", "FusedBatchNorm", "FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3",
    "FusedBatchNormV2", "FusedBatchNormV3", "MatMul",
})
#: Half must save at least this share of the float32 time. Medians of the
#: same kernel on a shared machine differ run to run by several percent; a
#: choice inside that noise would flip between first runs on equal
#: machines, and a near tie is not worth half's precision.
MARGIN = 0.10
#: How every reason of an op or region the timings keep float32 begins (the runtime looks for it).
KEPT_FLOAT32 = "kept float32:"
DEFAULT_BUDGET_SECONDS = 30.0
DEFAULT_BATCH_HINT = 32


@dataclass(frozen=True)
class OpCase:
    """One op to time: its NodeDef (inputs and device stripped), what it reads, and what would become half.

    Attributes:
        op: the op type.
        node_def: the serialized NodeDef, named ``op``, without inputs, device or ``_`` attrs.
        inputs: each input's dtype, static shape and (for a non-float input) value.
        half_attrs: the type attrs the painting would make half.
        target: ``"float16"`` or ``"bfloat16"``.
    """

    op: str
    node_def: bytes
    inputs: tuple[InputSpec, ...]
    half_attrs: tuple[str, ...]
    target: str

    @property
    def key(self) -> str:
        """A stable name for the cache: readable head, digest of everything."""
        shapes = " ".join(spec.describe() for spec in self.inputs)
        digest = hashlib.sha256(self.node_def + repr((self.inputs, self.half_attrs)).encode()).hexdigest()[:16]
        return f"{self.op} [{shapes}] {','.join(self.half_attrs)}->{self.target} {digest}"

    def benchmark_graph(self, device: str):
        """The GraphDef holding the op in both variants, and each variant's targets (as a region's case gives)."""
        from amp_rewrite.tune.timing import benchmark_graph

        graph_def, float_target, half_targets = benchmark_graph(self, device=device)
        return graph_def, [float_target], half_targets


@dataclass(frozen=True)
class Decision:
    """The tuner's answer for one node: whether half runs faster, and the words the report gives."""

    is_half: bool
    reason: str
    is_measured: bool = True


Measure = Callable[["OpCase | regions.RegionCase"], Timing]


class Tuner:
    """Decides, from timings, which heavy ops run in half.

    Args:
        target: ``"float16"`` or ``"bfloat16"``.
        device_type: ``"CPU"`` or ``"GPU"``, for the reasons.
        measure: times an :class:`OpCase` (the real one in :mod:`amp_rewrite.tune.timing`;
            tests pass their own). None: nothing can be measured here, with ``unmeasurable`` why.
        cache: the timings already known; new ones are added and saved.
        budget_seconds: the time one graph may spend measuring.
        unmeasurable: with no ``measure``, why (for the reasons).
        batch_hint: the size an unknown first dimension of the graph's inputs
            is timed at (:mod:`amp_rewrite.tune.shapes`); None leaves it unknown.
        clock: seconds, for the budget.
        traced_graphs: function name → the graph it was traced into, whose ops
            know variable shapes (:func:`amp_rewrite.tune.shapes.input_specs`).
    """

    def __init__(self, *, target: str, device_type: str, measure: Measure | None, cache: TuneCache | None,
                 budget_seconds: float = DEFAULT_BUDGET_SECONDS, unmeasurable: str = "",
                 batch_hint: int | None = DEFAULT_BATCH_HINT, clock: Callable[[], float] = time.perf_counter,
                 traced_graphs: Mapping[str, Any] | None = None):
        self.batch_hint = batch_hint
        self.traced_graphs = dict(traced_graphs or {})
        self.target = target
        self.device_type = device_type
        self.measure = measure
        self.cache = cache
        self.budget_seconds = budget_seconds
        self.unmeasurable = unmeasurable
        self.clock = clock
        self.measured = 0

    ops = TUNED_OPS

    def decide(self, graph, nodes: Iterable[tuple[int, tuple[str, ...]]]) -> dict[int, Decision]:
        """A decision per node of ``nodes`` ((node index, type attrs the painting would make half)).

        Nodes are decided in the order given; the budget runs out on the last ones.
        """
        nodes = list(nodes)
        specs, hinted = input_specs(graph, [i for i, _ in nodes], batch=self.batch_hint, traced=self.traced_graphs)
        decisions: dict[int, Decision] = {}
        spent = 0.0
        timings: dict[str, Timing | str] = {}
        for i, half_attrs in nodes:
            spec = specs[i]
            if isinstance(spec, str):
                decisions[i] = Decision(True, f"not measured: {spec}", is_measured=False)
                continue
            case = case_for(graph.nodes[i], spec, half_attrs, self.target)
            key = case.key
            if key not in timings:
                timings[key], used = self._timing(case, spent)
                spent += used
            decision = self._decision(timings[key])
            if i in hinted and decision.is_measured:
                decision = replace(decision, reason=f"{decision.reason} (unknown batch dimension timed as "
                                                    f"{self.batch_hint})")
            decisions[i] = decision
        if self.cache is not None:
            self.cache.save()
        if spent:
            logger.info("tuning: measured %d op(s) in %.1f s", self.measured, spent)
        return decisions

    def decide_regions(self, graph, allow: set[int], joined: Iterable[Iterable[int]] = ()
                       ) -> list[tuple[list[int], Decision]]:
        """A decision per half region (:mod:`amp_rewrite.tune.regions`) of the finished painting ``allow``.

        Only regions that hold an op besides heavy ones (which were timed one
        by one) and at most :data:`~amp_rewrite.tune.regions.MAX_REGION_OPS`
        ops are decided; a region that cannot be timed keeps its half and is
        not listed. Regions share a budget of their own, as large as the ops'.
        ``joined`` are groups that must share one dtype (a data structure's
        element types): each lies in one region.
        """
        chosen = []
        for region in regions.half_regions(graph, allow, joined):
            parts = regions.region_parts(graph, region)
            nodes = [n for part in parts.values() for n in part]
            if 0 < len(nodes) <= regions.MAX_REGION_OPS and any(graph.ops[n] not in self.ops for n in nodes):
                chosen.append((region, parts))
        if not chosen:
            return []
        wanted = [n for _, parts in chosen for part in parts.values() for n in part if regions.is_standalone(graph, n)]
        specs, _ = input_specs(graph, wanted, batch=self.batch_hint, traced=self.traced_graphs)
        decided, spent = [], 0.0
        for region, parts in chosen:
            decision, spent = self._region_decision(graph, parts, specs, allow, spent)
            if decision is not None:
                decided.append((region, decision))
        if self.cache is not None:
            self.cache.save()
        return decided

    def _region_decision(self, graph, parts: dict[int, list[int]], specs, allow: set[int], spent: float
                         ) -> tuple[Decision | None, float]:
        """The decision on one region from its parts' timings (None: not timed), and the budget spent so far."""
        total_float = total_half = 0.0
        words = []
        for body, part in parts.items():
            timed = [n for n in part if regions.is_standalone(graph, n) and not isinstance(specs.get(n), str)]
            if any(graph.ops[n] in self.ops and n not in timed for n in part):
                return None, spent  # a heavy op that cannot be timed: the region's gain is unknown
            if not timed:
                continue
            case = regions.build_case(graph, timed, specs, allow, target=self.target,
                                      in_loop=regions.in_loop_body(graph, body))
            timing, used = self._timing(case, spent)
            spent += used
            if isinstance(timing, str):
                return None, spent
            if case.in_loop and timing.half > timing.float32:
                return Decision(False, f"{KEPT_FLOAT32} a loop body's half region ({regions.describe_ops(case.ops)}) "
                                       f"runs {_ms(timing.half)} per iteration in {self.target} vs "
                                       f"{_ms(timing.float32)} in float32 on this {self.device_type}"), spent
            total_float, total_half = total_float + timing.float32, total_half + timing.half
            words.append(regions.describe_ops(case.ops))
        if not words:
            return None, spent
        timing = Timing(total_float, total_half)
        sizes = f"{_ms(timing.half)} in {self.target} vs {_ms(timing.float32)} in float32 on this {self.device_type}"
        if _half_wins(timing):
            return Decision(True, f"its half region ({'; '.join(words)}) measured faster: {sizes}"), spent
        return Decision(False, f"{KEPT_FLOAT32} its half region ({'; '.join(words)}) is no faster: {sizes}"), spent

    def _timing(self, case: OpCase | regions.RegionCase, spent: float) -> tuple[Timing | str, float]:
        """The case's timing (cached, or measured now) and the seconds spent; or why there is none."""
        cached = self.cache.get(case.key) if self.cache is not None else None
        if cached is not None:
            return cached, 0.0
        if self.measure is None:
            return self.unmeasurable or "nothing to measure with", 0.0
        if spent >= self.budget_seconds:
            return f"the tuning time budget of {self.budget_seconds:g} s was used up", 0.0
        start = self.clock()
        try:
            timing = self.measure(case)
            if _half_wins(timing):
                timing = max(timing, self.measure(case), key=lambda t: t.half / t.float32)
        except Exception as exc:  # noqa: BLE001 - a case that fails to run keeps the lists' verdict
            logger.debug("tuning: %s failed: %s", case.key, exc)
            return f"timing it failed ({first_line(exc, with_type=True)})", self.clock() - start
        self.measured += 1
        if self.cache is not None:
            self.cache.put(case.key, timing)
        return timing, self.clock() - start

    def _decision(self, timing: Timing | str) -> Decision:
        if isinstance(timing, str):
            return Decision(True, f"not measured: {timing}", is_measured=False)
        words = (f"{_ms(timing.half)} in {self.target} vs {_ms(timing.float32)} in float32 "
                 f"on this {self.device_type}")
        if _half_wins(timing):
            return Decision(True, f"measured faster in half: {words}")
        return Decision(False, f"{KEPT_FLOAT32} {words}")


def _half_wins(timing: Timing) -> bool:
    return timing.half <= timing.float32 * (1 - MARGIN)


def case_for(node, inputs: tuple[InputSpec, ...], half_attrs: tuple[str, ...], target: str) -> OpCase:
    """The :class:`OpCase` of ``node``: its op and attrs, stripped of what does not change its speed."""
    stripped = type(node)(name="op", op=node.op)
    for name in sorted(node.attr):
        if not name.startswith("_"):
            stripped.attr[name].CopyFrom(node.attr[name])
    return OpCase(node.op, stripped.SerializeToString(deterministic=True), inputs, tuple(sorted(half_attrs)), target)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def dtype_name(dtype: int) -> str:
    return DTYPE_NAMES.get(dtype, f"dtype{dtype}")


def tuner_for(config, *, traced_graphs: Mapping[str, Any] | None = None) -> Tuner:
    """The tuner a rewrite with ``config`` uses: real timings on this machine, the disk cache."""
    import tensorflow as tf

    from amp_rewrite.graph.op_registry import visible_gpus
    from amp_rewrite.tune import timing as tune_timing
    from amp_rewrite.tune.cache import default_cache_dir, device_description

    device_type = config.device_type
    measure: Measure | None = functools.partial(tune_timing.measure, device_type=device_type)
    gpu_name = None
    unmeasurable = ""
    if device_type == "GPU":
        gpus = visible_gpus()
        if gpus:
            gpu_name = tf.config.experimental.get_device_details(gpus[0]).get("device_name")
        else:
            measure, unmeasurable = None, "no GPU here to measure on"
    directory = config.tune_cache_dir or default_cache_dir()
    cache = TuneCache(directory, device=device_description(device_type, gpu_name=gpu_name),
                      tensorflow=tf.__version__)
    return Tuner(target=config.target, device_type=device_type, measure=measure, cache=cache,
                 budget_seconds=config.tune_budget_seconds, unmeasurable=unmeasurable,
                 batch_hint=config.tune_batch or None, traced_graphs=traced_graphs)
