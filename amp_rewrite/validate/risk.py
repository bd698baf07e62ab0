"""The risk rules: nodes float16 is known to break, kept float32 before any check run.

- :func:`range_rule`: a node that produces or reads a tensor beyond a share
  of the float16 range on the reference run (casting that tensor into any
  half consumer would overflow), and a float32 weight beyond it;
- :func:`pattern_rules`: softmax and exp-sum reductions; an epsilon below
  half's smallest normal added before a division, square root, reciprocal
  or log; layer-norm statistics, whose elementwise tail is released from
  the deny list so that it may run in half.

bfloat16 has float32's range, so :func:`float16_risks` is only asked for float16.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from amp_rewrite.graph.facts import DT_FLOAT, FLOAT16_MAX, node_name, tensor_name

HALF_MIN_NORMAL = 6.103515625e-05
_ELEMENTWISE = frozenset({"Sub", "Mul", "Add", "AddV2", "RealDiv", "Neg", "BiasAdd"})
_EPSILON_READERS = frozenset({"RealDiv", "Div", "Rsqrt", "Sqrt", "Reciprocal", "Inv", "Log", "Pow"})


@dataclass(frozen=True)
class Risks:
    """What the risk rules keep float32, and the nodes they release from the deny list.

    Attributes:
        range_kept: node → the largest |value| seen, beyond the range limit.
        pattern_kept: node → the pattern's reason, for nodes the range rule did not keep.
        release: layer-norm tails that may run in half.
    """

    range_kept: dict[str, float] = field(default_factory=dict)
    pattern_kept: dict[str, str] = field(default_factory=dict)
    release: frozenset[str] = frozenset()

    def keep(self) -> dict[str, str]:
        """Every node kept float32, with its reason: the range rule's first, then the patterns'."""
        reasons = {n: f"validation: |value| reaches {v:g}, beyond the half range kept" for n, v in
                   self.range_kept.items()}
        reasons.update(self.pattern_kept)
        return reasons


def float16_risks(graph_def, peaks: dict[str, float], range_fraction: float) -> Risks:
    """Both rules for a float16 rewrite; ``range_fraction`` is the share of the float16 range allowed."""
    range_kept = range_rule(graph_def, peaks, FLOAT16_MAX * range_fraction)
    pattern_keep, release = pattern_rules(graph_def)
    pattern_kept = {n: r for n, r in pattern_keep.items() if n not in range_kept}
    return Risks(range_kept, pattern_kept, frozenset(release))


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
            tensor = tensor_name(ref)
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
