"""AMP_REWRITE_FIND_OVERFLOW=1 in TF1 sessions: a skipped step names the op where the inf was born."""

import logging

import numpy as np
from helpers import tf1

from amp_rewrite.runtime.settings import LossScaleSettings, RuntimeSettings

PROBE = "amp-rewrite: session graph: first non-finite half output in graph order: "


def train(x_value, steps, w_value=300.0, *, through_exp=False, learning_rate=1e-9):
    """``steps`` gradient-descent steps of reduce_sum((x @ w)²); returns w after them.

    With ``through_exp`` the MatMul reads ``exp(x)``, named ``born``: Exp stays float32
    (deny list), and its value is cast to float16 for the MatMul, named ``mm``.
    """
    graph = tf1.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf1.float32, [None, 4], name="x")
        w = tf1.get_variable("w", [4, 3], initializer=tf1.constant_initializer(w_value))
        product = tf1.matmul(tf1.exp(x, name="born"), w, name="mm") if through_exp else \
            tf1.matmul(x, w, name="big_mm")
        loss = tf1.reduce_sum(tf1.square(product), name="loss")
        step = tf1.train.GradientDescentOptimizer(learning_rate).minimize(loss)
        init = tf1.global_variables_initializer()
    with tf1.Session(graph=graph) as sess:
        sess.run(init)
        for _ in range(steps):
            sess.run(step, {x: x_value})
        return sess.run(w)


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def probe_lines(caplog, *, at_least=1):
    """The finder's warnings; fails, showing every warning, when there are fewer than ``at_least``."""
    lines = [m for m in warnings_of(caplog) if m.startswith(PROBE)]
    assert len(lines) >= at_least, warnings_of(caplog)
    return lines


def probing(**fields):
    return RuntimeSettings(target="float16", is_finding_overflow=True,
                           loss_scale=LossScaleSettings(initial_scale=4.0), **fields)


def test_forward_overflow_names_the_matmul(amp_runtime, caplog):
    # 4 * 300 * 300 = 360000: x and w fit in float16, their product does not, and the
    # gradient of the square reads it.
    amp_runtime(probing())
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        train(np.full((2, 4), 300.0, np.float32), 3)
    lines = probe_lines(caplog)
    assert lines[0] == (PROBE + "output 0 of node 'big_mm' (op MatMul, float16); keep MatMul in float32 with "
                        "--deny-add MatMul or TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_DENYLIST_ADD=MatMul, "
                        "or only this node with --preserve big_mm")


def test_gradient_overflow_names_the_gradient_op(amp_runtime, caplog):
    # Forward: x @ w = 0.04, finite everywhere. Backward at the default scale 2**15: the
    # square's gradient is 2 * 0.04 * 32768 = 2621, and w's gradient MatMul sums it over
    # 64 rows: 167772 > 65504. At scale 2**13 it fits, so training goes on.
    amp_runtime(RuntimeSettings(target="float16", is_finding_overflow=True))
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        w = train(np.ones((64, 4), np.float32), 4, w_value=0.01)
    lines = probe_lines(caplog, at_least=0)
    assert len(lines) == 2, warnings_of(caplog)  # scales 2**15 and 2**14
    assert "node 'gradients/big_mm_grad/MatMul_1' (op MatMul, float16)" in lines[0]
    assert np.all(np.isfinite(w))


def test_finite_steps_print_nothing_and_probing_is_off_by_default(amp_runtime, caplog):
    amp_runtime(probing())
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        train(np.ones((2, 4), np.float32), 3, w_value=0.5)
    assert not [m for m in warnings_of(caplog) if PROBE in m]


def test_without_the_variable_a_skip_names_no_op(amp_runtime, caplog):
    amp_runtime(RuntimeSettings(target="float16", loss_scale=LossScaleSettings(initial_scale=4.0)))
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        train(np.full((2, 4), 300.0, np.float32), 3)
    messages = warnings_of(caplog)
    assert any("floor of 1" in m or "step skipped" in m for m in messages), messages
    assert not [m for m in messages if PROBE in m]


def train_through_a_cast(x_value, steps):
    return train(x_value, steps, 1e-3, through_exp=True, learning_rate=1e-12)


def test_a_value_cast_to_half_names_its_float32_producer_and_its_half_consumers(amp_runtime, caplog):
    # exp(12) = 162755 fits float32 but not float16: the inserted Cast before the MatMul makes the inf.
    amp_runtime(probing())
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        train_through_a_cast(np.full((2, 4), 12.0, np.float32), 2)
    lines = probe_lines(caplog)
    assert lines[0].startswith(PROBE + "output 0 of node 'born' (op Exp, float32) is not finite in float16, "
                               "where it is cast for its half consumers 'gradients/mm_grad/MatMul_1', 'mm'; "
                               "keep them in float32 so the value stays float32: ")
    assert "Cast" not in lines[0]


def test_following_the_cast_advice_keeps_the_value_float32(amp_runtime, caplog):
    amp_runtime(probing(keep_float32=(r"(^|::)(gradients/mm_grad/MatMul_1|mm)$",)))
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        train_through_a_cast(np.full((2, 4), 12.0, np.float32), 2)
    messages = warnings_of(caplog)
    assert not [m for m in messages if PROBE in m], messages
    assert not [m for m in messages if "skipped" in m], messages
