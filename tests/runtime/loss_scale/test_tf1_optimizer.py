"""Dynamic loss scaling: the update rule, unscaled gradients, skipped steps, settings."""

import logging

import numpy as np
import pytest
import tensorflow as tf
from helpers import runner_of, tf1

from amp_rewrite.errors import UsageError
from amp_rewrite.runtime.loss_scale import tf1_optimizer
from amp_rewrite.runtime.loss_scale.core import MAX_SCALE
from amp_rewrite.runtime.settings import LossScaleSettings, RuntimeSettings


def run_updates(settings, finite_steps, initial=None):
    """Runs the state update once per entry of ``finite_steps``; returns (scale, good, skipped) after each."""
    if initial is not None:
        settings = LossScaleSettings(settings.is_dynamic, initial, settings.growth_interval)
    graph = tf.Graph()
    with graph.as_default():
        state = tf1_optimizer.state_for_graph(settings)
        is_finite = tf1.placeholder(tf.bool, [])
        update = tf1_optimizer.update_state(state, is_finite, settings)
        read = [state.scale, state.good_steps, state.skipped_steps]
        init = tf1.global_variables_initializer()
    out = []
    with tf1.Session(graph=graph) as sess:
        sess.run(init)
        for finite in finite_steps:
            sess.run(update, {is_finite: finite})
            out.append(tuple(sess.run(read)))
    return out


def test_scale_doubles_after_growth_interval_finite_steps():
    got = run_updates(LossScaleSettings(growth_interval=3), [True, True, True, True])
    assert got == [(2.0 ** 15, 1, 0), (2.0 ** 15, 2, 0), (2.0 ** 16, 0, 0), (2.0 ** 16, 1, 0)]


def test_non_finite_step_halves_the_scale_and_resets_the_count():
    got = run_updates(LossScaleSettings(growth_interval=3), [True, True, False, True])
    assert got == [(2.0 ** 15, 1, 0), (2.0 ** 15, 2, 0), (2.0 ** 14, 0, 1), (2.0 ** 14, 1, 1)]


def test_scale_never_drops_below_one_nor_grows_past_the_cap():
    assert run_updates(LossScaleSettings(), [False, False], initial=2.0) == [(1.0, 0, 1), (1.0, 0, 2)]
    top = run_updates(LossScaleSettings(growth_interval=1), [True], initial=MAX_SCALE)
    assert top == [(MAX_SCALE, 0, 0)]


def test_fixed_scale_never_changes_but_skips_are_counted():
    fixed = LossScaleSettings(is_dynamic=False, initial_scale=128.0, growth_interval=1)
    assert run_updates(fixed, [True, False, True]) == [(128.0, 1, 0), (128.0, 0, 1), (128.0, 1, 1)]


def training_graph(optimizer_name):
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 4], name="x")
        multiplier = tf1.placeholder_with_default(1.0, [], name="multiplier")
        w = tf1.get_variable("w", [4, 3], initializer=tf1.initializers.random_normal(seed=1))
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w)), name="loss") * multiplier
        step = tf1.train.get_or_create_global_step()
        optimizer = {"adam": tf1.train.AdamOptimizer(0.1),
                     "momentum": tf1.train.MomentumOptimizer(0.1, 0.9)}[optimizer_name]
        grads_and_vars = optimizer.compute_gradients(loss)
        reference = tf.gradients(loss, [w])[0]
        train = optimizer.apply_gradients(grads_and_vars, global_step=step, name="train")
        init = tf1.global_variables_initializer()
    return graph, grads_and_vars[0][0], reference, train, init


def test_compute_gradients_returns_the_true_gradients(amp_runtime):
    amp_runtime()
    graph, grad, reference, _, init = training_graph("momentum")
    x = np.ones((2, 4), np.float32)
    with tf1.Session(graph=graph) as sess:
        sess.run(init)
        got, want = sess.run([grad, reference], {"x:0": x})
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=1e-3)
    assert np.abs(got).max() < 100  # not multiplied by 2**15
    assert "amp_loss_scale/scale" in {v.op.name for v in graph.get_collection("variables")}


@pytest.mark.parametrize("optimizer_name", ["adam", "momentum"])
def test_skipped_step_changes_no_variable_slot_or_global_step(amp_runtime, optimizer_name):
    amp_runtime()
    graph, _, _, train, init = training_graph(optimizer_name)
    x = np.ones((2, 4), np.float32)
    with graph.as_default():
        state = [v for v in tf1.global_variables() if not v.op.name.startswith("amp_loss_scale")]
    assert len(state) > 2  # w, global_step and the optimizer's slots
    with tf1.Session(graph=graph) as sess:
        sess.run(init)
        sess.run(train, {"x:0": x})
        before = sess.run(state)
        sess.run(train, {"x:0": x, "multiplier:0": np.inf})
        after = sess.run(state)
        scale = sess.run(graph.get_collection(tf1_optimizer.STATE_COLLECTION)[0])
        sess.run(train, {"x:0": x})
        moved = sess.run(state)
    for b, a in zip(before, after):
        np.testing.assert_array_equal(a, b)
    assert scale == 2.0 ** 14
    assert not np.array_equal(moved[0], after[0])


def test_train_op_collection_holds_the_guarded_step(amp_runtime):
    amp_runtime()
    graph, _, _, train, _ = training_graph("adam")
    assert graph.get_collection(tf1.GraphKeys.TRAIN_OP) == [train]
    assert train.name == "train"


def test_settings_from_env():
    assert RuntimeSettings.from_env({}) == RuntimeSettings(is_timing_steps=True)  # the step decides by default
    fixed = RuntimeSettings.from_env({"AMP_LOSS_SCALE": "128", "AMP_REWRITE_STRICT": "1"})
    assert fixed.loss_scale == LossScaleSettings(is_dynamic=False, initial_scale=128.0, is_asked=True)
    assert fixed.is_strict
    tuned = RuntimeSettings.from_env({"AMP_LOSS_SCALE": "dynamic", "AMP_LOSS_SCALE_INIT": "1024",
                                      "AMP_LOSS_SCALE_GROWTH_INTERVAL": "10",
                                      "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_LOG_PATH": "/tmp/d"})
    assert tuned.loss_scale == LossScaleSettings(True, 1024.0, 10, is_asked=True)
    assert tuned.dump_dir == "/tmp/d"
    both = {"AMP_REWRITE_DUMP_DIR": "/a", "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_LOG_PATH": "/b"}
    assert RuntimeSettings.from_env(both).dump_dir == "/a"


@pytest.mark.parametrize("environ, wanted", [
    ({"AMP_REWRITE_TARGET": "float16"}, True),
    ({"AMP_REWRITE_TARGET": "bfloat16"}, False),
    ({"AMP_REWRITE_TARGET": "bfloat16", "AMP_LOSS_SCALE": "dynamic"}, True),  # the default value, by name
    ({"AMP_REWRITE_TARGET": "bfloat16", "AMP_LOSS_SCALE_INIT": "256"}, True),
])
def test_loss_scaling_under_bfloat16_only_when_asked(environ, wanted):
    from amp_rewrite.runtime import scales_loss

    assert scales_loss(RuntimeSettings.from_env(environ)) is wanted


@pytest.mark.parametrize("environ, message", [
    ({"AMP_LOSS_SCALE": "big"}, "AMP_LOSS_SCALE='big': not a number"),
    ({"AMP_LOSS_SCALE": "0"}, "a finite number > 0"),
    ({"AMP_LOSS_SCALE_GROWTH_INTERVAL": "1.5"}, "not an integer"),
    ({"AMP_LOSS_SCALE_INIT": "0.5"}, "must be at least 1.0"),
])
def test_bad_settings_name_the_variable(environ, message):
    with pytest.raises(UsageError, match=message):
        RuntimeSettings.from_env(environ)


def test_a_loss_that_is_never_finite_is_named_once_not_every_step(amp_runtime, caplog):
    amp_runtime(RuntimeSettings(loss_scale=LossScaleSettings(initial_scale=4.0), target="float16"))
    graph, _, _, train, init = training_graph("momentum")
    x = np.ones((2, 4), np.float32)
    with tf1.Session(graph=graph) as sess, caplog.at_level(logging.DEBUG, logger="amp_rewrite"):
        sess.run(init)
        for _ in range(8):
            sess.run(train, {"x:0": x, "multiplier:0": np.nan})
        scale = sess.run(graph.get_collection(tf1_optimizer.STATE_COLLECTION)[0])
        step = sess.run(tf1.train.get_global_step(graph))
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    named = [m for m in warnings if "loss itself was not finite" in m]
    assert step == 0  # every step skipped, in half and then in float32
    assert scale == 1.0  # the float32 graph's skips went on halving it
    assert len(named) == 1 and "no scale helps" in named[0], warnings
    assert len([m for m in warnings if "loss scale now" in m]) == 1, warnings  # 4 -> 2, then said at the second


def run_momentum_steps(steps, x):
    """``steps`` training steps of the momentum graph on ``x``: (w after, global step, session runner)."""
    graph, _, _, train, init = training_graph("momentum")
    with graph.as_default():
        w = [v for v in tf1.global_variables() if v.op.name == "w"][0]
    with tf1.Session(graph=graph) as sess:
        sess.run(init)
        for _ in range(steps):
            sess.run(train, {"x:0": x, "multiplier:0": 1e-10})
        return sess.run(w), sess.run(tf1.train.get_global_step(graph)), runner_of(sess)


def test_half_that_no_scale_can_train_falls_back_to_float32_keeping_values(amp_runtime, caplog):
    # MatMul overflows half (|x| = 1e5 > 65504) whatever the scale; in float32 the step is fine.
    x = np.full((2, 4), 1e5, np.float32)
    float32_w, float32_step, _ = run_momentum_steps(5, x)
    amp_runtime(RuntimeSettings(loss_scale=LossScaleSettings(initial_scale=4.0), target="float16"))
    with caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        w, step, runner = run_momentum_steps(7, x)  # the losses of two in a row are not finite: no scale helps
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    fallback = [m for m in warnings if "running the float32 graph" in m]
    assert len(fallback) == 1 and "loss itself was not finite" in fallback[0], warnings
    assert "DENYLIST_ADD" in fallback[0] and "2 steps skipped in all" in fallback[0], warnings
    assert step == float32_step == 5
    assert np.all(np.isfinite(w))
    np.testing.assert_allclose(w, float32_w, rtol=1e-5)  # five float32 steps from the same start
    assert runner is not None and runner.fallback_reason is not None


def test_strict_mode_raises_when_no_scale_can_train(amp_runtime):
    from amp_rewrite.errors import RuntimeRewriteError

    amp_runtime(RuntimeSettings(loss_scale=LossScaleSettings(initial_scale=2.0), target="float16", is_strict=True))
    with pytest.raises(RuntimeRewriteError, match="no scale helps"):
        run_momentum_steps(4, np.full((2, 4), 1e5, np.float32))


def test_gradients_that_overflow_with_a_finite_loss_walk_the_scale_down_to_the_floor(amp_runtime, caplog):
    # loss * 1e9 is finite (the loss is reduced in float32); its gradients overflow half at any scale.
    amp_runtime(RuntimeSettings(loss_scale=LossScaleSettings(initial_scale=4.0), target="float16"))
    graph, _, _, train, init = training_graph("momentum")
    with tf1.Session(graph=graph) as sess, caplog.at_level(logging.WARNING, logger="amp_rewrite"):
        sess.run(init)
        for _ in range(4):
            sess.run(train, {"x:0": np.ones((2, 4), np.float32), "multiplier:0": 1e9})
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len([m for m in warnings if "loss scale now" in m]) == 2, warnings  # 4 -> 2 -> 1
    fallback = [m for m in warnings if "running the float32 graph" in m]
    assert len(fallback) == 1 and "floor of 1" in fallback[0] and "not finite even unscaled" in fallback[0], warnings

