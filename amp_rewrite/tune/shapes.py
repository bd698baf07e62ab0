"""What a node to be tuned reads: each input's dtype, static shape and, for a non-float input, its value.

Shapes come from TensorFlow's shape inference, as for the FLOP share
(:mod:`amp_rewrite.graph.flops`): main-graph nodes from an import of the graph
that wraps only them and their producers, function nodes from their
FunctionDef built as a graph (once per function). A non-float input (the
``input_sizes`` of a ``Conv2DBackpropInput``) must be a constant, since its
value decides the work. Anything not static makes the node's answer a string
saying why, and the tuner leaves the node to the lists.

Training graphs rarely know their batch size: a placeholder, a dataset's
``IteratorGetNext`` or a function's argument is ``[?, 32, 32, 3]``. Every
shape attr whose first dimension is unknown is given ``batch`` (the tuner's
``batch_hint``) before inference, so such ops are timed at that batch; a
half kernel's speed relative to float32 changes little with the batch once
it is a few dozen. Other unknown dimensions stay unknown.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from amp_rewrite import tf_internals
from amp_rewrite.graph.facts import DT_FLOAT, DTYPE_NAMES
from amp_rewrite.graph.importable import import_blocker

logger = logging.getLogger(__name__)

#: Inputs larger than this many elements are not timed (memory, and the budget).
MAX_ELEMENTS = 1 << 26


@dataclass(frozen=True)
class InputSpec:
    """One input of a tuned op: dtype enum, static shape, and the serialized TensorProto of a non-float value."""

    dtype: int
    shape: tuple[int, ...]
    value: bytes | None = None

    def describe(self) -> str:
        return f"{DTYPE_NAMES.get(self.dtype, f'dtype{self.dtype}')}{list(self.shape)}".replace(" ", "")


def input_specs(graph, nodes: list[int], *, batch: int | None = None, traced: Mapping[str, Any] | None = None
                ) -> tuple[dict[int, tuple[InputSpec, ...] | str], set[int]]:
    """Per node index of the typed view ``graph``: its inputs' specs, or why they are not static.

    Also returns the nodes whose graph or function needed ``batch`` for an
    unknown first dimension (None: no hint, such shapes stay unknown).
    ``traced`` maps function names to the graphs TensorFlow traced them into
    (the runtime has them): their ops know the shapes of variables, which a
    FunctionDef does not record, so they are read instead of a rebuilt body.
    """
    traced = traced or {}
    found: dict[int, tuple[InputSpec, ...] | str] = {}
    hinted: set[int] = set()
    main = [i for i in nodes if graph.body_of[i] == 0]
    if main:
        specs, was_hinted = _main_specs(graph, main, batch)
        found.update(specs)
        hinted.update(main if was_hinted else ())
    by_function: dict[str, list[int]] = {}
    for i in nodes:
        if graph.body_of[i] != 0:
            by_function.setdefault(graph.bodies[graph.body_of[i]].function, []).append(i)
    for name in [name for name in by_function if name in traced]:
        members = by_function.pop(name)
        specs = _traced_specs(traced[name], graph, members, batch)
        found.update({i: spec for i, (spec, _) in specs.items()})
        hinted.update(i for i, (_, was_hinted) in specs.items() if was_hinted)
    if by_function:
        with _library_graph(graph.graph_def).as_default():
            for name, members in by_function.items():
                specs, was_hinted = _function_specs(graph, name, members, batch)
                found.update(specs)
                hinted.update(members if was_hinted else ())
    return found, hinted


def _traced_specs(traced_graph, graph, nodes: list[int], batch: int | None
                  ) -> dict[int, tuple[tuple[InputSpec, ...] | str, bool]]:
    """Per node: its specs read off the traced graph, and whether an unknown first dimension was given ``batch``.

    A traced graph's shapes are inferred already, so the hint cannot be fed
    to inference as for a rebuilt body; an input whose only unknown
    dimension is the first (the batch a Keras step is traced with) is timed
    at ``batch`` instead.
    """
    found: dict[int, tuple[tuple[InputSpec, ...] | str, bool]] = {}
    for i in nodes:
        try:
            op = traced_graph.get_operation_by_name(graph.nodes[i].name)
        except (KeyError, ValueError):
            found[i] = ("input shapes unknown (not in the traced graph)", False)
            continue
        found[i] = (_specs(op, batch=batch), batch is not None and any(_batch_only(t.shape) for t in op.inputs))
    return found


def _batch_only(shape) -> bool:
    """Whether the first dimension is the only unknown one of a shape of known rank."""
    if shape.rank is None or shape.rank == 0 or shape.is_fully_defined():
        return False
    dims = shape.as_list()
    return dims[0] is None and all(d is not None for d in dims[1:])


def _library_graph(graph_def):
    """A scratch graph holding the library, so that a function body can call (or branch to) the others."""
    import tensorflow as tf

    scratch = tf.Graph()
    library_only = type(graph_def)()
    library_only.library.CopyFrom(graph_def.library)
    with scratch.as_default():
        tf.compat.v1.import_graph_def(library_only, name="")
    return scratch


def _main_specs(graph, nodes: list[int], batch: int | None):
    blocker = import_blocker(graph.graph_def)
    if blocker:
        return dict.fromkeys(nodes, f"input shapes unknown ({blocker})"), False
    graph_def, was_hinted = graph.graph_def, False
    if batch is not None:
        graph_def = type(graph.graph_def)()
        graph_def.CopyFrom(graph.graph_def)
        was_hinted = _give_batch(graph_def.node, batch)
    try:
        ops = tf_internals.import_selected_ops(graph_def, [graph.nodes[i].name for i in nodes])
    except Exception as exc:  # noqa: BLE001 - a graph TensorFlow cannot import has no static shapes here
        logger.debug("tuning: graph does not import: %s", exc)
        return dict.fromkeys(nodes, "input shapes unknown (TensorFlow cannot import the graph)"), False
    by_name = {op.name: op for op in ops}
    return {i: _specs(by_name[graph.nodes[i].name]) for i in nodes}, was_hinted


def _function_specs(graph, function: str, nodes: list[int], batch: int | None):
    fdef = next(b.fdef for b in graph.bodies if b.function == function)
    was_hinted = False
    if batch is not None:
        fdef = type(fdef).FromString(fdef.SerializeToString())
        was_hinted = _give_batch(fdef.node_def, batch)
        for arg_attrs in fdef.arg_attr.values():
            was_hinted = _give_batch_to_attrs(arg_attrs.attr, batch) or was_hinted
    try:
        built = tf_internals.function_def_to_graph(fdef)
    except Exception as exc:  # noqa: BLE001 - a function we cannot build has no static shapes here
        logger.debug("tuning: function %s does not build: %s", function, exc)
        return dict.fromkeys(nodes, f"input shapes unknown (function {function} does not build)"), False
    return {i: _specs(built.get_operation_by_name(graph.nodes[i].name)) for i in nodes}, was_hinted


# The gradient ops whose input k holds the shape of their output, usually
# computed at run time (ShapeN) rather than a constant.
_SIZES_INPUT = {
    "Conv2DBackpropInput": 0, "Conv2DBackpropFilter": 1, "Conv3DBackpropInputV2": 0, "Conv3DBackpropFilterV2": 1,
    "DepthwiseConv2dNativeBackpropInput": 0, "DepthwiseConv2dNativeBackpropFilter": 1,
}
_SHAPE_ATTRS = ("shape", "shapes", "output_shapes", "_output_shapes")


def _give_batch(nodes, batch: int) -> bool:
    """Sets every unknown first dimension of the nodes' shape attrs to ``batch``; whether any was."""
    changed = False
    for node in nodes:
        changed = _give_batch_to_attrs(node.attr, batch) or changed
    return changed


def _give_batch_to_attrs(attrs, batch: int) -> bool:
    changed = False
    for name in _SHAPE_ATTRS:
        if name not in attrs:
            continue
        value = attrs[name]
        for shape in ([value.shape] if value.HasField("shape") else list(value.list.shape)):
            if not shape.unknown_rank and shape.dim and shape.dim[0].size < 0:
                shape.dim[0].size = batch
                changed = True
    return changed


def _specs(op, *, batch: int | None = None) -> tuple[InputSpec, ...] | str:
    """The op's input specs; with ``batch``, an input whose only unknown dimension is the first is given it."""
    import tensorflow as tf

    specs = []
    for k, tensor in enumerate(op.inputs):
        if batch is not None and _batch_only(tensor.shape):
            dims = [batch, *tensor.shape.as_list()[1:]]
        elif tensor.shape.is_fully_defined():
            dims = tensor.shape.as_list()
        else:
            return f"input shapes unknown (input {k} is {tensor.shape})"
        shape = tuple(int(d) for d in dims)
        if math.prod(shape) > MAX_ELEMENTS:
            return f"input {k} is too large to time ({list(shape)})"
        dtype = tensor.dtype.as_datatype_enum
        if dtype == DT_FLOAT:
            specs.append(InputSpec(dtype, shape))
            continue
        value = tf.get_static_value(tensor)
        if value is None and _SIZES_INPUT.get(op.type) == k and op.outputs[0].shape.is_fully_defined():
            # a gradient's sizes input is the shape it produces, which inference found
            value = np.array(op.outputs[0].shape.as_list(), dtype=tensor.dtype.as_numpy_dtype)
        if value is None:
            return f"input {k} ({tensor.dtype.name}) is not a constant"
        specs.append(InputSpec(dtype, shape, tf.make_tensor_proto(value).SerializeToString(deterministic=True)))
    return tuple(specs)
