"""Per-step cost of the ENABLE_AUTO_MP session patch on a tiny graph.

A graph this small makes TensorFlow's own per-run cost dominate, so the
difference between the two timings is the patch's Python overhead per
``Session.run`` (fetch mapping, plan lookup, feed casts). Usage:
``python tools/step_overhead.py [-n 2000]``.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from amp_rewrite import runtime  # noqa: E402

tf1 = tf.compat.v1


def seconds_per_run(steps: int) -> float:
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [8, 16], name="x")
        w = tf1.get_variable("w", [16, 16], initializer=tf1.ones_initializer())
        loss = tf.reduce_sum(tf.matmul(x, w))
        train = tf1.train.GradientDescentOptimizer(1e-6).minimize(loss)
        init = tf1.global_variables_initializer()
    feed = {x: np.ones((8, 16), np.float32)}
    with tf1.Session(graph=graph) as sess:
        sess.run(init)
        for _ in range(50):
            sess.run([train, loss], feed)
        start = time.perf_counter()
        for _ in range(steps):
            sess.run([train, loss], feed)
        return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=2000, help="timed steps")
    steps = parser.parse_args().n
    plain = seconds_per_run(steps)
    runtime.enable(target="float16")  # patched on every machine: the patch is what is timed
    try:
        patched = seconds_per_run(steps)
    finally:
        runtime.disable()
    print(f"plain session {plain * 1e6:7.1f} us/step; with ENABLE_AUTO_MP {patched * 1e6:7.1f} us/step "
          f"(+{(patched - plain) * 1e6:.1f} us; the patched graph also runs the loss-scale guard)")


if __name__ == "__main__":
    main()
