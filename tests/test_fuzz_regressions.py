"""Minimal reproductions of core bugs the random-graph tests found.

A test for a bug not fixed yet is marked ``xfail(strict=True)``, with the
property it breaks listed in ``KNOWN_CORE_BUGS`` in test_fuzz.py. Once the
core is fixed the test passes, the strict marker turns that into a failure,
and both the marker and the entry go; the test stays as a regression test.
"""

import numpy as np
import tensorflow as tf

from graph_strategies import half_round_trips
from helpers import F16, F32, amp, assert_same_outputs_within_half, rng, tf1


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
