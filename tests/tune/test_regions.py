"""Half regions: a heavy op with the elementwise ops that followed it into half, timed as a whole."""

import numpy as np
import pytest
import tensorflow as tf
from helpers import BF16, F32, assert_same_outputs_within_half, half_nodes, rng, run, tf1

from amp_rewrite import Config, rewrite
from amp_rewrite.tune import regions, timing
from amp_rewrite.tune.cache import Timing
from amp_rewrite.tune.regions import RegionCase
from amp_rewrite.tune.tuner import Tuner

STEPS, BATCH, UNITS = 6, 4, 8
BODY_OPS = {"MatMul", "AddV2", "Split", "Sigmoid", "Tanh", "Mul"}


def recurrent_cell_graph(*, with_gradient=False):
    """A hand-written LSTM cell in a ``tf.while_loop`` over STEPS inputs, as a GraphDef with its library.

    ``with_gradient``: ``y`` is also differentiated, so the loop keeps what its gradient needs in
    TensorLists created outside the body (``EmptyTensorList`` accumulators) and pushed inside it.
    """
    w_value = rng(1).standard_normal((UNITS, 4 * UNITS)).astype(np.float32) * 0.3
    u_value = rng(2).standard_normal((UNITS, 4 * UNITS)).astype(np.float32) * 0.3

    @tf.function
    def run_cell(xs):
        w, u = tf.constant(w_value), tf.constant(u_value)

        def body(t, h, c):
            z = tf.matmul(xs[t], w) + tf.matmul(h, u)
            i, f, g, o = tf.split(z, 4, axis=1)
            c = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(g)
            return t + 1, tf.sigmoid(o) * tf.tanh(c), c

        zeros = tf.zeros([BATCH, UNITS])
        if not with_gradient:
            _, h, _ = tf.while_loop(lambda t, h, c: t < STEPS, body, (0, zeros, zeros))
            return tf.identity(h, name="y")
        with tf.GradientTape() as tape:
            tape.watch(xs)
            _, h, _ = tf.while_loop(lambda t, h, c: t < STEPS, body, (0, zeros, zeros))
            loss = tf.reduce_sum(h * h)
        return tf.identity(tape.gradient(loss, xs), name="y")

    graph = run_cell.get_concrete_function(tf.TensorSpec([STEPS, BATCH, UNITS], tf.float32, name="xs")).graph
    return graph.as_graph_def()


FEEDS = {"xs": rng(3).standard_normal((STEPS, BATCH, UNITS)).astype(np.float32)}


class Timings:
    """Fake timings: every MatMul alone twice as fast in half; a region as ``region`` says. Keeps the cases."""

    def __init__(self, region):
        self.region = region
        self.cases = []

    def __call__(self, case):
        self.cases.append(case)
        if isinstance(case, RegionCase):
            return self.region(case)
        return Timing(1e-3, 0.5e-3)


def tuned(graph_def, measure, fetches=("y",)):
    tuner = Tuner(target="bfloat16", device_type="CPU", measure=measure, cache=None)
    return rewrite(graph_def, fetches=list(fetches), config=Config(device_type="CPU", target="bfloat16"),
                   tuner=tuner)


def library_half_ops(graph_def) -> set[str]:
    """The op types of function-body nodes with a bfloat16 type attr."""
    return {node.op for f in graph_def.library.function for node in f.node_def
            if node.op != "Cast" and any(v.type == BF16 for v in node.attr.values())}


def test_a_loop_body_slower_in_half_stays_float32_though_its_matmuls_win_alone():
    gd = recurrent_cell_graph()
    measure = Timings(lambda case: Timing(1e-3, 1.2e-3 if case.in_loop else 0.5e-3))
    result = tuned(gd, measure)
    assert [c for c in measure.cases if isinstance(c, RegionCase) and c.in_loop]
    assert not library_half_ops(result.graph_def) and not half_nodes(result.graph_def)
    reasons = {name: outcome["reason"] for name, outcome in result.node_outcomes.items()}
    matmuls = [name for name in reasons if name.endswith("while/MatMul")]
    assert matmuls and "a loop body's half region" in reasons[matmuls[0]]
    assert "1.2 ms per iteration in bfloat16 vs 1 ms in float32" in reasons[matmuls[0]]
    want, got = run(gd, ["y"], FEEDS), run(result.graph_def, ["y"], FEEDS)
    np.testing.assert_array_equal(got[0], want[0])  # nothing left in half: float32's numbers exactly


def test_a_loop_body_dropped_to_float32_takes_its_data_structures_along():
    """The gradient's accumulators are created outside the body and pushed inside: all of them stay float32."""
    gd = recurrent_cell_graph(with_gradient=True)
    result = tuned(gd, Timings(lambda case: Timing(1e-3, 1.2e-3 if case.in_loop else 0.5e-3)))
    assert not library_half_ops(result.graph_def) and not half_nodes(result.graph_def)
    want, got = run(gd, ["y"], FEEDS), run(result.graph_def, ["y"], FEEDS)
    np.testing.assert_array_equal(got[0], want[0])


def test_a_loop_body_faster_in_half_keeps_its_cell_in_half():
    gd = recurrent_cell_graph()
    result = tuned(gd, Timings(lambda case: Timing(1e-3, 0.5e-3)))
    assert BODY_OPS <= library_half_ops(result.graph_def)
    reasons = [o["reason"] for name, o in result.node_outcomes.items() if name.endswith("while/Sigmoid")]
    assert reasons and "its half region" in reasons[0] and "measured faster" in reasons[0]
    assert_same_outputs_within_half(gd, result.graph_def, ["y"], FEEDS)


def test_the_body_is_timed_as_one_iteration_and_its_half_copy_computes_the_cell():
    """The region graph, run for real: what the painting made half outside the body enters without a Cast.

    h and c are loop variables painted half; w, u and the steps of xs are
    cast once, before the loop; so one iteration of the cell pays no Cast.
    """
    measure = Timings(lambda case: Timing(1e-3, 0.5e-3))
    tuned(recurrent_cell_graph(), measure)
    body = next(c for c in measure.cases if isinstance(c, RegionCase) and c.in_loop)
    assert {op for op, _ in body.ops} == BODY_OPS
    graph_def, float_targets, half_targets = body.benchmark_graph("/device:CPU:0")
    nodes = {n.name: n for n in graph_def.node}
    half = [nodes[name] for name in half_targets if not name.startswith("cast")]
    assert half and all(n.attr["T"].type == BF16 for n in half)
    assert all(nodes[name].attr["T"].type == F32 for name in float_targets)
    inputs = {name for n in half for name in n.input if not name.startswith("half/")}
    dtypes = sorted(nodes[name].attr["dtype"].type for name in inputs)
    assert dtypes == [tf.int32.as_datatype_enum] + [BF16] * 5  # Split's axis; x_t, w, u, h, c
    assert not [n for n in graph_def.node if n.op == "Cast"]
    seconds = timing.measure(body)
    assert seconds.float32 > 0 and seconds.half > 0
    graph = tf.Graph()
    with graph.as_default():
        tf1.import_graph_def(graph_def, name="")
    with tf1.Session(graph=graph) as session:
        for node in half:
            want, got = session.run([f"{node.name.replace('half/', 'float32/')}:0", f"{node.name}:0"])
            np.testing.assert_allclose(got.astype(np.float32), want, rtol=3e-2, atol=3e-2, err_msg=node.name)


def dense_graph(batch=16):
    """x → MatMul → BiasAdd → Tanh → Mul → y: a heavy op and three cheap ones after it."""
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [batch, 32], name="x")
        w = tf.constant(rng(4).standard_normal((32, 32)).astype(np.float32) * 0.2)
        b = tf.constant(rng(5).standard_normal(32).astype(np.float32) * 0.1)
        h = tf.tanh(tf.nn.bias_add(tf.matmul(x, w, name="mm"), b), name="act")
        tf.identity(h * 2.0, name="y")
    return g.as_graph_def()


@pytest.mark.parametrize("region, half", [((1.0, 0.95), False), ((1.0, 0.85), True)])
def test_a_region_outside_loops_needs_the_margin_in_total(region, half):
    gd = dense_graph()
    result = tuned(gd, Timings(lambda case: Timing(region[0] * 1e-3, region[1] * 1e-3)))
    assert ("mm" in half_nodes(result.graph_def)) is half
    reason = result.node_outcomes["act"]["reason"]
    assert ("measured faster" if half else "is no faster") in reason
    assert_same_outputs_within_half(gd, result.graph_def, ["y"], {"x": rng(6).standard_normal((16, 32))
                                                                   .astype(np.float32)})


def test_a_region_whose_heavy_op_cannot_be_timed_keeps_the_painting():
    gd = dense_graph(batch=None)  # the MatMul's batch is unknown: no static shape without a hint
    tuner = Tuner(target="bfloat16", device_type="CPU", measure=Timings(lambda case: Timing(1e-3, 9e-3)),
                  cache=None, batch_hint=None)
    result = rewrite(gd, fetches=["y"], config=Config(device_type="CPU", target="bfloat16"), tuner=tuner)
    assert "mm" in half_nodes(result.graph_def)
    assert "region" not in result.node_outcomes["act"]["reason"]


def test_regions_are_the_connected_half_vertices():
    from amp_rewrite.graph.typed_graph import TypedGraph

    graph = TypedGraph(dense_graph())
    allow = {graph.vertex("mm", "T"), graph.vertex("BiasAdd", "T"), graph.vertex("act", "T"),
             graph.vertex("y", "T")}
    found = regions.half_regions(graph, allow)
    assert sorted(map(len, found)) == [1, 3]  # y is not joined to the others: the Mul between is not half
