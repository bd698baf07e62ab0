"""The losses a user reads under ``ENABLE_AUTO_MP=1``, against float32's and Keras's own mixed policy.

Three training scripts, each written as a user would, each run in its own
process per mode:

- ``keras_mse``: a Keras 3 MLP regressor, ``loss="mse"``, ``fit`` with a validation split;
- ``keras_classifier``: a Keras 3 CNN, sparse categorical cross-entropy and accuracy, ``fit`` with a validation split;
- ``tf1_losses``: a TF1 MLP trained through ``Session.run`` on ``tf.compat.v1.losses.mean_squared_error``,
  with a validation loss every epoch.

Modes: ``float32``; ``bfloat16`` and ``float16`` (``ENABLE_AUTO_MP=1`` with
``AMP_REWRITE_TARGET``); ``auto`` (``ENABLE_AUTO_MP=1`` alone: float32 on a
CPU without fast half kernels); ``policy`` (Keras's ``mixed_bfloat16``, the
Keras workloads only). ``--before PYTHON`` adds ``bfloat16 (before)`` and
``float16 (before)``: the same runs with another interpreter, one whose
installed amp-rewrite predates a change. Modes alternate within a round; a
cell is the best (lowest) median step over ``--rounds``.

Per run: the per-epoch ``loss`` and ``val_loss`` (the values callbacks such
as ``EarlyStopping`` compare), their largest relative distance from float32's,
the share of the per-batch losses ``fit`` reports that are exact bfloat16
numbers (a loss reduced in bfloat16 is always one), and per step the median
wall time, process CPU time, and the profiler's op time (op durations summed
over one step; TF1: the step stats of ``RunMetadata``).

Usage: ``python tools/benchmarks/bench_read_out_losses.py [--rounds 3] [--before /path/to/old/python]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import profiling  # noqa: E402

MODES = {
    "float32": {},
    "auto": {"ENABLE_AUTO_MP": "1"},
    "bfloat16": {"ENABLE_AUTO_MP": "1", "AMP_REWRITE_TARGET": "bfloat16"},
    "float16": {"ENABLE_AUTO_MP": "1", "AMP_REWRITE_TARGET": "float16"},
    "policy": {"READ_OUT_KERAS_POLICY": "mixed_bfloat16"},
}
WORKLOADS = ("keras_mse", "keras_classifier", "tf1_losses")
EPOCHS, BATCH, PROFILED_STEPS = 3, 64, 3


# --- the workloads (run in the child process) ---------------------------------------------------


def regression_data(seed=0, n=4096, features=32, outputs=8):
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features)).astype(np.float32)
    teacher = rng.normal(size=(features, outputs)).astype(np.float32)
    y = (np.tanh(x @ teacher / 4) * 3 + 0.1 * rng.normal(size=(n, outputs))).astype(np.float32)
    return x, y


def image_data(seed=0, n=2048, size=16, classes=10):
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, size, size, 3)).astype(np.float32)
    x += rng.normal(size=(n, 1, 1, 3)).astype(np.float32)
    y = np.argmax(x.mean(axis=(1, 2)) @ rng.normal(size=(3, classes)), axis=1).astype(np.int64)
    return x, y


def keras_fit(model, x, y) -> dict:
    """``fit`` with a validation split, timing each step and profiling a few of the second epoch's."""
    timer = profiling.step_timer(warmup=5, profile_epoch=1, profile_batch=5, profiled=PROFILED_STEPS)
    history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, validation_split=0.2, verbose=0, shuffle=False,
                        callbacks=[timer])
    return {"loss": history.history["loss"], "val_loss": history.history["val_loss"],
            "batch_losses": timer.losses, **timer.summary()}


def keras_mse() -> dict:
    import keras

    keras.utils.set_random_seed(0)
    x, y = regression_data()
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(256, activation="relu"), keras.layers.Dense(8)])
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    return keras_fit(model, x, y)


def keras_classifier() -> dict:
    import keras

    keras.utils.set_random_seed(0)
    x, y = image_data()
    model = keras.Sequential([
        keras.Input((16, 16, 3)),
        keras.layers.Conv2D(32, 3, activation="relu", padding="same"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(64, 3, activation="relu", padding="same"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return keras_fit(model, x, y)


def tf1_losses() -> dict:
    import numpy as np
    import tensorflow as tf

    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    tf1.set_random_seed(0)
    x_all, y_all = regression_data()
    split = int(len(x_all) * 0.8)
    x = tf1.placeholder(tf.float32, [None, 32], name="x")
    y = tf1.placeholder(tf.float32, [None, 8], name="y")
    h = x
    for layer, (inputs, units) in enumerate([(32, 256), (256, 256)]):
        w = tf1.get_variable(f"w{layer}", [inputs, units], initializer=tf1.glorot_uniform_initializer(seed=layer))
        b = tf1.get_variable(f"b{layer}", [units], initializer=tf1.zeros_initializer())
        h = tf.nn.relu(tf.nn.bias_add(tf.matmul(h, w), b))
    out = tf.matmul(h, tf1.get_variable("w_out", [256, 8], initializer=tf1.glorot_uniform_initializer(seed=9)))
    loss = tf1.losses.mean_squared_error(y, out)
    train = tf1.train.AdamOptimizer(1e-3).minimize(loss)
    losses, val_losses, walls, cpus, op_ms = [], [], [], [], []
    with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        for _epoch in range(EPOCHS):
            epoch_losses = []
            for start in range(0, split, BATCH):
                feed = {x: x_all[start:start + BATCH], y: y_all[start:start + BATCH]}
                profiled = _epoch == 1 and len(op_ms) < PROFILED_STEPS
                options = tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE) if profiled else None
                metadata = tf1.RunMetadata() if profiled else None
                wall, cpu = time.perf_counter(), time.process_time()
                _, value = sess.run([train, loss], feed, options=options, run_metadata=metadata)
                if profiled:
                    op_ms.append(_step_stats_ms(metadata.step_stats))
                else:
                    walls.append(time.perf_counter() - wall)
                    cpus.append(time.process_time() - cpu)
                epoch_losses.append(float(value))
            losses.append(float(np.mean(epoch_losses)))
            val_losses.append(float(sess.run(loss, {x: x_all[split:], y: y_all[split:]})))
            batch_losses = epoch_losses
    return {"loss": losses, "val_loss": val_losses, "batch_losses": batch_losses,
            "wall_ms": 1e3 * statistics.median(walls[5:]), "cpu_ms": 1e3 * statistics.median(cpus[5:]),
            "op_ms": statistics.median(op_ms) if op_ms else None}


def _step_stats_ms(step_stats) -> float:
    return sum(node.all_end_rel_micros for device in step_stats.dev_stats for node in device.node_stats) / 1e3


def worker(name: str, out: str) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    policy = os.environ.get("READ_OUT_KERAS_POLICY")
    if policy:
        import keras

        keras.mixed_precision.set_global_policy(policy)
    result = globals()[name]()
    Path(out).write_text(json.dumps(result))


# --- the driver ------------------------------------------------------------------------------------


def run_one(python: str, workload: str, mode_env: dict) -> dict | None:
    from bench_auto_mp import clean_environment

    env = {k: v for k, v in clean_environment().items() if not k.startswith("READ_OUT_")}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONHASHSEED="0", **mode_env)
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
        out = handle.name
    done = subprocess.run([python, __file__, "--worker", workload, "--out", out], env=env,
                          capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        print(f"{workload} failed:\n{done.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(Path(out).read_text())


def is_bfloat16(value: float) -> bool:
    import ml_dtypes
    import numpy as np

    return float(np.float32(value).astype(ml_dtypes.bfloat16)) == float(value)


def relative(values, reference) -> float:
    return max(abs(v - r) / abs(r) for v, r in zip(values, reference))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--before", help="an interpreter whose amp-rewrite predates the change, for 'before' rows")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.out)
        return
    runs: dict[tuple[str, str], list[dict]] = {}
    for _ in range(args.rounds):
        for workload in args.workloads:
            for mode, env in MODES.items():
                if mode == "policy" and not workload.startswith("keras"):
                    continue
                interpreters = [(mode, sys.executable)]
                if args.before and mode in ("bfloat16", "float16"):
                    interpreters.append((f"{mode} (before)", args.before))
                for label, python in interpreters:
                    result = run_one(python, workload, env)
                    if result is not None:
                        runs.setdefault((workload, label), []).append(result)
    print(f"CPU: {profiling.cpu_line()}; rounds: {args.rounds}\n")
    print("| workload | mode | final loss | final val_loss | max rel. diff loss / val_loss vs float32 "
          "| batch losses exact in bfloat16 | wall ms/step | CPU ms/step | op ms/step |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for workload in args.workloads:
        reference = runs.get((workload, "float32"), [None])[0]
        for (name, label), results in runs.items():
            if name != workload:
                continue
            first = results[0]
            best = min(results, key=lambda r: r["wall_ms"])
            exact = sum(is_bfloat16(v) for v in first["batch_losses"]) / len(first["batch_losses"])
            diff = "-" if reference is None else (f"{relative(first['loss'], reference['loss']):.1e} / "
                                                  f"{relative(first['val_loss'], reference['val_loss']):.1e}")
            op = min((r["op_ms"] for r in results if r["op_ms"] is not None), default=None)
            print(f"| {workload} | {label} | {first['loss'][-1]:.5f} | {first['val_loss'][-1]:.5f} | {diff} "
                  f"| {exact:.0%} | {best['wall_ms']:.1f} | {min(r['cpu_ms'] for r in results):.1f} "
                  f"| {'-' if op is None else f'{op:.1f}'} |")


if __name__ == "__main__":
    main()
