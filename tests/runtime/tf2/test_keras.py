"""Keras 3 under the runtime: fit with ENABLE_AUTO_MP=1, and custom loops in this process.

The fit tests run ``tools/example/tf2_keras_fit.py`` (an MLP and a CNN on synthetic
data) in two subprocesses, with and without the variable, and compare what
they wrote. The custom-loop tests patch this process with ``enable()``.
"""

import json
import logging
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import REPO, rng
from runners import clean_env

from amp_rewrite import runtime
from amp_rewrite.runtime.loss_scale import tf2_install
from amp_rewrite.runtime.settings import RuntimeSettings

FIT_TOOL = REPO / "tools" / "example" / "tf2_keras_fit.py"
EPOCHS = 6


@pytest.fixture(scope="module")
def fits(tmp_path_factory):
    """Both fits, run side by side: {"fp32": {model: result}, "amp": {model: result}}."""
    root = tmp_path_factory.mktemp("fit")
    runs = {}
    for name, extra in (("fp32", {}), ("amp", {"ENABLE_AUTO_MP": "1", "AMP_REWRITE_TARGET": "float16"})):
        out = root / f"{name}.json"
        command = [sys.executable, str(FIT_TOOL), "--out", str(out), "--epochs", str(EPOCHS)]
        runs[name] = (out, subprocess.Popen(command, env=clean_env(**extra), stdout=subprocess.DEVNULL,
                                            stderr=subprocess.PIPE, text=True))
    results = {}
    for name, (out, process) in runs.items():
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr[-4000:]
        results[name] = {r["model"]: r for r in json.loads(out.read_text())}
    return results


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_fit_under_the_switch_scales_the_loss_and_keeps_float32_weights(fits, model):
    amp, fp32 = fits["amp"][model], fits["fp32"][model]
    assert amp["optimizer"] == fp32["optimizer"] == "Adam"  # compile keeps the user's optimizer
    assert amp["loss_scale"] == {"scale": 32768.0, "skipped": 0} and fp32["loss_scale"] is None
    assert amp["weight_dtypes"] == fp32["weight_dtypes"] == ["float32"]


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_fit_loss_falls_like_the_float32_loss(fits, model):
    amp, fp32 = fits["amp"][model]["losses"], fits["fp32"][model]["losses"]
    assert len(amp) == EPOCHS
    assert amp[-1] < 0.25 * amp[0]
    np.testing.assert_allclose(amp, fp32, rtol=2e-2)
    assert amp != fp32  # the half math really ran


@pytest.mark.parametrize("model, half_ops", [
    ("mlp", {"MatMul", "ReluGrad", "BiasAddGrad"}),
    ("cnn", {"Conv2D", "Conv2DBackpropFilter", "Conv2DBackpropInput", "MatMul"}),
])
def test_fit_runs_the_rewritten_train_step(fits, model, half_ops):
    rewritten = fits["amp"][model]["rewritten"]
    steps = [r for r in rewritten if r["name"] == "one_step_on_data"]
    assert steps and all(half_ops <= set(r["half_ops"]) for r in steps)
    assert fits["fp32"][model]["rewritten"] == []


@pytest.fixture
def amp_runtime():
    runtime.disable()
    runtime.enable(settings=RuntimeSettings(target="float16"))
    yield
    runtime.disable()


def small_model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])


def test_compile_keeps_the_optimizer(amp_runtime):
    model = small_model()
    sgd = keras.optimizers.SGD()
    model.compile(optimizer=sgd, loss="mse")
    assert model.optimizer is sgd
    assert runtime.installed_changes(tf2_install.LEDGER_NAME)
    ledger = runtime._ACTIVE.ledger  # pylint: disable=protected-access
    runtime.disable()
    assert not ledger.installed(tf2_install.LEDGER_NAME)


def eager_step(model, x, y, *, wrapper=None):
    """One custom-loop step; returns (the true gradient, the weight change).

    With ``wrapper`` (a LossScaleOptimizer), the loop scales as Keras documents.
    """
    optimizer = wrapper or model.optimizer
    kernel = model.trainable_variables[0]
    before = kernel.numpy()
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x) - y))
        scaled = optimizer.scale_loss(loss)
    grads = tape.gradient(scaled, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    true_grad = grads[0].numpy() / (float(wrapper.dynamic_scale.numpy()) if wrapper else 1.0)
    return true_grad, kernel.numpy() - before


def traced_step(model, x, y):
    """The same step (unscaled) as a tf.function, which the runtime rewrites; the gradient is eager."""
    kernel = model.trainable_variables[0]
    before = kernel.numpy()
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x) - y))
    grad = tape.gradient(loss, kernel).numpy()

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        model.optimizer.apply_gradients(zip(grads, model.trainable_variables))

    step()
    return grad, kernel.numpy() - before


@pytest.mark.parametrize("step, rtol", [(eager_step, 1e-5), (traced_step, 2e-2)])
def test_custom_loop_applies_the_true_gradients(amp_runtime, caplog, step, rtol):
    model = small_model()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    model.optimizer.build(model.trainable_variables)
    x = rng(4).normal(size=(16, 8)).astype(np.float32)
    y = rng(5).normal(size=(16, 4)).astype(np.float32)
    with caplog.at_level(logging.WARNING, "amp_rewrite"):
        for _ in range(2):
            grad, change = step(model, x, y)
            np.testing.assert_allclose(change, -0.1 * grad, rtol=rtol, atol=1e-3 * np.abs(grad).max())
    assert [r.getMessage() for r in caplog.records] == []
    assert float(runtime.loss_scaling().state().scale.numpy()) == 32768.0


def test_a_loss_scale_optimizer_is_not_scaled_twice(amp_runtime):
    model = small_model()
    wrapper = keras.optimizers.LossScaleOptimizer(inner_optimizer=keras.optimizers.SGD(0.1),
                                                  initial_scale=64.0)
    x = rng(4).normal(size=(16, 8)).astype(np.float32)
    y = rng(5).normal(size=(16, 4)).astype(np.float32)
    want = x.T @ (2.0 * (model(x).numpy() - y) / y.size)  # d mean((xW + b - y)^2) / dW
    grad, change = eager_step(model, x, y, wrapper=wrapper)
    np.testing.assert_allclose(grad, want, rtol=1e-4, atol=1e-6)  # scaled by 64 only
    np.testing.assert_allclose(change, -0.1 * grad, rtol=1e-5, atol=1e-7)
    assert not runtime.loss_scaling().has_state()  # neither the tape nor the optimizers scaled
