"""What goes into the validation runs and what they can observe.

:func:`random_feeds` makes sample inputs for every Placeholder;
:func:`observable_tensors` lists the float tensors a session can fetch, whose
largest magnitude the reference run records for the range rule.
"""

from __future__ import annotations

import numpy as np

from amp_rewrite.graph.facts import DT_BFLOAT16, DT_DOUBLE, DT_FLOAT, DT_HALF
from amp_rewrite.graph.typed_graph import TypedGraph
from amp_rewrite.pipeline import v1_loop_nodes
from amp_rewrite.validate.report import ValidationError


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


def observable_tensors(graph_def) -> list[str]:
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
