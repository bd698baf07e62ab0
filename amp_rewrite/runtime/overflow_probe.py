"""Naming the op whose half output overflowed (``AMP_REWRITE_FIND_OVERFLOW=1``).

A skipped step says which gradients were not finite, not where the inf or NaN
was born. In this mode each rebuilt body of a rewritten ``tf.function`` gets
probes: for every float16/bfloat16 output, in the order the body lists its
nodes (forward before backward, as traced), whether all its values are
finite. When one is not, the step prints the first such node, its op, and how
to keep it in float32. A TF1 session's training step gets the same probes
over the half outputs the step runs (:func:`session_probe`), fetched with the
step and logged as a warning. The probes cost a reduction per half tensor, so
they are only added in this mode; the rewritten graph is otherwise unchanged.
"""

from __future__ import annotations

from amp_rewrite.environment import DENYLIST_ADD_ENV

HALF_TYPES = ("float16", "bfloat16")
# v1 control-flow ops have frame-bound outputs that cannot be read from outside their frame.
FRAME_OPS = frozenset({"Enter", "Exit", "Merge", "NextIteration", "Switch", "RefEnter"})
DENYLIST_ENV = DENYLIST_ADD_ENV


def half_outputs(graph) -> list:
    """The half-typed outputs of ``graph``'s ops, in node order."""
    return [tensor for op in graph.get_operations() if op.type not in FRAME_OPS
            for tensor in op.outputs if tensor.dtype.name in HALF_TYPES]


def advice(node: str, op_type: str) -> str:
    """How to keep ``node`` (of ``op_type``) in float32."""
    return (f"keep {op_type} in float32 with --deny-add {op_type} or "
            f"{DENYLIST_ENV}={op_type}, or only this node with --preserve {node}")


def add_probes(graph, function_name: str) -> None:
    """Adds to the FuncGraph ``graph`` a conditional print of its first non-finite half output.

    The print runs as a control output of the function, so it needs no data
    consumer; nothing else in the graph changes.
    """
    import tensorflow as tf

    tensors = half_outputs(graph)
    if not tensors:
        return
    with graph.as_default(), tf.name_scope("amp_rewrite_overflow_probe"):
        finite, line = _first_non_finite(tensors, f"tf.function {function_name}")

        def report():
            with tf.control_dependencies([tf.print(line, output_stream=_stderr())]):
                return tf.identity(line)

        probe = tf.cond(tf.reduce_all(finite), lambda: tf.constant(""), report)
    graph.control_outputs.append(probe.op)


def session_probe(graph, ops):
    """A string tensor of ``graph`` (a session's): "" or the line naming its first non-finite half output.

    Only the half outputs of ``ops`` (the ops a run executes anyway, in any
    order) outside v1 loops and conds are probed, so fetching the probe with
    that run needs no other feed; None when there are none.
    """
    import tensorflow as tf

    running = {op.name for op in ops}
    tensors = [t for t in half_outputs(graph) if t.op.name in running and not _in_v1_frame(t.op)]
    if not tensors:
        return None
    with graph.as_default(), tf.name_scope("amp_rewrite_overflow_probe"):
        finite, line = _first_non_finite(tensors, "session graph")
        return tf.where(tf.reduce_all(finite), tf.constant(""), line)


def _first_non_finite(tensors, where: str):
    """Per tensor whether it is all finite, and the line naming the first that is not."""
    import tensorflow as tf

    finite = tf.stack([tf.reduce_all(tf.math.is_finite(t)) for t in tensors])
    messages = tf.constant([
        f"output {t.value_index} of node '{t.op.name}' (op {t.op.type}, {t.dtype.name}); "
        + advice(t.op.name, t.op.type) for t in tensors])
    first = tf.argmin(tf.cast(finite, tf.int32), output_type=tf.int32)
    line = tf.strings.join([f"amp-rewrite: {where}: first non-finite half output in graph order: ",
                            tf.gather(messages, first)])
    return finite, line


def _in_v1_frame(op) -> bool:
    """Whether ``op`` runs inside a v1 while loop or cond, whose tensors cannot be read from outside."""
    return getattr(op, "_control_flow_context", None) is not None


def _stderr():
    import sys

    return sys.stderr
