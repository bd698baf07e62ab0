"""Losses of two sigmoid autoencoders whose units saturate, under ``ENABLE_AUTO_MP=1``, against float32 and the peers.

The network is TensorFlow-Examples' ``autoencoder.py`` (a TF1 script, as
``tf_upgrade_v2`` leaves it): 784-256-128-256-784, every layer
``sigmoid(x @ W + b)``, weights and biases drawn with ``tf.random_normal``
(standard deviation 1), RMSProp with a learning rate of 0.01, the mean
squared error between the input and its reconstruction, batches of 256.
With such weights most units start saturated, and a Sigmoid rounded to
bfloat16 or float16 is then exactly 1, where its gradient ``y(1 - y)`` is 0
(``amp_rewrite/paint/saturation.py``). Two workloads, each run in its own
process per mode, as a user runs an unmodified script:

- ``tf1``: that script written here (the original downloads MNIST; this one
  reads :func:`synthetic_mnist`), its minibatch loss through
  ``Session.run``; the loss at a step is the mean of the 50 minibatch losses
  up to it (one minibatch is noisy);
- ``keras``: a Keras 3 port, ``Dense(units, activation="sigmoid")`` with
  ``RandomNormal(stddev=1)`` kernels and biases, ``fit`` for 64 epochs of
  16 steps (4096 images); the loss of an epoch is the one ``fit`` reports.

Data. :func:`synthetic_mnist`: 10000 28x28 images in [0, 1], ten classes,
each a prototype of four Gaussian strokes shifted by up to two pixels,
scaled, with noise, clipped; about as sparse as MNIST, so the first layer's
sums reach the same sizes. Seeded: the same arguments give the same images.

Modes: ``float32`` (no variable); ``bfloat16`` and ``float16``
(``ENABLE_AUTO_MP=1 AMP_REWRITE_TARGET=...  AMP_REWRITE_TUNE=0``: the
rewrite alone); ``bfloat16+decision`` and ``float16+decision`` (the same
with the step decision, as a user gets it: a step runs in half only where
it ran faster); for the Keras port, Keras's own ``mixed_bfloat16`` and
``mixed_float16`` policies, set before the model is built; ``grappler``:
TensorFlow's own ``auto_mixed_precision_onednn_bfloat16`` pass (the TF1
session's rewrite options; for Keras, ``tf.config.optimizer``). With
``--before PYTHON``, ``bfloat16 (before)`` and ``float16 (before)``: the
rewrite alone under another interpreter, one whose installed amp-rewrite
predates the saturation rule. The float16 modes run with
``TF_ENABLE_ONEDNN_OPTS=0``: on a CPU, oneDNN's fused
MatMul+BiasAdd+Sigmoid kernel takes over a second a step in float16, the
plain kernels milliseconds, and the numbers are the same.

Other activations. ``--activation tanh|elu|selu`` gives the hidden layers
that activation (the output layer stays a Sigmoid: the images are in [0,
1]); the modes ``bfloat16+kept`` and ``float16+kept`` are ``bfloat16`` and
``float16`` with ``AMP_REWRITE_KEEP_FLOAT32=<its op>``, which keeps the activation
and its gradient float32 by name. These runs decide which activations the
saturation rule should keep: one whose "kept" rows come no closer to
float32 than the plain ones is left to the lists.

Every run has a tuning cache of its own, so each step decision measures.
Per run: the losses at ``--steps`` (TF1) or every ``--every`` epochs
(Keras), each one's distance from float32's at the same step, the median
step time, amp-rewrite's lines (the rewrite and the step decision), and
which amp-rewrite the child imported.

Usage: ``python tools/benchmarks/bench_saturation.py [--workloads tf1 keras] [--steps 250,1000,3000]
[--epochs 64] [--every 16] [--seed 0] [--activation sigmoid] [--modes ...] [--before /path/to/old/python]
[--out results.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import profiling  # noqa: E402

ON = {"ENABLE_AUTO_MP": "1"}
NO_ONEDNN = {"TF_ENABLE_ONEDNN_OPTS": "0"}
MODES = {
    "float32": {},
    "bfloat16": {**ON, "AMP_REWRITE_TARGET": "bfloat16", "AMP_REWRITE_TUNE": "0"},
    "bfloat16+decision": {**ON, "AMP_REWRITE_TARGET": "bfloat16"},
    "float16": {**ON, "AMP_REWRITE_TARGET": "float16", "AMP_REWRITE_TUNE": "0", **NO_ONEDNN},
    "float16+decision": {**ON, "AMP_REWRITE_TARGET": "float16", **NO_ONEDNN},
    "keras mixed_bfloat16": {"SATURATION_POLICY": "mixed_bfloat16"},
    "keras mixed_float16": {"SATURATION_POLICY": "mixed_float16", **NO_ONEDNN},
    "grappler": {"SATURATION_GRAPPLER": "1"},
    "bfloat16+kept": {**ON, "AMP_REWRITE_TARGET": "bfloat16", "AMP_REWRITE_TUNE": "0"},
    "float16+kept": {**ON, "AMP_REWRITE_TARGET": "float16", "AMP_REWRITE_TUNE": "0", **NO_ONEDNN},
}
#: The activations of the hidden layers ``--activation`` offers, and the op each is (the output stays Sigmoid).
ACTIVATIONS = {"sigmoid": "Sigmoid", "tanh": "Tanh", "elu": "Elu", "selu": "Selu"}
KEPT = ("bfloat16+kept", "float16+kept")  # with AMP_REWRITE_KEEP_FLOAT32=<the activation's op>
BEFORE = {"bfloat16 (before)": "bfloat16", "float16 (before)": "float16"}
KERAS_ONLY = ("keras mixed_bfloat16", "keras mixed_float16")
WORKLOADS = ("tf1", "keras")
SIZES = (784, 256, 128, 256, 784)
BATCH, LEARNING_RATE, WINDOW, TIMEOUT_S = 256, 0.01, 50, 7200


def synthetic_mnist(n: int = 10000, seed: int = 0):
    """``n`` 28x28 images (flattened, float32 in [0, 1]) of ten stroke prototypes, shifted, scaled and noisy."""
    import numpy as np

    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:28, 0:28]
    prototypes = []
    for _ in range(10):
        image = np.zeros((28, 28))
        for _ in range(4):
            (cy, cx), (sy, sx) = rng.uniform(6, 22, 2), rng.uniform(1.5, 4, 2)
            image += np.exp(-((yy - cy) ** 2 / (2 * sy ** 2) + (xx - cx) ** 2 / (2 * sx ** 2)))
        prototypes.append(image)
    images = np.empty((n, 784), np.float32)
    for i, label in enumerate(rng.integers(0, 10, n)):
        dy, dx = rng.integers(-2, 3, 2)
        image = np.roll(prototypes[label], (dy, dx), (0, 1)) * rng.uniform(0.7, 1.3) + rng.normal(0, 0.1, (28, 28))
        images[i] = np.clip(image, 0, 1).reshape(-1)
    return images


# --- the workloads (run in the child process) ---------------------------------------------------


def tf1(steps: list[int], seed: int, activation: str) -> dict:
    """The TF1 autoencoder, trained for the largest of ``steps``; the windowed loss at each of them."""
    import numpy as np
    import tensorflow as tf

    v1 = tf.compat.v1
    v1.disable_eager_execution()
    v1.set_random_seed(seed)
    images = synthetic_mnist()
    x = v1.placeholder("float", [None, 784])
    layer = x
    for n_in, n_out in zip(SIZES, SIZES[1:]):
        weights, biases = tf.Variable(v1.random_normal([n_in, n_out])), tf.Variable(v1.random_normal([n_out]))
        function = getattr(tf.nn, activation if n_out != SIZES[-1] else "sigmoid")
        layer = function(tf.add(tf.matmul(layer, weights), biases))
    loss = tf.reduce_mean(tf.pow(x - layer, 2))
    optimizer = v1.train.RMSPropOptimizer(LEARNING_RATE).minimize(loss)
    config = v1.ConfigProto()
    if os.environ.get("SATURATION_GRAPPLER"):
        from tensorflow.core.protobuf.rewriter_config_pb2 import RewriterConfig

        config.graph_options.rewrite_options.auto_mixed_precision_onednn_bfloat16 = RewriterConfig.ON
    order = np.random.default_rng(seed)
    history, walls = [], []
    with v1.Session(config=config) as session:
        session.run(v1.global_variables_initializer())
        for _ in range(max(steps)):
            batch = images[order.integers(0, len(images), BATCH)]
            started = time.perf_counter()
            _, value = session.run([optimizer, loss], feed_dict={x: batch})
            walls.append(time.perf_counter() - started)
            history.append(float(value))
    return {"losses": {str(s): float(np.mean(history[s - WINDOW:s])) for s in steps},
            "step_ms": 1e3 * statistics.median(walls[20:])}


def keras(epochs: int, seed: int, activation: str) -> dict:
    """The Keras 3 port, ``fit`` for ``epochs`` epochs of 4096 images; the loss of every epoch."""
    import keras as k

    policy = os.environ.get("SATURATION_POLICY")
    if policy:
        k.mixed_precision.set_global_policy(policy)
    if os.environ.get("SATURATION_GRAPPLER"):
        import tensorflow as tf

        tf.config.optimizer.set_experimental_options({"auto_mixed_precision_onednn_bfloat16": True})
    k.utils.set_random_seed(seed)
    images = synthetic_mnist()[:4096]
    model = k.Sequential([k.Input((784,))] + [
        k.layers.Dense(units, activation=activation if units != SIZES[-1] else "sigmoid",
                       kernel_initializer=k.initializers.RandomNormal(stddev=1.0),
                       bias_initializer=k.initializers.RandomNormal(stddev=1.0)) for units in SIZES[1:]])
    model.compile(optimizer=k.optimizers.RMSprop(LEARNING_RATE), loss="mse")
    timer = epoch_timer()
    history = model.fit(images, images, batch_size=BATCH, epochs=epochs, verbose=0, callbacks=[timer])
    return {"losses": {str(e + 1): float(v) for e, v in enumerate(history.history["loss"])},
            "step_ms": 1e3 * statistics.median(timer.step_seconds[1:])}


def epoch_timer():
    """A Keras callback keeping each epoch's seconds per step."""
    import keras as k

    class EpochTimer(k.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.step_seconds: list[float] = []

        def on_epoch_begin(self, epoch, logs=None):
            self.started = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.step_seconds.append((time.perf_counter() - self.started) / self.params["steps"])

    return EpochTimer()


def worker(workload: str, steps: list[int], epochs: int, seed: int, activation: str, out: str) -> None:
    import amp_rewrite

    result = tf1(steps, seed, activation) if workload == "tf1" else keras(epochs, seed, activation)
    result["amp_rewrite_from"] = str(Path(amp_rewrite.__file__).parent)
    Path(out).write_text(json.dumps(result))


# --- the driver ------------------------------------------------------------------------------------


def modes_of(workload: str, chosen: list[str], before: str | None,
             activation: str) -> list[tuple[str, dict, str | None]]:
    """(label, environment, interpreter or None for this one) of each run of ``workload``."""
    kept = {"AMP_REWRITE_KEEP_FLOAT32": ACTIVATIONS[activation]}
    runs = [(f"{mode.split('+')[0]}, {ACTIVATIONS[activation]} kept float32" if mode in KEPT else mode,
             {**MODES[mode], **(kept if mode in KEPT else {})}, None)
            for mode in chosen if workload == "keras" or mode not in KERAS_ONLY]
    if before:
        runs += [(label, MODES[mode], before) for label, mode in BEFORE.items() if mode in chosen]
    return runs


def run_all(args) -> dict[tuple[str, str], dict]:
    """Every (workload, mode) once, each with a tuning cache of its own, so every step decision measures."""
    results = {}
    for workload in args.workloads:
        for label, env, python in modes_of(workload, args.modes, args.before, args.activation):
            command = [__file__, "--worker", workload, "--steps", ",".join(map(str, args.steps)),
                       "--epochs", str(args.epochs), "--seed", str(args.seed), "--activation", args.activation]
            with tempfile.TemporaryDirectory(prefix="bench_saturation_cache_") as cache:
                result = profiling.run_worker(command, {**env, "AMP_REWRITE_TUNE_CACHE": cache},
                                              timeout_s=TIMEOUT_S, python=python)
            results[workload, label] = result
            shown = result.get("failed") or " ".join(f"{s}: {v:.4f}" for s, v in list(result["losses"].items())[-3:])
            print(f"{workload} {label}: {shown}", file=sys.stderr, flush=True)
    return results


def points(workload: str, args) -> list[str]:
    if workload == "tf1":
        return [str(s) for s in args.steps]
    return [str(e) for e in range(args.every, args.epochs + 1, args.every)]


def table(workload: str, results: dict, args) -> list[str]:
    marks = points(workload, args)
    unit = "step" if workload == "tf1" else "epoch"
    reference = results.get((workload, "float32"), {}).get("losses", {})
    out = [f"\n{workload}: loss at {unit} " + ", ".join(marks) + " (and its distance from float32's)\n",
           "| mode | " + " | ".join(f"{unit} {m}" for m in marks) + " | ms/step | decision |",
           "|---|" + "---:|" * len(marks) + "---:|---|"]
    for (name, label), result in results.items():
        if name != workload:
            continue
        if "failed" in result:
            out.append(f"| {label} | failed: {result['failed'][:120]} |")
            continue
        cells = []
        for m in marks:
            value, base = result["losses"].get(m), reference.get(m)
            cells.append("-" if value is None else f"{value:.4f}" + (
                f" ({value / base - 1:+.1%})" if base and label != "float32" else ""))
        out.append(f"| {label} | " + " | ".join(cells) + f" | {result['step_ms']:.1f} | {decision(result)} |")
    return out


def decision(result: dict) -> str:
    """The step decision amp-rewrite's lines state, in short; "—" where none was logged."""
    for line in result.get("amp_rewrite", []):
        for verdict in ("runs in bfloat16", "runs in float16", "stays float32"):
            if verdict in line:
                return verdict.replace("runs in ", "")
    return "—"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--modes", nargs="+", default=[m for m in MODES if m not in KEPT], choices=list(MODES))
    parser.add_argument("--activation", default="sigmoid", choices=list(ACTIVATIONS),
                        help="the hidden layers' activation (the output layer's stays sigmoid)")
    parser.add_argument("--steps", default="250,1000,3000", help="TF1: the steps whose loss is reported")
    parser.add_argument("--epochs", type=int, default=64, help="Keras: epochs of 16 steps")
    parser.add_argument("--every", type=int, default=16, help="Keras: report every this many epochs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--before", help="an interpreter whose amp-rewrite predates the change, for 'before' rows")
    parser.add_argument("--out", help="write every run to this JSON file")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.steps = sorted(int(s) for s in args.steps.split(","))
    if args.steps[0] < WINDOW:
        parser.error(f"--steps must be at least {WINDOW} (a loss is the mean of the {WINDOW} before it)")
    if args.worker:
        worker(args.worker, args.steps, args.epochs, args.seed, args.activation, args.out)
        return
    started = time.perf_counter()
    results = run_all(args)
    print(f"CPU: {profiling.cpu_line()}; seed {args.seed}; hidden layers: {args.activation}; "
          f"took {(time.perf_counter() - started) / 60:.1f} min")
    for workload in args.workloads:
        print("\n".join(table(workload, results, args)))
    sources = sorted({r["amp_rewrite_from"] for r in results.values() if "amp_rewrite_from" in r})
    print("\namp-rewrite imported from: " + ", ".join(sources))
    for (workload, label), result in results.items():
        for line in dict.fromkeys(result.get("amp_rewrite", [])):
            print(f"- {workload} {label}: `{line[:240]}`")
    if args.out:
        Path(args.out).write_text(json.dumps({f"{w} | {m}": r for (w, m), r in results.items()}, indent=1))


if __name__ == "__main__":
    main()
