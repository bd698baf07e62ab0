"""The tuner: decisions from injected timings, the disk cache, the budget, the reasons, and tuning off."""

import json
import logging

import numpy as np
import pytest
import tensorflow as tf
from helpers import BF16, F32, amp, assert_same_outputs_within_half, half_nodes, rng, run, tf1
from runners import run_cli

from amp_rewrite import Config, rewrite
from amp_rewrite.paint import rules as painting
from amp_rewrite.tune.cache import FORMAT, Timing, TuneCache, default_cache_dir, device_description
from amp_rewrite.tune.regions import RegionCase
from amp_rewrite.tune.shapes import InputSpec
from amp_rewrite.tune.timing import benchmark_graph
from amp_rewrite.tune.tuner import MARGIN, Tuner, case_for


def heavy_graph(batch=8):
    """x → mm_fast → relu1 → mm_slow → relu2 → conv input …; each heavy op a distinct shape."""
    g = tf.Graph()
    r = rng(5)
    with g.as_default():
        x = tf1.placeholder(tf.float32, [batch, 32], name="x")
        w1 = tf.constant(r.standard_normal((32, 64)).astype(np.float32) * 0.2, name="w1")
        w2 = tf.constant(r.standard_normal((64, 48)).astype(np.float32) * 0.2, name="w2")
        h = tf.nn.relu(tf.matmul(x, w1, name="mm_fast"), name="relu1")
        h = tf.nn.relu(tf.matmul(h, w2, name="mm_slow"), name="relu2")
        img = tf.reshape(h, [batch, 4, 4, 3], name="img")
        k = tf.constant(r.standard_normal((3, 3, 3, 8)).astype(np.float32) * 0.2, name="k")
        c = tf.nn.conv2d(img, k, 1, "SAME", name="conv_tie")
        tf.identity(tf.reduce_mean(c, axis=[1, 2]), name="y")
    return g.as_graph_def()


FEEDS = {"x": rng(6).standard_normal((8, 32)).astype(np.float32)}
# milliseconds (float32, half) per op: faster in half, slower, and a near tie inside the margin
TIMINGS = {"mm_fast": (1.0, 0.5), "mm_slow": (1.2, 1.8), "conv_tie": (1.0, 0.95)}


class FakeMeasure:
    """Times by the op's first input shape, as the real one would by its key; counts calls.

    A half region (a heavy op with the elementwise ops it took into half) is
    timed as twice as fast in half, so the regions keep what the ops chose;
    their keys are kept apart, in ``regions``.
    """

    def __init__(self, by_shape):
        self.by_shape = by_shape
        self.calls = []
        self.regions = []

    def __call__(self, case):
        if isinstance(case, RegionCase):
            self.regions.append(case.key)
            return Timing(2e-3, 1e-3)
        self.calls.append(case.key)
        f32, half = self.by_shape[case.inputs[0].shape]
        return Timing(f32 / 1e3, half / 1e3)


SHAPES = {(8, 32): TIMINGS["mm_fast"], (8, 64): TIMINGS["mm_slow"], (8, 4, 4, 3): TIMINGS["conv_tie"]}


def tuner(measure, cache=None, **kwargs):
    return Tuner(target="bfloat16", device_type="CPU", measure=measure, cache=cache, **kwargs)


def tuned(graph_def, measure, cache=None, **kwargs):
    return rewrite(graph_def, fetches=["y"], config=Config(device_type="CPU", target="bfloat16"),
                   tuner=tuner(measure, cache, **kwargs))


def test_half_only_where_it_measured_faster_by_the_margin():
    gd = heavy_graph()
    result = tuned(gd, FakeMeasure(SHAPES))
    types = {n.name: n.attr["T"].type for n in result.graph_def.node if "T" in n.attr}
    assert types["mm_fast"] == BF16  # 0.5 ms vs 1.0 ms
    assert types["mm_slow"] == F32  # 1.8 ms vs 1.2 ms
    assert types["conv_tie"] == F32  # 0.95 ms vs 1.0 ms: inside the margin
    assert 0.95 > 1.0 * (1 - MARGIN)
    assert types["relu1"] == BF16  # clear op after a half MatMul still follows it
    assert types["relu2"] == F32
    assert half_nodes(result.graph_def) == {"mm_fast", "relu1", "w1"}  # w1: a Const stored in half
    assert_same_outputs_within_half(gd, result.graph_def, ["y"], FEEDS)


def test_every_decision_is_a_reason_in_the_report_and_explain_and_at_debug(caplog):
    caplog.set_level(logging.DEBUG, logger="amp_rewrite.pipeline")
    result = tuned(heavy_graph(), FakeMeasure(SHAPES))
    nodes = result.report()["nodes"]
    assert nodes["mm_slow"]["reason"] == (
        "mm_slow (MatMul) stays float32: kept float32: 1.8 ms in bfloat16 vs 1.2 ms in float32 on this CPU")
    assert nodes["mm_fast"]["reason"] == (
        "mm_fast (MatMul) → bfloat16: allow-list op, measured faster in half: "
        "0.5 ms in bfloat16 vs 1 ms in float32 on this CPU; "
        "its half region (MatMul, Relu) measured faster: 1 ms in bfloat16 vs 2 ms in float32 on this CPU")
    assert "kept float32: 0.95 ms in bfloat16 vs 1 ms in float32" in nodes["conv_tie"]["reason"]
    logged = [r.getMessage() for r in caplog.records]
    assert nodes["mm_slow"]["reason"] in logged and nodes["mm_fast"]["reason"] in logged
    assert "keep_float32_where_half_is_slower: +allow 0, +deny 2, unmarked 0" in logged


def unknown_dims_graph(shape):
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, shape, name="x")
        w = tf.constant(rng(1).standard_normal((16, 16)).astype(np.float32), name="w")
        tf.identity(tf.matmul(x, w, name="mm"), name="y")
    return g.as_graph_def()


def test_an_op_whose_shapes_are_not_static_keeps_the_lists_verdict():
    measure = FakeMeasure({})
    result = tuned(unknown_dims_graph([4, None]), measure)
    assert measure.calls == []
    assert "mm" in half_nodes(result.graph_def)
    assert result.node_outcomes["mm"]["reason"].endswith(
        "allow-list op, not measured: input shapes unknown (input 0 is (4, None))")
    without_hint = tuned(unknown_dims_graph([None, 16]), measure, batch_hint=None)
    assert measure.calls == [] and "mm" in half_nodes(without_hint.graph_def)
    assert "input shapes unknown (input 0 is (None, 16))" in without_hint.node_outcomes["mm"]["reason"]


def test_an_unknown_batch_dimension_is_timed_at_the_hint_and_said():
    measure = FakeMeasure({(24, 16): (1.0, 2.0)})
    gd = unknown_dims_graph([None, 16])
    result = tuned(gd, measure, batch_hint=24)
    assert len(measure.calls) == 1 and measure.calls[0].startswith("MatMul [float32[24,16] float32[16,16]]")
    assert not half_nodes(result.graph_def)
    assert result.node_outcomes["mm"]["reason"].endswith(
        "kept float32: 2 ms in bfloat16 vs 1 ms in float32 on this CPU (unknown batch dimension timed as 24)")
    assert_same_outputs_within_half(gd, result.graph_def, ["y"], {"x": np.ones((3, 16), np.float32)})


def test_identical_ops_are_measured_once():
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [4, 16], name="x")
        w = tf.constant(rng(1).standard_normal((16, 16)).astype(np.float32), name="w")
        a = tf.matmul(x, w, name="mm_a")
        tf.identity(tf.matmul(x, w, name="mm_b") + a, name="y")
    measure = FakeMeasure({(4, 16): (1.0, 2.0)})
    result = tuned(g.as_graph_def(), measure)
    assert len(measure.calls) == 1
    assert not half_nodes(result.graph_def)


def test_the_budget_bounds_the_first_run_and_says_so():
    clock = iter(np.arange(0.0, 100.0, 0.6)).__next__  # each measurement costs 0.6 s
    measure = FakeMeasure(SHAPES)
    result = tuned(heavy_graph(), measure, budget_seconds=1.0, clock=clock)
    assert len(set(measure.calls)) == 2  # 0.6 s, 1.2 s: the third would exceed 1 s
    reason = result.node_outcomes["conv_tie"]["reason"]
    assert "not measured: the tuning time budget of 1 s was used up" in reason
    assert "conv_tie" in half_nodes(result.graph_def)  # the lists' verdict


def test_a_case_that_fails_to_run_keeps_the_lists_verdict():
    def failing(case):
        raise RuntimeError("no kernel\nmore text")

    result = tuned(heavy_graph(), failing)
    assert {"mm_fast", "mm_slow", "conv_tie"} <= half_nodes(result.graph_def)
    assert result.node_outcomes["mm_slow"]["reason"].endswith(
        "not measured: timing it failed (RuntimeError: no kernel)")


def batch_norm_graph():
    g = tf.Graph()
    r = rng(2)
    with g.as_default():
        x = tf1.placeholder(tf.float32, [2, 6, 6, 4], name="x")
        k = tf.constant(r.standard_normal((3, 3, 4, 4)).astype(np.float32) * 0.3, name="k")
        c = tf.nn.conv2d(x, k, 1, "SAME", name="conv")
        ones, zeros = tf.ones([4]), tf.zeros([4])
        y, _, _ = tf1.nn.fused_batch_norm(c, ones, zeros, mean=zeros, variance=ones, is_training=False,
                                          name="bn")
        tf.identity(tf.nn.relu(y, name="relu"), name="y")
    return g.as_graph_def()


def test_an_infer_op_measured_slower_stays_float32_between_half_ops():
    gd = batch_norm_graph()
    calls = []

    def by_op(case):
        calls.append(case.op)
        return Timing(1e-3, 0.5e-3) if case.op == "Conv2D" else Timing(1e-3, 3e-3)

    result = tuned(gd, by_op)
    kinds = {n.name: n for n in result.graph_def.node}
    assert calls == ["Conv2D", "Conv2D", "FusedBatchNormV3"]  # a half win is measured twice
    assert kinds["conv"].attr["T"].type == BF16
    assert kinds["bn"].attr["T"].type == F32
    assert kinds["relu"].attr["T"].type == F32  # the lists would have painted both
    assert {"bn", "relu"} <= half_nodes(amp(gd, ["y"], target="bfloat16").graph_def)
    assert "kept float32: 3 ms in bfloat16 vs 1 ms in float32" in result.node_outcomes["bn"]["reason"]
    feeds = {"x": rng(3).standard_normal((2, 6, 6, 4)).astype(np.float32)}
    assert_same_outputs_within_half(gd, result.graph_def, ["y"], feeds)


def cache_for(directory, device="CPU test (avx2)"):
    return TuneCache(directory, device=device, tensorflow=tf.__version__)


def test_the_second_run_measures_nothing_and_decides_the_same(tmp_path):
    gd = heavy_graph()
    first = FakeMeasure(SHAPES)
    one = tuned(gd, first, cache_for(tmp_path))
    assert len(set(first.calls)) == 3

    def must_not_run(case):
        raise AssertionError(f"measured {case.key} again")

    two = tuned(gd, must_not_run, cache_for(tmp_path))
    assert two.graph_def.SerializeToString(deterministic=True) == one.graph_def.SerializeToString(deterministic=True)
    assert two.report()["nodes"] == one.report()["nodes"]
    saved = json.loads(cache_for(tmp_path).path.read_text())
    assert saved["format"] == FORMAT and saved["tensorflow"] == tf.__version__
    assert sorted(saved["entries"]) == sorted(set(first.calls + first.regions))


@pytest.mark.parametrize("content, why", [
    ("{not json", "not JSON"),
    (json.dumps({"format": "something else", "entries": {}}), "not a tuning cache of this version"),
    (json.dumps({"format": FORMAT, "device": "CPU elsewhere", "tensorflow": "0.1", "entries": {"k": [1, 2]}}),
     "made for 'CPU elsewhere' with TensorFlow '0.1'"),
])
def test_a_corrupt_or_foreign_cache_file_is_ignored_with_one_line(tmp_path, caplog, content, why):
    cache = cache_for(tmp_path)
    cache.path.write_text(content)
    caplog.set_level(logging.WARNING)
    measure = FakeMeasure(SHAPES)
    result = tuned(heavy_graph(), measure, cache_for(tmp_path))
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert warnings[0].startswith(f"amp-rewrite: ignoring tuning cache {cache.path}: ") and why in warnings[0]
    assert len(set(measure.calls)) == 3 and "mm_fast" in half_nodes(result.graph_def)
    assert json.loads(cache.path.read_text())["device"] == "CPU test (avx2)"  # replaced by a valid one


def test_an_unwritable_cache_costs_one_warning(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    caplog.set_level(logging.WARNING)
    result = tuned(heavy_graph(), FakeMeasure(SHAPES), cache_for(blocker / "sub"))
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "tuning cache" in warnings[0] and "not written" in warnings[0]
    assert "mm_slow" not in half_nodes(result.graph_def)


def test_cache_location_follows_the_override_then_xdg_then_home():
    assert Config.from_env({"AMP_REWRITE_TUNE_CACHE": "/x/y", "XDG_CACHE_HOME": "/c"}).tune_cache_dir == "/x/y"
    assert Config.from_env({}).tune_cache_dir is None
    assert str(default_cache_dir({"XDG_CACHE_HOME": "/c"})) == "/c/amp-rewrite"
    assert str(default_cache_dir({})).endswith(".cache/amp-rewrite")


def test_the_device_description_names_the_cpu_model_and_its_kernel_flags(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Some CPU 9000\nflags\t\t: fpu avx2 sse4_2 avx512_bf16 f16c\n")
    text = device_description("CPU", cpuinfo_path=str(info))
    assert text.startswith("CPU Some CPU 9000 (avx2 f16c avx512_bf16), ")
    assert device_description("GPU", gpu_name="Tesla V100") == "GPU Tesla V100"


def test_tuning_off_builds_no_tuner_and_changes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    gd = heavy_graph()
    plain = amp(gd, ["y"], target="bfloat16")
    assert "keep_float32_where_half_is_slower" in [r.__name__ for r in painting.RULES]
    assert {"mm_fast", "mm_slow", "conv_tie"} <= half_nodes(plain.graph_def)
    assert not any("measured" in e["reason"] for e in plain.report()["nodes"].values())
    assert not list(tmp_path.iterdir())  # nothing timed, nothing cached


def test_the_key_separates_what_changes_the_speed_and_ignores_names_and_devices():
    node = tf1.NodeDef(name="a", op="MatMul", device="/device:CPU:0")
    node.attr["T"].type = F32
    node.attr["transpose_a"].b = False
    node.attr["_class"].s = b"loc:@x"
    specs = (InputSpec(F32, (4, 16)), InputSpec(F32, (16, 8)))
    key = case_for(node, specs, ("T",), "bfloat16").key
    renamed = tf1.NodeDef()
    renamed.CopyFrom(node)
    renamed.name, renamed.device = "b", ""
    del renamed.attr["_class"]
    assert case_for(renamed, specs, ("T",), "bfloat16").key == key
    assert key.startswith("MatMul [float32[4,16] float32[16,8]] T->bfloat16 ")
    transposed = tf1.NodeDef()
    transposed.CopyFrom(node)
    transposed.attr["transpose_a"].b = True
    assert case_for(transposed, specs, ("T",), "bfloat16").key != key
    assert case_for(node, specs, ("T",), "float16").key != key
    assert case_for(node, (specs[0], InputSpec(F32, (16, 9))), ("T",), "bfloat16").key != key


def test_the_benchmark_graph_runs_both_variants_with_casts_around_the_half_one():
    gd = batch_norm_graph()
    measure_cases = []
    tuned(gd, lambda case: measure_cases.append(case) or Timing(1.0, 0.1))
    bn = next(c for c in measure_cases if c.op == "FusedBatchNormV3")
    graph_def, float_name, half_names = benchmark_graph(bn, device="/device:CPU:0")
    nodes = {n.name: n for n in graph_def.node}
    assert nodes["half_op"].attr["T"].type == BF16 and nodes["half_op"].attr["U"].type == F32
    assert list(nodes["half_op"].input) == ["cast_in0", "input1", "input2", "input3", "input4"]
    assert half_names == ["cast_out0"]  # y only: the batch statistics are U, float32
    assert nodes[float_name].attr["T"].type == F32
    got_float, got_half = run(graph_def, [float_name, "cast_out0"])
    np.testing.assert_allclose(got_half, got_float, rtol=2e-2, atol=2e-2)


def test_timing_under_the_runtime_runs_the_op_as_given(amp_runtime, caplog):
    """With ENABLE_AUTO_MP on, the timing sessions are not rewritten again by the runtime's session patch."""
    from amp_rewrite.runtime.settings import RuntimeSettings
    from amp_rewrite.tune.timing import measure

    measure_cases = []
    tuned(heavy_graph(), lambda case: measure_cases.append(case) or Timing(1.0, 0.1))
    amp_runtime(RuntimeSettings(target="bfloat16"))
    with caplog.at_level(logging.DEBUG, logger="amp_rewrite.runtime"):
        timing = measure(next(c for c in measure_cases if c.op == "MatMul"), device_type="CPU")
    assert timing.float32 > 0 and timing.half > 0
    assert not [r.getMessage() for r in caplog.records if r.name.startswith("amp_rewrite.runtime.tf1")]


def test_the_runtime_reads_its_tuning_switches_once(monkeypatch, amp_runtime):
    from amp_rewrite.errors import UsageError
    from amp_rewrite.runtime.settings import RuntimeSettings
    from amp_rewrite.runtime.tf2 import tracing

    assert RuntimeSettings.from_env({}).is_tuning is False
    settings = RuntimeSettings.from_env({"AMP_REWRITE_TUNE": "1", "AMP_REWRITE_TUNE_BUDGET": "7.5",
                                         "AMP_REWRITE_TUNE_CACHE": "/somewhere", "AMP_REWRITE_TUNE_BATCH": "16",
                                         "AMP_REWRITE_TARGET": "float16"})  # rewriting here, whatever the CPU
    assert (settings.is_tuning, settings.tune_budget_seconds, settings.tune_cache_dir, settings.tune_batch) == (
        True, 7.5, "/somewhere", 16)
    with pytest.raises(UsageError, match="AMP_REWRITE_TUNE_BUDGET='soon': not a number"):
        RuntimeSettings.from_env({"AMP_REWRITE_TUNE_BUDGET": "soon"})
    amp_runtime(settings)
    config = tracing.default_config()
    assert (config.is_tuning, config.tune_budget_seconds, config.tune_cache_dir, config.tune_batch) == (
        True, 7.5, "/somewhere", 16)


def test_ops_inside_functions_are_timed_from_the_functions_shapes():
    @tf.function
    def block(x):
        return tf.nn.relu(tf.matmul(x, tf.ones([8, 8]) * 0.1, name="mm_in_fn"), name="relu_in_fn")

    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [None, 8], name="x")
        h = tf.matmul(x, tf.ones([8, 8]) * 0.2, name="mm_main")
        tf.identity(block(h), name="y")
    gd = g.as_graph_def()
    measure = FakeMeasure({(32, 8): (1.0, 2.0)})
    result = tuned(gd, measure)
    assert len(measure.calls) == 1  # the same MatMul inside and outside the function
    function_nodes = [name for name in result.node_outcomes if name.endswith("::mm_in_fn")]
    assert function_nodes and "kept float32: 2 ms" in result.node_outcomes[function_nodes[0]]["reason"]
    assert not half_nodes(result.graph_def) and not result.applied.functions_rewritten
    assert_same_outputs_within_half(gd, result.graph_def, ["y"], {"x": np.ones((5, 8), np.float32)})


def test_the_runtime_times_function_ops_with_the_traced_variable_shapes(amp_runtime, monkeypatch, tmp_path):
    from amp_rewrite.runtime.settings import RuntimeSettings
    from amp_rewrite.tune import timing as tune_timing

    cases = []

    def fake_measure(case, *, device_type):
        cases.append(case)
        return Timing(1e-3, 2e-3 if case.op == "MatMul" else 0.5e-3)  # MatMul slower in half, Relu not heavy

    monkeypatch.setattr(tune_timing, "measure", fake_measure)
    kernel = tf.Variable(rng(7).standard_normal((16, 8)).astype(np.float32) * 0.3)
    other = tf.Variable(rng(8).standard_normal((8, 8)).astype(np.float32) * 0.3)

    def step(x):
        return tf.matmul(tf.nn.relu(tf.matmul(x, kernel)), other)

    x = tf.constant(rng(9).standard_normal((4, 16)).astype(np.float32))
    want = tf.function(step)(x).numpy()
    amp_runtime(RuntimeSettings(target="bfloat16", is_tuning=True, tune_cache_dir=str(tmp_path)))
    function = tf.function(step)
    got = function(x).numpy()
    shapes = sorted(tuple(spec.shape for spec in case.inputs) for case in cases)
    assert shapes == [((4, 8), (8, 8)), ((4, 16), (16, 8))]  # the variables' shapes, from the traced graph
    traced = function.get_concrete_function(x)
    assert not any(op.get_attr("T") == tf.bfloat16 for op in traced.graph.get_operations() if op.type == "MatMul")
    np.testing.assert_array_equal(got, want)  # nothing left in bfloat16: the float32 numbers exactly


def test_a_function_the_hook_rewrote_keeps_its_measured_choices_when_a_caller_is_rewritten(
        amp_runtime, monkeypatch, tmp_path):
    from amp_rewrite.runtime.settings import RuntimeSettings
    from amp_rewrite.runtime.tf2 import tracing
    from amp_rewrite.tune import timing as tune_timing

    def fake_measure(case, *, device_type):  # the 16-wide MatMul is faster in half, the 8-wide one slower
        return Timing(1e-3, 0.5e-3 if case.inputs[1].shape == (16, 16) else 2e-3)

    monkeypatch.setattr(tune_timing, "measure", fake_measure)
    fast = tf.Variable(rng(7).standard_normal((16, 16)).astype(np.float32) * 0.3)
    slow = tf.Variable(rng(8).standard_normal((16, 8)).astype(np.float32) * 0.3)
    amp_runtime(RuntimeSettings(target="bfloat16", is_tuning=True, tune_cache_dir=str(tmp_path)))

    @tf.function
    def inner(x):
        return tf.matmul(tf.matmul(x, fast, name="mm_fast"), slow, name="mm_slow")

    @tf.function
    def outer(x):
        return inner(x) * 2.0, tf.matmul(x, fast, name="mm_outer")  # its own half op: it is rewritten

    x = tf.constant(rng(9).standard_normal((4, 16)).astype(np.float32))
    inner.get_concrete_function(x)  # traced, tuned and swapped first, as Keras' inner step is
    record = tracing.record_of(outer.get_concrete_function(x))
    outcomes = record.rewritten.result.node_outcomes
    slow_reason = next(e["reason"] for name, e in outcomes.items() if name.endswith("::mm_slow"))
    assert "kept float32: 2 ms in bfloat16 vs 1 ms in float32" in slow_reason
    library = record.rewritten.result.graph_def.library.function
    assert all(node.attr["T"].type == F32 for f in library for node in f.node_def if node.name == "mm_slow")


class Passes:
    """A measure whose answers for one case are given pass by pass (ms), as on a machine whose load changes."""

    def __init__(self, *passes):
        self.passes = list(passes)
        self.calls = 0

    def __call__(self, case):
        f32, half = self.passes[self.calls]
        self.calls += 1
        return Timing(f32 / 1e3, half / 1e3)


def one_matmul():
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [4, 16], name="x")
        w = tf.constant(rng(1).standard_normal((16, 16)).astype(np.float32), name="w")
        tf.identity(tf.matmul(x, w, name="mm"), name="y")
    return g.as_graph_def()


@pytest.mark.parametrize("passes, is_half, reason", [
    # a win faked by a slow float32 pass does not hold in the second pass
    (((1.3, 1.0), (1.0, 1.05)), False, "kept float32: 1.05 ms in bfloat16 vs 1 ms in float32"),
    # a real win holds in both; the pass less favourable to half is the reason
    (((1.0, 0.5), (1.0, 0.6)), True, "measured faster in half: 0.6 ms in bfloat16 vs 1 ms in float32"),
    # half losing the first pass is not measured again
    (((1.0, 1.5),), False, "kept float32: 1.5 ms in bfloat16 vs 1 ms in float32"),
])
def test_a_half_win_must_hold_in_a_second_pass(tmp_path, passes, is_half, reason):
    measure = Passes(*passes)
    cache = TuneCache(tmp_path, device="CPU test", tensorflow="test")
    result = tuned(one_matmul(), measure, cache)
    assert measure.calls == len(passes)
    assert ("mm" in half_nodes(result.graph_def)) is is_half
    assert reason in result.report()["nodes"]["mm"]["reason"]
    again = Passes()  # the cache holds the kept pass: nothing is measured, the decision is the same
    result = tuned(one_matmul(), again, TuneCache(tmp_path, device="CPU test", tensorflow="test"))
    assert again.calls == 0 and ("mm" in half_nodes(result.graph_def)) is is_half


def test_the_runtime_times_a_step_traced_with_an_unknown_batch_at_the_hint(amp_runtime, monkeypatch, tmp_path,
                                                                          caplog):
    """A Keras step is traced with its batch unknown: ``(None, 16)`` is timed as ``(32, 16)``; all float32 is said."""
    from amp_rewrite.runtime.settings import RuntimeSettings
    from amp_rewrite.tune import timing as tune_timing

    cases = []

    def fake_measure(case, *, device_type):
        cases.append(case)
        return Timing(1e-3, 2e-3)  # slower in half: kept float32

    monkeypatch.setattr(tune_timing, "measure", fake_measure)
    caplog.set_level(logging.INFO, logger="amp_rewrite")
    kernel = tf.Variable(rng(7).standard_normal((16, 8)).astype(np.float32) * 0.3)
    amp_runtime(RuntimeSettings(target="bfloat16", is_tuning=True, tune_cache_dir=str(tmp_path)))
    function = tf.function(lambda x: tf.matmul(x, kernel), input_signature=[tf.TensorSpec([None, 16], tf.float32)])
    x = tf.constant(rng(9).standard_normal((4, 16)).astype(np.float32))
    np.testing.assert_array_equal(function(x).numpy(), (x @ kernel).numpy())
    assert [tuple(spec.shape for spec in case.inputs) for case in cases if not isinstance(case, RegionCase)] == [
        ((32, 16), (16, 8))]
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO and "stays float32" in r.getMessage()]
    assert len(said) == 1 and "no op or half region measured faster in bfloat16" in said[0]
