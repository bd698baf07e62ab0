"""Per-step cost of the ENABLE_AUTO_MP session patch on a tiny graph.

A graph this small makes TensorFlow's own per-run cost dominate, so the
difference between the timings is the patch's Python work per
``Session.run`` (plan lookup, feed conversion, fetch mapping, casts back).
Three loops run interleaved in one process, in blocks, several times:

- ``plain``: the script's float32 graph in an unpatched session;
- ``rewritten``: the rewritten shadow graph (with its loss-scale guard and
  report) run directly by an unpatched ``Session.run``;
- ``callable``: the same shadow step as a raw session callable made once
  (the floor: no Python work per call beyond TensorFlow's own);
- ``patched``: the script's session under the runtime, which runs the same
  shadow graph through the patch.

``patched - callable`` is the patch's own overhead over the cheapest way to
run the rewritten step from Python; ``patched - plain`` also holds the cost
of the loss-scale guard. TensorFlow's own time for the same step varies
from loop to loop by tens of microseconds, so these differences are noisy.
The last figure has no TensorFlow in it: the patched ``Session.run`` once
more, with the resolved step replaced by a function returning the values
it returned, which leaves exactly the patch's Python work per call (plan
lookup, feed checks, loss-scale log, results). Usage:
``python tools/benchmarks/bench_step_overhead.py [-n 200] [-r 15]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import timeit

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.core.protobuf import config_pb2  # noqa: E402
from tensorflow.python.client import session as session_lib  # noqa: E402

from amp_rewrite import runtime  # noqa: E402

tf1 = tf.compat.v1
UNPATCHED_RUN = session_lib.BaseSession.run


def tiny_training_session():
    """A session on a one-matmul training graph, its fetches and its feed."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [8, 16], name="x")
        w = tf1.get_variable("w", [16, 16], initializer=tf1.ones_initializer())
        loss = tf.reduce_sum(tf.matmul(x, w))
        train = tf1.train.GradientDescentOptimizer(1e-6).minimize(loss)
        init = tf1.global_variables_initializer()
    sess = tf1.Session(graph=graph)
    sess.run(init)
    return sess, [train, loss], {x: np.ones((8, 16), np.float32)}


def timed(run, steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        run()
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=200, help="timed steps per block")
    parser.add_argument("-r", type=int, default=15, help="blocks per loop, interleaved")
    args = parser.parse_args()

    plain_sess, plain_fetches, plain_feed = tiny_training_session()
    runtime.enable(target="float16")  # patched on every machine: the patch is what is timed
    try:
        sess, fetches, feed = tiny_training_session()
        sess.run(fetches, feed)
        runner = runtime.current_runtime().objects.runners.get(sess)
        plan = list(runner.plans.values())[-1]  # the training step's, made last
        shadow_feed = {plan.feeds[t.name].tensor: v for t, v in feed.items()}
        options = config_pb2.CallableOptions(
            feed=[t.name for t in shadow_feed],
            fetch=[e.name for e in plan.fetches if hasattr(e, "dtype")],
            target=[e.name for e in plan.fetches if not hasattr(e, "dtype")])
        step = runner.shadow_session._make_callable_from_options(options)
        feed_values = list(shadow_feed.values())
        loops = {
            "plain": lambda: UNPATCHED_RUN(plain_sess, plain_fetches, plain_feed),
            "rewritten": lambda: UNPATCHED_RUN(runner.shadow_session, plan.fetches, shadow_feed),
            "callable": lambda: step(*feed_values),
            "patched": lambda: sess.run(fetches, feed),
        }
        for run in loops.values():
            timed(run, 100)  # warm-up
        times = {name: [] for name in loops}
        names = list(loops)
        for block in range(args.r):  # the order rotates, so no loop always follows the same one
            for name in names[block % len(names):] + names[:block % len(names)]:
                times[name].append(timed(loops[name], args.n))
        python_only = patch_python_work(sess, fetches, feed)
        sess.close()
    finally:
        runtime.disable()
        plain_sess.close()
    median = {name: statistics.median(values) * 1e6 for name, values in times.items()}
    for name, values in times.items():
        print(f"{name:10s} median {median[name]:7.1f} us/step  "
              f"(blocks: {', '.join(f'{v * 1e6:.1f}' for v in values)})")
    print(f"patch overhead: {median['patched'] - median['callable']:+.1f} us/step over the callable, "
          f"{median['patched'] - median['rewritten']:+.1f} us/step over Session.run of the rewritten graph; "
          f"patched / plain {median['patched'] / median['plain']:.2f}x, "
          f"patched / callable {median['patched'] / median['callable']:.2f}x")
    print(f"patch Python work per call, the step stubbed out: {python_only:.1f} us")


def patch_python_work(sess, fetches, feed) -> float:
    """Microseconds per patched ``sess.run`` with the shadow step replaced by its recorded values."""
    runner = runtime.current_runtime().objects.runners.get(sess)
    (call,) = runner.keeper.calls.values()  # the one fast call the timed loop resolved
    values = call.session._do_call(call.run, *[feed[t] for t in feed])
    real_run = call.run
    call.run = lambda *args: values
    try:
        best = min(timeit.repeat(lambda: sess.run(fetches, feed), number=20000, repeat=7))
    finally:
        call.run = real_run
    return best / 20000 * 1e6


if __name__ == "__main__":
    main()
