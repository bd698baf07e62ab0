"""The overflow finder's wording and order, on a traced function's graph (TF2) as on a session's (TF1)."""

import tensorflow as tf

from amp_rewrite.runtime import overflow_probe


def traced_graph():
    """A FuncGraph as the rewrite leaves it: ``born`` stays float32, a Cast feeds the half ``mm``.

    The rewrite appends its Casts after the body's nodes: this one comes after ``early``.
    """

    @tf.function
    def step(x, w):
        born = tf.exp(x, name="born")
        first = tf.matmul(tf.cast(x, tf.float16, name="x16"), w, name="early")
        half = tf.cast(born, tf.float16, name="born-0-CastToFp16-AmpRewrite")
        return tf.matmul(half, w, name="mm"), first

    return step.get_concrete_function(tf.TensorSpec([2, 4]), tf.TensorSpec([4, 4], tf.float16)).graph


def test_a_cast_half_value_is_named_by_its_float32_producer():
    graph = traced_graph()
    by_name = {t.op.name: t for t in overflow_probe.half_outputs(graph)}
    line = overflow_probe.describe(by_name["born-0-CastToFp16-AmpRewrite"])
    assert line.startswith("output 0 of node 'born' (op Exp, float32) is not finite in float16, "
                           "where it is cast for its half consumers 'mm'; ")
    assert "AMP_REWRITE_KEEP_FLOAT32='(^|::)(mm)$'" in line
    assert "Cast" not in line.split(";")[1]


def test_a_cast_half_value_is_probed_where_its_producer_runs():
    order = [t.op.name for t in overflow_probe.half_outputs(traced_graph())]
    # The Cast comes after early in the graph, but its producer born comes before: so is it probed.
    assert order.index("born-0-CastToFp16-AmpRewrite") < order.index("early")


def test_a_half_op_is_named_itself():
    by_name = {t.op.name: t for t in overflow_probe.half_outputs(traced_graph())}
    assert overflow_probe.describe(by_name["mm"]).startswith("output 0 of node 'mm' (op MatMul, float16); keep "
                                                             "MatMul in float32")
