"""A loss-scaled step without its loss scaling: the float32 variant a step trial times and may keep.

Loss scaling enters a step's graph when the step is built: a TF1 optimizer's
``compute_gradients``/``apply_gradients``
(:mod:`~amp_rewrite.runtime.loss_scale.tf1_optimizer`) build it into the
script's graph, and the patched tape and Keras optimizers
(:mod:`~amp_rewrite.runtime.loss_scale.tf2_tape`,
:mod:`~amp_rewrite.runtime.loss_scale.tf2_guarded_apply`) into the traced
``tf.function``. So the float32 graph a trial compares half with (the
script's own graph in a TF1 session, the traced body of a ``tf.function``)
scales its loss too, and checks every gradient for infs and NaNs before it
applies them: a step float32 never needed, at the cost of a pass over every
gradient, a conditional around the optimizer and the scale's update.

The float32 variant is that graph with the scaling taken out, node by node,
where the adapters built it (:mod:`~amp_rewrite.runtime.loss_scale.core`
names each part; nothing else is touched):

- the scale that seeds back-propagation (``amp_loss_scale_seed/scale``)
  becomes the constant 1: the gradients are the loss's own;
- each gradient's division by the scale (``MulNoNan`` under
  ``amp_loss_scale_unscale``) becomes an ``Identity`` of the gradient;
- the guard's predicate (``amp_loss_scale_apply/is_finite``) becomes the
  constant True, so only the apply branch runs and nothing reads the
  finiteness checks (a session prunes them). In a ``tf.function`` the guard
  (an ``If``) becomes a call of its apply branch: its skip branch reads the
  checks to name the variables at fault, and a conditional's inputs are
  computed whether the branch taken reads them or not, whereas the function
  runtime inlines a call and prunes the arguments it does not read. A TF1
  session keeps its guard a conditional (``If`` in control flow v2,
  ``Switch`` ops in v1): its skip branch reads nothing, the session lowers
  the conditional into the graph around the constant predicate, and it
  would not inline a call (its apply branch would run as a function of its
  own, its arguments passed one by one);
- the state's updates (``amp_loss_scale_update``: the schedule's, and the
  tape's count of non-finite losses in a row) assign nothing, and the
  state's reads there and in the seed become constants that nothing the
  step keeps reads (a ``tf.function`` runs every read it holds).

The loss-scale state stays where the half steps left it: a float32 step
neither grows nor shrinks the scale nor counts as a good or skipped step, so
a step that alternates between the two variants (a trial) keeps the half
steps' schedule, and a float32 verdict leaves a state that a later half body
(a fallback's, a new trace) continues from. (A TF1 session counts
non-finite losses from the half steps' reports alike.)

Building the variant costs a copy of the nodes that change; the TF1 session
imports it once per step, and a ``tf.function`` gets its functions rebuilt
once (:func:`amp_rewrite.runtime.tf2.concrete.reload_calling`). A step
without loss scaling is its own float32 variant: nothing is copied.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from amp_rewrite.graph.facts import function_input_source
from amp_rewrite.runtime.loss_scale.core import (
    APPLY_SCOPE,
    IS_FINITE,
    SEED_NAME,
    SEED_SCOPE,
    UNSCALE_SCOPE,
    UPDATE_SCOPE,
)

GUARD_OPS = ("If", "StatelessIf")
CALL_OP = "StatefulPartitionedCall"


def unscaled_nodes(nodes: Sequence) -> list | None:
    """A GraphDef's ``nodes`` (a TF1 step) with the loss scaling taken out; None when they hold none.

    The nodes given are not modified: those that change are copies, the
    others are the same objects. Names stay as they were.
    """
    found = _unscaled_all(nodes, guard_as_call=False)
    return found[0] if found is not None else None


def unscaled_function(fdef):
    """A copy of the FunctionDef ``fdef`` with the loss scaling taken out, or None when it holds none.

    Its references to an output whose op changed name it as the new op does.
    """
    found = _unscaled_all(fdef.node_def, guard_as_call=True)
    if found is None:
        return None
    nodes, outputs = found
    new = type(fdef)()
    new.CopyFrom(fdef)
    del new.node_def[:]
    new.node_def.extend(nodes)
    for key, ref in fdef.ret.items():
        new.ret[key] = _renamed_output(ref, outputs)
    return new


def _unscaled_all(nodes: Sequence, *, guard_as_call: bool) -> tuple[list, dict[str, tuple[str, str]]] | None:
    """The nodes without loss scaling, and per changed node whose output is named anew, (old name, new name).

    With ``guard_as_call``, the guard's conditional becomes a call of its apply branch.
    """
    predicates = {node.name for node in nodes if _is_predicate(node)}
    out, outputs = [], {}
    for node in nodes:
        new = _unscaled(node, predicates, guard_as_call=guard_as_call)
        if new is not node:
            before, after = _output_name(node.op), _output_name(new.op)
            if before != after and before is not None and after is not None:
                outputs[node.name] = (before, after)
        out.append(new)
    if all(new is node for new, node in zip(out, nodes)):
        return None
    return [_reading_renamed(node, outputs) for node in out], outputs


def _output_name(op: str) -> str | None:
    """The name of ``op``'s first output (a FunctionDef names an output by it), or None."""
    from amp_rewrite.graph.op_registry import OpRegistry

    op_def = OpRegistry.registry_op_def(op)
    return op_def.output_arg[0].name if op_def is not None and op_def.output_arg else None


def _reading_renamed(node, outputs: dict[str, tuple[str, str]]):
    """``node``, or a copy of it whose inputs name the renamed outputs by their new names."""
    inputs = [_renamed_output(ref, outputs) for ref in node.input]
    if inputs == list(node.input):
        return node
    new = type(node)()
    new.CopyFrom(node)
    del new.input[:]
    new.input.extend(inputs)
    return new


def _renamed_output(ref: str, outputs: dict[str, tuple[str, str]]) -> str:
    """A FunctionDef reference ``node:output:k``, with the output named anew where ``outputs`` says so."""
    parts = ref.split(":")
    if len(parts) == 3 and parts[0] in outputs and parts[1] == outputs[parts[0]][0]:
        return f"{parts[0]}:{outputs[parts[0]][1]}:{parts[2]}"
    return ref


def _unscaled(node, predicates: set[str], *, guard_as_call: bool):
    """``node`` as the float32 variant runs it: itself, or a changed copy."""
    scopes = node.name.split("/")[:-1]
    leaf = node.name.rsplit("/", 1)[-1]
    if node.name in predicates:
        return _constant(node, "bool", True)
    if guard_as_call and node.op in GUARD_OPS and node.input and function_input_source(node.input[0]) in predicates:
        return _call_of_then_branch(node)
    if node.op == "Identity" and _in(scopes, SEED_SCOPE) and _is(leaf, SEED_NAME):
        return _constant(node, node.attr["T"].type, 1)
    if node.op == "MulNoNan" and _in(scopes, UNSCALE_SCOPE):
        return _replaced(node, "Identity", [node.input[0]], {"T": node.attr["T"]})
    if node.op.startswith("Assign") and node.op.endswith("VariableOp") and _in(scopes, UPDATE_SCOPE):
        return _replaced(node, "NoOp", [], {})
    if node.op == "ReadVariableOp" and (_in(scopes, SEED_SCOPE) or _in(scopes, UPDATE_SCOPE)):
        # nothing the step keeps reads it: a function would still run the read (a stateful op)
        return _constant(node, node.attr["dtype"].type, 0)
    return node


def _is_predicate(node) -> bool:
    return (node.op == "Equal" and _is(node.name.rsplit("/", 1)[-1], IS_FINITE)
            and _in(node.name.split("/")[:-1], APPLY_SCOPE))


def _in(scopes: list[str], scope: str) -> bool:
    """Whether one of a node's enclosing ``scopes`` is ``scope`` (made unique by TensorFlow: ``scope_1``)."""
    return any(_is(name, scope) for name in scopes)


def _is(name: str, wanted: str) -> bool:
    return re.fullmatch(re.escape(wanted) + r"(_\d+)?", name) is not None


def _call_of_then_branch(node):
    """The guard's conditional as a call of its apply branch, on the same inputs but the predicate."""
    attrs = {"f": node.attr["then_branch"], "Tin": node.attr["Tin"], "Tout": node.attr["Tout"]}
    return _replaced(node, CALL_OP, node.input[1:], attrs)


def _constant(node, dtype, value):
    """``node`` as a scalar constant ``value`` of ``dtype`` (a name or a DataType enum), after its control inputs."""
    import tensorflow as tf
    from tensorflow.core.framework import attr_value_pb2

    dtype = tf.as_dtype(dtype)
    attrs = {"dtype": attr_value_pb2.AttrValue(type=dtype.as_datatype_enum),
             "value": attr_value_pb2.AttrValue(tensor=tf.make_tensor_proto(value, dtype=dtype))}
    return _replaced(node, "Const", [], attrs)


def _replaced(node, op: str, inputs, attrs: dict):
    """A copy of ``node`` running ``op`` on ``inputs`` with ``attrs``; its control inputs and device stay."""
    new = type(node)()
    new.name = node.name
    new.op = op
    new.device = node.device
    new.input.extend([ref for ref in inputs if not ref.startswith("^")])
    new.input.extend(ref for ref in node.input if ref.startswith("^"))
    for key, value in attrs.items():
        new.attr[key].CopyFrom(value)
    return new
