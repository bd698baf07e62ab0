"""Per-step cost of putting back what a skipped loss-scaled step wrote, on a batch-norm CNN that is not skipped.

Under loss scaling every rewritten body that holds the optimizer's guard
reads each floating variable its step writes before the step writes it (a
batch norm's moving mean and variance, the metrics' state), and after the
step runs one cond that assigns the reads back only when the step was
skipped (:mod:`amp_rewrite.runtime.loss_scale.step_writes`). This measures
what that adds to steps that are not skipped: two identical Keras 3 CNNs
(convolutions, each followed by ``BatchNormalization``; an AUC and a mean
loss updated after the optimizer) train in one process under the runtime,
one traced with the restore and one without it, each with a ``tf.function``
step. Their steps are timed in interleaved blocks whose order rotates; the
best and the median block of each are printed, in wall time and in the
process's CPU time (steadier than wall time on a busy machine, with
``TF_NUM_INTEROP_THREADS=1 TF_NUM_INTRAOP_THREADS=1``), with the profiler's op time
per step of each (the profiler records the expensive kernels: a variable's
read is not among them), and the ops the restore adds to the step's graph.
The CPU's model and half-precision flags head the output.

Usage: ``python tools/benchmarks/bench_skip_restore.py [--target bfloat16] [-n 20] [-r 7] [--batch 32]``.
bfloat16 (the default, with loss scaling turned on as ``AMP_LOSS_SCALE``
does) runs fast on a CPU with AVX512_BF16/AMX; float16 is where the
runtime scales by default.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import Counter

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import profiling  # noqa: E402

from amp_rewrite import runtime  # noqa: E402
from amp_rewrite.runtime.settings import RuntimeSettings  # noqa: E402
from amp_rewrite.runtime.tf2 import concrete  # noqa: E402


def cnn_step(batch: int):
    """A Keras 3 CNN with three conv + batch-norm blocks, its optimizer and metrics, and a tf.function step."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    layers = [keras.Input((32, 32, 3))]
    for filters in (32, 64, 64):
        layers += [keras.layers.Conv2D(filters, 3, padding="same", use_bias=False),
                   keras.layers.BatchNormalization(), keras.layers.ReLU()]
    model = keras.Sequential([*layers, keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
    optimizer = keras.optimizers.SGD(1e-3, momentum=0.9)
    auc, mean_loss = keras.metrics.AUC(num_thresholds=200), keras.metrics.Mean()
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((batch, 32, 32, 3)).astype(np.float32))
    labels = rng.integers(0, 10, batch)
    y, one_hot = tf.constant(labels), tf.constant(np.eye(10, dtype=np.float32)[labels])

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        auc.update_state(one_hot, tf.nn.softmax(logits))
        mean_loss.update_state(loss)
        return loss

    return step


def without_restore(make):
    """``make()`` with the rebuilt bodies it traces left without the restore."""
    kept = concrete.restore_in_body
    concrete.restore_in_body = lambda graph: False
    try:
        step = make()
        step()  # traced (and rewritten) now, while the restore is off
        return step
    finally:
        concrete.restore_in_body = kept


def graph_ops(step) -> Counter:
    """The op types of the body ``step`` runs (the rewritten one), counted."""
    return Counter(op.type for op in step.get_concrete_function().graph.get_operations())


def timed(step, steps: int) -> tuple[float, float]:
    """Seconds per step: wall time, and the process's CPU time (all threads)."""
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps, (time.process_time() - cpu) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=("bfloat16", "float16"), default="bfloat16")
    parser.add_argument("-n", type=int, default=20, help="timed steps per block")
    parser.add_argument("-r", type=int, default=7, help="blocks per step, interleaved")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--profiled", type=int, default=10, help="steps of each under the profiler")
    args = parser.parse_args()
    print(profiling.cpu_line())
    runtime.enable(settings=RuntimeSettings(target=args.target, is_loss_scaled=True))
    try:
        steps = {"restore": cnn_step(args.batch), "without": without_restore(lambda: cnn_step(args.batch))}
        for step in steps.values():
            timed(step, 10)  # traced, and the loss scale settled
        skipped_before = int(runtime.loss_scaling().state().skipped_steps.numpy())
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in steps}
        names = list(steps)
        for block in range(args.r):  # the order rotates, so neither always follows the other
            for name in names[block % 2:] + names[:block % 2]:
                times[name].append(timed(steps[name], args.n))
        skipped = int(runtime.loss_scaling().state().skipped_steps.numpy()) - skipped_before
        ops = {name: profiling.profile_calls(step, args.profiled) for name, step in steps.items()}
        added = graph_ops(steps["restore"]) - graph_ops(steps["without"])
    finally:
        runtime.disable()
    print(f"{args.target}, batch {args.batch}, {args.r} blocks of {args.n} steps each; "
          f"{skipped} steps skipped while timed")
    for name, values in times.items():
        wall, cpu = [v[0] for v in values], [v[1] for v in values]
        op_ms = sum(row["ms"] for row in ops[name].values())
        print(f"{name:8s} wall best {min(wall) * 1e3:7.2f} ms/step, median {statistics.median(wall) * 1e3:7.2f}; "
              f"CPU best {min(cpu) * 1e3:7.2f}, median {statistics.median(cpu) * 1e3:7.2f}; "
              f"profiler op time {op_ms:7.2f} ms/step")
    print("the restore adds to the step's graph: " + ", ".join(f"{count} {op}" for op, count in sorted(added.items())))
    for k, what in enumerate(("wall", "CPU")):
        best = {name: min(v[k] for v in values) for name, values in times.items()}
        median = {name: statistics.median(v[k] for v in values) for name, values in times.items()}
        print(f"restore - without, {what}: {(best['restore'] - best['without']) * 1e6:+.0f} us/step (best), "
              f"{(median['restore'] - median['without']) * 1e6:+.0f} us/step (median)")


if __name__ == "__main__":
    main()
