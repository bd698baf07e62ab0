"""Step time after the step decision: a float32 verdict against float32, a half verdict against the op lists.

Under ``ENABLE_AUTO_MP=1`` each step's first calls alternate its half and
float32 variants, and the faster stays. What stays must then run as fast
as what it was timed as: a float32 verdict as fast as the script without
amp-rewrite, a half verdict as fast as the op lists' rewrite alone
(``AMP_REWRITE_TUNE=0``). This tool measures both, on two workloads:

- ``cnn``: a Keras 3 ``fit`` of ``tools/benchmarks/bench_keras_policy.py``'s
  CNN (3 convs on 32x32x3 images, Adam), batch ``--batch`` (default 64);
- ``transformer``: ``tools/benchmarks/models.py``'s post-norm transformer
  block (width 256, 4 heads, 128 tokens, Adam) trained through a TF1
  ``Session``, batch ``--tf1-batch`` (default 4).

The modes, each run in its own process:

- ``float32``: no amp-rewrite variable;
- ``lists``: ``ENABLE_AUTO_MP=1 AMP_REWRITE_TARGET=bfloat16 AMP_REWRITE_TUNE=0``;
- ``half verdict`` / ``float32 verdict``: ``ENABLE_AUTO_MP=1
  AMP_REWRITE_TARGET=bfloat16``, a fresh tuning cache, and the trial's
  verdict forced: the worker replaces the trials' timer with one that runs
  each call and reports the loser's time ten times over, and turns the
  profiled mixing off, so the step runs the pure body the verdict kept;
- ``half verdict, cached`` / ``float32 verdict, cached``: the same variables
  with a tuning cache a forced run filled before the rounds: the verdict is
  read before the first step (the path of every later run of a script);
- ``float16, float32 verdict``: ``AMP_REWRITE_TARGET=float16`` (loss
  scaling on), the verdict forced to float32: the float32 body must leave
  the loss scaling out to run at float32's speed.

Each run takes ``WARMUP`` untimed steps (the trial's ten and more), then
``--steps`` timed ones (their median is the run's wall time), then 2 under
TensorFlow's profiler (their op time per step: the op events' durations,
summed over threads). Every round runs each workload in every mode, the
order rotated each round; a cell is the best of ``--rounds`` rounds (the
lowest median wall time, the lowest op time). The ratio column divides a
verdict's time by its reference's: ``float32`` for a float32 verdict,
``lists`` for a half one. Each run notes the machine's load average when
it started.

Usage: ``flock /work/bench.lock python tools/benchmarks/bench_verdict_speed.py [--workloads cnn transformer]
[--rounds 3] [--steps 20] [--out results.json]``
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

import bench_keras_policy as keras_runs  # noqa: E402
import profiling  # noqa: E402

WORKLOADS = ("cnn", "transformer")
AUTO = {"ENABLE_AUTO_MP": "1", "AMP_REWRITE_TARGET": "bfloat16"}
#: mode → (its variables, the verdict its worker forces or None, the cache it reads: "fresh" or a forced mode's)
MODES: dict[str, tuple[dict[str, str], str | None, str]] = {
    "float32": ({}, None, "fresh"),
    "lists": ({**AUTO, "AMP_REWRITE_TUNE": "0"}, None, "fresh"),
    "half verdict": (AUTO, "half", "fresh"),
    "half verdict, cached": (AUTO, None, "half verdict"),
    "float32 verdict": (AUTO, "float32", "fresh"),
    "float32 verdict, cached": (AUTO, None, "float32 verdict"),
    "float16, float32 verdict": ({**AUTO, "AMP_REWRITE_TARGET": "float16"}, "float32", "fresh"),
}
REFERENCE = {"half verdict": "lists", "half verdict, cached": "lists", "float32 verdict": "float32",
             "float32 verdict, cached": "float32", "float16, float32 verdict": "float32"}
WARMUP, PROFILED, TIMEOUT_S = 20, 2, 3600


# --- the worker (run in the child process) ---------------------------------------------------------


def force(verdict: str) -> None:
    """Makes every step trial of this process decide ``verdict``, on its real calls, with no mixed body."""
    from amp_rewrite import runtime
    from amp_rewrite.runtime.tf1.session import session_trial

    loser = "float32" if verdict == "half" else "half"

    def timer(body, call):
        began = time.perf_counter()
        outputs = call()
        seconds = time.perf_counter() - began
        return outputs, seconds * (10.0 if body == loser else 1.0)

    active = runtime.current_runtime()
    if active.tracing is not None and active.tracing.trials is not None:
        active.tracing.trials.timer = timer
        active.tracing.trials.profiler = None
    trials = session_trial.trials_of(active)
    if trials is not None:
        trials.timer = timer


def cnn_worker(steps: int, batch: int) -> dict:
    import keras

    keras.utils.set_random_seed(0)
    model, _, _ = keras_runs.cnn(1)
    x, y = keras_runs.images((WARMUP + steps + PROFILED) * batch, 32)
    timer = profiling.step_timer(warmup=WARMUP, profile_epoch=0, profile_batch=WARMUP + steps, profiled=PROFILED)
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=[timer])
    return {**timer.summary(), "best_ms": 1e3 * min(timer.walls), "loss": timer.losses}


def transformer_worker(steps: int, batch: int) -> dict:
    import bench_bfloat16_steps as sessions
    import models

    model = models.tf1_transformer_block_training(batch=batch, seq=128, d_model=256, heads=4)
    runner = sessions.Runner(model, model.graph_def)
    warmup = [1e3 * runner.step() for _ in range(WARMUP)]
    walls = [runner.step() for _ in range(steps)]
    types = profiling.profile_calls(runner.step, PROFILED)
    runner.session.close()
    return {"wall_ms": 1e3 * statistics.median(walls), "best_ms": 1e3 * min(walls), "warmup_ms": warmup,
            "op_ms": sum(row["ms"] for row in types.values()), "loss": runner.losses}


def worker(workload: str, verdict: str | None, steps: int, batch: int, out: str) -> None:
    import tensorflow as tf  # noqa: F401 - the runtime enables itself when TensorFlow is imported

    if verdict is not None:
        force(verdict)
    result = cnn_worker(steps, batch) if workload == "cnn" else transformer_worker(steps, batch)
    Path(out).write_text(json.dumps(result))


# --- the driver ------------------------------------------------------------------------------------


def run_one(workload: str, mode: str, args, caches: dict[str, str]) -> dict:
    variables, verdict, cache = MODES[mode]
    batch = args.batch if workload == "cnn" else args.tf1_batch
    command = [__file__, "--worker", workload, "--steps", str(args.steps), "--batch", str(batch),
               *(["--force", verdict] if verdict else [])]
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench_verdict_cache_") as fresh:
        directory = fresh if cache == "fresh" else caches[f"{workload}/{cache}"]
        result = profiling.run_worker(command, {**variables, "AMP_REWRITE_TUNE_CACHE": directory},
                                      timeout_s=TIMEOUT_S)
    result["load"] = load
    return result


def fill_caches(workloads: list[str], args, root: str) -> dict[str, str]:
    """Per workload, a tuning cache each forced verdict filled (one untimed run each), for the cached modes."""
    caches = {}
    for workload in workloads:
        for mode in ("half verdict", "float32 verdict"):
            directory = caches[f"{workload}/{mode}"] = os.path.join(root, f"{workload}-{mode.split()[0]}")
            os.makedirs(directory)
            variables, verdict, _ = MODES[mode]
            batch = args.batch if workload == "cnn" else args.tf1_batch
            result = profiling.run_worker([__file__, "--worker", workload, "--steps", "1", "--batch", str(batch),
                                           "--force", str(verdict)],
                                          {**variables, "AMP_REWRITE_TUNE_CACHE": directory}, timeout_s=TIMEOUT_S)
            print(f"cache for {workload} {mode}: {decisions(result) or result.get('failed')}", file=sys.stderr,
                  flush=True)
    return caches


def decisions(result: dict) -> list[str]:
    return [line.split("amp-rewrite: ", 1)[-1] for line in result.get("amp_rewrite", [])
            if "stays float32" in line or "runs in bfloat16:" in line or "runs in float16:" in line
            or "not tried" in line]


def cell(runs: list[dict]) -> dict:
    good = [run for run in runs if "failed" not in run]
    if not good:
        return {"failed": runs[-1].get("failed", "not run") if runs else "not run"}
    fastest = min(good, key=lambda run: run["wall_ms"])
    ops = [run["op_ms"] for run in good if run.get("op_ms") is not None]
    return {"wall_ms": fastest["wall_ms"], "best_ms": min(run["best_ms"] for run in good),
            "op_ms": min(ops) if ops else None, "walls": [round(run["wall_ms"], 2) for run in good],
            "loads": [round(run["load"], 1) for run in good],
            "decisions": sorted({line for run in good for line in decisions(run)})}


def table(workloads: list[str], cells: dict) -> list[str]:
    out = ["| workload | mode | wall ms/step (best of rounds) | each round | op ms/step | ÷ reference | load |",
           "|---|---|---:|---|---:|---:|---|"]
    for workload in workloads:
        for mode, c in cells[workload].items():
            if "failed" in c:
                out.append(f"| {workload} | {mode} | failed: {c['failed'][:120]} |||||")
                continue
            reference = cells[workload].get(REFERENCE.get(mode, ""), {})
            ratio = (f"{reference['wall_ms'] / c['wall_ms']:.3f}x {REFERENCE[mode]}"
                     if mode in REFERENCE and "wall_ms" in reference else "")
            out.append(f"| {workload} | {mode} | {c['wall_ms']:.2f} | {', '.join(map(str, c['walls']))} "
                       f"| {keras_runs.fmt(c['op_ms'])} | {ratio} | {', '.join(map(str, c['loads']))} |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per run (default 20)")
    parser.add_argument("--batch", type=int, default=64, help="the CNN's batch (default 64)")
    parser.add_argument("--tf1-batch", type=int, default=4, help="the transformer's batch (default 4)")
    parser.add_argument("--out", help="write every run and the cells to this JSON file")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--force", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.force, args.steps, args.batch, args.out)
        return
    started = time.perf_counter()
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench_verdict_caches_") as root:
        needs_cache = any(MODES[mode][2] != "fresh" for mode in args.modes)
        caches = fill_caches(args.workloads, args, root) if needs_cache else {}
        for round_number, workload, mode in keras_runs.interleaved(args.workloads, args.modes, args.rounds):
            result = run_one(workload, mode, args, caches)
            runs.append({"workload": workload, "mode": mode, "round": round_number, **result})
            shown = f"{result['wall_ms']:.2f} ms/step" if "wall_ms" in result else f"FAILED: {result.get('failed')}"
            print(f"round {round_number}/{args.rounds} {workload} {mode}: {shown} (load {result['load']:.1f}); "
                  f"{'; '.join(decisions(result))}", file=sys.stderr, flush=True)
    cells = {workload: {mode: cell([run for run in runs if run["workload"] == workload and run["mode"] == mode])
                        for mode in args.modes} for workload in args.workloads}
    print(f"CPU: {profiling.cpu_line()}")
    print(f"rounds: {args.rounds}; {WARMUP} warm-up, {args.steps} timed, {PROFILED} profiled steps a run; "
          f"cnn batch {args.batch}, transformer batch {args.tf1_batch}; took "
          f"{(time.perf_counter() - started) / 60:.1f} min\n")
    print("\n".join(table(args.workloads, cells)))
    print("\nverdicts:")
    for workload in args.workloads:
        for mode in args.modes:
            for line in cells[workload][mode].get("decisions", []):
                print(f"- {workload}, {mode}: `{line[:240]}`")
    if args.out:
        Path(args.out).write_text(json.dumps({"cpu": profiling.cpu_line(), "cells": cells, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
