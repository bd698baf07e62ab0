"""Per-step training time of three Keras 3 models under ``ENABLE_AUTO_MP=1``, against float32 and Keras's own policy.

Three models, each trained with ``fit`` on seeded synthetic data, each run
in its own process per mode:

- ``cnn``: three 3x3 convolutions (32, 64, 64 filters, ReLU) with max
  pooling between them and a dense classifier; 32x32x3 images, batch 64,
  Adam, sparse categorical cross-entropy;
- ``resnet50``: ``keras.applications.ResNet50`` (no weights) on 64x64x3
  images, 10 classes, batch 16, AdamW;
- ``gpt``: a two-block causal transformer (vocabulary 4096, 128 tokens,
  width 256, 4 heads, GELU feed-forward of 1024, token and position
  embeddings), batch 16, AdamW, next-token cross-entropy on the logits.

Modes: ``float32`` (no variable); ``auto`` (``ENABLE_AUTO_MP=1`` alone, which
picks float32 on a CPU without fast bfloat16 kernels); ``bfloat16``
(``AMP_REWRITE_TARGET=bfloat16`` forced); ``bfloat16+tune`` (the same with
``AMP_REWRITE_TUNE=1``, which once timed heavy ops one by one and is now
the step decision, as unset; one timing cache, new for each run of this
tool, so the first round measures and later rounds read it); ``policy`` (no variable; the
script sets Keras's ``mixed_bfloat16`` global policy before building the
model, the peer). The models are the same in every mode: no layer is given
a dtype, and the losses compute in float32 (Keras casts their inputs).

One ``fit`` call of one epoch per run: ``WARMUP`` steps (tracing, the
rewrite, tuning) untimed, then ``--steps`` timed steps, then ``PROFILED``
steps under the TensorFlow profiler. Per run: the median wall (and process
CPU) milliseconds of the timed steps, the profiler's op time per step (the
durations of its ``node:OpType`` events, summed over the threads that ran
them, so it can exceed the wall time), the same per op type, the number
of ``Cast`` ops run per step, the losses ``fit`` reports after each step
(Keras's running mean over the epoch) and the final one, and amp-rewrite's
own ``amp-rewrite...`` lines from stderr. Every round runs each model in
every mode, the mode order rotated each round, so a busy machine slows the
modes alike; a cell is the best (lowest) of the rounds.

Usage: ``python tools/benchmarks/bench_keras_policy.py [--models cnn resnet50 gpt] [--modes float32 auto bfloat16
bfloat16+tune policy] [--rounds 3] [--steps 6] [--out results.json] [--markdown]``
"""

from __future__ import annotations

import argparse
import json
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
    "bfloat16+tune": {"ENABLE_AUTO_MP": "1", "AMP_REWRITE_TARGET": "bfloat16", "AMP_REWRITE_TUNE": "1"},
    "policy": {},
}
POLICIES = {"policy": "mixed_bfloat16"}
MODELS = ("cnn", "resnet50", "gpt")
WARMUP, PROFILED, TOP_OPS, TIMEOUT_S = 3, 2, 15, 3600
CLASSES, VOCAB, TOKENS, WIDTH, HEADS, FFN = 10, 4096, 128, 256, 4, 1024


# --- the models and their data (run in the child process) ------------------------------------------


def images(samples: int, size: int, seed: int = 0):
    """Noisy images whose label a fixed linear teacher reads off their mean colour."""
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(samples, size, size, 3)).astype(np.float32)
    x += rng.normal(size=(samples, 1, 1, 3)).astype(np.float32)
    y = np.argmax(x.mean(axis=(1, 2)) @ rng.normal(size=(3, CLASSES)), axis=1).astype(np.int32)
    return x, y


def token_runs(samples: int, seed: int = 0):
    """Arithmetic token sequences (a random start and stride each), as inputs and next-token targets."""
    import numpy as np

    rng = np.random.default_rng(seed)
    start = rng.integers(0, VOCAB, size=(samples, 1))
    stride = rng.integers(1, 8, size=(samples, 1))
    sequences = ((start + stride * np.arange(TOKENS + 1)) % VOCAB).astype(np.int32)
    return sequences[:, :-1], sequences[:, 1:]


def cnn(steps: int):
    import keras
    from keras import layers

    model = keras.Sequential([
        keras.Input((32, 32, 3)),
        layers.Conv2D(32, 3, padding="same", activation="relu"),
        layers.MaxPooling2D(),
        layers.Conv2D(64, 3, padding="same", activation="relu"),
        layers.MaxPooling2D(),
        layers.Conv2D(64, 3, padding="same", activation="relu"),
        layers.MaxPooling2D(),
        layers.Flatten(),
        layers.Dense(CLASSES),
    ])
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model, 64, images(steps * 64, 32)


def resnet50(steps: int):
    import keras

    model = keras.applications.ResNet50(weights=None, input_shape=(64, 64, 3), classes=CLASSES)
    model.compile(optimizer=keras.optimizers.AdamW(1e-3), loss=keras.losses.SparseCategoricalCrossentropy())
    return model, 16, images(steps * 16, 64)


def gpt(steps: int):
    import keras
    from keras import layers

    class TokenAndPosition(layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.tokens = layers.Embedding(VOCAB, WIDTH)
            self.positions = layers.Embedding(TOKENS, WIDTH)

        def call(self, ids):
            return self.tokens(ids) + self.positions(keras.ops.arange(keras.ops.shape(ids)[-1]))

    ids = keras.Input((TOKENS,), dtype="int32")
    x = TokenAndPosition()(ids)
    for _ in range(2):
        h = layers.LayerNormalization(epsilon=1e-5)(x)
        x = layers.Add()([x, layers.MultiHeadAttention(HEADS, WIDTH // HEADS)(h, h, use_causal_mask=True)])
        h = layers.Dense(FFN, activation="gelu")(layers.LayerNormalization(epsilon=1e-5)(x))
        x = layers.Add()([x, layers.Dense(WIDTH)(h)])
    logits = layers.Dense(VOCAB)(layers.LayerNormalization(epsilon=1e-5)(x))
    model = keras.Model(ids, logits)
    model.compile(optimizer=keras.optimizers.AdamW(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model, 16, token_runs(steps * 16)


def worker(name: str, steps: int, policy: str | None, out: str, warmup: int = WARMUP) -> None:
    """Builds and trains one model for one epoch of ``warmup`` + ``steps`` + PROFILED steps; writes the result."""
    import keras

    if policy:
        keras.mixed_precision.set_global_policy(policy)
    keras.utils.set_random_seed(0)
    total = warmup + steps + PROFILED
    model, batch, (x, y) = globals()[name](total)
    timer = profiling.step_timer(warmup=warmup, profile_epoch=0, profile_batch=warmup + steps, profiled=PROFILED)
    started = time.perf_counter()
    history = model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=[timer])
    result = {"fit_s": time.perf_counter() - started, "loss": history.history["loss"],
              "step_losses": timer.losses, "op_types": timer.op_types, **timer.summary()}
    Path(out).write_text(json.dumps(result))


# --- the driver ------------------------------------------------------------------------------------


def run_one(model: str, mode: str, steps: int, cache_dir: str) -> dict:
    """One model in one mode in a fresh process: the worker's result, or ``{"failed": why}``."""
    policy = ["--policy", POLICIES[mode]] if mode in POLICIES else []
    return profiling.run_worker([__file__, "--worker", model, "--steps", str(steps), *policy],
                                {**MODES[mode], "AMP_REWRITE_TUNE_CACHE": cache_dir}, timeout_s=TIMEOUT_S)


def rotated(modes: list[str], round_index: int) -> list[str]:
    shift = round_index % len(modes)
    return modes[shift:] + modes[:shift]


def interleaved(subjects: list[str], modes: list[str], rounds: int):
    """``(round, subject, mode)`` of every run, rounds from 1: each subject in every mode once a round,
    the mode order rotated each round, so another job's load falls on all modes alike."""
    for round_index in range(rounds):
        for subject in subjects:
            for mode in rotated(modes, round_index):
                yield round_index + 1, subject, mode


def run_all(models: list[str], modes: list[str], rounds: int, steps: int) -> list[dict]:
    """Every (model, mode) once a round, in a mode order rotated each round; one record per run."""
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench_keras_policy_tune_") as cache_dir:
        for round_number, model, mode in interleaved(models, modes, rounds):
            result = run_one(model, mode, steps, cache_dir)
            runs.append({"model": model, "mode": mode, "round": round_number, **result})
            print(f"round {round_number}/{rounds} {model} {mode}: {progress(result)}", file=sys.stderr, flush=True)
    return runs


def progress(result: dict) -> str:
    if "failed" in result:
        return f"FAILED: {result['failed']}"
    return (f"{result['wall_ms']:.1f} ms/step wall, {fmt(result['op_ms'])} ms/step ops, "
            f"loss {result['loss'][-1]:.4f}, process {result['process_s']:.0f} s")


# --- the cells and the report ----------------------------------------------------------------------


def cast_row(result: dict) -> dict:
    return (result.get("op_types") or {}).get("Cast", {"ms": 0.0, "count": 0})


def cell(runs: list[dict]) -> dict:
    """The best of a (model, mode)'s runs: lowest wall time, lowest op time (with that run's op types)."""
    good = [r for r in runs if "failed" not in r]
    if not good:
        return {"failed": runs[-1]["failed"] if runs else "not run", "runs": len(runs)}
    fastest = min(good, key=lambda r: r["wall_ms"])
    profiled = [r for r in good if r.get("op_ms") is not None]
    by_ops = min(profiled, key=lambda r: r["op_ms"]) if profiled else fastest
    finals = [r["loss"][-1] for r in good]
    return {"wall_ms": fastest["wall_ms"], "cpu_ms": fastest["cpu_ms"], "op_ms": by_ops.get("op_ms"),
            "cast_count": cast_row(by_ops)["count"], "cast_ms": cast_row(by_ops)["ms"],
            "op_types": by_ops.get("op_types") or {}, "loss": fastest["loss"][-1],
            "loss_spread": max(finals) - min(finals), "step_losses": fastest["step_losses"],
            "fit_s": fastest["fit_s"], "warmup_ms": fastest["warmup_ms"], "amp_rewrite": fastest["amp_rewrite"],
            "warnings": fastest["warnings"], "runs": len(runs), "failed_runs": len(runs) - len(good)}


def fmt(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def ratio(cells: dict, mode: str, reference: str, key: str) -> str:
    base = cells.get(reference, {}).get(key)
    value = cells[mode].get(key)
    return "-" if not base or value is None else f"{value / base:.2f}"


def summary_table(model: str, modes: list[str], cells: dict) -> list[str]:
    out = [f"\n### {model}\n", "times per step, the best of the rounds; a ratio is this mode's time over the "
           "reference's (above 1: slower)\n", "| mode | wall ms/step | op ms/step | Cast/step | Cast ms/step "
           "| wall ÷ float32 | op ÷ float32 | wall ÷ policy | op ÷ policy | final loss |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for mode in modes:
        c = cells[mode]
        if "failed" in c:
            out.append(f"| {mode} | failed: {c['failed'][:100]} |||||||||")
            continue
        ratios = [ratio(cells, mode, ref, key) for ref in ("float32", "policy") for key in ("wall_ms", "op_ms")]
        out.append(f"| {mode} | {fmt(c['wall_ms'])} | {fmt(c['op_ms'])} | {c['cast_count']:.0f} "
                   f"| {fmt(c['cast_ms'], 2)} | {' | '.join(ratios)} | {c['loss']:.4f} |")
    return out


def op_type_table(modes: list[str], cells: dict) -> list[str]:
    """Op types as rows (each mode's top TOP_OPS by time, and Cast), ms per step and count per step by mode."""
    shown = [m for m in modes if cells[m].get("op_types")]
    if not shown:
        return []
    names = {"Cast"}
    for mode in shown:
        ranked = sorted(cells[mode]["op_types"].items(), key=lambda item: -item[1]["ms"])
        names.update(name for name, _ in ranked[:TOP_OPS])
    order = sorted(names, key=lambda n: -max(cells[m]["op_types"].get(n, {"ms": 0})["ms"] for m in shown))
    out = ["\nop time per step by op type, ms (ops run per step):\n", f"| op type | {' | '.join(shown)} |",
           "|---|" + "---:|" * len(shown)]
    for name in order:
        values = [cells[m]["op_types"].get(name) for m in shown]
        out.append(f"| {name} | " + " | ".join("-" if v is None else f"{v['ms']:.2f} ({v['count']:.0f})"
                                             for v in values) + " |")
    return out


def log_lines(modes: list[str], cells: dict) -> list[str]:
    out = []
    for mode in modes:
        for line in dict.fromkeys(cells[mode].get("amp_rewrite", [])):
            out.append(f"- {mode}: `{line[:300]}`")
        for line in cells[mode].get("warnings", []):
            out.append(f"- {mode} (warning): `{line[:300]}`")
    return ["\namp-rewrite's lines and warnings on stderr:\n", *out] if out else []


def markdown(models: list[str], modes: list[str], cells: dict) -> list[str]:
    out = []
    for model in models:
        out += summary_table(model, modes, cells[model])
        out += op_type_table(modes, cells[model])
        out += log_lines(modes, cells[model])
    return out


def plain(models: list[str], modes: list[str], cells: dict) -> list[str]:
    out = []
    for model in models:
        for mode in modes:
            c = cells[model][mode]
            out.append(f"{model:9s} {mode:14s} " + (f"failed: {c['failed']}" if "failed" in c else
                       f"wall {fmt(c['wall_ms'])} ms/step, ops {fmt(c['op_ms'])} ms/step, "
                       f"Cast {c['cast_count']:.0f} ({fmt(c['cast_ms'], 2)} ms), loss {c['loss']:.4f}"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6, help=f"timed steps per run (after {WARMUP} warm-up steps)")
    parser.add_argument("--out", help="write every run and the cells to this JSON file")
    parser.add_argument("--markdown", action="store_true", help="print Markdown tables")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--policy", help=argparse.SUPPRESS)
    parser.add_argument("--warmup", type=int, default=WARMUP, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps < 1 or args.rounds < 1:
        parser.error("--steps and --rounds must be at least 1")
    if args.worker:
        worker(args.worker, args.steps, args.policy, args.out, args.warmup)
        return
    started = time.perf_counter()
    runs = run_all(args.models, args.modes, args.rounds, args.steps)
    cells = {model: {mode: cell([r for r in runs if r["model"] == model and r["mode"] == mode])
                     for mode in args.modes} for model in args.models}
    elapsed = time.perf_counter() - started
    print(f"CPU: {profiling.cpu_line()}")
    print(f"rounds: {args.rounds}; steps: {WARMUP} warm-up, {args.steps} timed, {PROFILED} profiled; "
          f"took {elapsed / 60:.1f} min")
    print("\n".join(markdown(args.models, args.modes, cells) if args.markdown else
                    plain(args.models, args.modes, cells)))
    if args.out:
        Path(args.out).write_text(json.dumps({
            "cpu": {"model": profiling.cpu_model(), "flags": profiling.cpu_flags()},
            "rounds": args.rounds, "warmup": WARMUP, "steps": args.steps, "profiled": PROFILED,
            "elapsed_s": elapsed, "cells": cells, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
