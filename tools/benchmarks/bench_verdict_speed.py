"""Step time after the step decision: a float32 verdict against float32, a half verdict against the op lists.

Under ``ENABLE_AUTO_MP=1`` each step's first calls alternate its half and
float32 variants, and the faster stays. What stays must then run as fast
as what it was timed as: a float32 verdict as fast as the script without
amp-rewrite, a half verdict as fast as the op lists' rewrite alone
(``AMP_REWRITE_TUNE=0``). This tool measures both, on two workloads:

- ``cnn``: Keras 3's train function (what ``fit`` calls each step) of
  ``tools/benchmarks/bench_keras_policy.py``'s CNN (3 convs on 32x32x3
  images, Adam), batch ``--batch`` (default 64);
- ``transformer``: ``tools/benchmarks/models.py``'s post-norm transformer
  block (width 256, 4 heads, 128 tokens, Adam) trained through a TF1
  ``Session``, batch ``--tf1-batch`` (default 4).

Each comparison runs in one process, which steps three copies of the
workload by turns (the order rotated every step), so that another job's
load falls on all three alike (a machine shared with other jobs varies far
more from one process to the next than within one):

- the **reference**: for a float32 verdict, the workload built and traced
  before the runtime is enabled (plain float32, and a plain
  ``Session.run``); for a half verdict, the op lists' rewrite (the
  runtime's, with its trials off for this copy);
- the **verdict**: the runtime on, a fresh tuning cache, the trial's
  verdict forced (a timer that runs each call and reports the loser's time
  ten times over; no mixed body), measured after its trial;
- the **cached verdict**: the same workload built again, which reads the
  verdict from the cache before its first step (the path of every later run
  of a script).

The comparisons (``--modes``): ``float32`` (bfloat16 rewritten, float32
kept), ``half`` (bfloat16 kept) and ``float16`` (the target float16, so the
loss is scaled, float32 kept: its float32 step must leave the scaling out).

Each copy takes 15 untimed steps after its trial, then ``--steps`` timed
ones; a run reports each copy's fastest and median step, and whether the
copy ran the same ops as the reference, op type by op type, in one more
step each under TensorFlow's profiler (TF1: its step stats), with the op
time of that step. A cell is the best of ``--rounds`` runs (the lowest
fastest step, the lowest median), with the ratio reference ÷ copy of
those (1.00: as fast), and the median over the runs of each run's own
ratio: the steadiest figure on a shared machine, since the copies of one
run shared its load. Each run notes the machine's load average when it
started.

Usage: ``flock /work/bench.lock python tools/benchmarks/bench_verdict_speed.py [--workloads cnn transformer]
[--modes float32 half float16] [--rounds 5] [--steps 40] [--out results.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_keras_policy as keras_runs  # noqa: E402
import profiling  # noqa: E402

WORKLOADS = ("cnn", "transformer")
#: comparison → (the target, the verdict forced, the reference)
MODES = {"float32": ("bfloat16", "float32", "float32"), "half": ("bfloat16", "half", "lists"),
         "float16": ("float16", "float32", "float32")}
COPIES = ("reference", "verdict", "cached")
WARMUP, TIMEOUT_S = 15, 3600


# --- the worker (run in the child process) ---------------------------------------------------------


def enable(target: str, verdict: str, cache_dir: str):
    """The runtime, enabled with step trials that decide ``verdict`` on their real calls, with no mixed body."""
    from amp_rewrite import runtime
    from amp_rewrite.runtime.settings import RuntimeSettings
    from amp_rewrite.runtime.tf1.session import session_trial

    runtime.enable(settings=RuntimeSettings(target=target, is_timing_steps=True, tune_cache_dir=cache_dir))
    active = runtime.current_runtime()
    loser = "float32" if verdict == "half" else "half"

    def timer(body, call):
        began = time.perf_counter()
        outputs = call()
        return outputs, (time.perf_counter() - began) * (10.0 if body == loser else 1.0)

    active.tracing.trials.timer = timer
    active.tracing.trials.profiler = None
    session_trial.trials_of(active).timer = timer
    return active


class KerasCopy:
    """One copy of the CNN: its train function and an endless iterator of its batches."""

    def __init__(self, batch: int, *, untried=None):
        import keras
        import tensorflow as tf

        keras.utils.set_random_seed(0)
        self.model, _, _ = keras_runs.cnn(1)
        x, y = keras_runs.images(batch * 8, 32)
        self.data = iter(tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).repeat())
        self.model.make_train_function()
        if untried is not None:
            with untried():
                self.step()  # traced, and rewritten, with no trial
        for _ in range(12):  # the trial's ten calls, and the first-call guard's
            self.step()

    def step(self) -> float:
        began = time.perf_counter()
        logs = self.model.train_function(self.data)
        for value in logs.values() if isinstance(logs, dict) else ():
            value.numpy()
        return time.perf_counter() - began

    def ops(self) -> tuple[Counter, float]:
        """The op types one step ran, counted, and its op milliseconds, from TensorFlow's profiler."""
        import tensorflow as tf

        from amp_rewrite.runtime.profile import op_events

        with tempfile.TemporaryDirectory() as logdir:
            tf.profiler.experimental.start(logdir)
            try:
                self.step()
            finally:
                tf.profiler.experimental.stop()
            found, picos = Counter(), 0
            for _, op, duration in op_events(Path(logdir).rglob("*.xplane.pb")):
                found[op] += 1
                picos += duration
        return found, picos / 1e9


class SessionCopy:
    """One copy of the TF1 transformer: its own graph and session (patched, or a plain ``Session.run``)."""

    def __init__(self, model, *, is_plain: bool = False, untried: bool = False):
        import tensorflow as tf

        from amp_rewrite import tf_internals

        tf1 = tf.compat.v1
        self.graph = tf.Graph()
        with self.graph.as_default():
            tf1.import_graph_def(model.graph_def, name="")
        fetched = [self.graph.get_operation_by_name(name) for name in model.fetches]
        self.fetches = [op.outputs[0] if op.outputs else op for op in fetched]
        self.feeds = {self.graph.get_tensor_by_name(f"{name}:0"): value for name, value in model.feeds.items()}
        self.session = tf1.Session(graph=self.graph)
        self.run = (lambda *args, **kwargs: tf_internals.run_unpatched(self.session, *args, **kwargs)) \
            if is_plain else self.session.run
        self.run(self.graph.get_operation_by_name("init"))
        if untried:
            from amp_rewrite import runtime

            runtime.current_runtime().objects.runners.get(self.session).keeper.step_trials = None
        for _ in range(12):
            self.step()

    def step(self) -> float:
        began = time.perf_counter()
        self.run(self.fetches, self.feeds)
        return time.perf_counter() - began

    def ops(self) -> tuple[Counter, float]:
        import tensorflow as tf

        tf1 = tf.compat.v1
        metadata = tf1.RunMetadata()
        self.run(self.fetches, self.feeds, options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE),
                 run_metadata=metadata)
        found, micros = Counter(), 0
        for device in metadata.step_stats.dev_stats:
            for node in device.node_stats:
                if " = " in node.timeline_label:
                    found[node.timeline_label.split(" = ")[1].split("(")[0]] += 1
                    micros += node.op_end_rel_micros - node.op_start_rel_micros
        return found, micros / 1e3


def copies(workload: str, mode: str, batch: int, cache_dir: str) -> dict:
    """The reference, the verdict and the cached verdict of ``workload`` under ``mode``, each after its trial."""
    import contextlib
    import dataclasses

    import models

    target, verdict, reference = MODES[mode]
    if workload == "cnn":
        plain = KerasCopy(batch) if reference == "float32" else None
        active = enable(target, verdict, cache_dir)

        @contextlib.contextmanager
        def untried():
            hook = active.tracing
            trials, tools = hook.trials, hook.tools
            hook.trials, hook.tools = None, dataclasses.replace(tools, trials=None)
            try:
                yield
            finally:
                hook.trials, hook.tools = trials, tools

        ref = plain if plain is not None else KerasCopy(batch, untried=untried)
        return {"reference": ref, "verdict": KerasCopy(batch), "cached": KerasCopy(batch)}
    plain_model = models.tf1_transformer_block_training(batch=batch, seq=128, d_model=256, heads=4)
    enable(target, verdict, cache_dir)
    model = models.tf1_transformer_block_training(batch=batch, seq=128, d_model=256, heads=4)  # scaled: float16
    ref = SessionCopy(plain_model, is_plain=True) if reference == "float32" else SessionCopy(model, untried=True)
    return {"reference": ref, "verdict": SessionCopy(model), "cached": SessionCopy(model)}


def worker(workload: str, mode: str, steps: int, batch: int, out: str) -> None:
    with tempfile.TemporaryDirectory(prefix="bench_verdict_cache_") as cache_dir:
        runs = copies(workload, mode, batch, cache_dir)
        times: dict[str, list[float]] = {name: [] for name in COPIES}
        for index in range(WARMUP + steps):
            for name in COPIES[index % 3:] + COPIES[:index % 3]:
                seconds = runs[name].step()
                if index >= WARMUP:
                    times[name].append(seconds)
        ops = {name: runs[name].ops() for name in COPIES}
    result: dict = {name: {"best_ms": 1e3 * min(times[name]), "median_ms": 1e3 * statistics.median(times[name]),
                           "op_ms": ops[name][1], "ops": dict(ops[name][0])} for name in COPIES}
    result["decisions"] = [f"{name} {'runs in half' if is_half else 'stays float32'}: {why}"
                           for name, is_half, why in decisions()]
    Path(out).write_text(json.dumps(result))


def decisions() -> list[tuple[str, bool, str]]:
    """What this process's step trials decided (the forced ones, and those read from the cache)."""
    from amp_rewrite import runtime
    from amp_rewrite.runtime.tf2 import tracing

    return [*tracing.step_decisions(), *runtime.session_step_decisions()]


# --- the driver ------------------------------------------------------------------------------------


def run_one(workload: str, mode: str, args) -> dict:
    batch = args.batch if workload == "cnn" else args.tf1_batch
    load = os.getloadavg()[0]
    result = profiling.run_worker([__file__, "--worker", workload, "--mode", mode, "--steps", str(args.steps),
                                   "--batch", str(batch)], {}, timeout_s=TIMEOUT_S)
    result["load"] = load
    return result


def differences(ops: dict, reference: dict) -> str:
    """``same ops``, or the op types one ran more (+) or less (-) often than the reference, counted."""
    mine, theirs = Counter(ops), Counter(reference)
    more, less = mine - theirs, theirs - mine
    if not more and not less:
        return "same ops"
    return ", ".join([f"+{n} {op}" for op, n in sorted(more.items())]
                     + [f"-{n} {op}" for op, n in sorted(less.items())])


def cell(runs: list[dict]) -> dict:
    good = [run for run in runs if "failed" not in run]
    if not good:
        return {"failed": runs[-1].get("failed", "not run") if runs else "not run"}
    out = {"loads": [round(run["load"], 1) for run in good],
           "verdicts": sorted({line for run in good for line in run.get("decisions", [])})}
    for name in COPIES:
        out[name] = {"best_ms": min(run[name]["best_ms"] for run in good),
                     "median_ms": min(run[name]["median_ms"] for run in good),
                     "op_ms": min(run[name]["op_ms"] for run in good),
                     "per_run": [(round(run[name]["best_ms"], 2), round(run[name]["median_ms"], 2)) for run in good],
                     # each run's ratio is of copies that shared its load: their median is the steadiest figure
                     "ratios": [statistics.median(run["reference"][key] / run[name][key] for run in good)
                                for key in ("best_ms", "median_ms")],
                     "ops": differences(good[-1][name]["ops"], good[-1]["reference"]["ops"])}
    return out


def table(workloads: list[str], modes: list[str], cells: dict) -> list[str]:
    out = ["| workload | verdict | copy | fastest step ms | median step ms | reference ÷ copy: best of runs "
           "(fastest, median) | the runs' median ratio (fastest, median) | op ms | ops against the reference "
           "| each run (fastest/median) |", "|---|---|---|---:|---:|---|---|---:|---|---|"]
    for workload in workloads:
        for mode in modes:
            c = cells[workload][mode]
            if "failed" in c:
                out.append(f"| {workload} | {mode} | failed: {c['failed'][:120]} ||||||")
                continue
            ref = c["reference"]
            for name in COPIES:
                row = c[name]
                label = f"reference ({MODES[mode][2]})" if name == "reference" else name
                ratio = "" if name == "reference" else (f"{ref['best_ms'] / row['best_ms']:.3f}, "
                                                        f"{ref['median_ms'] / row['median_ms']:.3f}")
                ratios = "" if name == "reference" else ", ".join(f"{value:.3f}" for value in row["ratios"])
                out.append(f"| {workload} | {mode} | {label} | {row['best_ms']:.2f} | {row['median_ms']:.2f} | {ratio} "
                           f"| {ratios} | {row['op_ms']:.1f} | {'' if name == 'reference' else row['ops']} "
                           f"| {' '.join(f'{b}/{m}' for b, m in row['per_run'])} |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40, help="timed steps of each copy per run (default 40)")
    parser.add_argument("--batch", type=int, default=64, help="the CNN's batch (default 64)")
    parser.add_argument("--tf1-batch", type=int, default=4, help="the transformer's batch (default 4)")
    parser.add_argument("--out", help="write every run and the cells to this JSON file")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.mode, args.steps, args.batch, args.out)
        return
    started = time.perf_counter()
    runs = []
    for round_number, workload, mode in keras_runs.interleaved(args.workloads, args.modes, args.rounds):
        result = run_one(workload, mode, args)
        runs.append({"workload": workload, "mode": mode, "round": round_number, **result})
        shown = result.get("failed") or ", ".join(
            f"{name} {result[name]['best_ms']:.2f}/{result[name]['median_ms']:.2f} ms" for name in COPIES)
        print(f"round {round_number}/{args.rounds} {workload} {mode} (load {result['load']:.1f}): {shown}",
              file=sys.stderr, flush=True)
    cells = {workload: {mode: cell([run for run in runs if run["workload"] == workload and run["mode"] == mode])
                        for mode in args.modes} for workload in args.workloads}
    print(f"CPU: {profiling.cpu_line()}")
    print(f"rounds: {args.rounds}; per run, each copy: {WARMUP} untimed steps after its trial, {args.steps} timed; "
          f"cnn batch {args.batch}, transformer batch {args.tf1_batch}; took "
          f"{(time.perf_counter() - started) / 60:.1f} min; load averages at each run's start: "
          + "; ".join(f"{w} {m}: {cells[w][m].get('loads')}" for w in args.workloads for m in args.modes) + "\n")
    print("\n".join(table(args.workloads, args.modes, cells)))
    print("\nverdicts:")
    for workload in args.workloads:
        for mode in args.modes:
            for line in cells[workload][mode].get("verdicts", []):
                print(f"- {workload}, {mode}: `{line[:240]}`")
    if args.out:
        Path(args.out).write_text(json.dumps({"cpu": profiling.cpu_line(), "cells": cells, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
