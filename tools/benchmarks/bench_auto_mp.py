"""Per-step time of CNN training with and without ``ENABLE_AUTO_MP=1`` on this machine.

Two unmodified training scripts, each run in its own process:

- ``tf1``: a TF1 CNN (conv-conv-pool-conv-conv-pool-dense) trained with
  Momentum through ``Session.run``;
- ``keras``: the same CNN trained with Keras 3 ``fit``.

Every round runs each script once per mode: float32 (no variable),
``ENABLE_AUTO_MP=1`` (the target ``auto`` picks here), and the two forced
targets. Modes alternate within a round, so a busy machine slows them alike.
A run reports the median time of its measured steps and its losses.
Usage: ``python tools/benchmarks/bench_auto_mp.py [--rounds 3] [--steps 20]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

MODES = {
    "float32": {},
    "auto": {"ENABLE_AUTO_MP": "1"},
    "bfloat16": {"ENABLE_AUTO_MP": "1", "AMP_REWRITE_TARGET": "bfloat16"},
    "float16": {"ENABLE_AUTO_MP": "1", "AMP_REWRITE_TARGET": "float16"},
}
BATCH, SIZE, CLASSES, WARMUP = 64, 32, 10, 3


def data(seed=0):
    """Images whose label a fixed linear teacher reads off their pooled colours."""
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(BATCH * 4, SIZE, SIZE, 3)).astype(np.float32)
    x += rng.normal(size=(BATCH * 4, 1, 1, 3)).astype(np.float32)
    teacher = rng.normal(size=(3, CLASSES))
    y = np.argmax(x.mean(axis=(1, 2)) @ teacher, axis=1).astype(np.int64)
    return x, y


def train_tf1(steps: int) -> dict:
    import numpy as np
    import tensorflow as tf

    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    tf1.set_random_seed(0)
    x_all, y_all = data()
    x = tf1.placeholder(tf.float32, [None, SIZE, SIZE, 3], name="x")
    y = tf1.placeholder(tf.int64, [None], name="y")
    h = x
    for i, filters in enumerate((32, 32, None, 64, 64, None)):
        if filters is None:
            h = tf.nn.max_pool2d(h, 2, 2, "VALID")
            continue
        w = tf1.get_variable(f"conv{i}", [3, 3, h.shape[-1], filters],
                             initializer=tf1.glorot_uniform_initializer(seed=i))
        h = tf.nn.relu(tf.nn.conv2d(h, w, 1, "SAME"))
    h = tf.reshape(h, [-1, int(np.prod(h.shape[1:]))])
    w = tf1.get_variable("dense", [h.shape[-1], 128], initializer=tf1.glorot_uniform_initializer(seed=7))
    h = tf.nn.relu(tf.matmul(h, w))
    w = tf1.get_variable("logits", [128, CLASSES], initializer=tf1.glorot_uniform_initializer(seed=8))
    logits = tf.matmul(h, w)
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
    train = tf1.train.MomentumOptimizer(0.01, 0.9).minimize(loss)
    times, cpu_times, losses = [], [], []
    with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        for step in range(WARMUP + steps):
            i = (step % 4) * BATCH
            feed = {x: x_all[i:i + BATCH], y: y_all[i:i + BATCH]}
            start, cpu_start = time.perf_counter(), time.process_time()
            value, _ = sess.run([loss, train], feed)
            times.append(time.perf_counter() - start)
            cpu_times.append(time.process_time() - cpu_start)
            losses.append(float(value))
    return {"times": times[WARMUP:], "cpu_times": cpu_times[WARMUP:], "losses": losses}


def train_keras(steps: int) -> dict:
    return fit_and_time(keras_cnn(), steps)


def keras_cnn(*, jit_compile=False):
    """The CNN as a compiled Keras model (``jit_compile`` as Keras' ``compile`` takes it)."""
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((SIZE, SIZE, 3)),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(CLASSES),
    ])
    return compiled(model, jit_compile=jit_compile)


def compiled(model, *, jit_compile=False):
    import keras

    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=jit_compile)
    return model


def fit_and_time(model, steps: int) -> dict:
    """Trains ``model`` for WARMUP + ``steps`` batches; the measured steps' times and every loss."""
    import keras

    x_all, y_all = data()

    class Timer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.times, self.cpu_times, self.losses, self.start, self.cpu_start = [], [], [], 0.0, 0.0

        def on_train_batch_begin(self, batch, logs=None):
            self.start, self.cpu_start = time.perf_counter(), time.process_time()

        def on_train_batch_end(self, batch, logs=None):
            self.times.append(time.perf_counter() - self.start)
            self.cpu_times.append(time.process_time() - self.cpu_start)
            self.losses.append(float(logs["loss"]))

    timer = Timer()
    epochs = -(-(WARMUP + steps) // 4)
    model.fit(x_all, y_all, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0,
              callbacks=[timer])
    return {"times": timer.times[WARMUP:WARMUP + steps], "cpu_times": timer.cpu_times[WARMUP:WARMUP + steps],
            "losses": timer.losses}


def clean_environment() -> dict:
    """This process's environment without a variable amp-rewrite reads (each mode sets its own)."""
    from amp_rewrite.environment import read_by_package

    ours = set(read_by_package(os.environ))
    return {k: v for k, v in os.environ.items() if k not in ours}


def run_once(kind: str, mode: str, steps: int) -> dict:
    env = clean_environment()
    env.update(MODES[mode], TF_CPP_MIN_LOG_LEVEL="2", PYTHONHASHSEED="0")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        done = subprocess.run([sys.executable, __file__, "--worker", kind, "--steps", str(steps),
                               "--out", out], env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{kind} {mode} failed:\n{done.stderr[-3000:]}")
        with open(out) as f:
            result = json.load(f)
    result["log"] = [line for line in done.stderr.splitlines() if "amp-rewrite:" in line]
    return result


def cpu_description() -> str:
    from amp_rewrite.runtime.target import FAST_BF16_FLAGS, cpu_flags

    model = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    flags = cpu_flags()
    shown = sorted(f for f in flags if f.startswith(("avx512", "amx", "avx2", "fma", "f16c")))
    fast = [f for f in FAST_BF16_FLAGS if f in flags]
    return f"{model}, {os.cpu_count()} cores; flags: {' '.join(shown)}; fast bfloat16: {fast or 'none'}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--kinds", default="tf1,keras")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        result = (train_tf1 if args.worker == "tf1" else train_keras)(args.steps)
        with open(args.out, "w") as f:
            json.dump(result, f)
        return

    kinds, modes = args.kinds.split(","), args.modes.split(",")
    print(cpu_description())
    medians = {(k, m): [] for k in kinds for m in modes}
    losses, logs = {}, {}
    for round_index in range(args.rounds):
        for kind in kinds:
            for mode in modes:
                result = run_once(kind, mode, args.steps)
                medians[(kind, mode)].append(statistics.median(result["times"]))
                losses[(kind, mode)] = result["losses"]
                logs[(kind, mode)] = result["log"]
        print(f"round {round_index + 1}/{args.rounds} done", file=sys.stderr)
    for kind in kinds:
        base = statistics.median(medians[(kind, "float32")]) if "float32" in modes else None
        print(f"\n{kind}: median step time over {args.rounds} rounds of {args.steps} steps")
        for mode in modes:
            step = statistics.median(medians[(kind, mode)])
            ratio = f"{base / step:.2f}x float32's speed" if base else ""
            first, last = losses[(kind, mode)][0], losses[(kind, mode)][-1]
            print(f"  {mode:9s} {step * 1000:8.1f} ms  {ratio:24s} loss {first:.4f} -> {last:.4f}")
            for line in logs[(kind, mode)][:1]:
                print(f"            {line.split('amp-rewrite: ', 1)[-1][:110]}")


if __name__ == "__main__":
    main()
