"""An activation whose gradient reads its output stays float32 with it (``keep_saturating_activations_float32``).

Nodes are named by the colour expected: ``allow*`` half, ``sat*`` the
activations kept float32, ``infer*`` half. A Sigmoid's gradient is
``y(1 - y)``, computed from its output ``y``; half rounds a saturated ``y``
to exactly 1, where that gradient is 0, so a network whose units saturate
stops learning in half where float32 trains on.
"""

import numpy as np
import pytest
import tensorflow as tf
from helpers import BF16, F16, F32, HALF_TYPES, amp, node_types, rng, tf1, v1_control_flow

from amp_rewrite.paint import rules
from amp_rewrite.paint.explain import disagreements, explain_chain
from amp_rewrite.paint.saturation import GRADIENT_REASON, REASON

HALF = {"bfloat16": BF16, "float16": F16}


def without_the_rule():
    """The schedule as it was before this rule: the lists alone decide the activations."""
    return tuple(rule for rule in rules.ROOT_RULES if rule is not rules.keep_saturating_activations_float32)


def dense_graph(*, activation=tf.sigmoid, training=True, sizes=(16, 32, 16), seed=0, batch=8):
    """x -> allow1 -> infer1 (+ b) -> sat1 -> allow2 -> infer2 -> sat2, a squared error, and RMSProp if training."""
    r = rng(seed)
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [batch, sizes[0]], name="x")
        h = x
        for k, (n_in, n_out) in enumerate(zip(sizes, sizes[1:]), start=1):
            w = tf.Variable(r.standard_normal((n_in, n_out)).astype(np.float32), name=f"w{k}")
            b = tf.Variable(r.standard_normal(n_out).astype(np.float32), name=f"b{k}")
            h = activation(tf.add(tf.matmul(h, w, name=f"allow{k}"), b, name=f"infer{k}"), name=f"sat{k}")
        loss = tf.reduce_mean(tf.square(x - h), name="loss")
        fetches = ["loss"]
        if training:
            tf1.train.RMSPropOptimizer(0.01).minimize(loss, name="train")
            fetches.append("train")
        tf1.variables_initializer(tf1.global_variables(), name="init")
    return g.as_graph_def(), fetches + ["init"]


def cast_source(graph_def, name: str, ordinal: int = 0) -> str:
    """The node a Cast feeding input ``ordinal`` of ``name`` reads; fails if that input is no Cast."""
    nodes = {n.name: n for n in graph_def.node}
    cast = nodes[nodes[name].input[ordinal].split(":")[0]]
    assert cast.op == "Cast", f"{name} input {ordinal} is {cast.op}"
    return cast.input[0].split(":")[0]


@pytest.mark.parametrize("target", ["bfloat16", "float16"])
def test_a_sigmoid_its_gradient_reads_stays_float32_with_it_and_every_matmul_stays_half(target):
    gd, fetches = dense_graph()
    result = amp(gd, fetches, target=target)
    out, types = result.graph_def, node_types(result.graph_def)
    half = HALF[target]
    for name in ("allow1", "allow2", "infer1", "infer2", "gradients/allow1_grad/MatMul_1",
                 "gradients/allow2_grad/MatMul", "gradients/allow2_grad/MatMul_1"):
        assert types[name] == half, name
    for name in ("sat1", "sat2", "gradients/sat1_grad/SigmoidGrad", "gradients/sat2_grad/SigmoidGrad"):
        assert types[name] == F32, name
    assert cast_source(out, "sat1") == "infer1"  # cast up from the half sum
    assert cast_source(out, "allow2") == "sat1"  # the next layer reads a half Cast of it
    assert cast_source(out, "gradients/sat1_grad/SigmoidGrad", 1) == "gradients/allow2_grad/tuple/control_dependency"
    assert disagreements(result) == []
    again = amp(out, fetches, target=target).graph_def  # idempotent: the rewritten graph is rewritten as it is
    assert again.SerializeToString(deterministic=True) == out.SerializeToString(deterministic=True)
    outcomes = result.node_outcomes
    assert REASON in outcomes["sat1"]["reason"]
    assert GRADIENT_REASON in outcomes["gradients/sat1_grad/SigmoidGrad"]["reason"]
    assert outcomes["gradients/sat1_grad/SigmoidGrad"]["cause"] == "sat1"


def test_explain_names_the_rule_for_the_gradient_and_its_activation():
    gd, fetches = dense_graph()
    outcomes = amp(gd, fetches, target="bfloat16").node_outcomes
    chain = explain_chain(outcomes, "gradients/sat2_grad/SigmoidGrad")
    assert [line.split(" (")[0] for line in chain] == ["gradients/sat2_grad/SigmoidGrad", "sat2"]
    assert "stays float32: " + GRADIENT_REASON in chain[0] and "stays float32: " + REASON in chain[1]


@pytest.mark.parametrize("target", ["bfloat16", "float16"])
def test_an_inference_graph_is_rewritten_as_without_the_rule(target, monkeypatch):
    gd, fetches = dense_graph(training=False)
    with_rule = amp(gd, fetches, target=target).graph_def
    types = node_types(with_rule)
    assert types["sat1"] == types["allow2"] == HALF[target]  # no gradient reads it: the lists decide
    monkeypatch.setattr(rules, "ROOT_RULES", without_the_rule())
    assert amp(gd, fetches, target=target).graph_def.SerializeToString(deterministic=True) == \
        with_rule.SerializeToString(deterministic=True)


@pytest.mark.parametrize("activation", [tf.tanh, tf.nn.elu, tf.nn.selu, tf.nn.softmax],
                         ids=["tanh", "elu", "selu", "softmax"])
def test_activations_that_trained_as_well_in_half_are_left_to_the_lists(activation, monkeypatch):
    gd, fetches = dense_graph(activation=activation)
    with_rule = amp(gd, fetches, target="bfloat16").graph_def
    assert node_types(with_rule)["sat1"] == BF16
    monkeypatch.setattr(rules, "ROOT_RULES", without_the_rule())
    assert amp(gd, fetches, target="bfloat16").graph_def.SerializeToString(deterministic=True) == \
        with_rule.SerializeToString(deterministic=True)


def test_a_cast_between_the_sigmoid_and_its_gradient_keeps_the_gradient_float32():
    """A float32 Sigmoid the rewrite may not change (preserved) still keeps its gradient float32."""
    gd, fetches = dense_graph()
    result = amp(gd, fetches + ["sat1"], target="bfloat16")
    types = node_types(result.graph_def)
    assert types["sat1"] == F32 and types["gradients/sat1_grad/SigmoidGrad"] == F32
    assert types["allow2"] == BF16


# -- loops and functions ---------------------------------------------------------------------------------


def lstm_graph():
    """A TF1 ``dynamic_rnn`` LSTM (a v1 while loop) with a Sigmoid output layer ``sat_out``, trained with RMSProp."""
    from tf_keras.src.layers.rnn import legacy_cells

    g = tf.Graph()
    with g.as_default(), v1_control_flow():
        tf1.set_random_seed(0)
        x = tf1.placeholder(tf.float32, [4, 6, 8], name="x")
        target = tf1.placeholder(tf.float32, [4, 16], name="target")
        cell = legacy_cells.LSTMCell(16, initializer=tf1.random_normal_initializer(stddev=1.0, seed=1))
        outputs, _ = tf1.nn.dynamic_rnn(cell, x, dtype=tf.float32)
        w = tf.Variable(rng(5).standard_normal((16, 16)).astype(np.float32), name="w_out")
        y = tf.sigmoid(tf.matmul(outputs[:, -1], w, name="allow_out"), name="sat_out")
        loss = tf.reduce_mean(tf.square(y - target), name="loss")
        tf1.train.RMSPropOptimizer(0.01).minimize(loss, name="train")
        tf1.global_variables_initializer()
    r = rng(2)
    feeds = {"x:0": r.standard_normal((4, 6, 8)).astype(np.float32),
             "target:0": r.uniform(0, 1, (4, 16)).astype(np.float32)}
    return g.as_graph_def(), feeds


def train_session(graph_def, feeds, steps):
    g = tf.Graph()
    with g.as_default():
        tf1.import_graph_def(graph_def, name="")
    with tf1.Session(graph=g) as session:
        session.run("init")
        return np.array([session.run(["loss:0", "train"], feeds)[0] for _ in range(steps)])


@pytest.mark.slow
def test_an_lstms_gates_are_left_to_the_lists_and_a_sigmoid_after_its_loop_is_kept(monkeypatch):
    """A gate runs every iteration, its Casts would too: the loop is painted as without the rule."""
    gd, feeds = lstm_graph()
    fetches = ["loss", "train", "init"]
    result = amp(gd, fetches, target="bfloat16", is_checking=True)  # postconditions hold
    out = result.graph_def
    assert disagreements(result) == []
    types = node_types(out)
    gates = [n.name for n in gd.node if n.op in ("Sigmoid", "SigmoidGrad") and "/while/" in f"/{n.name}"]
    assert len(gates) == 6  # three gates and their gradients
    assert all(types[name] == BF16 for name in gates)
    assert types["sat_out"] == types["gradients/sat_out_grad/SigmoidGrad"] == F32
    assert types["allow_out"] == types["rnn/while/lstm_cell/MatMul"] == BF16
    monkeypatch.setattr(rules, "ROOT_RULES", without_the_rule())
    lists = amp(gd, fetches, target="bfloat16")
    loop = {n.name: n for n in out.node if "/while/" in f"/{n.name}"}
    assert loop == {n.name: n for n in lists.graph_def.node if "/while/" in f"/{n.name}"}
    assert result.report()["casts_in_loop_bodies"] == lists.report()["casts_in_loop_bodies"]
    want, got = train_session(gd, feeds, 5), train_session(out, feeds, 5)
    np.testing.assert_allclose(got, want, rtol=2e-2)


def gru_like_step():
    """A GRU-like cell in a ``tf.while_loop`` inside a ``tf.function`` trained with a GradientTape.

    The loop's gate ``infer_gate`` is in the While's body function, and its
    gradient in the gradient loop's; the output layer ``sat_out`` is outside
    the loop, in the step's own function.
    """
    r = rng(3)
    w = tf.Variable(r.standard_normal((8, 32)).astype(np.float32), name="w")
    u = tf.Variable(r.standard_normal((16, 32)).astype(np.float32), name="u")
    v = tf.Variable(r.standard_normal((16, 4)).astype(np.float32), name="v")
    xs = tf.constant(r.standard_normal((5, 4, 8)).astype(np.float32))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            def body(i, h):
                z = tf.matmul(xs[i], w, name="allow_x") + tf.matmul(h, u, name="allow_h")
                gate, candidate = tf.split(z, 2, axis=1)
                update = tf.sigmoid(gate, name="infer_gate")
                return i + 1, update * h + (1 - update) * tf.tanh(candidate, name="infer_candidate")

            _, h = tf.while_loop(lambda i, h: i < 5, body, [0, tf.zeros([4, 16])])
            y = tf.sigmoid(tf.matmul(h, v, name="allow_out"), name="sat_out")
            loss = tf.reduce_mean(tf.square(y - 0.5))
        grads = tape.gradient(loss, [w, u, v])
        return loss, grads[0], grads[1], grads[2]

    return step.get_concrete_function()


def function_nodes(result, op: str) -> dict[str, object]:
    """``function::node`` → NodeDef of every ``op`` node in the functions the rewritten graph calls."""
    return {name: n for f in result.graph_def.library.function for n in f.node_def
            if n.op == op and (name := f"{f.signature.name}::{n.name}") in result.node_outcomes}


@pytest.mark.slow
def test_a_tf_function_keeps_the_sigmoid_after_its_loop_and_leaves_the_loops_gate_to_the_lists():
    concrete = gru_like_step()
    gd = concrete.graph.as_graph_def()
    result = amp(gd, [t.op.name for t in concrete.outputs], target="bfloat16", is_checking=True)
    assert disagreements(result) == []
    out = result.graph_def
    main = {n.name: n.attr["T"].type for n in out.node if n.op in ("Sigmoid", "SigmoidGrad", "MatMul")}
    assert {name for name, t in main.items() if t == F32} == {"sat_out", "gradient_tape/sat_out/SigmoidGrad"}
    assert main["allow_out"] == BF16
    in_loops = {**function_nodes(result, "Sigmoid"), **function_nodes(result, "SigmoidGrad")}
    assert len(in_loops) == 2 and all("while_body" in name for name in in_loops)  # the gate, its gradient
    assert all(n.attr["T"].type == BF16 for n in in_loops.values())
    assert all(n.attr["T"].type == BF16 for n in function_nodes(result, "MatMul").values())
    assert REASON in result.node_outcomes["sat_out"]["reason"]


@pytest.mark.slow
def test_a_gradient_in_another_function_than_its_sigmoid_keeps_both_float32():
    """Differentiating through a nested ``tf.function`` puts the forward and the gradient in two calls."""
    r = rng(4)
    w1 = tf.Variable(r.standard_normal((8, 16)).astype(np.float32))
    w2 = tf.Variable(r.standard_normal((16, 4)).astype(np.float32))
    x = tf.constant(r.standard_normal((4, 8)).astype(np.float32))

    @tf.function
    def layer(h):
        return tf.sigmoid(tf.matmul(h, w1, name="allow_inner"), name="sat_inner")

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(layer(x), w2, name="allow_outer")))
        return loss, tape.gradient(loss, w1)

    concrete = step.get_concrete_function()
    gd = concrete.graph.as_graph_def()
    result = amp(gd, [t.op.name for t in concrete.outputs], target="bfloat16")
    out = result.graph_def
    [(forward, sigmoid)] = function_nodes(result, "Sigmoid").items()
    [(backward, sigmoid_grad)] = function_nodes(result, "SigmoidGrad").items()
    assert forward.split("::")[0] != backward.split("::")[0]  # two function bodies
    assert sigmoid.attr["T"].type == sigmoid_grad.attr["T"].type == F32
    assert all(n.attr["T"].type == BF16 for n in function_nodes(result, "MatMul").values())
    assert node_types(out)["allow_outer"] == BF16
    assert not any(c.attr["DstT"].type in HALF_TYPES and c.input[0].endswith("sat_inner")
                   for f in out.library.function for c in f.node_def
                   if c.op == "Cast" and f.signature.name == backward.split("::")[0])


# -- training: a network whose units saturate trains like float32 --------------------------------------

STEPS, BATCH = 300, 32


def autoencoder_graph():
    """A narrow sigmoid autoencoder, 256-64-32-64-256, weights and biases drawn with std 1, RMSProp 0.01.

    With std-1 weights over 256 inputs most first-layer units start
    saturated (their sums reach 6 and more), where bfloat16 rounds the
    Sigmoid to 1.
    """
    return dense_graph(sizes=(256, 64, 32, 64, 256), seed=1, batch=BATCH)


def autoencoder_data():
    """512 sparse patterns in [0, 1]: eight prototypes with noise."""
    r = rng(0)
    prototypes = (r.random((8, 256)) < 0.3) * r.uniform(0.5, 1, (8, 256))
    return np.clip(prototypes[r.integers(0, 8, 512)] + r.normal(0, 0.05, (512, 256)), 0, 1).astype(np.float32)


def losses(graph_def):
    """The loss of each of STEPS RMSProp steps on batches drawn with a fixed seed."""
    data, order = autoencoder_data(), rng(2)
    g = tf.Graph()
    with g.as_default():
        tf1.import_graph_def(graph_def, name="")
    with tf1.Session(graph=g) as session:
        session.run("init")
        return np.array([session.run(["loss:0", "train"], {"x:0": data[order.integers(0, 512, BATCH)]})[0]
                         for _ in range(STEPS)])


@pytest.mark.slow
def test_a_saturating_autoencoder_trains_in_bfloat16_like_float32_where_the_lists_alone_stall(monkeypatch):
    gd, fetches = autoencoder_graph()
    float32 = losses(gd)[-20:].mean()
    ours = losses(amp(gd, fetches, target="bfloat16").graph_def)[-20:].mean()
    monkeypatch.setattr(rules, "ROOT_RULES", without_the_rule())
    lists = losses(amp(gd, fetches, target="bfloat16").graph_def)[-20:].mean()
    assert abs(ours / float32 - 1) < 0.05, (ours, float32)
    assert lists / float32 > 1.15, (lists, float32)  # what the rule mends: the lists alone stall
