"""Each node's op time in one traced step, read from the ``RunMetadata`` step stats of a TF1 session.

The runtime's profile (:mod:`amp_rewrite.runtime.profile`) prints them as a
table; ``--tune`` (:mod:`amp_rewrite.tune.graph_sessions`) gives them to the
choice of which regions of a step stay float32.
"""

from __future__ import annotations

from dataclasses import dataclass

#: DataType enum → the precision a profile names.
PRECISIONS = {1: "float32", 19: "float16", 14: "bfloat16", 2: "float64"}


@dataclass(frozen=True)
class OpTime:
    """One node's time in the profiled step (summed over its runs), its op and its output precision."""

    node: str
    op: str
    micros: float
    precision: str


def step_stats_ops(step_stats) -> list[OpTime]:
    """Per node: its op (from the timeline label), summed op time and first output's dtype."""
    found: dict[str, list] = {}
    for device in step_stats.dev_stats:
        for stats in device.node_stats:
            if stats.node_name in ("_SOURCE", "_SINK") or "(" not in stats.timeline_label:
                continue
            op = stats.timeline_label.split(" = ", 1)[-1].split("(", 1)[0].strip()
            dtype = stats.output[0].tensor_description.dtype if stats.output else 0
            entry = found.setdefault(stats.node_name, [op, 0.0, PRECISIONS.get(dtype, "other" if dtype else "-")])
            entry[1] += stats.op_end_rel_micros - stats.op_start_rel_micros
    return [OpTime(node, op, micros, precision) for node, (op, micros, precision) in found.items()]
