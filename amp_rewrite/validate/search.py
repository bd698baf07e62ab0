"""The search: rewrite, check against float32, and return half regions to float32 until the check passes.

:func:`validated_rewrite` drives the steps :mod:`amp_rewrite.validate`
describes: the reference run, the risk rules, the first check, then
:func:`_return_regions`, a binary search over the :func:`half_regions`
ordered riskiest first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import numpy as np

from amp_rewrite.config import Config
from amp_rewrite.errors import UsageError
from amp_rewrite.graph.facts import node_name
from amp_rewrite.pipeline import RewriteResult, fetched_nodes, rewrite
from amp_rewrite.validate.report import ValidationReport
from amp_rewrite.validate.risk import Risks, float16_risks
from amp_rewrite.validate.runner import Runner
from amp_rewrite.validate.tolerance import METRICS, Tolerance


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
        GraphError: a fetch names no node, or a port the node does not have.
        ValidationError: bad sample inputs (missing, wrong shape or dtype).
    """
    config = config if config is not None else Config.from_env()
    tolerance = tolerance or Tolerance()
    _check_limits(tolerance, max_runs)
    fetches = list(fetches)
    fetched_nodes(graph_def, fetches)  # the rewrite's own check, before the float32 run meets a bad fetch
    report = ValidationReport()
    runner = Runner(graph_def, feeds, fetches, report, max_runs, progress)
    reference, peaks = runner.reference()
    risks = float16_risks(graph_def, peaks, range_fraction) if config.target == "float16" else Risks()
    report.range_kept, report.pattern_kept = risks.range_kept, risks.pattern_kept
    attempt = _CheckedRewrite(graph_def, replace(config, fetches=tuple(fetches), release=tuple(sorted(risks.release))),
                     risks.keep(), runner, reference, tolerance)
    result, error, report.errors = attempt({})
    report.passed = error <= 1.0
    if not report.passed:
        regions = half_regions(result, peaks)
        report.regions_total = len(regions)
        result, report.passed = _return_regions(regions, attempt, result, error, report)
    return replace(result, validation=report), report


def _check_limits(tolerance: Tolerance, max_runs: int) -> None:
    """Refuses a metric no :class:`Tolerance` knows (set after it was made) and too few runs for a check."""
    if tolerance.metric not in METRICS:
        raise UsageError(f"unknown metric {tolerance.metric!r}; choose one of {', '.join(METRICS)}")
    if not isinstance(max_runs, int) or max_runs < 2:
        raise UsageError(f"max_runs {max_runs!r}: must be an integer >= 2 (a float32 run and a check)")


class Attempt(NamedTuple):
    """One rewrite checked against the float32 outputs."""

    result: RewriteResult
    error: float  # the worst output's error, in tolerances (1.0 is the limit)
    errors: dict


@dataclass(frozen=True)
class _CheckedRewrite:
    """Rewrites the float32 graph with some nodes kept float32 and checks it against the reference outputs.

    Attributes:
        graph_def: the float32 graph.
        config: the rewrite configuration, with the fetches and the released nodes set.
        keep: node → reason, for the nodes every attempt keeps float32 (the risk rules').
        runner: runs the graphs and counts the runs.
        reference: the float32 outputs, by fetch.
        tolerance: how close the outputs must be.
    """

    graph_def: Any
    config: Config
    keep: dict[str, str]
    runner: Runner
    reference: dict
    tolerance: Tolerance

    def __call__(self, extra: dict[str, str]) -> Attempt:
        """The rewrite keeping ``extra`` float32 too, and its errors."""
        config = replace(self.config, keep_float32=tuple(sorted({**self.keep, **extra}.items())))
        result = rewrite(self.graph_def, config=config)
        errors = self.runner.compare(result.graph_def, self.reference, self.tolerance)
        return Attempt(result, max(errors.values(), default=0.0), errors)


def _return_regions(regions: list[list[str]], attempt: _CheckedRewrite, result: RewriteResult, error: float,
                    report: ValidationReport) -> tuple[RewriteResult, bool]:
    """Finds regions whose return to float32 makes the check pass (see :mod:`amp_rewrite.validate`).

    ``result`` and ``error`` are the last check's; the search starts from them.
    """
    runner = attempt.runner
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
