"""Minimal reproductions of core bugs the random-graph tests found.

A test for a bug not fixed yet is marked ``xfail(strict=True)``, with the
property it breaks listed in ``KNOWN_CORE_BUGS`` in test_fuzz.py. Once the
core is fixed the test passes, the strict marker turns that into a failure,
and both the marker and the entry go; the test stays as a regression test.
"""

import numpy as np
import tensorflow as tf
from graph_strategies import half_round_trips
from helpers import F16, F32, amp, assert_same_outputs_within_half, rng, tf1, v1_control_flow


def test_mixed_consumers_of_a_widening_cast_get_no_round_trip():
    """An existing half -> float32 Cast read by half and float32 ops: no Cast back to half after it."""
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [8, 8], name="x")
        narrow = tf.cast(x, tf.float16, name="narrow")
        widen = tf.cast(narrow, tf.float32, name="widen")  # read by a half op and by a fetch
        allow1 = tf.matmul(widen, widen, name="allow1")
        tf.identity(allow1, name="fetch")
        tf.identity(widen, name="fetch_widen")
    gd = g.as_graph_def()
    out = amp(gd, ["fetch", "fetch_widen"]).graph_def
    nodes = {n.name: n for n in out.node}
    assert nodes["allow1"].attr["T"].type == F16
    assert nodes["fetch_widen"].attr["T"].type == F32
    feeds = {"x": (rng(0).standard_normal((8, 8)) * 0.5).astype(np.float32)}
    assert_same_outputs_within_half(gd, out, ["fetch", "fetch_widen"], feeds)
    # The half MatMul should read "narrow" (already half), not widen -> Cast back to half.
    assert half_round_trips(out) == set(), half_round_trips(out)


def test_preserved_next_iteration_keeps_float32():
    """A preserved NextIteration keeps float32, so its Merge (which it must feed directly) does too."""
    g = tf.Graph()
    with g.as_default(), v1_control_flow():
        x = tf1.placeholder(tf.float32, [8, 8], name="x")
        w = tf.constant(np.eye(8, dtype=np.float32) * 0.9, name="w")

        def body(i, h):
            return i + 1, tf.nn.relu(tf.matmul(h, w, name="allow_loop"))

        _, h = tf1.while_loop(lambda i, h: i < 3, body, [tf.constant(0), x], name="loop")
        tf.identity(h, name="fetch")
    gd = g.as_graph_def()
    result = amp(gd, ["fetch"], preserve=("loop/NextIteration_1",))
    nodes = {n.name: n for n in result.graph_def.node}
    feeds = {"x": (rng(0).standard_normal((8, 8)) * 0.5).astype(np.float32)}
    assert_same_outputs_within_half(gd, result.graph_def, ["fetch"], feeds)
    assert "loop/allow_loop" in result.converted
    assert nodes["loop/NextIteration_1"].attr["T"].type == F32
    assert nodes["loop/Merge_1"].attr["T"].type == F32
