"""Accuracy-guarded rewrite: range rule, pattern rules, region bisection, sample-input errors."""

import math
from dataclasses import replace

import numpy as np
import pytest
import tensorflow as tf
from helpers import CPU, amp, half_nodes, rng, run, tf1
from runners import run_cli

from amp_rewrite import GraphError
from amp_rewrite.validate import (
    Tolerance,
    ValidationError,
    pattern_rules,
    random_feeds,
    validated_rewrite,
)


class Weights:
    """Deterministic weight Consts for one graph: building it twice gives the same graph."""

    def __init__(self, seed: int):
        self.rng = rng(seed)

    def __call__(self, shape, scale=0.2, name=None):
        return tf.constant((self.rng.standard_normal(shape) * scale).astype(np.float32), name=name)


def inputs(shape, seed=21):
    return rng(seed).standard_normal(shape).astype(np.float32)


def overflow_graph():
    weights = Weights(31)
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [4, 32], name="x")
        h = x
        for i in range(2):
            h = tf.nn.relu(tf.matmul(h, weights((32, 32)), name=f"mm{i}"), name=f"relu{i}")
        big = tf.matmul(h * 3000.0, weights((32, 32), 30.0), name="mm_big")  # far beyond 65504
        small = tf.nn.relu(big, name="relu_big") * 1e-5
        tf.identity(tf.matmul(small, weights((32, 8)), name="mm_out"), name="out")
    return g.as_graph_def(), {"x": inputs((4, 32))}


def test_overflowing_region_stays_float32_and_the_rest_stays_half():
    gd, feeds = overflow_graph()
    plain = amp(gd, ["out"]).graph_def
    assert not np.all(np.isfinite(run(plain, ["out"], feeds)[0]))
    result, report = validated_rewrite(gd, feeds=feeds, fetches=["out"], config=CPU)
    assert report.passed and report.runs == 2
    assert set(report.range_kept) == {"mm_big", "relu_big", "mul_1"}
    assert all(v > 16376 for v in report.range_kept.values())
    half = half_nodes(result.graph_def)
    assert {"mm0", "mm1", "relu0", "relu1", "mm_out"} <= half
    assert not {"mm_big", "relu_big", "mul_1"} & half
    got, = run(result.graph_def, ["out"], feeds)
    want, = run(gd, ["out"], feeds)
    assert np.all(np.isfinite(got))
    assert Tolerance().error(got, want) <= 1.0
    assert "beyond the half range" in result.report()["nodes"]["mm_big"]["rule"]


def three_region_graph():
    """Three half regions split by float32 deny ops; the middle one cancels catastrophically in half."""
    weights = Weights(32)
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [4, 16], name="x")
        a = tf.matmul(x, weights((16, 16)), name="a_mm")
        a = tf.exp(tf.nn.relu(a, name="a_relu") * 0.1, name="split1")
        b = tf.matmul(a, weights((16, 16)), name="b_mm")
        b = tf.subtract(tf.add(b, 12000.0, name="b_add"), 12000.0, name="b_sub")  # half spacing is 8 there
        b = tf.matmul(b, weights((16, 16)), name="b_mm2")
        c = tf.exp(b * 0.1, name="split2")
        c = tf.matmul(c, weights((16, 8)), name="c_mm")
        tf.identity(tf.nn.relu(c, name="c_relu"), name="out")
    return g.as_graph_def(), {"x": inputs((4, 16))}


def test_bisection_returns_exactly_the_region_that_loses_precision():
    gd, feeds = three_region_graph()
    result, report = validated_rewrite(gd, feeds=feeds, fetches=["out"], config=CPU)
    assert report.passed and report.regions_total == 3
    assert len(report.regions_returned) == 1
    returned = set(report.regions_returned[0]["nodes"])
    assert {"b_mm", "b_add", "b_sub", "b_mm2"} <= returned
    assert report.regions_returned[0]["error_before"] > 1.0 >= report.regions_returned[0]["error_after"]
    assert report.runs <= 2 * math.log2(3) + 2
    half = half_nodes(result.graph_def)
    assert {"a_mm", "c_mm"} <= half and not returned & half


def transformer_block():
    weights = Weights(33)
    g = tf.Graph()
    seq, d = 8, 32
    with g.as_default():
        x = tf1.placeholder(tf.float32, [2, seq, d], name="x")
        q = tf.einsum("bsd,de->bse", x, weights((d, d), 3.0))
        k = tf.einsum("bsd,de->bse", x, weights((d, d), 3.0))
        v = tf.einsum("bsd,de->bse", x, weights((d, d)))
        scores = tf.multiply(tf.matmul(q, k, transpose_b=True, name="scores"), 20.0,
                             name="scaled_scores")  # logits far beyond half's range
        attention = tf.matmul(tf.nn.softmax(scores, name="softmax"), v, name="attend")
        h = x + tf.einsum("bsd,de->bse", attention, weights((d, d)))
        mean, variance = tf.nn.moments(h, axes=[-1], keepdims=True)
        normed = (h - mean) * tf.math.rsqrt(variance + 1e-12)
        tf.identity(tf.einsum("bsd,de->bse", normed, weights((d, d))), name="out")
    return g.as_graph_def(), {"x": inputs((2, seq, d))}


def test_transformer_with_large_logits_and_layer_norm_stays_finite():
    gd, feeds = transformer_block()
    plain = amp(gd, ["out"]).graph_def
    assert not np.all(np.isfinite(run(plain, ["out"], feeds)[0]))
    result, report = validated_rewrite(gd, feeds=feeds, fetches=["out"], config=CPU)
    assert report.passed
    assert "softmax" in report.pattern_kept or "softmax" in report.range_kept
    assert "scaled_scores" in report.range_kept and "scores" in half_nodes(result.graph_def)
    got, = run(result.graph_def, ["out"], feeds)
    want, = run(gd, ["out"], feeds)
    assert np.all(np.isfinite(got)) and Tolerance().error(got, want) <= 1.0
    assert result.half_flop_share > 0.5


def test_bfloat16_has_float32_range_so_no_risk_rule_keeps_anything():
    gd, feeds = overflow_graph()
    result, report = validated_rewrite(gd, feeds=feeds, fetches=["out"], config=replace(CPU, target="bfloat16"))
    assert report.passed and report.runs == 2 and report.range_kept == {} and report.pattern_kept == {}
    assert {"mm_big", "relu_big", "mul_1", "mm_out"} <= half_nodes(result.graph_def)
    assert result.graph_def == amp(gd, ["out"], target="bfloat16").graph_def


def fine_graph():
    """``relu(tanh(x @ w1) @ w2)``: nothing in it overflows or loses accuracy in half."""
    weights = Weights(34)
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [4, 16], name="x")
        tf.identity(tf.nn.relu(tf.matmul(tf.tanh(tf.matmul(x, weights((16, 16)))), weights((16, 4)))), name="out")
    return g.as_graph_def()


def test_graph_that_is_already_fine_costs_two_runs_and_returns_nothing():
    gd = fine_graph()
    result, report = validated_rewrite(gd, feeds={"x": inputs((4, 16))},
                                       fetches=["out"], config=CPU)
    assert report.passed and report.runs == 2 and report.regions_returned == [] and report.range_kept == {}
    assert result.graph_def == amp(gd, ["out"]).graph_def


def test_pattern_rules_find_epsilon_and_layer_norm_and_release_the_tail():
    weights = Weights(35)
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [4, 16], name="x")
        h = tf.matmul(x, weights((16, 16)), name="mm")
        scaled = tf.math.divide(h, tf.add(tf.abs(h), 1e-8, name="eps_add"), name="eps_div")
        tf.identity(tf.matmul(scaled, weights((16, 4)), name="mm_scaled"), name="out_scaled")
        mean, variance = tf.nn.moments(h, axes=[-1], keepdims=True)
        tail = tf.multiply(tf.subtract(h, mean, name="tail_sub"), tf.math.rsqrt(variance + 1e-5),
                           name="tail_mul")
        tf.identity(tf.matmul(tail, weights((16, 4)), name="mm2"), name="out")
    gd = g.as_graph_def()
    keep, release = pattern_rules(gd)
    assert {"eps_add", "eps_div"} <= set(keep)
    assert any("moments/mean" in n for n in keep) and any("SquaredDifference" in n for n in keep)
    assert {"tail_sub", "tail_mul"} <= release
    result, report = validated_rewrite(gd, feeds={"x": inputs((4, 16))},
                                       fetches=["out", "out_scaled"], config=CPU)
    assert report.passed
    half = half_nodes(result.graph_def)
    assert {"tail_sub", "tail_mul", "mm2", "mm_scaled"} <= half and not {"eps_div", "eps_add"} & half
    assert not {"tail_sub", "tail_mul"} & half_nodes(amp(gd, ["out", "out_scaled"]).graph_def)


@pytest.mark.parametrize("feeds,message", [
    ({}, "no sample input for placeholder 'x'"),
    ({"x": np.zeros((3, 32), np.float32)}, "has shape [3, 32], the graph wants (4, 32)"),
    ({"x": np.zeros((4, 32), np.int32)}, "is int32, the graph wants float32"),
    ({"x": np.zeros((4, 32), np.float32), "ghost": np.zeros(1)}, "'ghost:0' names no tensor"),
])
def test_bad_sample_inputs_are_clear_errors(feeds, message):
    gd, _ = overflow_graph()
    with pytest.raises(ValidationError) as err:
        validated_rewrite(gd, feeds=feeds, fetches=["out"], config=CPU)
    assert message in str(err.value)


def test_a_fetch_port_the_node_lacks_is_the_rewrites_error_before_any_run():
    gd, feeds = overflow_graph()
    with pytest.raises(GraphError, match=r"^fetch 'out:1': node out \(op Identity\) has 1 output$"):
        validated_rewrite(gd, feeds=feeds, fetches=["out:1"], config=CPU)


def test_max_runs_bound_stops_with_a_message():
    gd, feeds = three_region_graph()
    result, report = validated_rewrite(gd, feeds=feeds, fetches=["out"], config=CPU, max_runs=3)
    assert not report.passed and report.runs == 3
    assert "stopped after 3 runs" in report.message


def test_random_feeds_cover_placeholders_with_unknown_batch():
    g = tf.Graph()
    with g.as_default():
        tf1.placeholder(tf.float32, [None, 5], name="a")
        tf1.placeholder(tf.int32, [3], name="b")
    feeds = random_feeds(g.as_graph_def(), seed=1)
    assert feeds["a"].shape == (2, 5) and feeds["a"].dtype == np.float32
    assert feeds["b"].shape == (3,) and feeds["b"].dtype == np.int32


def test_cli_validate_with_inputs_file_and_failing_budget(tmp_path):
    gd, feeds = three_region_graph()
    (tmp_path / "g.pb").write_bytes(gd.SerializeToString())
    np.savez(tmp_path / "feeds.npz", **feeds)
    args = ["g.pb", "o.pb", "--fetch", "out", "--device-type", "CPU", "--validate", "--inputs", "feeds.npz"]
    proc = run_cli(*args, "--report", "r.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "1 of 3 half regions returned to float32" in proc.stdout
    import json
    assert json.loads((tmp_path / "r.json").read_text())["validation"]["passed"] is True
    proc = run_cli(args[0], "o2.pb", *args[2:], "--max-runs", "3", cwd=tmp_path)
    assert proc.returncode == 1 and "stopped after 3 runs" in proc.stderr
    assert not (tmp_path / "o2.pb").exists()
    proc = run_cli(*args[:-2], cwd=tmp_path)
    assert proc.returncode == 2 and "needs sample inputs" in proc.stderr


def test_under_the_runtime_the_reference_runs_the_float32_graph(amp_runtime):
    """With ENABLE_AUTO_MP on, validation's own sessions run the graphs they were given, unpatched."""
    from amp_rewrite import runtime
    from amp_rewrite.runtime.settings import RuntimeSettings

    gd = fine_graph()
    _, alone = validated_rewrite(gd, feeds={"x": inputs((4, 16))}, fetches=["out"], config=CPU)
    amp_runtime(RuntimeSettings(target="float16"))
    _, under = validated_rewrite(gd, feeds={"x": inputs((4, 16))}, fetches=["out"], config=CPU)
    assert len(runtime.current_runtime().objects.runners) == 0  # no session went through the runtime
    assert under.errors == alone.errors and max(alone.errors.values()) > 0  # float32 against half, not half twice
