"""XLA-compiled functions under the runtime: float32 under ``auto`` on a CPU, rewritten when a target is forced."""

import logging

import numpy as np
import pytest
import tensorflow as tf
from helpers import rng

from amp_rewrite.runtime import target
from amp_rewrite.runtime.settings import RuntimeSettings
from amp_rewrite.runtime.tf2 import tracing

W = tf.constant(rng(4).standard_normal((16, 16)).astype(np.float32) * 0.3)
X = tf.constant(rng(5).standard_normal((4, 16)).astype(np.float32))


def matmul_types(graph) -> set:
    return {op.get_attr("T") for op in graph.get_operations() if op.type == "MatMul"}


def _step(x):
    return tf.nn.relu(tf.matmul(x, W))


@pytest.fixture
def fast_bf16_cpu(monkeypatch):
    """A CPU with AVX512_BF16 and no GPU, so that ``auto`` picks bfloat16."""
    from amp_rewrite.graph import op_registry

    monkeypatch.setattr(target, "cpu_flags", lambda: frozenset({"avx2", "avx512_bf16"}))
    monkeypatch.setattr(op_registry, "visible_gpus", lambda: [])


class _Def:
    def __init__(self, xla):
        from tensorflow.core.framework import function_pb2

        self.function_def = function_pb2.FunctionDef()
        if xla is not None:
            self.function_def.attr["_XlaMustCompile"].b = xla


@pytest.mark.parametrize("xla, setting, device, stays", [
    (True, "auto", "CPU", True),
    (True, "bfloat16", "CPU", False),  # asked for: rewritten
    (True, "float16", "CPU", False),
    (True, "auto", "GPU", False),  # XLA has fast half kernels on a GPU
    (True, None, "CPU", False),  # not the runtime: amp_rewrite.function
    (False, "auto", "CPU", False),
    (None, "auto", "CPU", False),
])
def test_which_xla_functions_stay_float32(xla, setting, device, stays):
    reason = tracing.xla_keeps_float32(_Def(xla).function_def, setting=setting, device_type=device)
    assert (reason is not None) is stays
    if stays:
        assert reason.startswith("XLA-compiled (jit_compile=True) on a CPU")
        assert "without jit_compile, bfloat16 runs on oneDNN's kernels" in reason


def test_auto_on_a_cpu_leaves_an_xla_function_float32_with_one_line(amp_runtime, fast_bf16_cpu, caplog):
    amp_runtime(RuntimeSettings(target="auto"))
    caplog.set_level(logging.INFO, logger="amp_rewrite")
    compiled = tf.function(_step, jit_compile=True).get_concrete_function(X)
    plain = tf.function(_step).get_concrete_function(X)
    assert matmul_types(compiled.graph) == {tf.float32}
    assert tracing.record_of(compiled) is None
    assert matmul_types(plain.graph) == {tf.bfloat16}  # the same math without XLA is rewritten
    lines = [r.getMessage() for r in caplog.records if "runs in float32" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("amp-rewrite: tf.function ") and "\n" not in lines[0]
    assert tracing.XLA_ON_CPU in lines[0]


def test_a_forced_target_still_rewrites_an_xla_function(amp_runtime, fast_bf16_cpu):
    amp_runtime(RuntimeSettings(target="bfloat16"))
    compiled = tf.function(_step, jit_compile=True).get_concrete_function(X)
    assert matmul_types(compiled.graph) == {tf.bfloat16}
    assert tracing.record_of(compiled) is not None


def test_an_xla_function_called_from_a_plain_one_keeps_its_float32_body(amp_runtime, fast_bf16_cpu):
    amp_runtime(RuntimeSettings(target="auto"))
    inner = tf.function(_step, jit_compile=True)

    @tf.function
    def outer(x):
        return tf.matmul(inner(x), W)

    traced = outer.get_concrete_function(X)
    record = tracing.record_of(traced)
    assert record is not None  # the outer MatMul is rewritten
    assert matmul_types(traced.graph) == {tf.bfloat16}
    library = {f.signature.name: f for f in record.rewritten.result.graph_def.library.function}
    compiled = [f for f in library.values() if "_XlaMustCompile" in f.attr and f.attr["_XlaMustCompile"].b]
    assert compiled and all(
        node.attr["T"].type == tf.float32.as_datatype_enum
        for f in compiled for node in f.node_def if node.op == "MatMul")
    reasons = [e["reason"] for e in record.rewritten.result.node_outcomes.values()]
    assert any("call not rewritten: XLA-compiled (jit_compile=True) on a CPU" in r for r in reasons)
    np.testing.assert_allclose(traced(X).numpy(), (tf.nn.relu(X @ W) @ W).numpy(), rtol=3e-2, atol=3e-2)


@pytest.mark.gpu
def test_gpu_auto_runs_an_xla_function_in_float16_close_to_float32(amp_runtime):
    """On a GPU, ``auto`` picks float16 and rewrites an XLA function (XLA has fast half kernels there)."""
    from helpers import float32_as_float32

    from amp_rewrite import runtime

    weights = tf.constant(rng(6).standard_normal((512, 512)).astype(np.float32) * 0.05)
    x = tf.constant(rng(7).standard_normal((256, 512)).astype(np.float32))

    def layers(x, w):
        return tf.nn.softmax(tf.matmul(tf.nn.gelu(tf.matmul(x, w)), w))

    want = layers(tf.cast(x, tf.float64), tf.cast(weights, tf.float64)).numpy()  # the reference of both
    with float32_as_float32():
        float32 = tf.function(layers, jit_compile=True)(x, weights).numpy()
    amp_runtime(RuntimeSettings(target="auto"))
    assert runtime.current_target() == "float16"
    compiled = tf.function(layers, jit_compile=True)
    traced = compiled.get_concrete_function(x, weights)
    assert matmul_types(traced.graph) == {tf.float16}
    assert tracing.record_of(traced) is not None
    got = compiled(x, weights)
    assert got.dtype == tf.float32 and "GPU" in got.device, got.device
    assert not np.array_equal(got.numpy(), float32)  # the half math ran
    np.testing.assert_allclose(float32, want, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(got.numpy(), want, rtol=2e-2, atol=2e-4)
