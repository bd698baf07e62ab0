"""Accuracy-guarded rewrite: check the half graph against float32 and fall back where it fails.

The steps, all in memory:

1. **Reference run.** The float32 graph runs once on the sample inputs. The
   same run records ``max |value|`` of every float tensor it can observe (main
   graph, outside v1 loop frames and cond branches) through reductions
   added to a scratch copy, so no tensor is kept.
2. **Range rule** (float16 only; bfloat16 has float32's range): a node
   that produces or reads a tensor beyond ``range_fraction`` of the half
   range stays float32. Casting that tensor into any half consumer would
   overflow, so its readers stay float32 too.
3. **Pattern rules** (float16): softmax reductions stay float32; an epsilon
   smaller than half's smallest normal, added before a division, square
   root, reciprocal or log, keeps both ops float32; layer-norm statistics
   stay float32 while their elementwise tail may be half.
4. **Check run.** If the outputs are not within tolerance (NaN and inf always
   fail), connected half regions go back to float32. Regions are ordered by
   the largest magnitude seen in them, riskiest first. For each culprit, a
   binary search finds the shortest prefix of regions whose return makes the
   check pass, and the last region of that prefix is kept float32. With one
   culprit among R regions this takes about ``log2(R) + 2`` runs; ``max_runs``
   bounds the total.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np

from amp_rewrite.config import Config
from amp_rewrite.errors import AmpRewriteError, UsageError
from amp_rewrite.graph.facts import DT_BFLOAT16, DT_DOUBLE, DT_FLOAT, DT_HALF, FLOAT16_MAX, node_name, parse_input
from amp_rewrite.graph.typed_graph import TypedGraph
from amp_rewrite.pipeline import RewriteResult, rewrite, v1_loop_nodes

logger = logging.getLogger(__name__)

HALF_MIN_NORMAL = 6.103515625e-05
METRICS = ("allclose", "cosine", "top1")
_ELEMENTWISE = frozenset({"Sub", "Mul", "Add", "AddV2", "RealDiv", "Neg", "BiasAdd"})
_EPSILON_READERS = frozenset({"RealDiv", "Div", "Rsqrt", "Sqrt", "Reciprocal", "Inv", "Log", "Pow"})


class Attempt(NamedTuple):
    """One rewrite checked against the float32 outputs."""

    result: RewriteResult
    error: float  # the worst output's error, in tolerances (1.0 is the limit)
    errors: dict


class ValidationError(AmpRewriteError):
    """The sample inputs do not fit the graph, or validation could not reach the tolerance."""


@dataclass
class Tolerance:
    """When two outputs agree: ``allclose`` (``|got - want| <= atol*scale + rtol*|want|``), ``cosine``, ``top1``.

    ``atol`` is relative to the largest ``|value|`` of the float32 output, so one
    setting fits outputs of any scale.
    """

    rtol: float = 2e-2
    atol: float = 2e-2
    metric: str = "allclose"

    def __post_init__(self):
        for name in ("rtol", "atol"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise UsageError(f"{name} {value!r}: must be a finite number >= 0")
        if self.rtol == 0 and self.atol == 0:
            raise UsageError("rtol and atol are both 0: no half graph can pass")
        if self.metric not in METRICS:
            raise UsageError(f"unknown metric {self.metric!r}; choose one of {', '.join(METRICS)}")

    def error(self, got: np.ndarray, want: np.ndarray) -> float:
        """How far ``got`` is from ``want``: at most 1.0 passes.

        Where ``want`` is not finite (a legitimate -inf, say), ``got`` must be
        the same value; where it is finite, ``got`` must be finite too, and the
        metric judges those values. A mismatch is inf, never NaN.
        """
        got = np.asarray(got, dtype=np.float64)
        want = np.asarray(want, dtype=np.float64)
        if got.shape != want.shape:
            return math.inf
        finite = np.isfinite(want)
        if not np.all(np.isfinite(got[finite])):
            return math.inf
        odd_got, odd_want = got[~finite], want[~finite]
        if not np.all((odd_got == odd_want) | (np.isnan(odd_got) & np.isnan(odd_want))):
            return math.inf
        if not np.all(finite):
            got, want = got[finite], want[finite]
        if got.size == 0:
            return 0.0
        if self.metric == "cosine":
            denominator = np.linalg.norm(got) * np.linalg.norm(want)
            similarity = 1.0 if denominator == 0 else float(np.sum(got * want) / denominator)
            return (1.0 - similarity) / 1e-3
        if self.metric == "top1":
            agree = np.argmax(got, axis=-1) == np.argmax(want, axis=-1)
            return 0.0 if np.all(agree) else 1.0 + float(np.mean(~agree))
        scale = max(float(np.max(np.abs(want))), 1e-30)
        limit = self.atol * scale + self.rtol * np.abs(want)
        return float(np.max(np.abs(got - want) / limit))


@dataclass
class ValidationReport:
    """What validation found and did."""

    runs: int = 0
    passed: bool = False
    errors: dict[str, float] = field(default_factory=dict)
    range_kept: dict[str, float] = field(default_factory=dict)
    pattern_kept: dict[str, str] = field(default_factory=dict)
    regions_total: int = 0
    regions_returned: list[dict] = field(default_factory=list)
    message: str = ""

    def as_dict(self) -> dict:
        return {
            "runs": self.runs, "passed": self.passed, "errors": self.errors, "range_kept": self.range_kept,
            "pattern_kept": self.pattern_kept, "regions_total": self.regions_total,
            "regions_returned": self.regions_returned, "message": self.message,
        }


def validated_rewrite(
    graph_def,
    *,
    feeds: Mapping[str, np.ndarray],
    fetches,
    config: Config | None = None,
    tolerance: Tolerance | None = None,
    max_runs: int = 24,
    range_fraction: float = 0.25,
    progress: Callable[[str], None] | None = None,
) -> tuple[RewriteResult, ValidationReport]:
    """Rewrites ``graph_def``, checks it against float32 on ``feeds``, and repairs it where needed.

    Args:
        graph_def: the float32 graph (never modified).
        feeds: placeholder (or tensor) name → sample value.
        fetches: the outputs to compare (node or tensor names).
        config: the rewrite configuration.
        tolerance: how close the outputs must be.
        max_runs: most graph executions allowed, reference run included.
        range_fraction: share of the half range above which a tensor stays float32.
        progress: called with a short line before each run, for terminals.

    Returns:
        The final rewrite and a :class:`ValidationReport`.

    Raises:
        ValidationError: bad sample inputs (missing, wrong shape or dtype).
    """
    config = config if config is not None else Config.from_env()
    tolerance = tolerance or Tolerance()
    if tolerance.metric not in METRICS:
        raise UsageError(f"unknown metric {tolerance.metric!r}; choose one of {', '.join(METRICS)}")
    if not isinstance(max_runs, int) or max_runs < 2:
        raise UsageError(f"max_runs {max_runs!r}: must be an integer >= 2 (a float32 run and a check)")
    fetches = list(fetches)
    report = ValidationReport()
    runner = _Runner(graph_def, feeds, fetches, report, max_runs, progress)
    reference, peaks = runner.reference()
    keep: dict[str, str] = {}
    release: set[str] = set()
    if config.target == "float16":
        report.range_kept = range_rule(graph_def, peaks, FLOAT16_MAX * range_fraction)
        keep.update({n: f"validation: |value| reaches {v:g}, beyond the half range kept" for n, v in
                     report.range_kept.items()})
        pattern_keep, release = pattern_rules(graph_def)
        report.pattern_kept = {n: r for n, r in pattern_keep.items() if n not in keep}
        keep.update(report.pattern_kept)
    base = replace(config, fetches=tuple(fetches), keep_float32=tuple(sorted(keep.items())),
                   release=tuple(sorted(release)))

    def attempt(extra: dict[str, str]) -> Attempt:
        cfg = replace(base, keep_float32=tuple(sorted({**keep, **extra}.items())))
        result = rewrite(graph_def, config=cfg)
        errors = runner.compare(result.graph_def, reference, tolerance)
        return Attempt(result, max(errors.values(), default=0.0), errors)

    result, error, errors = attempt({})
    report.errors = errors
    if error <= 1.0:
        report.passed = True
    else:
        regions = half_regions(result, peaks)
        report.regions_total = len(regions)
        result, report.passed = _return_regions(regions, attempt, result, error, report, runner)
    return replace(result, validation=report), report


def _return_regions(regions, attempt, result: RewriteResult, error: float, report: ValidationReport,
                    runner) -> tuple[RewriteResult, bool]:
    """Finds regions whose return to float32 makes the check pass (see the module docstring).

    ``result`` and ``error`` are the last check's; the search starts from them.
    """
    returned: list[int] = []
    remaining = list(range(len(regions)))

    def reverted(extra: list[int]) -> dict[str, str]:
        return {n: f"validation: region {k} returned to float32 (outputs off in half)"
                for k in returned + extra for n in regions[k]}

    def record(k: int, before: float, after: float) -> None:
        returned.append(k)
        report.regions_returned.append({"region": k, "nodes": regions[k], "error_before": before,
                                        "error_after": after})

    while remaining:
        lo, hi, passing = 1, len(remaining), None
        while lo < hi and not runner.exhausted():
            mid = (lo + hi) // 2
            outcome = attempt(reverted(remaining[:mid]))
            if outcome.error <= 1.0:
                hi, passing = mid, outcome
            else:
                lo = mid + 1
        if lo < hi or (passing is None and runner.exhausted()):
            report.message = (f"stopped after {report.runs} runs (max runs); {len(returned)} regions "
                              f"returned, outputs still {error:.3g}x the tolerance")
            return result, False
        if passing is None:
            passing = attempt(reverted(remaining[:hi]))
            if passing.error > 1.0:
                report.message = ("outputs are off even with every half region in float32: "
                                  "the difference does not come from half precision")
                return passing.result, False
        culprit = remaining.pop(lo - 1)
        record(culprit, error, passing.error)
        report.errors = passing.errors
        if lo == 1:
            return passing.result, True
        if runner.exhausted():  # keep the passing graph: it also returned the regions before the culprit
            for k in remaining[:lo - 1]:
                record(k, error, passing.error)
            del remaining[:lo - 1]
            return passing.result, True
        result, error, report.errors = attempt(reverted([]))
        report.regions_returned[-1]["error_after"] = error
        if error <= 1.0:
            return result, True
    report.message = "every half region returned to float32 and the outputs are still off"
    return result, False


def range_rule(graph_def, peaks: dict[str, float], limit: float) -> dict[str, float]:
    """Nodes producing or reading a tensor whose |value| exceeds ``limit``, with the value seen."""
    kept: dict[str, float] = {}
    for tensor, peak in peaks.items():
        if peak > limit:
            name = node_name(tensor)
            kept[name] = max(kept.get(name, 0.0), peak)
    readers: dict[str, float] = {}
    for node in graph_def.node:
        for ref in node.input:
            if ref.startswith("^"):
                continue
            tensor = _tensor_name(ref)
            if peaks.get(tensor, 0.0) > limit:
                readers[node.name] = max(readers.get(node.name, 0.0), peaks[tensor])
    for name, peak in readers.items():
        kept[name] = max(kept.get(name, 0.0), peak)
    for node in graph_def.node:  # weights beyond the limit
        if node.op == "Const" and node.attr["dtype"].type == DT_FLOAT:
            from amp_rewrite.graph.tensors import max_abs

            peak = max_abs(node.attr["value"].tensor)
            if peak > limit:
                kept[node.name] = peak
    return kept


def pattern_rules(graph_def) -> tuple[dict[str, str], set[str]]:
    """Numerically fragile patterns to keep float32, and layer-norm tails to release from deny."""
    nodes = {n.name: n for n in graph_def.node}
    consumers: dict[str, list] = {}
    for node in graph_def.node:
        for ref in node.input:
            if not ref.startswith("^"):
                consumers.setdefault(node_name(ref), []).append(node)
    keep: dict[str, str] = {}
    for node in graph_def.node:
        if node.op in ("Softmax", "LogSoftmax"):
            keep[node.name] = "validation pattern: softmax reduction kept float32"
        if node.op == "Exp":
            for reader in consumers.get(node.name, []):
                if reader.op in ("Sum", "Mean"):
                    keep[node.name] = keep[reader.name] = "validation pattern: exp-sum reduction kept float32"
        if node.op in ("Add", "AddV2", "Maximum") and _tiny_constant(node, nodes):
            for reader in consumers.get(node.name, []):
                if reader.op in _EPSILON_READERS:
                    keep[node.name] = keep[reader.name] = ("validation pattern: epsilon below half's smallest "
                                                           "normal kept float32")
    stats = _layer_norm_statistics(graph_def, nodes, consumers)
    for name in stats:
        keep[name] = "validation pattern: layer-norm statistics kept float32"
    release = _elementwise_tail(stats, consumers)
    return keep, release - set(keep)


def _tiny_constant(node, nodes) -> bool:
    from amp_rewrite.graph.tensors import const_value

    for ref in node.input:
        source = nodes.get(node_name(ref))
        if source is not None and source.op == "Const" and source.attr["dtype"].type == DT_FLOAT:
            value = np.abs(const_value(source.attr["value"].tensor))
            if value.size and 0 < float(np.max(value)) < HALF_MIN_NORMAL:
                return True
    return False


def _layer_norm_statistics(graph_def, nodes, consumers) -> set[str]:
    """Mean → SquaredDifference → Mean → (+eps) → Rsqrt chains, as tf.nn.moments and layer norms build."""
    stats: set[str] = set()
    for node in graph_def.node:
        if node.op != "SquaredDifference":
            continue
        chain = {node.name}
        means = []
        for ref in node.input:
            source = nodes.get(node_name(ref))
            passed = []
            while source is not None and source.op in ("Identity", "StopGradient") and source.input:
                passed.append(source.name)
                source = nodes.get(node_name(source.input[0]))
            if source is not None and source.op == "Mean":
                means.append(source)
                chain.update(passed)
        variances = [c for c in consumers.get(node.name, []) if c.op == "Mean"]
        if not means or not variances:
            continue
        chain.update(m.name for m in means)
        chain.update(v.name for v in variances)
        frontier = list(variances)
        for _ in range(3):  # variance + eps -> rsqrt / sqrt
            frontier = [c for f in frontier for c in consumers.get(f.name, [])
                        if c.op in ("Add", "AddV2", "Rsqrt", "Sqrt", "Reciprocal")]
            chain.update(c.name for c in frontier)
        stats |= chain
    return stats


def _elementwise_tail(stats: set[str], consumers) -> set[str]:
    tail: set[str] = set()
    frontier = [c for name in stats for c in consumers.get(name, []) if c.name not in stats]
    for _ in range(4):
        frontier = [c for c in frontier if c.op in _ELEMENTWISE and c.name not in tail]
        tail.update(c.name for c in frontier)
        frontier = [c for f in frontier for c in consumers.get(f.name, [])]
    return tail


def half_regions(result: RewriteResult, peaks: dict[str, float]) -> list[list[str]]:
    """Connected regions of main-graph nodes computing in half, riskiest first.

    Risk is the largest magnitude seen in a region's tensors on the reference
    run; ties keep graph order, so the list is deterministic.
    """
    import networkx as nx

    graph_def = result.graph_def
    converted = [n for n in result.converted if "::" not in n]
    order = {n.name: i for i, n in enumerate(graph_def.node)}
    half = set(converted)
    links = nx.Graph()
    links.add_nodes_from(sorted(half, key=order.__getitem__))
    for node in graph_def.node:
        if node.name not in half:
            continue
        for ref in node.input:
            src = node_name(ref)
            if not ref.startswith("^") and src in half:
                links.add_edge(src, node.name)
    regions = [sorted(c, key=order.__getitem__) for c in nx.connected_components(links)]

    def risk(region):
        peak = max((v for t, v in peaks.items() if node_name(t) in region), default=0.0)
        return (-peak, order[region[0]])

    return sorted(regions, key=risk)


def random_feeds(graph_def, *, seed: int = 0, batch: int = 2) -> dict[str, np.ndarray]:
    """Standard-normal floats (zeros for ints, False for bools) for every Placeholder; unknown dims = ``batch``."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    feeds = {}
    for node in graph_def.node:
        if node.op != "Placeholder":
            continue
        shape = node.attr["shape"].shape
        if shape.unknown_rank:
            raise ValidationError(f"placeholder {node.name} has unknown rank: give sample inputs with --inputs")
        dims = [d.size if d.size >= 0 else batch for d in shape.dim]
        try:
            dtype = tf.as_dtype(node.attr["dtype"].type)
        except TypeError:
            raise ValidationError(f"placeholder {node.name} has dtype {node.attr['dtype'].type}, which is no "
                                  f"DataType") from None
        if dtype in (tf.resource, tf.variant, tf.string) or dtype.is_complex or dtype.is_quantized:
            raise ValidationError(f"placeholder {node.name} is {dtype.name}, which random inputs cannot fill: "
                                  f"give sample inputs with --inputs")
        if dtype.is_floating:
            feeds[node.name] = rng.standard_normal(dims).astype(dtype.as_numpy_dtype)
        elif dtype == tf.bool:
            feeds[node.name] = np.zeros(dims, bool)
        else:
            feeds[node.name] = np.zeros(dims, dtype.as_numpy_dtype)
    return feeds


def _tensor_name(ref: str) -> str:
    name, port, _ = parse_input(ref)
    return f"{name}:{port}"


class _Runner:
    """Runs graphs on the sample inputs, counting runs; checks feeds once."""

    def __init__(self, graph_def, feeds, fetches, report: ValidationReport, max_runs: int, progress):
        self.graph_def = graph_def
        self.feeds = {(_tensor_name(k)): np.asarray(v) for k, v in feeds.items()}
        self.fetches = fetches
        self.report = report
        self.max_runs = max_runs
        self.progress = progress

    def exhausted(self) -> bool:
        return self.report.runs >= self.max_runs

    def reference(self) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        """The float32 outputs, and max |value| of every observable float tensor."""
        import tensorflow as tf

        graph = self._import(self.graph_def)
        self._check_feeds(graph)
        for fetch in self.fetches:
            self._fetch(graph, fetch)
        observable = _observable_tensors(self.graph_def)
        peaks_ops = {}
        with graph.as_default(), tf.name_scope("amp_rewrite_validation"):
            for tensor_name in observable:
                tensor = graph.get_tensor_by_name(tensor_name)
                if tensor.dtype.is_floating and tensor_name not in self.feeds:
                    peaks_ops[tensor_name] = tf.reduce_max(tf.abs(tf.cast(tensor, tf.float32)))
        values = self._run(graph, [self._fetch(graph, f) for f in self.fetches] + list(peaks_ops.values()),
                           "float32 reference")
        outputs = dict(zip(self.fetches, values[:len(self.fetches)]))
        for name, value in outputs.items():
            value = np.asarray(value)
            if value.dtype.kind == "f" and value.size and np.any(np.isnan(value)):
                raise ValidationError(f"output {name} is NaN in float32 on these sample inputs; nothing to "
                                      f"compare the half graph with: give other sample inputs")
        peaks = {name: float(v) for name, v in zip(peaks_ops, values[len(self.fetches):])}
        for name, value in self.feeds.items():
            if value.dtype.kind == "f" and value.size:
                peaks[name] = float(np.max(np.abs(value)))
        return outputs, peaks

    def compare(self, graph_def, reference, tolerance: Tolerance) -> dict[str, float]:
        graph = self._import(graph_def)
        values = self._run(graph, [self._fetch(graph, f) for f in self.fetches], "check")
        return {f: tolerance.error(v, reference[f]) for f, v in zip(self.fetches, values)}

    def _import(self, graph_def):
        import tensorflow as tf

        from amp_rewrite.graph.flops import import_blocker

        blocker = import_blocker(graph_def)
        if blocker:
            raise ValidationError(f"cannot run the graph to validate it: {blocker}")
        graph = tf.Graph()
        try:
            with graph.as_default():
                tf.compat.v1.import_graph_def(graph_def, name="")
        except Exception as exc:  # noqa: BLE001 - whatever TensorFlow raises, the graph cannot run here
            text = getattr(exc, "message", None) or str(exc)
            raise ValidationError(f"cannot run the graph to validate it: TensorFlow does not import it: "
                                  f"{text.strip().splitlines()[0] if text.strip() else type(exc).__name__}") from None
        return graph

    def _check_feeds(self, graph) -> None:
        import tensorflow as tf

        for name, value in self.feeds.items():
            try:
                tensor = graph.get_tensor_by_name(name)
            except (KeyError, ValueError):
                raise ValidationError(f"sample input {name!r} names no tensor of the graph") from None
            if value.dtype.kind == "f" and value.size and not np.all(np.isfinite(value)):
                raise ValidationError(f"sample input {name!r} holds NaN or infinite values: give finite ones")
            try:
                dtype = tf.string if value.dtype.kind in "OSU" else tf.as_dtype(value.dtype)
            except TypeError:
                dtype = None
            if dtype != tensor.dtype:
                raise ValidationError(f"sample input {name!r} is {value.dtype}, the graph wants "
                                      f"{tensor.dtype.name}")
            if not tensor.shape.is_compatible_with(value.shape):
                raise ValidationError(f"sample input {name!r} has shape {list(value.shape)}, the graph "
                                      f"wants {tensor.shape}")
        fed = {node_name(n) for n in self.feeds}
        missing = [n.name for n in self.graph_def.node if n.op == "Placeholder" and n.name not in fed]
        if missing:
            raise ValidationError(f"no sample input for placeholder {missing[0]!r}"
                                  + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))

    def _fetch(self, graph, name):
        try:
            if ":" in name:
                return graph.get_tensor_by_name(name)
            op = graph.get_operation_by_name(name)
        except (KeyError, ValueError) as exc:
            raise ValidationError(f"fetch {name!r}: {str(exc).strip(chr(34)).splitlines()[0]}") from None
        return op.outputs[0] if op.outputs else op

    def _run(self, graph, fetches, label: str):
        import tensorflow as tf

        self.report.runs += 1
        if self.progress:
            self.progress(f"validation run {self.report.runs}/{self.max_runs}: {label}")
        config = tf.compat.v1.ConfigProto(allow_soft_placement=True)
        feed_dict = {graph.get_tensor_by_name(k): v for k, v in self.feeds.items()}
        with tf.compat.v1.Session(graph=graph, config=config) as sess:
            try:
                return sess.run(fetches, feed_dict)
            except tf.errors.OpError as exc:
                raise ValidationError(f"{label} run failed at node {getattr(exc.op, 'name', '?')}: "
                                      f"{exc.message.splitlines()[0]}") from None


def _observable_tensors(graph_def) -> list[str]:
    """Float outputs of main-graph nodes that a session can fetch (not in loop frames or cond branches)."""
    view = TypedGraph(graph_def)
    hidden = v1_loop_nodes(view) | view.main_nodes_after(("Switch", "RefSwitch"), ("Merge", "RefMerge"))
    tensors = []
    for i, node in enumerate(graph_def.node):
        outs = view.out_attrs[i]
        if i in hidden or node.op in ("Placeholder", "Const") or outs is None:
            continue
        for port in range(len(outs)):
            vid = view.output_vertex(i, port)
            if vid is not None and view.dtype(vid) in (DT_FLOAT, DT_HALF, DT_BFLOAT16, DT_DOUBLE):
                tensors.append(f"{node.name}:{port}")
    return tensors


def terminal_progress() -> Callable[[str], None] | None:
    """A progress printer for an interactive stderr, else None."""
    if not sys.stderr.isatty():
        return None
    return lambda line: print(f"\r{line:<78}", end="", file=sys.stderr, flush=True)
