"""Extra tracing time of the ``tf.function`` hook on small training steps.

Each step is a ``tf.function`` holding its GradientTape and optimizer update.
A fresh ``tf.function`` is traced ``-n`` times without the hook and ``-n``
times with it (``amp_rewrite.enable()``), alternating, so both see the same
load; the table gives the median trace times, the hook's extra time as a
ratio of TensorFlow's own tracing time, and how much of it is the rewrite
itself (the rest is rebuilding and registering the rewritten functions). Usage:
``python tools/tf2_tracing_cost.py [-n 5]``.
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
from amp_rewrite.runtime import tf_function  # noqa: E402


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


def trace_seconds(step, specs, repeats) -> tuple[float, float]:
    """Median trace time without and with the hook, the two traced alternately."""
    plain, hooked = [], []
    for _ in range(repeats):
        plain.append(trace_once(step, specs))
        amp_rewrite.enable(target="float16")  # hooked on every machine
        try:
            hooked.append(trace_once(step, specs))
        finally:
            amp_rewrite.disable()
    return statistics.median(plain), statistics.median(hooked)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=5, help="traces per setting")
    args = parser.parse_args(argv)
    print("| step | nodes | trace without hook (ms) | with hook (ms) | extra (ms) | extra / TF's tracing "
          "| of which rewrite (ms) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, build in (("Keras MLP + Adam", mlp), ("Keras CNN + Adam", cnn)):
        keras.utils.set_random_seed(0)
        step, specs = build()
        tf.function(step).get_concrete_function(*specs)  # warm-up: creates no more variables
        plain, hooked = trace_seconds(step, specs, args.n)
        reports = tf_function.rewritten_functions()[-args.n:]
        rewrite = statistics.median(r.rewrite_seconds for r in reports)
        nodes = reports[-1].nodes_total
        print(f"| {name} | {nodes} | {plain * 1e3:.0f} | {hooked * 1e3:.0f} | "
              f"{(hooked - plain) * 1e3:.0f} | {(hooked - plain) / plain:.2f} | {rewrite * 1e3:.0f} |")


if __name__ == "__main__":
    main()
