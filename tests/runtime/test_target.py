"""The runtime's target: chosen for the machine, forced by setting; bfloat16 scales no loss."""

import logging

import numpy as np
import pytest
import tensorflow as tf
from helpers import loss_scale_reports, runner_of

from amp_rewrite import runtime
from amp_rewrite.errors import UsageError
from amp_rewrite.runtime import target
from amp_rewrite.runtime.loss_scale import tf1_optimizer
from amp_rewrite.runtime.settings import RuntimeSettings

tf1 = tf.compat.v1

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9R14
flags\t\t: fpu sse sse2 avx2 avx512f avx512_bf16 {extra}
bugs\t\t: sysret_ss_attrs

processor\t: 1
flags\t\t: fpu
"""


@pytest.mark.parametrize("gpus, flags, expected", [
    (["GPU:0"], {"avx512_bf16"}, "float16"),
    (["GPU:0", "GPU:1"], set(), "float16"),
    ([], {"avx512f", "avx512_bf16"}, "bfloat16"),
    ([], {"amx_bf16", "amx_tile"}, "bfloat16"),
    ([], {"avx2", "avx512f", "fma"}, None),
    ([], set(), None),
])
def test_auto_follows_the_machine(gpus, flags, expected):
    choice = target.choose_target("auto", list_gpus=lambda: gpus, read_cpu_flags=lambda: flags)
    assert choice.target == expected
    assert choice.reason


@pytest.mark.parametrize("setting", ["float16", "bfloat16"])
def test_a_forced_target_ignores_the_machine(setting):
    def unused():
        raise AssertionError("a forced target must not look at the machine")

    choice = target.choose_target(setting, list_gpus=unused, read_cpu_flags=unused)
    assert choice == target.TargetChoice(setting, f"{setting} was requested")


def test_cpu_flags_come_from_the_first_processor(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO.format(extra="amx_bf16"))
    assert {"avx512_bf16", "amx_bf16", "avx2"} <= target.cpu_flags(str(path))
    assert target.cpu_flags(str(tmp_path / "missing")) == frozenset()


@pytest.mark.parametrize("text, expected", [
    ("", "auto"), ("auto", "auto"), (" BFloat16 ", "bfloat16"), ("float16", "float16"),
])
def test_target_setting_is_read_from_the_environment(text, expected):
    assert RuntimeSettings.from_env({"AMP_REWRITE_TARGET": text}).target == expected


def test_an_unknown_target_is_a_usage_error():
    with pytest.raises(UsageError, match="AMP_REWRITE_TARGET='fp8'"):
        RuntimeSettings.from_env({"AMP_REWRITE_TARGET": "fp8"})
    with pytest.raises(UsageError, match="unknown target"):
        RuntimeSettings(target="half")


@pytest.fixture
def machine(monkeypatch):
    """Makes ``auto`` see the given GPUs and CPU flags; the runtime is off before and after."""

    def pretend(gpus=(), flags=()):
        monkeypatch.setattr(target, "_tensorflow_gpus", lambda: list(gpus))
        monkeypatch.setattr(target, "cpu_flags", lambda: frozenset(flags))

    runtime.disable()
    yield pretend
    runtime.disable()


def test_auto_without_fast_half_leaves_tensorflow_alone(machine, caplog):
    from tensorflow.python.client import session as session_lib

    machine(flags={"avx2"})
    original = session_lib.BaseSession.run
    with caplog.at_level(logging.INFO, "amp_rewrite"):
        runtime.enable(settings=RuntimeSettings())
    assert not runtime.is_enabled() and runtime.current_target() is None
    assert session_lib.BaseSession.run is original
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "float32" in lines[0] and "AVX512_BF16" in lines[0]


@pytest.mark.parametrize("gpus, flags, expected", [
    (["GPU:0"], (), "float16"), ((), ("avx512_bf16",), "bfloat16"),
])
def test_auto_patches_for_the_chosen_target(machine, gpus, flags, expected):
    machine(gpus=gpus, flags=flags)
    runtime.enable(settings=RuntimeSettings())
    assert runtime.is_enabled() and runtime.current_target() == expected
    assert runtime.target_choice().target == expected


def test_enable_target_argument_wins_over_the_settings(machine):
    machine(flags=())
    runtime.enable(settings=RuntimeSettings(target="float16"), target="bfloat16")
    assert runtime.current_target() == "bfloat16"


def train_graph():
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(0)
        x = tf1.placeholder(tf.float32, [None, 8], name="x")
        labels = tf1.placeholder(tf.int32, [None], name="labels")
        w1 = tf1.get_variable("w1", [8, 32], initializer=tf1.initializers.random_normal(seed=1))
        w2 = tf1.get_variable("w2", [32, 4], initializer=tf1.initializers.random_normal(seed=2))
        hidden = tf.nn.relu(tf.matmul(x, w1, name="mm1"), name="relu1")
        logits = tf.matmul(hidden, w2, name="logits")
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=logits), name="loss")
        train = tf1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train")
        init = tf1.global_variables_initializer()
    return graph, loss, train, init


def batch():
    rng = np.random.default_rng(0)
    return {"x:0": rng.normal(size=(16, 8)).astype(np.float32),
            "labels:0": rng.integers(0, 4, size=16)}


def losses(graph, loss, train, init, steps=5):
    with tf1.Session(graph=graph) as sess:
        sess.run(init)
        out = [sess.run([loss, train], batch())[0] for _ in range(steps)]
        shadow = runner_of(sess)
        return out, (shadow.shadow_graph if shadow is not None else None)


def test_bfloat16_adds_no_loss_scale_ops_and_trains_in_bfloat16(amp_runtime):
    float32, _ = losses(*train_graph())
    amp_runtime(RuntimeSettings(target="bfloat16"))
    graph, loss, train, init = train_graph()
    assert not graph.get_collection(tf1_optimizer.STATE_COLLECTION)
    assert not [op.name for op in graph.get_operations() if "amp_loss_scale" in op.name]
    assert not loss_scale_reports(graph)
    got, shadow = losses(graph, loss, train, init)
    assert shadow.get_operation_by_name("mm1").get_attr("T") == tf.bfloat16
    assert shadow.get_operation_by_name("logits").get_attr("T") == tf.bfloat16
    assert all(isinstance(v, np.float32) for v in got)
    # bfloat16 keeps 8 bits of mantissa: within a few percent of float32.
    np.testing.assert_allclose(got, float32, rtol=3e-2)
    assert got[-1] < got[0]


def test_amp_loss_scale_still_scales_under_bfloat16(amp_runtime, monkeypatch):
    monkeypatch.setenv("AMP_LOSS_SCALE", "128")
    monkeypatch.setenv("AMP_REWRITE_TARGET", "bfloat16")
    amp_runtime(RuntimeSettings.from_env())  # read once, as enable() reads it
    graph, *_ = train_graph()
    assert len(graph.get_collection(tf1_optimizer.STATE_COLLECTION)) == 3


def test_float16_keeps_dynamic_loss_scaling(amp_runtime):
    amp_runtime(RuntimeSettings(target="float16"))
    graph, *_ = train_graph()
    assert len(graph.get_collection(tf1_optimizer.STATE_COLLECTION)) == 3
    assert loss_scale_reports(graph)


@pytest.mark.parametrize("setting, scales", [("bfloat16", False), ("float16", True)])
def test_tf2_loss_scaling_is_installed_only_for_float16(amp_runtime, setting, scales):
    import keras

    from amp_rewrite import runtime
    from amp_rewrite.runtime.loss_scale import tf2_install
    from amp_rewrite.runtime.tf2 import tracing

    amp_runtime(RuntimeSettings(target=setting))
    assert bool(runtime.installed_changes(tf2_install.LEDGER_NAME)) is scales
    assert (runtime.loss_scaling() is not None) is scales
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    assert type(model.optimizer).__name__ == "SGD"
    assert tracing.default_config().target == setting


@pytest.mark.parametrize("gpus, expected", [(["GPU:0"], "GPU"), ([], "CPU")])
def test_the_runtime_asks_the_offline_pass_which_device_its_graphs_run_on(monkeypatch, gpus, expected):
    from amp_rewrite.graph import op_registry
    from amp_rewrite.runtime.tf2 import tracing

    monkeypatch.setattr(op_registry, "visible_gpus", lambda: list(gpus))
    monkeypatch.setattr(target, "cpu_flags", lambda: frozenset())
    assert op_registry.default_device_type(runs_here=True) == expected
    assert tracing.default_config().device_type == expected
    assert target.choose_target("auto").target == ("float16" if gpus else None)


def test_the_offline_default_device_does_not_depend_on_this_machines_gpus(monkeypatch):
    from amp_rewrite.graph import op_registry

    def unused():
        raise AssertionError("an offline rewrite may run elsewhere: no look at this machine")

    monkeypatch.setattr(op_registry, "visible_gpus", unused)
    assert op_registry.default_device_type() == (
        "GPU" if op_registry.build_has_device_type("GPU") else "CPU")
