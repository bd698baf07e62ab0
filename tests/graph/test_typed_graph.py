"""The typed view: one vertex per (node, type attr), ports mapped through OpDefs."""

import pytest
import tensorflow as tf
from helpers import tf1

from amp_rewrite import GraphError
from amp_rewrite.graph.op_ports import TypeAttr
from amp_rewrite.graph.typed_graph import TypedGraph


def build(fn):
    g = tf.Graph()
    with g.as_default():
        fn()
    return TypedGraph(g.as_graph_def())


def attrs_of(view, name):
    i = view.index[name]
    return [view.vertex_attr[v] for v in view.node_vertices[i]]


def test_vertices_per_type_attr_list_entry_and_fixed_type():
    def fn():
        x = tf1.placeholder(tf.float32, [2, 4, 4, 3], name="x")
        tf.raw_ops.FusedBatchNormV3(x=x, scale=tf.ones([3]), offset=tf.zeros([3]), mean=tf.zeros([3]),
                                    variance=tf.ones([3]), is_training=False, name="bn")
        tf.raw_ops.IdentityN(input=[x, tf.constant(1)], name="idn")
        tf.math.add_n([x, x, x], name="addn")
        tf.reduce_sum(x, axis=0, name="sum")

    view = build(fn)
    assert set(attrs_of(view, "bn")) >= {TypeAttr("T"), TypeAttr("U")}
    assert set(attrs_of(view, "idn")) == {TypeAttr("T", 0), TypeAttr("T", 1)}
    assert attrs_of(view, "addn") == [TypeAttr("T")]  # N inputs share one vertex
    assert view.in_attrs[view.index["addn"]] == [TypeAttr("T")] * 3
    assert set(attrs_of(view, "sum")) == {TypeAttr("T"), TypeAttr("Tidx")}


def test_edges_join_producer_port_to_consumer_port_vertices():
    def fn():
        x = tf1.placeholder(tf.float32, [2, 3], name="x")
        bn = tf.raw_ops.FusedBatchNormV3(x=tf.reshape(x, [1, 1, 2, 3]), scale=tf.ones([3]), offset=tf.zeros([3]),
                                         mean=tf.zeros([3]), variance=tf.ones([3]), is_training=False, name="bn")
        tf.identity(bn.batch_mean, name="mean_out")

    view = build(fn)
    mean_out = view.vertex("mean_out", "T")
    assert view.fanin[mean_out] == (view.vertex("bn", "U"),)


def test_unknown_op_gets_no_vertices_and_a_warning(caplog):
    gd = tf.compat.v1.GraphDef()
    gd.node.add(name="a", op="MyCustomOp")
    with caplog.at_level("WARNING"):
        view = TypedGraph(gd)
    assert view.node_vertices == [()] and view.unknown_ops == ["MyCustomOp"]
    assert "MyCustomOp" in caplog.text


@pytest.mark.parametrize("mutate,message", [
    (lambda gd: gd.node[1].input.append("missing"), "names a node that does not exist"),
    (lambda gd: gd.node.add().CopyFrom(gd.node[0]), "duplicate node name"),
    (lambda gd: gd.node[1].input.pop(), "expected 1 data inputs, got 0"),
    (lambda gd: gd.node[1].input.__setitem__(0, "x:3"), "asks for output 3"),
])
def test_malformed_graphs_name_node_and_op(mutate, message):
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [2], name="x")
        tf.nn.relu(x, name="r")
    gd = g.as_graph_def()
    mutate(gd)
    with pytest.raises(GraphError, match=message):
        TypedGraph(gd)


def test_output_count_reads_the_op_def_without_the_view():
    from amp_rewrite.graph.op_ports import output_count
    from amp_rewrite.graph.op_registry import OpRegistry

    @tf.function
    def pair(a):
        return a + 1.0, a * 2.0

    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [6, 3], name="x")
        tf.split(x, 3, axis=0, name="split")
        tf.unstack(x, num=6, axis=0, name="unstack")
        tf.raw_ops.IdentityN(input=[x, tf.constant(1), x], name="idn")
        tf.raw_ops.FusedBatchNormV3(x=tf.reshape(x, [1, 1, 6, 3]), scale=tf.ones([3]), offset=tf.zeros([3]),
                                    mean=tf.zeros([3]), variance=tf.ones([3]), is_training=False, name="bn")
        pair(x)
    gd = g.as_graph_def()
    call = next(n.name for n in gd.node if n.op in ("PartitionedCall", "StatefulPartitionedCall"))
    gd.node.add(name="direct", op=gd.library.function[0].signature.name, input=["x"])  # the function as an op
    gd.node.add(name="custom", op="MyCustomOp")
    no_count = gd.node.add(name="no_count", op="Unpack", input=["x"])
    no_count.attr["T"].type = tf.float32.as_datatype_enum  # the "num" attr it needs is missing
    registry = OpRegistry(gd.library)
    counts = {n.name: output_count(n, registry) for n in gd.node}
    assert {name: counts[name] for name in ("x", "split", "unstack", "idn", "bn", call, "direct")} == {
        "x": 1, "split": 3, "unstack": 6, "idn": 3, "bn": 6, call: 2, "direct": 2}
    assert counts["custom"] is None and counts["no_count"] is None
    del gd.node[-1]
    view = TypedGraph(gd)
    assert all(counts[n.name] == len(view.out_attrs[view.index[n.name]] or [])
               for n in gd.node if n.name != "custom")


def edge_by_edge(view):
    """Fan-in and fan-out appended one data edge at a time, consumers in node order, inputs in order."""
    fanin = [[] for _ in view.vertex_node]
    fanout = [[] for _ in view.vertex_node]
    for dst in range(len(view.nodes)):
        for k, (src, port) in enumerate(view.inputs(dst)):
            u, v = view.output_vertex(src, port), view.input_vertex(dst, k)
            if u is not None and v is not None:
                fanout[u].append(v)
                fanin[v].append(u)
    return fanin, fanout


def assert_edges_in_edge_order(view):
    fanin, fanout = edge_by_edge(view)
    for v in range(len(view.vertex_node)):
        # Calls add edges to their instances after these: the data edges come first.
        assert list(view.fanin[v][:len(fanin[v])]) == fanin[v], view.describe(v)
        assert list(view.fanout[v][:len(fanout[v])]) == fanout[v], view.describe(v)


def test_fan_in_and_out_keep_edge_order_when_ports_share_a_vertex():
    def fn():
        x = tf1.placeholder(tf.float32, [4, 4], name="x")
        first, second = tf.split(x, 2, name="split")
        tf.add(second, first, name="reads_1_then_0")
        tf.identity(first, name="reads_0")
        tf.add_n([second, tf.identity(x[:2], name="top"), first], name="addn")

    view = build(fn)
    split = view.vertex("split", "T")
    readers = [view.vertex(name, "T") for name in ("reads_1_then_0", "reads_1_then_0", "reads_0", "addn", "addn")]
    assert list(view.fanout[split]) == readers
    assert_edges_in_edge_order(view)


@pytest.mark.parametrize("seed", range(12))
def test_fan_in_and_out_keep_edge_order_on_random_graphs(seed):
    from graph_strategies import build as build_recipe
    from graph_strategies import recipe_from_seed

    graph_def = build_recipe(recipe_from_seed(seed, max_steps=24)).graph.as_graph_def()
    assert_edges_in_edge_order(TypedGraph(graph_def))
