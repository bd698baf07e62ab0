"""``rewrite()``: a float32 GraphDef in, a mixed-precision GraphDef out.

:func:`_rewrite` copies the graph, turns FusedBatchNorm V1 into V2 so that its
``T`` can be half, and builds the typed view. :func:`paint` then finds the
data structures whose ops share a handle, adds the writer → reader edges
between their element types to the view, and runs the painting rules in the
order :data:`amp_rewrite.paint.rules.RULES` gives: first
:data:`~amp_rewrite.paint.rules.ROOT_RULES`, which find the roots (with no
vertex painted allow after them there is nothing to do, and :func:`paint`
stops), then :data:`~amp_rewrite.paint.rules.SPREAD_RULES`, which spread the
colours and make them agree where values must hold one dtype. That tuple is
the one account of the schedule: each rule's docstring in
:mod:`amp_rewrite.paint.rules` says what it does with a small example, and
the numbered list of ``docs/how-it-works.md`` is written from them.

Then the batch norms whose ``T`` was not painted turn back into V1;
:func:`amp_rewrite.paint.casts.apply_painting` retypes the painted attrs, folds
Consts and inserts the Casts; :func:`amp_rewrite.graph.functions.finalize_functions`
writes the function instances into the library; :func:`name_changes` names
what changed, for the report. When ``config.is_checking`` is set
(``AMP_REWRITE_CHECK=1`` or ``AMP_REWRITE_STRICT=1`` for the CLI and the
runtime), :func:`amp_rewrite.paint.checks.ensure` then checks the output's
structural postconditions. Fetched nodes, feeds, variables and their
reads are never changed; the caller's GraphDef is never mutated.

Logging: one INFO line per rewrite. At DEBUG, what each rule changed
(``+allow``, ``+deny``, ``unmarked`` vertices) and then every node's outcome,
in the sentence :mod:`amp_rewrite.paint.explain` gives for it.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from amp_rewrite.config import Config
from amp_rewrite.errors import AmpRewriteError, GraphError, PaintingRuleError
from amp_rewrite.graph.facts import DT_BFLOAT16, DT_FLOAT, DT_HALF, node_name, parse_input, sinks
from amp_rewrite.graph.functions import LibraryResult, finalize_functions
from amp_rewrite.graph.op_ports import output_count
from amp_rewrite.graph.op_registry import OpRegistry, default_device_type, graph_pb2
from amp_rewrite.graph.typed_graph import TypedGraph
from amp_rewrite.paint import rules, tensor_lists
from amp_rewrite.paint.casts import Applied, apply_painting, promote_batch_norms, restore_unconverted_batch_norms
from amp_rewrite.paint.checks import ensure
from amp_rewrite.paint.context import NodeChoices, PaintContext
from amp_rewrite.paint.explain import node_outcomes
from amp_rewrite.paint.keep_patterns import match_patterns
from amp_rewrite.paint.op_lists import OpLists, load_lists
from amp_rewrite.paint.rules import Painting, Rule

logger = logging.getLogger(__name__)

TARGET_DTYPES = {"float16": DT_HALF, "bfloat16": DT_BFLOAT16}


def paint(ctx: PaintContext) -> Painting:
    """Runs the painting rules in order and returns the colours.

    Raises:
        PaintingRuleError: a rule failed unexpectedly; the error names it.
    """
    clusters, edges = tensor_lists.find_tensor_list_clusters(ctx)
    for writer, reader in edges:
        ctx.graph.add_edge(writer, reader)
    logger.debug("find_tensor_list_clusters: %d clusters, %d writer → reader edges added to the view",
                 len(clusters), len(edges))
    painting = Painting(len(ctx.graph.vertex_node), tensor_list_clusters=clusters)
    ran = _run_rules(rules.ROOT_RULES, ctx, painting, ran=("find_tensor_list_clusters",))
    if not painting.allow:
        logger.debug("no allow-list op can run in half; nothing to do")
        return painting
    _run_rules(rules.SPREAD_RULES, ctx, painting, ran=ran)
    return painting


def _run_rules(schedule: tuple[Rule, ...], ctx: PaintContext, painting: Painting, *,
               ran: tuple[str, ...]) -> tuple[str, ...]:
    """Runs each rule of ``schedule`` and logs what it changed.

    Args:
        ran: the names of the rules that ran before, in order; a failure names them.

    Returns:
        ``ran`` followed by the rules of ``schedule``.
    """
    for rule in schedule:
        before = painting.allowed, painting.denied, painting.unmarked
        try:
            rule(ctx, painting)
        except (AmpRewriteError, RecursionError, MemoryError):
            raise  # bad input, said in one line by whoever raised it
        except Exception as exc:
            raise PaintingRuleError(rule.__name__, exc, ran_before=ran) from exc
        ran += (rule.__name__,)
        logger.debug("%s: +allow %d, +deny %d, unmarked %d", rule.__name__, painting.allowed - before[0],
                     painting.denied - before[1], painting.unmarked - before[2])
    return ran


@dataclass(frozen=True)
class RewriteResult:
    """The rewritten graph and what was done to it.

    Attributes:
        graph_def: the rewritten GraphDef (a new object, or the input one for ``in_place``).
        config: the configuration used.
        lists: the effective op lists.
        seconds: wall time of the rewrite.
        applied: what changed, by the report's names (:class:`AppliedNames`).
        unmatched_patterns: the config's keep-float32 patterns that matched no node.
        tuning: with ``--tune`` (:func:`amp_rewrite.tune.whole_graph.decide`), what
            timing both graphs decided (a ``GraphDecision``); when float32
            stays, ``graph_def`` is the float32 graph and the other fields
            describe the rewrite that was timed. None without tuning.
    """

    graph_def: Any
    config: Config
    lists: OpLists
    seconds: float
    nodes_total: int
    applied: AppliedNames
    explain: Callable[[], dict] = field(repr=False)
    unknown_ops: tuple[str, ...] = ()
    validation: Any = None
    step_seconds: dict[str, float] = field(default_factory=dict, repr=False)
    unmatched_patterns: tuple[str, ...] = ()
    tuning: Any = None

    @cached_property
    def node_outcomes(self) -> dict[str, dict]:
        """Per node: its colour, the rule that decided it, and the neighbour that caused it."""
        with _collector_paused():
            return self.explain()

    @property
    def converted(self) -> list[str]:
        return self.applied.converted

    @property
    def casts(self) -> list[str]:
        return self.applied.casts

    @cached_property
    def half_flop_share(self) -> float | None:
        """Share of MatMul/Conv FLOPs computed in the target type; None when no shapes are known."""
        from amp_rewrite.graph.flops import half_flop_share

        with _collector_paused():
            return half_flop_share(self.graph_def)

    def summary(self, *, with_flops: bool = True) -> str:
        """One line: converted nodes, casts, and (unless ``with_flops`` is false) the FLOP share.

        The FLOP share imports the graph and builds every function body to
        infer shapes; a runtime hook that rewrites on every trace skips it.
        """
        line = (f"converted {len(self.converted)}/{self.nodes_total} nodes to {self.config.target}, "
                f"{len(self.casts)} casts")
        if self.tuning is not None and self.tuning.outcome == "float32":  # the float32 graph was kept
            return f"{self.tuning.line(self.config.target)}; the {self.config.target} rewrite timed {line}"
        if with_flops:
            share = self.half_flop_share
            line += (", MatMul/Conv FLOPs unknown (no static shapes)" if share is None
                     else f", {share:.1%} of MatMul/Conv FLOPs in {self.config.target}")
        if self.validation is not None:
            v = self.validation
            line += (f"; validated in {v.runs} runs, {len(v.range_kept)} nodes kept for range, "
                     f"{len(v.regions_returned)} of {v.regions_total} half regions returned to float32")
        if self.tuning is not None:
            line += f"; the graph {self.tuning.line(self.config.target)}"
        return line

    def report(self) -> dict:
        """The JSON-able report: totals, names, and per node its colour and rule."""
        return {
            "target": self.config.target,
            "level": self.config.level,
            "device_type": self.config.device_type,
            "nodes_total": self.nodes_total,
            "converted": self.converted,
            "casts": self.casts,
            "casts_in_loop_bodies": self.applied.casts_in_loops,
            "functions_rewritten": self.applied.functions_rewritten,
            "folded_consts": self.applied.folded_consts,
            "consts_kept_float32": self.applied.consts_out_of_range,
            "unknown_ops": list(self.unknown_ops),
            "fp16_flop_share": self.half_flop_share,
            "seconds": round(self.seconds, 6),
            "nodes": self.node_outcomes,
            **({"validation": self.validation.as_dict()} if self.validation is not None else {}),
            **({"tuning": self.tuning.as_dict(self.config.target)} if self.tuning is not None else {}),
        }


def rewrite(graph_def, *, fetches=None, target: str | None = None,
            config: Config | None = None, in_place: bool = False) -> RewriteResult:
    """Rewrites a float32 GraphDef to mixed precision.

    Args:
        graph_def: a ``tf.compat.v1.GraphDef``; not modified unless ``in_place``.
        fetches: node names (``name`` or ``name:port``) the caller fetches; they
            keep their dtype. Overrides ``config.fetches``. When neither gives
            any, every node without consumers is kept.
        target: ``"float16"`` or ``"bfloat16"``; overrides ``config.target``.
        config: the configuration; by default read from TensorFlow's
            ``TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_*`` environment variables.
        in_place: rewrite ``graph_def`` itself instead of a copy, for a
            caller that has no further use for the float32 graph: it saves
            one GraphDef of memory and the time to copy it. If the rewrite
            raises, ``graph_def`` may be left partly rewritten. (A copy is
            still made when ``config.dump_dir`` or the self-checks need the
            original.)

    Returns:
        A :class:`RewriteResult` with the new GraphDef and the report.

    Raises:
        GraphError: the graph is malformed, or a fetch names no node or a port
            the node does not have.
        ListError: the op lists are inconsistent.
    """
    with _collector_paused():
        return _rewrite(graph_def, fetches=fetches, target=target, config=config, in_place=in_place)


@contextmanager
def _collector_paused():
    """Pauses Python's cyclic garbage collector while a rewrite allocates.

    With TensorFlow loaded the heap is large, and each full collection
    triggered by the rewrite's many small allocations scans all of it; the
    rewrite builds no reference cycles that need collecting before it returns.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _rewrite(graph_def, *, fetches, target, config, in_place) -> RewriteResult:
    start = time.perf_counter()
    config = _effective_config(config, fetches=fetches, target=target)
    lists = load_lists(config.target, lists_dir=config.lists_dir, edits=config.list_edits, level=config.level)
    lap = _Laps()
    nodes_total = len(graph_def.node) + sum(len(f.node_def) for f in graph_def.library.function)
    work = _working_copy(graph_def, config, in_place=in_place)
    preserved = _preserved_nodes(work, config)
    promoted = promote_batch_norms(work, skip=preserved)
    lap("copy")
    graph = TypedGraph(work, OpRegistry(work.library), opaque_functions=dict(config.opaque_functions))
    lap("typed view")
    kept, unmatched = _match_keep_patterns(graph, config)
    ctx = _paint_context(graph, lists, config, preserved=preserved, kept_by_pattern=kept)
    painting = paint(ctx)
    lap("painting")
    restore_unconverted_batch_norms(graph, painting, promoted)
    was_float32 = [dtype == DT_FLOAT for dtype in ctx.dtypes]
    applied = apply_painting(ctx, painting, was_float32)
    lap("casts")
    names = name_changes(graph, applied, finalize_functions(graph))
    lap("functions")
    result = RewriteResult(
        graph_def=work, config=config, lists=lists, seconds=time.perf_counter() - start,
        nodes_total=nodes_total, applied=names, explain=lambda: node_outcomes(ctx, painting, applied, was_float32),
        unknown_ops=tuple(graph.unknown_ops), step_seconds=lap.seconds, unmatched_patterns=unmatched,
    )
    if config.is_checking:
        _check_postconditions(graph_def, result, ctx)
    if config.dump_dir:
        _dump(config.dump_dir, graph_def, result)
    _log_outcomes(result)
    return result


def _effective_config(config: Config | None, *, fetches, target: str | None) -> Config:
    """``config`` (else the environment's) with the arguments that override it, and a device type chosen."""
    config = config if config is not None else Config.from_env()
    if fetches is not None:
        config = replace(config, fetches=tuple(fetches))
    if target is not None:
        config = replace(config, target=target)
    if config.device_type is None:
        config = replace(config, device_type=default_device_type())
    return config


def _working_copy(graph_def, config: Config, *, in_place: bool):
    """The GraphDef to rewrite: ``graph_def`` itself for ``in_place``, unless the dump or the checks need it intact."""
    if in_place and not (config.dump_dir or config.is_checking):
        return graph_def
    work = graph_pb2().GraphDef()
    work.CopyFrom(graph_def)
    return work


def _match_keep_patterns(graph: TypedGraph, config: Config) -> tuple[dict[int, str], tuple[str, ...]]:
    """The nodes the keep-float32 patterns match (index → reason), and the patterns that match none."""
    kept, unmatched = match_patterns(graph, config.keep_float32_patterns)
    for pattern in unmatched:
        logger.debug("keep-float32 pattern %r matches no node", pattern)
    return kept, unmatched


def _paint_context(graph: TypedGraph, lists: OpLists, config: Config, *, preserved: frozenset[str],
                   kept_by_pattern: dict[int, str]) -> PaintContext:
    """What the rules read."""
    assert config.device_type is not None, "_effective_config chooses the device type"
    choices = NodeChoices(preserved=preserved, keep_float32=dict(config.keep_float32), kept_by_pattern=kept_by_pattern,
                          fixed_signatures=frozenset(config.fixed_signatures), release=frozenset(config.release))
    return PaintContext(graph, lists, target_dtype=TARGET_DTYPES[config.target], device_type=config.device_type,
                        choices=choices, force_all=config.level == "UNSAFE_FORCE_ALL")


def _check_postconditions(original, result: RewriteResult, ctx: PaintContext) -> None:
    """Raises on the first structural postcondition the output breaks (:func:`amp_rewrite.paint.checks.ensure`)."""
    graph = ctx.graph
    left_alone = {graph.nodes[i].name for i in graph.bodies[0].index.values() if ctx.skip_reason[i] is not None}
    ensure(original, result.graph_def, casts=result.casts, fetches=result.config.fetches, left_alone=left_alone)


def _dump(directory: str, original, result: RewriteResult) -> None:
    """Writes the graph before and after the rewrite, and the lists, into ``directory``."""
    from amp_rewrite.graph.io import dump_rewrite

    paths = dump_rewrite(directory, original, result.graph_def, result.lists)
    logger.info("dumped the graph before and after the rewrite to %s", paths[0].parent)


def _log_outcomes(result: RewriteResult) -> None:
    """Every node's outcome at DEBUG, then the one INFO line."""
    if logger.isEnabledFor(logging.DEBUG):
        for outcome in result.node_outcomes.values():
            logger.debug("%s", outcome["reason"])
    logger.info("converted %d/%d nodes to %s, %d casts, in %.3f s", len(result.converted),
                result.nodes_total, result.config.target, len(result.casts), result.seconds)


@dataclass(frozen=True)
class AppliedNames:
    """What a rewrite changed, by the names the report uses.

    Main-graph nodes are named as they are, function nodes as
    ``function::node`` in the function written for them.

    Attributes:
        converted: nodes whose type attrs changed, folded Consts included.
        casts: the Casts inserted.
        folded_consts: float32 Consts now stored in half.
        consts_out_of_range: Consts kept float32 because a value exceeds the
            half range, with their largest magnitude.
        casts_in_loops: the inserted Casts that run on every loop iteration.
        functions_rewritten: the functions the library holds in a new version.
    """

    converted: list[str]
    casts: list[str]
    folded_consts: list[str]
    consts_out_of_range: dict[str, float]
    casts_in_loops: list[str]
    functions_rewritten: list[str]


def name_changes(graph: TypedGraph, applied: Applied, library: LibraryResult) -> AppliedNames:
    """Names what :func:`apply_painting` changed, once the library is final: the report's one naming step."""
    casts = library.qualify(applied.casts_by_body)
    in_v1_loops = v1_loop_nodes(graph)
    casts_in_loops = [c for c in applied.casts_by_body.get(0, []) if applied.cast_sources[(0, c)] in in_v1_loops]
    casts_in_loops += [c for c in casts if c.split("::")[0] in library.loop_functions]
    return AppliedNames(
        converted=library.qualify(applied.converted_by_body),
        casts=casts,
        folded_consts=library.qualify(applied.folded_by_body),
        consts_out_of_range=library.qualify_map(applied.out_of_range_by_body),
        casts_in_loops=casts_in_loops,
        functions_rewritten=library.rewritten,
    )


class _Laps:
    """Wall time of each named step of a rewrite, for benchmarks (``RewriteResult.step_seconds``)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def __call__(self, step: str) -> None:
        now = time.perf_counter()
        self.seconds[step] = now - self._last
        self._last = now


def fetched_nodes(graph_def, fetches) -> set[str]:
    """The nodes ``fetches`` name, each fetch checked against ``graph_def``'s main graph.

    Args:
        graph_def: the graph the fetches are read from.
        fetches: ``name`` or ``name:port`` strings.

    Raises:
        GraphError: a fetch names no node, or a port the node does not have
            (checked where the node's op is known: an unknown op's outputs are not).
    """
    nodes = {node.name: node for node in graph_def.node}
    registry = OpRegistry(graph_def.library) if any(":" in fetch for fetch in fetches) else None
    fetched = set()
    for fetch in fetches:
        name, port, _ = parse_input(fetch)
        if name not in nodes:
            raise GraphError(f"fetch {fetch!r} names no node of the graph")
        if registry is not None and ":" in fetch:
            outputs = output_count(nodes[name], registry)
            if outputs is not None and not 0 <= port < outputs:
                raise GraphError(f"fetch {fetch!r}: node {name} (op {nodes[name].op}) has "
                                 f"{outputs} output{'s' if outputs != 1 else ''}")
        fetched.add(name)
    return fetched


def _preserved_nodes(graph_def, config: Config) -> frozenset[str]:
    fetched = fetched_nodes(graph_def, config.fetches) if config.fetches else sinks(graph_def)
    names = {node.name for node in graph_def.node}
    missing = [p for p in config.preserve if node_name(p) not in names]
    if missing:
        raise GraphError(f"node to preserve {missing[0]!r} names no node of the graph")
    return frozenset(fetched | {node_name(p) for p in config.preserve})


def v1_loop_nodes(graph: TypedGraph) -> set[int]:
    """Main-graph nodes inside a v1 while frame: reached from an Enter before its Exit."""
    return graph.v1_loop_nodes()
