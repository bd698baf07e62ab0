"""Extra tracing time of the ``tf.function`` hook on small training steps.

Each step is a ``tf.function`` holding its GradientTape and optimizer update.
A fresh ``tf.function`` is traced ``-n`` times without the hook, then once
right after ``amp_rewrite.enable()`` and ``-n`` times more with it, then
``-n`` times without it again (the plain figure is the median of both
brackets). This for each target:

- ``float16`` adds the loss-scale guard around the optimizer update. The
  first trace after ``enable()`` creates the loss-scale variables, and
  ``tf.function`` traces a function that creates variables twice: a cost
  paid once per process, given apart.
- ``bfloat16`` adds no loss scaling; what is left is the rewrite and the
  reloading of the rewritten functions.

The table gives median trace times, the hook's extra time as a ratio of
TensorFlow's own tracing time, and how much of it is the rewrite itself.
Usage: ``python tools/benchmarks/bench_tracing.py [-n 5]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import amp_rewrite  # noqa: E402
from amp_rewrite.runtime.tf2 import tracing  # noqa: E402


def keras_step(model, shape):
    """A custom-loop step: Keras model, Adam, loss and update inside one tf.function."""
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    specs = (tf.TensorSpec((64, *shape)), tf.TensorSpec((64,), tf.int64))
    return step, specs


def mlp():
    return keras_step(keras.Sequential([keras.Input((32,)), keras.layers.Dense(128, activation="relu"),
                                        keras.layers.Dense(128, activation="relu"),
                                        keras.layers.Dense(10)]), (32,))


def cnn():
    return keras_step(keras.Sequential([
        keras.Input((16, 16, 3)), keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(), keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)]), (16, 16, 3))


def trace_once(step, specs) -> float:
    function = tf.function(step)
    start = time.perf_counter()
    function.get_concrete_function(*specs)
    return time.perf_counter() - start


def trace_seconds(step, specs, repeats, target) -> tuple[float, float, float]:
    """Median trace time without the hook, the first trace with it, and the median of the later ones."""
    plain = [trace_once(step, specs) for _ in range(repeats)]
    amp_rewrite.enable(target=target)  # hooked on every machine
    try:
        first = trace_once(step, specs)
        hooked = [trace_once(step, specs) for _ in range(repeats)]
    finally:
        amp_rewrite.disable()
    plain += [trace_once(step, specs) for _ in range(repeats)]
    return statistics.median(plain), first, statistics.median(hooked)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=5, help="traces per setting")
    args = parser.parse_args(argv)
    print("| step | target | nodes | trace without hook (ms) | with hook (ms) | extra (ms) "
          "| extra / TF's tracing | of which rewrite (ms) | first trace with hook (ms) | its extra / TF's tracing |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, build in (("Keras MLP + Adam", mlp), ("Keras CNN + Adam", cnn)):
        keras.utils.set_random_seed(0)
        step, specs = build()
        tf.function(step).get_concrete_function(*specs)  # warm-up: creates no more variables
        for target in ("float16", "bfloat16"):
            plain, first, hooked = trace_seconds(step, specs, args.n, target)
            reports = tracing.rewritten_functions()[-args.n:]
            rewrite = statistics.median(r.rewrite_seconds for r in reports)
            nodes = reports[-1].nodes_total
            print(f"| {name} | {target} | {nodes} | {plain * 1e3:.0f} | {hooked * 1e3:.0f} | "
                  f"{(hooked - plain) * 1e3:.0f} | {(hooked - plain) / plain:.2f} | {rewrite * 1e3:.0f} "
                  f"| {first * 1e3:.0f} | {(first - plain) / plain:.2f} |")


if __name__ == "__main__":
    main()
