"""v1 loops: colour strings from TensorFlow's own suite, an LSTM training graph, in-graph training."""

import numpy as np
import pytest
import tensorflow as tf
from helpers import F16, amp, assert_same_outputs_within_half, half_nodes, like_this_grappler, rng, tf1, v1_control_flow

from amp_rewrite.paint.explain import disagreements
from amp_rewrite.report.grappler import grappler_rewrite


def make_node(x, colour, name):
    colour = colour.lower()
    if colour == "w":
        return tf.matmul(x, x, name=name) * 0.1
    if colour == "g":
        return tf.add(x, 1.0, name=name)
    if colour == "c":
        return tf.nn.relu(x, name=name)
    return tf.pow(tf.abs(x) + 1.0, 0.5, name=name)  # "b": Pow is on the deny list


def colour_loop(inp, body, out):
    g = tf.Graph()
    with g.as_default(), v1_control_flow():
        a = tf1.placeholder(tf.float32, [8, 8], name="input")
        for i, colour in enumerate(inp):
            a = make_node(a, colour, f"input_{i}")

        def loop_body(i, x):
            for k, colour in enumerate(body):
                x = make_node(x, colour, f"body_{k}")
            return i + 1, x

        _, a = tf1.while_loop(lambda i, _: i < 3, loop_body, [tf.constant(0), a])
        for i, colour in enumerate(out):
            a = make_node(a, colour, f"output_{i}")
        tf.identity(a, name="fetch")
    return g.as_graph_def()


def section_types(graph_def, prefix, count):
    by_base = {n.name.split("/")[-1]: n for n in graph_def.node if n.op != "Const"}
    return "".join("H" if by_base[f"{prefix}_{i}"].attr["T"].type == F16 else "f" for i in range(count))


@pytest.mark.parametrize("case", ["W,C,C", "C,C,W", "W,G,W", "W,gbg,W", "b,gWC,c", "b,CWCG,C", "C,GWCG,C",
                                  "C,CgbgWC,g"])
def test_colour_string_loops(case):
    inp, body, out = case.split(",")
    gd = colour_loop(inp, body, out)
    result = amp(gd, ["fetch"]).graph_def
    expected = ",".join("".join("H" if c.isupper() else "f" for c in section) for section in (inp, body, out))
    got = ",".join(section_types(result, p, len(s)) for p, s in (("input", inp), ("body", body), ("output", out)))
    assert got == expected
    grappler = grappler_rewrite(gd, ["fetch"])[0]
    with like_this_grappler():  # on TensorFlow 2.20 and later: our result itself
        as_grappler = amp(gd, ["fetch"]).graph_def
    sections = (("input", inp), ("body", body), ("output", out))
    assert [section_types(grappler, p, len(s)) for p, s in sections] == \
        [section_types(as_grappler, p, len(s)) for p, s in sections]
    feeds = {"input": rng(1).uniform(-0.5, 0.5, (8, 8)).astype(np.float32)}
    assert_same_outputs_within_half(gd, result, ["fetch"], feeds, rtol=5e-2, atol=5e-2)


def lstm_training_graph():
    from tf_keras.src.layers.rnn import legacy_cells

    g = tf.Graph()
    with g.as_default(), v1_control_flow():
        tf1.set_random_seed(0)
        x = tf1.placeholder(tf.float32, [4, 6, 8], name="x")
        target = tf1.placeholder(tf.float32, [4, 16], name="target")
        outputs, _ = tf1.nn.dynamic_rnn(legacy_cells.LSTMCell(16), x, dtype=tf.float32)
        loss = tf.reduce_mean(tf.square(outputs[:, -1] - target), name="loss")
        tf1.train.AdamOptimizer(0.01).minimize(loss, name="train")
        init = tf1.global_variables_initializer()
    r = rng(2)
    feeds = {"x": r.standard_normal((4, 6, 8)).astype(np.float32),
             "target": r.standard_normal((4, 16)).astype(np.float32)}
    return g.as_graph_def(), feeds, init.name


def train(graph_def, feeds, init, steps=5):
    graph = tf.Graph()
    with graph.as_default():
        tf1.import_graph_def(graph_def, name="")
    feed_dict = {graph.get_tensor_by_name(k + ":0"): v for k, v in feeds.items()}
    with tf1.Session(graph=graph) as sess:
        sess.run(graph.get_operation_by_name(init))
        return np.array([sess.run(["loss:0", graph.get_operation_by_name("train")], feed_dict)[0]
                         for _ in range(steps)])


@pytest.mark.slow
def test_tf1_dynamic_rnn_lstm_trains_in_half_with_few_casts_per_iteration():
    gd, feeds, init = lstm_training_graph()
    fetches = ["train", "loss", init]
    result = amp(gd, fetches)
    out = result.graph_def
    assert disagreements(result) == []
    half = half_nodes(out)
    assert any(n.startswith("rnn/while/lstm_cell/MatMul") for n in half)
    merges = {n.name: n.attr["T"].type for n in out.node if n.op == "Merge"}
    for n in out.node:
        if n.op == "NextIteration":
            for m in (i for i in out.node if i.op == "Merge" and n.name in i.input):
                assert merges[m.name] == n.attr["T"].type, (n.name, m.name)
    loop_casts = result.report()["casts_in_loop_bodies"]
    grappler = grappler_rewrite(gd, fetches)[0]
    grappler_casts = [n for n in grappler.node if n.op == "Cast" and "AutoMixedPrecision" in n.name]
    assert len(result.casts) < len(grappler_casts)
    assert len(loop_casts) <= 3
    want, got = train(gd, feeds, init), train(out, feeds, init)
    np.testing.assert_allclose(got, want, rtol=1e-2)
    assert got[-1] < got[0]


def test_in_graph_training_loop_over_ref_variables_reads_weights_each_iteration():
    g = tf.Graph()
    with g.as_default(), v1_control_flow():
        x = tf1.placeholder(tf.float32, [4, 8], name="x")
        w = tf1.Variable(rng(3).standard_normal((8, 8)).astype(np.float32) * 0.3, use_resource=False, name="w")

        def body(i, total):
            loss = tf.reduce_mean(tf.square(tf.matmul(x, w, name="mm")))
            grad = tf.gradients(loss, [w])[0]
            with tf.control_dependencies([tf1.assign_sub(w, 0.1 * grad)]):
                return i + 1, total + tf.identity(loss)

        _, total = tf1.while_loop(lambda i, _: i < 5, body, [tf.constant(0), tf.constant(0.0)])
        tf.identity(total, name="total")
        tf.identity(w, name="final_w")
        init = tf1.global_variables_initializer()
    gd = g.as_graph_def()
    out = amp(gd, ["total", "final_w", init.name]).graph_def
    assert any(n.op == "MatMul" and n.attr["T"].type == F16 for n in out.node)
    ops = {n.name: n for n in out.node}

    def reads_variable(node):
        return node.op in ("VariableV2", "Variable") or (
            node.op == "Identity" and ops[node.input[0]].op in ("VariableV2", "Variable"))

    enters = [n for n in out.node if n.op in ("Enter", "RefEnter")]
    assert any(reads_variable(ops[n.input[0]]) for n in enters)  # the weights do enter the loop
    for node in enters:
        source = ops[node.input[0].split(":")[0]]
        if source.op == "Cast":
            assert not reads_variable(ops[source.input[0]]), f"Cast between a variable read and {node.name}"
    results = []
    for graph_def in (gd, out):
        graph = tf.Graph()
        with graph.as_default():
            tf1.import_graph_def(graph_def, name="")
        with tf1.Session(graph=graph) as sess:
            sess.run(graph.get_operation_by_name(init.name))
            results.append(sess.run(["total:0", "final_w:0"], {"x:0": np.ones((4, 8), np.float32)}))
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=2e-2)
    np.testing.assert_allclose(results[1][1], results[0][1], rtol=2e-2, atol=2e-2)
    assert results[1][1].dtype == np.float32
