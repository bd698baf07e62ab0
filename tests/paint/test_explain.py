"""explain: every node's reason states the dtype the rewritten graph gives it, and names the right neighbour."""

import numpy as np
import tensorflow as tf
from helpers import F16, amp, function_call_graph, rng, tf1

from amp_rewrite.paint.explain import disagreements, explain_chain


def batch_norm_graph():
    """``x @ w * (gamma * rsqrt(var))``: the scale is computed from constants, like a frozen batch norm."""
    r = rng(3)
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [4, 8], name="x")
        w = tf.constant(r.standard_normal((8, 8)).astype(np.float32), name="w")
        gamma = tf.constant(r.uniform(0.5, 1.5, 8).astype(np.float32), name="gamma")
        var = tf.constant(r.uniform(0.5, 1.5, 8).astype(np.float32), name="var")
        scale = tf.multiply(gamma, tf.math.rsqrt(var, name="rsqrt"), name="infer_scale")
        y = tf.multiply(tf.matmul(x, w, name="allow1"), scale, name="infer_after")
        tf.identity(y, name="out")
    return g.as_graph_def()


def test_infer_op_with_only_half_consumers_says_so():
    result = amp(batch_norm_graph(), ["out"])
    outcomes = result.node_outcomes
    assert outcomes["infer_after"]["precision"] == "float16"
    assert outcomes["infer_scale"]["precision"] == "float32"
    assert outcomes["infer_scale"]["reason"] == (
        "infer_scale (Mul) stays float32: infer op fed by no half op; its consumer infer_after is float16")
    chain = explain_chain(outcomes, "infer_scale")
    assert chain[1].startswith("infer_after (Mul) → float16: infer op after an allow op; its input allow1")
    assert disagreements(result) == []


def test_a_reason_contradicting_the_graph_is_found():
    result = amp(batch_norm_graph(), ["out"])
    node = next(n for n in result.graph_def.node if n.name == "infer_scale")
    node.attr["T"].type = F16  # the graph now says half where the reason says float32
    found = disagreements(result)
    assert len(found) == 1
    assert found[0].startswith("infer_scale: the reason says float32, the rewritten node has float16")


def test_nodes_inside_functions_are_described_as_function_node():
    result = amp(function_call_graph(), ["out"])
    function = next(f.signature.name for f in result.graph_def.library.function)
    outcomes = result.node_outcomes
    relu = outcomes[f"{function}::clr_in_fn"]
    assert relu["precision"] == "float16" and relu["cause"] == f"{function}::allow_in_fn"
    assert relu["reason"].startswith(f"{function}::clr_in_fn (Relu) → float16: ")
    described = {name for name in outcomes if "::" in name}
    assert described == {f"{function}::{n.name}" for n in result.graph_def.library.function[0].node_def
                         if f"{function}::{n.name}" not in result.casts}
    assert disagreements(result) == []
