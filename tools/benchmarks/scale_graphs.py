"""Large GraphDefs for the scale benchmark and the linear-work test: synthetic towers and replicas.

:func:`synthetic_graph` writes NodeDefs directly (no TensorFlow graph
building), so a million-node graph takes seconds. Each tower is a chain of
dense blocks that exercises every colour: ``MatMul`` (allow), ``BiasAdd`` and
``Relu`` (infer/clear), ``Identity`` (clear), and every fourth block an
``Exp`` (deny) whose result is added back (infer), so deny paint, infer
propagation, Casts in both directions and Const folding all happen.

:func:`replicate` puts K renamed copies of a real graph into one GraphDef,
as many towers or an unrolled model would.
"""

from __future__ import annotations

DT_FLOAT = 1


def _const(graph_def, name: str, shape: tuple[int, ...], value: float):
    import numpy as np
    from tensorflow.python.framework import tensor_util

    node = graph_def.node.add(name=name, op="Const")
    node.attr["dtype"].type = DT_FLOAT
    node.attr["value"].tensor.CopyFrom(
        tensor_util.make_tensor_proto(np.full(shape, value, dtype=np.float32)))
    return node


def synthetic_graph(nodes: int, *, depth: int = 40, width: int = 8):
    """A float32 GraphDef of about ``nodes`` nodes: towers of ``depth`` dense blocks.

    Returns:
        (graph_def, fetches): the graph and the name of every tower's output.
    """
    from tensorflow.core.framework import graph_pb2

    graph_def = graph_pb2.GraphDef()
    x = graph_def.node.add(name="x", op="Placeholder")
    x.attr["dtype"].type = DT_FLOAT
    x.attr["shape"].shape.dim.add(size=2)
    x.attr["shape"].shape.dim.add(size=width)
    # Consts are shared by every tower: a real graph's weights are ~1 node per layer,
    # and a million-node graph of distinct weights would only measure numpy.
    weights = [_const(graph_def, f"w{b}", (width, width), 0.05 + 0.001 * b).name for b in range(depth)]
    bias = _const(graph_def, "bias", (width,), 0.01).name

    def add(name, op, inputs, **type_attrs):
        node = graph_def.node.add(name=name, op=op, input=inputs)
        for attr in type_attrs.get("attrs", ("T",)):
            node.attr[attr].type = DT_FLOAT
        return name

    per_tower = 1 + depth * 4 + (depth + 3) // 4 * 2
    fetches = []
    for t in range((max(nodes, per_tower) - depth - 3) // per_tower + 1):
        prev = add(f"t{t}/in", "Identity", ["x"])
        for b in range(depth):
            p = f"t{t}/b{b}/"
            mm = graph_def.node.add(name=p + "MatMul", op="MatMul", input=[prev, weights[b]])
            mm.attr["T"].type = DT_FLOAT
            mm.attr["transpose_a"].b = False
            mm.attr["transpose_b"].b = False
            biased = add(p + "BiasAdd", "BiasAdd", [mm.name, bias])
            relu = add(p + "Relu", "Relu", [biased])
            prev = add(p + "Identity", "Identity", [relu])
            if b % 4 == 3:
                exp = add(p + "Exp", "Exp", [prev])
                prev = add(p + "Add", "AddV2", [prev, exp])
        fetches.append(add(f"t{t}/out", "Identity", [prev]))
    return graph_def, fetches


def _renamed(ref: str, prefix: str) -> str:
    return "^" + prefix + ref[1:] if ref.startswith("^") else prefix + ref


def replicate(graph_def, copies: int, fetches: list[str]):
    """``copies`` copies of ``graph_def``'s nodes, copy k's names prefixed ``r{k}/``.

    The function library is kept once; colocation constraints are renamed
    with their nodes. Returns (graph_def, fetches of every copy).
    """
    from tensorflow.core.framework import graph_pb2

    result = graph_pb2.GraphDef()
    result.versions.CopyFrom(graph_def.versions)
    result.library.CopyFrom(graph_def.library)
    all_fetches = []
    for k in range(copies):
        prefix = f"r{k}/"
        for node in graph_def.node:
            new = result.node.add()
            new.CopyFrom(node)
            new.name = prefix + node.name
            del new.input[:]
            new.input.extend(_renamed(ref, prefix) for ref in node.input)
            if "_class" in node.attr:
                values = new.attr["_class"].list.s
                renamed = [b"loc:@" + prefix.encode() + v[5:] if v.startswith(b"loc:@") else v for v in values]
                del values[:]
                values.extend(renamed)
        all_fetches += [prefix + f for f in fetches]
    return result, all_fetches
