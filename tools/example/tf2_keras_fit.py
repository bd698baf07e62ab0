"""Keras 3 ``fit`` of a small MLP and CNN on synthetic data; writes what happened as JSON.

The script knows nothing about amp-rewrite: run it with and without
``ENABLE_AUTO_MP=1`` and compare. For each model the JSON holds the loss of
every epoch, the optimizer's class, the dtypes of the weights, and, when the
runtime is on, each rewritten ``tf.function`` with the op types it runs in
half. Usage: ``[ENABLE_AUTO_MP=1] python tools/example/tf2_keras_fit.py --out FILE.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

HALF = ("float16", "bfloat16")


def mlp():
    return keras.Sequential([
        keras.Input((32,)),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10),
    ])


def cnn():
    return keras.Sequential([
        keras.Input((16, 16, 3)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10),
    ])


def synthetic_data(shape, samples, seed):
    """Inputs, and labels a fixed random linear teacher gives them.

    Images get a random offset per channel on top of the noise, and the
    teacher reads the channel means, which a conv + pooling model can learn.
    """
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(samples, *shape)).astype(np.float32)
    if len(shape) == 3:
        x += rng.normal(size=(samples, 1, 1, shape[-1])).astype(np.float32)
        features = x.mean(axis=(1, 2))
    else:
        features = x
    teacher = rng.normal(size=(features.shape[1], 10)).astype(np.float32)
    return x, np.argmax(features @ teacher, axis=1)


def train(name, build, shape, *, epochs, seed):
    keras.utils.set_random_seed(seed)
    x, y = synthetic_data(shape, 1024, seed)
    model = build()
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    start = time.perf_counter()
    history = model.fit(x, y, batch_size=64, epochs=epochs, shuffle=False, verbose=0)
    return {
        "model": name,
        "losses": [float(v) for v in history.history["loss"]],
        "fit_seconds": time.perf_counter() - start,
        "optimizer": type(model.optimizer).__name__,
        "inner_optimizer": type(getattr(model.optimizer, "inner_optimizer", model.optimizer)).__name__,
        "weight_dtypes": sorted({str(w.dtype) for w in model.weights}),
        "loss_scale": loss_scale(),
        "rewritten": rewritten_functions(),
    }


def loss_scale():
    """The runtime's loss scale and skipped steps so far, or None when it is off."""
    runtime = sys.modules.get("amp_rewrite.runtime")
    scaling = runtime.loss_scaling() if runtime is not None else None
    if scaling is None:
        return None
    state = scaling.state()
    return {"scale": float(state.scale.numpy()), "skipped": int(state.skipped_steps.numpy())}


_REPORTED: set[int] = set()


def rewritten_functions():
    """The tf.functions the runtime rewrote since the last call (none when it is off)."""
    tf_function = sys.modules.get("amp_rewrite.runtime.tf2.tracing")
    if tf_function is None:
        return []
    found = []
    for concrete_function, report in tf_function.swapped():
        if id(report) in _REPORTED:
            continue
        _REPORTED.add(id(report))
        half_ops = sorted({op.type for op in concrete_function.graph.get_operations()
                           if op.type != "Cast" and any(v.type and _dtype_name(v.type) in HALF
                                                        for v in op.node_def.attr.values())})
        found.append({"name": report.name, "summary": report.summary, "seconds": report.seconds,
                      "half_ops": half_ops})
        tf_function.restore(concrete_function)
    return found


def _dtype_name(enum):
    import tensorflow as tf

    return tf.dtypes.as_dtype(enum).name


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--models", default="mlp,cnn")
    args = parser.parse_args(argv)
    builders = {"mlp": (mlp, (32,)), "cnn": (cnn, (16, 16, 3))}
    results = [train(name, *builders[name], epochs=args.epochs, seed=args.seed)
               for name in args.models.split(",")]
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
