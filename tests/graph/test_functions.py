"""Rewriting across function, While, If and call boundaries (tf.function graphs)."""

import helpers
import numpy as np
import pytest
import tensorflow as tf
from helpers import F16, F32, assert_same_outputs_within_half, rng, tf1

from amp_rewrite.paint.explain import disagreements
from amp_rewrite.report.grappler import grappler_rewrite

R = rng(11)
W = (R.standard_normal((16, 16)) * 0.3).astype(np.float32)
U = (R.standard_normal((16, 16)) * 0.3).astype(np.float32)


def amp(graph_def, fetches=None, **fields):
    """The rewrite, with every node's reason (function bodies included) checked against its dtype."""
    result = helpers.amp(graph_def, fetches, **fields)
    assert disagreements(result) == []
    return result


def functions(graph_def) -> dict:
    return {f.signature.name: f for f in graph_def.library.function}


def half_ops(fdef, op):
    return [n for n in fdef.node_def if n.op == op and n.attr["T"].type == F16]


def assert_library_consistent(graph_def):
    """Every called function exists; call type attrs match the callee's signature."""
    library = functions(graph_def)
    bodies = [("main", graph_def.node)] + [(name, f.node_def) for name, f in library.items()]
    for where, nodes in bodies:
        for node in nodes:
            if node.op in ("PartitionedCall", "StatefulPartitionedCall"):
                callee = library[node.attr["f"].func.name]
                assert list(node.attr["Tin"].list.type) == [a.type for a in callee.signature.input_arg], where
                assert list(node.attr["Tout"].list.type) == [a.type for a in callee.signature.output_arg], where
            if node.op in ("While", "StatelessWhile"):
                types = list(node.attr["T"].list.type)
                for attr in ("body", "cond"):
                    callee = library[node.attr[attr].func.name]
                    assert [a.type for a in callee.signature.input_arg] == types, (where, attr)
                assert [a.type for a in library[node.attr["body"].func.name].signature.output_arg] == types
            if node.op in ("If", "StatelessIf"):
                for attr in ("then_branch", "else_branch"):
                    callee = library[node.attr[attr].func.name]
                    assert [a.type for a in callee.signature.input_arg] == list(node.attr["Tin"].list.type)
                    assert [a.type for a in callee.signature.output_arg] == list(node.attr["Tout"].list.type)


def rnn_graph():
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [10, 4, 16], name="x")
        w, u = tf.constant(W, name="w"), tf.constant(U, name="u")

        @tf.function
        def rnn(xs):
            def body(i, h):
                return i + 1, tf.tanh(tf.matmul(xs[i], w) + tf.matmul(h, u))

            return tf.while_loop(lambda i, h: i < 10, body, [0, tf.zeros([4, 16])])[1]

        tf.identity(rnn(x), name="y")
    return g.as_graph_def(), {"x": R.standard_normal((10, 4, 16)).astype(np.float32)}


def test_while_rnn_runs_in_half_with_no_casts_per_iteration():
    gd, feeds = rnn_graph()
    result = amp(gd, ["y"])
    out = result.graph_def
    body = next(f for name, f in functions(out).items() if name.startswith("while_body"))
    assert len(half_ops(body, "MatMul")) == 2 and len(half_ops(body, "Tanh")) == 1
    assert not [n for n in body.node_def if n.op == "Cast"]
    assert result.report()["casts_in_loop_bodies"] == []
    assert_library_consistent(out)
    _, got = assert_same_outputs_within_half(gd, out, ["y"], feeds)
    assert got[0].dtype == np.float32


def test_grappler_casts_inside_the_same_loop_every_iteration():
    gd, _ = rnn_graph()
    theirs, _ = grappler_rewrite(gd, ["y"])
    body = next(f for name, f in functions(theirs).items() if name.startswith("while_body"))
    assert len([n for n in body.node_def if n.op == "Cast"]) >= 3


def test_loop_variable_fed_by_a_deny_op_stays_float32_without_casts_per_iteration():
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [4, 16], name="x")
        w = tf.constant(W * 0.1, name="w")

        @tf.function
        def loop(h):
            def body(i, h):
                return i + 1, tf.exp(tf.reduce_mean(h, axis=1, keepdims=True) * 0.1) * h

            return tf.while_loop(lambda i, h: i < 3, body, [0, tf.matmul(h, w)])[1]

        tf.identity(loop(x), name="y")
    gd = g.as_graph_def()
    result = amp(gd, ["y"])
    out = result.graph_def
    body = next(f for name, f in functions(out).items() if name.startswith("while_body"))
    assert not [n for n in body.node_def if n.op == "Cast"]
    assert_library_consistent(out)
    assert_same_outputs_within_half(gd, out, ["y"], {"x": R.standard_normal((4, 16)).astype(np.float32)})


def test_cond_branches_and_the_if_agree_on_types():
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [4, 16], name="x")
        flag = tf1.placeholder(tf.bool, [], name="flag")
        w = tf.constant(W, name="w")

        @tf.function
        def f(h, flag):
            h = tf.matmul(h, w)
            h = tf.cond(flag, lambda: tf.nn.relu(h), lambda: tf.sigmoid(h))
            return tf.matmul(h, w)

        tf.identity(f(x, flag), name="y")
    gd = g.as_graph_def()
    out = amp(gd, ["y"]).graph_def
    assert_library_consistent(out)
    branches = [f for name, f in functions(out).items() if "cond_true" in name or "cond_false" in name]
    assert branches and all(a.type == F16 for f in branches for a in f.signature.output_arg)
    for value in (True, False):
        feeds = {"x": R.standard_normal((4, 16)).astype(np.float32), "flag": np.array(value)}
        assert_same_outputs_within_half(gd, out, ["y"], feeds)


def test_nested_functions_are_rewritten_through_both_calls():
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [4, 16], name="x")
        w = tf.constant(W, name="w")

        @tf.function
        def inner(h):
            return tf.nn.relu(tf.matmul(h, w))

        @tf.function
        def outer(h):
            return tf.matmul(inner(h), w)

        tf.identity(outer(x), name="y")
    gd = g.as_graph_def()
    result = amp(gd, ["y"])
    out = result.graph_def
    inner_fn = next(f for name, f in functions(out).items() if "inner" in name)
    assert inner_fn.signature.input_arg[0].type == F16 and inner_fn.signature.output_arg[0].type == F16
    assert not [n for f in functions(out).values() for n in f.node_def if n.op == "Cast"]
    assert_library_consistent(out)
    assert_same_outputs_within_half(gd, out, ["y"], {"x": R.standard_normal((4, 16)).astype(np.float32)})


def test_tensor_array_written_inside_a_while_loop_runs():
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [5, 4, 16], name="x")
        w = tf.constant(W, name="w")

        @tf.function
        def f(xs):
            ta = tf.TensorArray(tf.float32, size=5)

            def body(i, ta):
                return i + 1, ta.write(i, tf.matmul(xs[i], w))

            _, ta = tf.while_loop(lambda i, ta: i < 5, body, [0, ta])
            return tf.reduce_sum(ta.stack(), axis=0)

        tf.identity(f(x), name="y")
    gd = g.as_graph_def()
    out = amp(gd, ["y"]).graph_def
    assert_library_consistent(out)
    element_types = {n.attr["element_dtype"].type for f in out.library.function for n in f.node_def
                     if n.op.startswith("TensorList")}
    assert element_types == {F16}
    assert_same_outputs_within_half(gd, out, ["y"], {"x": R.standard_normal((5, 4, 16)).astype(np.float32)})


def test_function_called_from_a_half_site_and_a_float32_site_stays_correct_for_both():
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [4, 16], name="x")
        w = tf.constant(W, name="w")

        @tf.function
        def scale(h):
            return tf.nn.relu(h) * 2.0

        half_side = scale(tf.matmul(x, w))  # fed by a half MatMul, read by one
        float_side = scale(tf.exp(x * 0.1))  # fed by a deny op, fetched as float32
        tf.identity(tf.matmul(half_side, w), name="y_half")
        tf.identity(float_side, name="y_float")
    gd = g.as_graph_def()
    out = amp(gd, ["y_half", "y_float"]).graph_def
    assert_library_consistent(out)
    library = functions(out)
    variants = [f for name, f in library.items() if name.startswith("__inference_scale")]
    assert sorted(f.signature.input_arg[0].type for f in variants) == [F32, F16]
    assert_same_outputs_within_half(gd, out, ["y_half", "y_float"],
                                    {"x": R.standard_normal((4, 16)).astype(np.float32)})


def test_function_no_call_reaches_is_left_untouched():
    @tf.function
    def unused(h):
        return tf.matmul(h, h)

    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [4, 4], name="x")
        unused.get_concrete_function(tf.TensorSpec([4, 4], tf.float32)).add_to_graph()
        tf.identity(tf.matmul(x, x), name="y")
    gd = g.as_graph_def()
    original = {name: f.SerializeToString(deterministic=True) for name, f in functions(gd).items()}
    out = amp(gd, ["y"]).graph_def
    assert {name: f.SerializeToString(deterministic=True) for name, f in functions(out).items()} == original


def test_function_rewrite_is_idempotent_and_deterministic():
    gd, _ = rnn_graph()
    once = amp(gd, ["y"]).graph_def
    assert amp(gd, ["y"]).graph_def.SerializeToString(deterministic=True) == once.SerializeToString(deterministic=True)
    twice = amp(once, ["y"])
    assert twice.graph_def == once and twice.casts == []


def test_flop_share_counts_matmuls_inside_functions():
    gd, _ = rnn_graph()
    result = amp(gd, ["y"])
    assert result.half_flop_share == pytest.approx(1.0)
    from amp_rewrite.graph.flops import half_flop_share
    assert half_flop_share(gd) == 0.0


# --- instancing, seen without painting ------------------------------------------------------------

def _relu_function(name, *, polymorphic=False):
    """y = relu(x); with ``polymorphic`` the argument's type is an attr ``T`` instead of float32."""
    from tensorflow.core.framework import function_pb2

    fdef = function_pb2.FunctionDef()
    fdef.signature.name = name
    arg = fdef.signature.input_arg.add(name="x")
    if polymorphic:
        arg.type_attr = "T"
    else:
        arg.type = F32
    fdef.signature.output_arg.add(name="y", type=F32)
    relu = fdef.node_def.add(name="relu", op="Relu", input=["x"])
    relu.attr["T"].type = F32
    fdef.ret["y"] = "relu:activations:0"
    return fdef


def _call(graph_def_or_fdef, name, function, source):
    nodes = graph_def_or_fdef.node if hasattr(graph_def_or_fdef, "node") else graph_def_or_fdef.node_def
    node = nodes.add(name=name, op="PartitionedCall", input=[source])
    node.attr["f"].func.name = function
    node.attr["Tin"].list.type.append(F32)
    node.attr["Tout"].list.type.append(F32)
    return node


def test_each_call_gets_its_own_numbered_instance_and_unfit_calls_stay_opaque():
    from amp_rewrite.graph.instances import Instances
    from amp_rewrite.graph.op_registry import OpRegistry

    gd = tf1.GraphDef()
    gd.node.add(name="x", op="Placeholder").attr["dtype"].type = F32
    gd.library.function.add().CopyFrom(_relu_function("f"))
    gd.library.function.add().CopyFrom(_relu_function("poly", polymorphic=True))
    recursive = _relu_function("rec")
    _call(recursive, "again", "rec", "relu:activations:0")
    recursive.ret["y"] = "again:output:0"
    gd.library.function.add().CopyFrom(recursive)
    _call(gd, "call1", "f", "x")
    _call(gd, "call2", "f", "call1")
    direct = gd.node.add(name="direct", op="f", input=["call2"])
    _call(gd, "missing", "nope", "x")
    _call(gd, "polymorphic", "poly", "x")
    _call(gd, "recursion", "rec", "x")

    view = Instances(gd, OpRegistry(gd.library))
    main = {node.name: i for i, node in enumerate(gd.node)}
    assert view.bodies[0].index == main and view.nodes[:len(gd.node)] == list(gd.node)
    callers = [view.nodes[b.call].name for b in view.bodies[1:]]
    assert callers == ["call1", "call2", "direct", "recursion"]  # breadth first, in node order
    first = len(gd.node)
    for body_id, body in enumerate(view.bodies[1:], start=1):
        names = [view.nodes[i].name for i in range(first, first + len(body.index))]
        inner = ["again"] if body.function == "rec" else []
        assert names == ["x", "relu", *inner, "_retval/y"]  # virtual args, the body's nodes, virtual results
        assert body.args == [first] and body.rets == [first + len(body.index) - 1]
        assert [view.nodes[i].op for i in body.args + body.rets] == ["_Arg", "_Retval"]
        assert view.body_of[first:first + len(body.index)] == [body_id] * len(body.index)
        assert body.fdef is not None and body.fdef is not view.library[body.function]  # a private copy
        first += len(body.index)
    assert first == len(view.nodes)
    assert view.virtual == {i for b in view.bodies[1:] for i in b.args + b.rets}
    assert view.bodies[0].children[main["direct"]] == {"": [3]} and direct.op == "f"
    rec = view.bodies[4]
    assert (rec.function, rec.depth) == ("rec", 1)
    assert view.opaque_calls == {
        main["missing"]: "function nope is not in the graph's library",
        main["polymorphic"]: "function poly has a polymorphic signature",
        rec.index["again"]: "function rec calls itself",
    }


def test_entry_call_runs_the_function_and_its_rewrite_keeps_the_signature():
    from amp_rewrite.graph.functions import entry_call

    graph_def = helpers.function_call_graph()
    entry = graph_def.library.function[0]
    called = tf.compat.v1.GraphDef()
    called.library.CopyFrom(graph_def.library)
    call_name = "entry/block"  # ENTRY_PREFIX starts with "_", which TensorFlow does not import
    called.node.extend(entry_call(entry.signature, call_name))
    assert [(n.name, n.op) for n in called.node] == [(f"{call_name}/arg0", "Placeholder"),
                                                    (call_name, "StatefulPartitionedCall")]
    assert called.node[0].attr["dtype"].type == F32
    x = R.standard_normal((4, 8)).astype(np.float32)
    expected = np.maximum(x @ (np.ones((8, 8), np.float32) * 0.1), 0)
    (out,) = helpers.run(called, [call_name], {f"{call_name}/arg0": x})
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    result = amp(called, [call_name])
    body = functions(result.graph_def)[entry.signature.name]
    assert [a.type for a in body.signature.input_arg] == [F32] and [a.type for a in body.signature.output_arg] == [F32]
    assert half_ops(body, "MatMul")
    assert_same_outputs_within_half(called, result.graph_def, [call_name], {f"{call_name}/arg0": x})
