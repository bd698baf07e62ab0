"""TensorFlow's private parts: every capability is there on this TensorFlow; a missing one runs float32.

The fallback tests fake a TensorFlow that lacks one internal by adding a
symbol no TensorFlow has to the capability a path checks, then run that path:
its graph runs float32 (outputs equal the float32 run's exactly), one warning
names the symbol, and strict mode raises instead.
"""

import logging
from dataclasses import replace

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import mlp_session_graph, rng, runner_of, tf1

from amp_rewrite import runtime, tf_internals
from amp_rewrite.errors import RuntimeRewriteError
from amp_rewrite.runtime.settings import RuntimeSettings
from amp_rewrite.runtime.tf2 import tracing

X = rng().normal(size=(4, 8)).astype(np.float32)
ABSENT = "tensorflow.python.client.session:NoSuchInternal"


def all_capabilities():
    return [value for value in vars(tf_internals).values() if isinstance(value, tf_internals.Capability)]


def test_every_capability_is_there_on_this_tensorflow():
    pytest.importorskip("tf_keras", reason="tf_keras is not installed: its optimizers cannot be checked")
    capabilities = all_capabilities()
    assert {c.name for c in capabilities} >= {"TF1 sessions", "TF1 loss scaling", "tf.function tracing",
                                              "TF2 loss scaling", "Keras 3 optimizers", "tf_keras optimizers"}
    assert {c.name: tf_internals.missing(c) for c in capabilities} == {c.name: [] for c in capabilities}


def test_missing_names_absent_modules_and_attributes_in_order():
    capability = tf_internals.Capability("x", (
        "tensorflow.python.client.session:BaseSession.run",
        "tensorflow.python.no_such_module:Thing",
        "tensorflow.python.client.session:BaseSession.no_such_method",
    ))
    assert tf_internals.missing(capability) == ["tensorflow.python.no_such_module:Thing",
                                                "tensorflow.python.client.session:BaseSession.no_such_method"]


@pytest.mark.parametrize(("version", "side"), [
    ("2.15.1", "older"), ("2.22.0", "newer"), ("3.0.0rc1", "newer"), ("2.16.2", None), ("2.21.0", None),
])
def test_untested_versions_are_named_and_tested_ones_are_not(version, side):
    sentence = tf_internals.untested_version(version)
    if side is None:
        assert sentence is None
    else:
        assert sentence == (f"TensorFlow {version} is {side} than the versions tested (2.16 to 2.21); "
                            "its internals were checked and are there")


def test_this_tensorflow_is_in_the_tested_range():
    assert tf_internals.untested_version(tf.__version__) is None


def lacking(monkeypatch, name: str) -> str:
    """Makes the capability ``name`` of tf_internals need one more symbol, which no TensorFlow has."""
    capability = getattr(tf_internals, name)
    monkeypatch.setattr(tf_internals, name, replace(capability, symbols=capability.symbols + (ABSENT,)))
    return (f"amp-rewrite: {{}} run in float32: TensorFlow {tf.__version__} lacks {ABSENT}, "
            f"which {capability.name} under amp-rewrite needs")


def float32_run(graph):
    with tf1.Session(graph=graph) as sess:
        sess.run("init")
        return sess.run("y:0", {"x:0": X})


def test_a_missing_session_internal_leaves_sessions_float32_with_one_line(amp_runtime, monkeypatch, caplog):
    want = float32_run(mlp_session_graph())
    expected = lacking(monkeypatch, "SESSIONS").format("TF1 sessions")
    with caplog.at_level(logging.WARNING, "amp_rewrite"):
        amp_runtime()
        graph = mlp_session_graph()
        with tf1.Session(graph=graph) as sess:
            sess.run("init")
            got = sess.run("y:0", {"x:0": X})
            assert runner_of(sess) is None
    assert np.array_equal(got, want)
    assert [r.getMessage() for r in caplog.records] == [expected]
    assert runtime.is_enabled()  # tf.function traces are rewritten still


def test_a_missing_loss_scaling_internal_keeps_float16_sessions_float32(amp_runtime, monkeypatch, caplog):
    expected = lacking(monkeypatch, "TF1_LOSS_SCALING").format("TF1 sessions")
    want = float32_run(mlp_session_graph())
    with caplog.at_level(logging.WARNING, "amp_rewrite"):
        amp_runtime()  # float16: sessions would need loss scaling
        graph = mlp_session_graph()
        with tf1.Session(graph=graph) as sess:
            sess.run("init")
            assert np.array_equal(sess.run("y:0", {"x:0": X}), want)
            assert runner_of(sess) is None
    assert [r.getMessage() for r in caplog.records] == [expected]


def test_a_missing_internal_raises_in_strict_mode_and_patches_nothing(monkeypatch):
    expected = lacking(monkeypatch, "SESSIONS").format("TF1 sessions")
    runtime.disable()
    try:
        with pytest.raises(RuntimeRewriteError) as raised:
            runtime.enable(settings=RuntimeSettings(target="float16", is_strict=True))
        assert "amp-rewrite: " + str(raised.value) == expected
        assert not runtime.is_enabled()
    finally:
        runtime.disable()


def dense_model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    return model


def fit_losses(model):
    y = 0.1 * X.mean(axis=1, keepdims=True)  # small gradients: no step skipped at the first scale
    return model.fit(X, y, epochs=3, batch_size=4, verbose=0, shuffle=False).history["loss"]


def test_missing_keras_optimizer_internals_make_fit_run_float32(amp_runtime, monkeypatch, caplog):
    want = fit_losses(dense_model())
    expected = lacking(monkeypatch, "KERAS3_OPTIMIZERS").format("tf.function traces")
    before = len(tracing.rewritten_functions())
    with caplog.at_level(logging.WARNING, "amp_rewrite"):
        amp_runtime()  # Keras is imported already: its optimizers are checked now
        got = fit_losses(dense_model())
    assert [r.getMessage() for r in caplog.records] == [expected]
    assert len(tracing.rewritten_functions()) == before
    assert got == want


def test_keras_optimizer_internals_there_make_fit_run_half(amp_runtime):
    want = fit_losses(dense_model())
    before = len(tracing.rewritten_functions())
    amp_runtime()
    got = fit_losses(dense_model())
    assert len(tracing.rewritten_functions()) > before
    np.testing.assert_allclose(got, want, rtol=5e-2)
    assert got != want


def test_a_newer_tensorflow_runs_with_one_info_line(amp_runtime, monkeypatch, caplog):
    runtime.disable()
    monkeypatch.setattr(tf, "__version__", "2.22.0")
    with caplog.at_level(logging.INFO, "amp_rewrite"):
        amp_runtime()
    assert runtime.is_enabled()
    untested = [r for r in caplog.records if "tested" in r.getMessage()]
    assert [(r.levelname, r.getMessage()) for r in untested] == [
        ("INFO", "amp-rewrite: TensorFlow 2.22.0 is newer than the versions tested (2.16 to 2.21); "
                 "its internals were checked and are there")]


def test_op_determinism_is_read_from_tensorflow():
    from tensorflow.python.framework import config

    assert not tf_internals.is_op_determinism_enabled()
    tf.config.experimental.enable_op_determinism()
    try:
        assert tf_internals.is_op_determinism_enabled()
    finally:
        config.disable_op_determinism()
    assert not tf_internals.is_op_determinism_enabled()


def test_a_captured_variable_handle_says_what_the_variable_holds():
    w = tf.Variable(tf.zeros([16, 2048], tf.bfloat16))

    @tf.function
    def f(x):
        return tf.matmul(x, w)

    graph = f.get_concrete_function(tf.TensorSpec([None, 16], tf.bfloat16)).graph
    found = [tf_internals.resource_handle_types(t) for t in graph.inputs]
    assert found == [[], [("bfloat16", (16, 2048))]]
