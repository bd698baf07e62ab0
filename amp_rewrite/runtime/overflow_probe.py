"""Naming the op whose half output overflowed (``AMP_REWRITE_FIND_OVERFLOW=1``).

A skipped step says which gradients were not finite, not where the inf or NaN
was born. In this mode each rebuilt body of a rewritten ``tf.function`` gets
probes: for every float16/bfloat16 output, in the order the body lists its
nodes (forward before backward, as traced), whether all its values are
finite. When one is not, the step prints the first such node, its op, and how
to keep it in float32. A half value made by a Cast (one the rewrite inserted
before half consumers, or an existing Cast it retyped) was born in the Cast's
float32 producer: that producer is named, in its place in the order, with the
consumers that made the Cast, and the advice keeps those consumers float32, so
the value never leaves float32. A TF1 session's training step gets the same probes
over the half outputs the step runs (:func:`session_probe`), fetched with the
step and logged as a warning. The probes cost a reduction per half tensor, so
they are only added in this mode; the rewritten graph is otherwise unchanged.
"""

from __future__ import annotations

import re

from amp_rewrite import tf_internals
from amp_rewrite.environment import DENYLIST_ADD_ENV, KEEP_FLOAT32_ENV

HALF_TYPES = ("float16", "bfloat16")
# v1 control-flow ops have frame-bound outputs that cannot be read from outside their frame.
FRAME_OPS = frozenset({"Enter", "Exit", "Merge", "NextIteration", "Switch", "RefEnter"})
DENYLIST_ENV = DENYLIST_ADD_ENV


def half_outputs(graph) -> list:
    """The half-typed outputs of ``graph``'s ops, in node order; a Cast's at its producer's place."""
    ops = graph.get_operations()
    order = {op.name: i for i, op in enumerate(ops)}
    tensors = [tensor for op in ops if op.type not in FRAME_OPS
               for tensor in op.outputs if tensor.dtype.name in HALF_TYPES]
    return sorted(tensors, key=lambda t: order.get(_origin(t).op.name, order[t.op.name]))


def describe(tensor) -> str:
    """Which op made the non-finite half value ``tensor``, and how to keep it float32."""
    origin = _origin(tensor)
    if origin is tensor:
        return (f"output {tensor.value_index} of node '{tensor.op.name}' (op {tensor.op.type}, "
                f"{tensor.dtype.name}); " + advice(tensor.op.name, tensor.op.type))
    consumers = sorted({op.name for op in tensor.consumers()})
    return (f"output {origin.value_index} of node '{origin.op.name}' (op {origin.op.type}, {origin.dtype.name}) "
            f"is not finite in {tensor.dtype.name}, where it is cast for its half consumers "
            + ", ".join(f"'{name}'" for name in consumers) + "; " + consumers_advice(consumers))


def _origin(tensor):
    """The float32 tensor a Cast to half read, or ``tensor`` itself when no Cast made it."""
    op = tensor.op
    if op.type == "Cast" and op.inputs and op.inputs[0].dtype.name not in HALF_TYPES:
        return op.inputs[0]
    return tensor


def advice(node: str, op_type: str) -> str:
    """How to keep ``node`` (of ``op_type``) in float32."""
    return (f"keep {op_type} in float32 with --deny-add {op_type} or "
            f"{DENYLIST_ENV}={op_type}, or only this node with --preserve {node}")


def consumers_advice(consumers: list[str]) -> str:
    """How to keep the value read by ``consumers`` in float32: keep them float32 (a name pattern)."""
    names = "|".join(re.escape(name) for name in consumers)
    return (f"keep them in float32 so the value stays float32: {KEEP_FLOAT32_ENV}='(^|::)({names})$' "
            "(--keep-float32 on the command line)")


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

    messages = tf.constant([describe(t) for t in tensors])  # before the probe's own ops consume them
    finite = tf.stack([tf.reduce_all(tf.math.is_finite(t)) for t in tensors])
    first = tf.argmin(tf.cast(finite, tf.int32), output_type=tf.int32)
    line = tf.strings.join([f"amp-rewrite: {where}: first non-finite half output in graph order: ",
                            tf.gather(messages, first)])
    return finite, line


def _in_v1_frame(op) -> bool:
    """Whether ``op`` runs inside a v1 while loop or cond, whose tensors cannot be read from outside."""
    return tf_internals.control_flow_context(op) is not None


def _stderr():
    import sys

    return sys.stderr
