"""Per-step training time with and without measured precision (``AMP_REWRITE_TUNE=1``) on this machine.

``AMP_REWRITE_TUNE=1`` timed heavy ops one by one when the results in
``docs/benchmarks.md`` were taken; that timing is retired, and the variable
now means what unset means (the step decides), so a ``+tune`` mode differs
from its plain mode only by its fresh timing cache.

Four unmodified training scripts, each run in its own process:

- ``tf1`` and ``keras``: the CNNs of ``tools/benchmarks/bench_auto_mp.py`` (TF1
  ``Session`` and Keras ``fit``);
- ``keras_xla``: the Keras CNN compiled with ``jit_compile=True``;
- ``depthwise``: a Keras MobileNet-style model (depthwise 3x3 and pointwise
  1x1 convolutions) trained with ``fit``.

Modes: float32 (no variable), float32 again (a control: the spread between
two runs of the same graph is this machine's noise), ``ENABLE_AUTO_MP=1``
(the target ``auto`` picks here), forced float16 and forced bfloat16, each
of the last three with and without ``AMP_REWRITE_TUNE=1``. Every round runs
each script once per mode, alternating, so a busy machine slows them alike.
Each step is timed twice: wall-clock time, and the process's CPU time
(every thread's), which a shared machine's other jobs disturb far less. The tuned modes
share one timing cache for the whole run, so the first round's tuned runs
measure and the later ones read the cache; the times reported exclude the
warm-up steps, which hold the rewrite and its measuring, reported apart as
the first step's time. Usage:
``python tools/benchmarks/bench_tune.py [--rounds 2] [--steps 5] [--kinds tf1,keras,keras_xla,depthwise]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_auto_mp as workloads  # noqa: E402

TUNE = {"AMP_REWRITE_TUNE": "1"}
CLOCKS = {"wall": "times", "cpu": "cpu_times"}
MODES = {
    "float32": {},
    # float32 again, in its own process: how far two runs of one graph differ on this machine now.
    "float32-again": {},
    "auto": {"ENABLE_AUTO_MP": "1"},
    "auto+tune": {"ENABLE_AUTO_MP": "1", **TUNE},
    "float16": {"ENABLE_AUTO_MP": "1", "AMP_REWRITE_TARGET": "float16"},
    "float16+tune": {"ENABLE_AUTO_MP": "1", "AMP_REWRITE_TARGET": "float16", **TUNE},
    "bfloat16": {"ENABLE_AUTO_MP": "1", "AMP_REWRITE_TARGET": "bfloat16"},
    "bfloat16+tune": {"ENABLE_AUTO_MP": "1", "AMP_REWRITE_TARGET": "bfloat16", **TUNE},
}


def depthwise_model():
    """Two depthwise-separable blocks after a stem convolution, batch norms between them."""
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import keras

    keras.utils.set_random_seed(0)
    layers = keras.layers
    blocks = [keras.Input((workloads.SIZE, workloads.SIZE, 3)), layers.Conv2D(32, 3, padding="same"),
              layers.BatchNormalization(), layers.ReLU()]
    for filters, stride in ((64, 1), (128, 2), (128, 1)):
        blocks += [layers.DepthwiseConv2D(3, strides=stride, padding="same"), layers.BatchNormalization(),
                   layers.ReLU(), layers.Conv2D(filters, 1), layers.BatchNormalization(), layers.ReLU()]
    blocks += [layers.GlobalAveragePooling2D(), layers.Dense(workloads.CLASSES)]
    return workloads.compiled(keras.Sequential(blocks))


TRAIN = {
    "tf1": workloads.train_tf1,
    "keras": lambda steps: workloads.fit_and_time(workloads.keras_cnn(), steps),
    "keras_xla": lambda steps: workloads.fit_and_time(workloads.keras_cnn(jit_compile=True), steps),
    "depthwise": lambda steps: workloads.fit_and_time(depthwise_model(), steps),
}


def run_once(kind: str, mode: str, steps: int, cache_dir: str) -> dict:
    env = workloads.clean_environment()
    env.update(MODES[mode], TF_CPP_MIN_LOG_LEVEL="2", PYTHONHASHSEED="0", AMP_REWRITE_TUNE_CACHE=cache_dir)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        done = subprocess.run([sys.executable, __file__, "--worker", kind, "--steps", str(steps), "--out", out],
                              env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{kind} {mode} failed:\n{done.stderr[-3000:]}")
        with open(out) as f:
            result = json.load(f)
    result["log"] = [line.split("amp-rewrite: ", 1)[-1] for line in done.stderr.splitlines()
                     if "amp-rewrite:" in line and "converted 0/7 " not in line and "converted 0/8 " not in line]
    return result


def report(kinds, modes, medians, losses, logs, rounds, steps) -> None:
    """One table per script: the median over rounds of each run's median step, wall and CPU time."""
    for kind in kinds:
        print(f"\n{kind}: median step time over {rounds} rounds of {steps} steps (wall; CPU time of all threads)")
        print("| mode | step | vs float32 | CPU per step | vs float32 | last loss | first rewrite's line |")
        print("|---|---:|---:|---:|---:|---:|---|")
        base = {clock: statistics.median(medians[(kind, "float32", clock)]) if "float32" in modes else None
                for clock in CLOCKS}
        for mode in modes:
            cells = []
            for clock in CLOCKS:
                step = statistics.median(medians[(kind, mode, clock)])
                cells += [f"{step * 1000:.0f} ms", f"{base[clock] / step:.2f}x" if base[clock] else ""]
            line = (logs[(kind, mode)] or [""])[-1][:120]
            print(f"| {mode} | {' | '.join(cells)} | {losses[(kind, mode)][-1]:.4f} | {line} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--kinds", default=",".join(TRAIN))
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        with open(args.out, "w") as f:
            json.dump(TRAIN[args.worker](args.steps), f)
        return
    kinds, modes = args.kinds.split(","), args.modes.split(",")
    print(workloads.cpu_description())
    medians = {(k, m, clock): [] for k in kinds for m in modes for clock in CLOCKS}
    losses, logs = {}, {}
    with tempfile.TemporaryDirectory() as cache_dir:
        for round_index in range(args.rounds):
            for kind in kinds:
                for mode in modes:
                    result = run_once(kind, mode, args.steps, cache_dir)
                    for clock, key in CLOCKS.items():
                        medians[(kind, mode, clock)].append(statistics.median(result[key]))
                    losses[(kind, mode)] = result["losses"]
                    logs[(kind, mode)] = result["log"]
                    wall, cpu = (medians[(kind, mode, clock)][-1] * 1000 for clock in CLOCKS)
                    print(f"round {round_index + 1} {kind} {mode}: {wall:.0f} ms, CPU {cpu:.0f} ms",
                          file=sys.stderr, flush=True)
    report(kinds, modes, medians, losses, logs, args.rounds, args.steps)


if __name__ == "__main__":
    main()
