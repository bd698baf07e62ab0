"""Step time of five workloads: float32, ``ENABLE_AUTO_MP=1`` with its step decision, the op lists alone, the peer.

Under ``ENABLE_AUTO_MP=1`` on a CPU with fast bfloat16 kernels, each
rewritten ``tf.function`` runs its first eager calls alternately in its
bfloat16 and its float32 body, times them, and keeps the faster (bfloat16
only where it is clearly faster); one INFO line says which
(``amp-rewrite: tf.function NAME runs in bfloat16: ...`` or ``... stays
float32: ...``). This tool measures what that decision gives against the
op lists alone and against each workload's peer.

The workloads:

- ``cnn``, ``gpt``, ``resnet50``: Keras 3 ``fit`` of the models of
  ``tools/benchmarks/bench_keras_policy.py`` (a 3-conv CNN on 32x32x3
  images, batch 64, Adam; a 2-block causal transformer, width 256, 128
  tokens, batch 16, AdamW; ResNet-50 on 64x64x3 images, batch 16, AdamW),
  run by that tool's worker: ``DECISION_WARMUP`` untimed steps (tracing,
  the rewrite, and the decision's trial calls; as many in every mode, so
  every mode trains on the same data), the timed steps, then 2 steps under
  the TensorFlow profiler;
- ``bert``: a frozen BERT-small-like encoder (4 layers, width 256, 4
  heads, feed-forward 1024, 64 tokens, batch 8), inference through a TF1
  ``Session``;
- ``transformer``: one post-norm transformer block (width 256, 4 heads,
  128 tokens, batch 8) trained with Adam through a TF1 ``Session``;
- ``lstm``: a TF1 ``dynamic_rnn`` LSTM (256 units, 24 time steps, batch 64;
  a v1 while loop, its gradient popping the gates from stacks) trained with
  Adam through a TF1 ``Session``: its gates are Sigmoids read by their
  gradients inside a loop, where Casts would run every iteration.

The TF1 graphs are ``tools/benchmarks/models.py``'s, at the sizes
``tools/benchmarks/bench_bfloat16_steps.py`` uses; ``TF1_WARMUP`` untimed
``Session.run`` calls, the timed ones, then 2 under the profiler.

The modes, each run in its own process:

- ``float32``: no amp-rewrite variable;
- ``auto``: ``ENABLE_AUTO_MP=1`` alone, the default: the step decision on;
- ``lists``: ``ENABLE_AUTO_MP=1 AMP_REWRITE_TUNE=0``: the op lists alone,
  no decision;
- ``peer``: for Keras, its ``mixed_bfloat16`` global policy set before the
  model is built; for the TF1 graphs, Grappler's
  ``auto_mixed_precision_onednn_bfloat16`` pass run on the graph (as
  ``tools/benchmarks/bench_bfloat16_steps.py`` does) and the result run in
  the session. Neither sets an amp-rewrite variable.

Under ``auto`` and ``lists`` the TF1 scripts run unmodified: amp-rewrite's
runtime rewrites the graph their ``Session.run`` runs, and under ``auto``
each session step is tried like a ``tf.function`` (``amp-rewrite: session
step (fetches ...) runs in bfloat16: ...``); ``TF1_WARMUP`` covers its trial.

``--modes`` runs a subset of the modes. With ``--before PYTHON``, ``auto``
and ``lists`` each get a twin, ``auto (before)`` and ``lists (before)``, the
same run under another interpreter, one whose installed amp-rewrite is
another version (today's release, say), with its own tuning cache: the rows
to compare a change's step time with. The twins take their turns in the
rotated order like any mode.

The decision column gives what each run's stderr said (once, where every
round said the same; else round by round): ``bfloat16`` or ``float32`` with
the two step times the line gives, or "lists only" for an
``ENABLE_AUTO_MP=1`` Keras run that logged no decision (the op lists alone
decided). amp-rewrite's whole lines follow the table.

The tuning cache (``AMP_REWRITE_TUNE_CACHE``) is a directory made fresh
for each run of this tool and shared by all its processes: the first
round's ``auto`` runs measure and decide, later rounds read their verdicts
from the cache (so their decisions cost no trial calls).

Every round runs each workload in every mode, the mode order rotated each
round, so a busy machine slows the modes alike; a cell is the best of the
rounds (the lowest wall time, and separately the lowest profiler op time:
the durations of the op events per step, summed over the threads that ran
them, so they can exceed the wall time).

A full run takes about half an hour on 2 cores, more than half of it
ResNet-50; ``--quick`` (1 round, 1 timed step per ``fit``, small TF1
graphs) about 10 minutes.

Usage: ``python tools/benchmarks/bench_step_decision.py [--workloads cnn gpt resnet50 bert transformer lstm]
[--modes float32 auto lists peer] [--before /path/to/old/python] [--rounds 3] [--steps N] [--quick]
[--out results.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_keras_policy as keras_runs  # noqa: E402
import profiling  # noqa: E402

KERAS = ("cnn", "gpt", "resnet50")
WORKLOADS = {
    "cnn": "Keras CNN fit (3 convs, 32x32, batch 64)",
    "gpt": "Keras mini-GPT fit (2 blocks, width 256, 128 tokens, batch 16)",
    "resnet50": "Keras ResNet-50 fit (64x64, batch 16, AdamW)",
    "bert": "BERT-small-like inference, TF1 session (4 layers, width 256, 64 tokens, batch 8)",
    "transformer": "transformer block training step, TF1 session (width 256, 128 tokens, batch 8)",
    "lstm": "dynamic_rnn LSTM training step, TF1 session (256 units, 24 time steps, batch 64, Adam)",
}
MODES = {
    "float32": {},
    "auto": {"ENABLE_AUTO_MP": "1"},
    "lists": {"ENABLE_AUTO_MP": "1", "AMP_REWRITE_TUNE": "0"},
    "peer": {},
}
MODE_LABELS = {"float32": "float32", "auto": "`ENABLE_AUTO_MP=1`",
               "lists": "`ENABLE_AUTO_MP=1 AMP_REWRITE_TUNE=0`"}
QUICK_WORKLOADS = {
    "bert": "BERT-like inference, TF1 session (2 layers, width 128, 32 tokens, batch 2)",
    "transformer": "transformer block training step, TF1 session (width 64, 16 tokens, batch 2)",
    "lstm": "dynamic_rnn LSTM training step, TF1 session (64 units, 12 time steps, batch 8, Adam)",
}
BEFORE = " (before)"
TWINNED = ("auto", "lists")  # the modes --before runs under the other interpreter too
PEER_LABELS = {"keras": "Keras `mixed_bfloat16` policy", "tf1": "Grappler oneDNN bfloat16"}
KERAS_POLICY = "mixed_bfloat16"
GRAPPLER_PASS = "auto_mixed_precision_onednn_bfloat16"
# the calls the step decision takes at most: the pure trial, one profiled call of each body, and the
# trial confirming a mixed body
DECISION_CALLS = 10 + 2 + 5
DECISION_WARMUP = DECISION_CALLS + 2
TF1_WARMUP, PROFILED, TIMEOUT_S = 10 + 2, 2, 3600  # a session step's trial is ten runs
STEPS = {"keras": 3, "tf1": 10}
QUICK_STEPS = {"keras": 1, "tf1": 3}
DECISION = re.compile(r"(?:tf\.function|session step) (?P<name>\S+|\([^)]*\)) "
                      r"(?P<verdict>runs in b?float16|stays float32|runs \d+ of \d+ half regions in b?float16):"
                      r"\s*(?P<why>.*)")
STEP_TIMES = re.compile(r"ran (?P<half>[\d.]+) ms in b?float16 and (?P<full>[\d.]+) ms in float32")
MIXED_TIMES = re.compile(r"ran (?P<mixed>[\d.]+) ms with (?P<regions>\d+ of \d+) half regions in b?float16 and "
                         r"(?P<pure>[\d.]+) ms in (?P<pure_kind>\S+) .*alone it ran (?P<other>[\d.]+) ms")


def kind(workload: str) -> str:
    return "keras" if workload in KERAS else "tf1"


# --- the TF1 session worker (run in the child process) ---------------------------------------------


def tf1_graph(workload: str, quick: bool):
    """The workload's ModelGraph: bench_bfloat16_steps.py's sizes, or models.py's small defaults for --quick."""
    import bench_bfloat16_steps as sessions
    import models

    if workload == "lstm":
        return models.tf1_lstm_training() if quick else models.tf1_lstm_training(steps=24, batch=64, units=256)
    if quick:
        return models.bert_like_inference() if workload == "bert" else models.tf1_transformer_block_training()
    name = "bert_like_inference" if workload == "bert" else "transformer_block_tf1_training"
    return sessions.MODELS[name]()


def tf1_worker(workload: str, mode: str, steps: int, quick: bool, out: str) -> None:
    """Steps one TF1 graph in a session: TF1_WARMUP untimed, ``steps`` timed, PROFILED profiled; writes the result."""
    import bench_bfloat16_steps as sessions
    import tensorflow as tf
    from tensorflow.python.util import _pywrap_utils

    from amp_rewrite.report.grappler import grappler_rewrite

    model = tf1_graph(workload, quick)
    graph_def = model.graph_def
    if mode == "peer":
        graph_def, _ = grappler_rewrite(model.graph_def, list(model.fetches), optimizer=GRAPPLER_PASS)
    runner = sessions.Runner(model, graph_def)
    warmup = [1e3 * runner.step() for _ in range(TF1_WARMUP)]
    walls, cpus = [], []
    for _ in range(steps):
        cpu = time.process_time()
        walls.append(runner.step())
        cpus.append(time.process_time() - cpu)
    types = profiling.profile_calls(runner.step, PROFILED)
    runner.session.close()
    Path(out).write_text(json.dumps({
        "wall_ms": 1e3 * statistics.median(walls), "cpu_ms": 1e3 * statistics.median(cpus),
        "op_ms": sum(row["ms"] for row in types.values()), "op_types": types, "warmup_ms": warmup,
        "loss": runner.losses,
        "onednn_bfloat16": bool(_pywrap_utils.IsDataTypeSupportedByOneDNNOnThisCPU(tf.bfloat16.as_datatype_enum)),
    }))


# --- the driver ------------------------------------------------------------------------------------


def base_mode(mode: str) -> str:
    """The mode a twin of ``--before`` repeats (``auto`` for ``auto (before)``)."""
    return mode.removesuffix(BEFORE)


def run_one(workload: str, mode: str, steps: int, quick: bool, cache_dir: str, before: str | None = None) -> dict:
    """One workload in one mode in a fresh process: the worker's result, or ``{"failed": why}``.

    A ``(before)`` twin runs under the interpreter ``before``, with a tuning cache of its own.
    """
    twin = mode.endswith(BEFORE)
    mode = base_mode(mode)
    env = {**MODES[mode], "AMP_REWRITE_TUNE_CACHE": cache_dir + ("-before" if twin else "")}
    if kind(workload) == "keras":
        policy = ["--policy", KERAS_POLICY] if mode == "peer" else []
        command = [keras_runs.__file__, "--worker", workload, "--steps", str(steps),
                   "--warmup", str(DECISION_WARMUP), *policy]
    else:
        command = [__file__, "--worker", workload, "--mode", mode, "--steps", str(steps), *(["--quick"] * quick)]
    result = profiling.run_worker(command, env, timeout_s=TIMEOUT_S, python=before if twin else None)
    result["decision"] = decision(workload, mode, result.get("amp_rewrite", []))
    return result


def run_all(workloads: list[str], modes: list[str], rounds: int, steps: dict, quick: bool,
            before: str | None = None) -> list[dict]:
    """Every (workload, mode) once a round, in a mode order rotated each round; one record per run."""
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench_step_decision_cache_") as cache_dir:
        for round_number, workload, mode in keras_runs.interleaved(workloads, modes, rounds):
            result = run_one(workload, mode, steps[kind(workload)], quick, cache_dir, before)
            runs.append({"workload": workload, "mode": mode, "round": round_number, **result})
            print(f"round {round_number}/{rounds} {workload} {mode}: {progress(result)}", file=sys.stderr,
                  flush=True)
    return runs


def progress(result: dict) -> str:
    if "failed" in result:
        return f"FAILED: {result['failed']}"
    return (f"{result['wall_ms']:.1f} ms/step wall, {keras_runs.fmt(result['op_ms'])} ms/step ops, "
            f"decision: {result['decision']}, process {result['process_s']:.0f} s")


# --- the decision, from amp-rewrite's lines --------------------------------------------------------


def decision_lines(lines: list[str]) -> list[re.Match]:
    """The step decisions among amp-rewrite's stderr lines, in order."""
    return [match for match in map(DECISION.search, lines) if match]


def decision(workload: str, mode: str, lines: list[str]) -> str:
    """A run's decision in short: each verdict with its step times, "lists only", or "—" where none applies."""
    found = decision_lines(lines)
    if found:
        named = len({match["name"] for match in found}) > 1
        return "; ".join((f"{match['name']}: " if named else "") + short(match) for match in found)
    if MODES[mode].get("ENABLE_AUTO_MP") and kind(workload) == "keras":
        return "lists only"
    return "—"


def short(match: re.Match) -> str:
    mixed = MIXED_TIMES.search(match["why"])
    if mixed:
        return (f"mixed, {mixed['regions']} regions half ({mixed['mixed']} ms vs {mixed['pure']} in "
                f"{mixed['pure_kind']}, {mixed['other']} in the other)")
    verdict = "float32" if match["verdict"] == "stays float32" else match["verdict"].split()[-1]
    times = STEP_TIMES.search(match["why"])
    if times:
        return f"{verdict} ({times['half']} vs {times['full']} ms)"
    return f"{verdict} ({match['why'][:60]})" if match["why"] else verdict


# --- the cells and the report ----------------------------------------------------------------------


def cell(runs: list[dict], loss_step: int) -> dict:
    """The best of a (workload, mode)'s runs: lowest wall time, lowest op time; every run's decision.

    The loss is the fastest run's after ``loss_step`` steps (the last timed
    one); for a Keras fit, the running mean over the epoch that ``fit`` reports.
    """
    good = [r for r in runs if "failed" not in r]
    decisions = [r.get("decision", "?") if "failed" not in r else "failed" for r in runs]
    if not good:
        return {"failed": runs[-1]["failed"] if runs else "not run", "decisions": decisions}
    fastest = min(good, key=lambda r: r["wall_ms"])
    profiled = [r for r in good if r.get("op_ms") is not None]
    losses = fastest.get("step_losses") or fastest.get("loss") or []
    return {"wall_ms": fastest["wall_ms"], "op_ms": min(r["op_ms"] for r in profiled) if profiled else None,
            "loss": losses[loss_step - 1] if len(losses) >= loss_step else None, "loss_step": loss_step,
            "decisions": decisions,
            "lines": list(dict.fromkeys(line for r in good for line in r.get("amp_rewrite", [])))}


def by_round(decisions: list[str]) -> str:
    """The decisions of a cell's runs: one, if every round took it; else each round's."""
    if len(set(decisions)) == 1:
        return decisions[0] + (" (every round)" if len(decisions) > 1 and decisions[0] != "—" else "")
    return "; ".join(f"r{index}: {text}" for index, text in enumerate(decisions, 1))


def ratio(value, base) -> str:
    return "-" if value is None or not base else f"{value / base:.2f}"


def table(workloads: list[str], modes: list[str], cells: dict) -> list[str]:
    out = ["| workload | mode | wall ms/step | op ms/step | wall ÷ float32 | op ÷ float32 | loss (at step) "
           "| decision |", "|---|---|---:|---:|---:|---:|---:|---|"]
    for workload in workloads:
        base = cells[workload].get("float32", {})
        for mode in modes:
            c = cells[workload][mode]
            label = (PEER_LABELS[kind(workload)] if mode == "peer" else MODE_LABELS[base_mode(mode)]
                     + mode[len(base_mode(mode)):])
            if "failed" in c:
                out.append(f"| {workload} | {label} | failed: {c['failed'][:100]} ||||| {by_round(c['decisions'])} |")
                continue
            loss = "-" if c["loss"] is None else f"{c['loss']:.4f} ({c['loss_step']})"
            out.append(f"| {workload} | {label} | {keras_runs.fmt(c['wall_ms'])} | {keras_runs.fmt(c['op_ms'])} "
                       f"| {ratio(c['wall_ms'], base.get('wall_ms'))} | {ratio(c['op_ms'], base.get('op_ms'))} "
                       f"| {loss} | {by_round(c['decisions'])} |")
    return out


def line_list(workloads: list[str], modes: list[str], cells: dict) -> list[str]:
    """amp-rewrite's lines of each (workload, mode), each once."""
    out = [f"- {workload} {mode}: `{line[:300]}`" for workload in workloads for mode in modes
           for line in cells[workload][mode].get("lines", [])]
    return ["\namp-rewrite's lines on stderr (every round's, each once):\n", *out] if out else []


def versions() -> str:
    found = []
    for name in ("tensorflow", "tensorflow-cpu", "keras"):
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pass
    return ", ".join(found)


def header(args, steps: dict, runs: list[dict], elapsed: float, loads: tuple) -> list[str]:
    onednn = {r["onednn_bfloat16"] for r in runs if "onednn_bfloat16" in r}
    return [f"CPU: {profiling.cpu_line()}", f"versions: {versions()}"
            + (f"; oneDNN bfloat16 on this CPU: {onednn.pop()}" if len(onednn) == 1 else ""),
            "load average (1, 5, 15 min) at the start and the end: "
            + "; ".join(", ".join(f"{x:.2f}" for x in load) for load in loads)
            + (f"; (before) rows: {args.before}" if args.before else ""),
            f"rounds: {args.rounds}{' (--quick: small TF1 graphs)' if args.quick else ''}; "
            f"Keras fits: {DECISION_WARMUP} warm-up, {steps['keras']} timed, {keras_runs.PROFILED} profiled steps; "
            f"TF1 sessions: {TF1_WARMUP} warm-up, {steps['tf1']} timed, {PROFILED} profiled runs; "
            f"a new tuning cache for this run; took {elapsed / 60:.1f} min", "",
            *(f"- {w}: {(args.quick and QUICK_WORKLOADS.get(w)) or WORKLOADS[w]}" for w in args.workloads), ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--before", help="an interpreter whose amp-rewrite is another version: twins of "
                                         f"{' and '.join(TWINNED)} run under it")
    parser.add_argument("--rounds", type=int, help="rounds, the best of which a cell shows (default 3; 1 with --quick)")
    parser.add_argument("--steps", type=int, help=(
        f"timed steps per run (default {STEPS['keras']} for a Keras fit, {STEPS['tf1']} for a TF1 session; "
        f"{QUICK_STEPS['keras']} and {QUICK_STEPS['tf1']} with --quick)"))
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 round, fewer steps, small TF1 graphs")
    parser.add_argument("--out", help="write every run and the cells to this JSON file")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.rounds = args.rounds or (1 if args.quick else 3)
    steps = {k: args.steps or (QUICK_STEPS if args.quick else STEPS)[k] for k in STEPS}
    if min(args.rounds, *steps.values()) < 1:
        parser.error("--steps and --rounds must be at least 1")
    if args.worker:
        tf1_worker(args.worker, args.mode, args.steps, args.quick, args.out)
        return
    modes = [twin for mode in args.modes
             for twin in (mode, *([mode + BEFORE] if args.before and mode in TWINNED else []))]
    started, load = time.perf_counter(), os.getloadavg()
    runs = run_all(args.workloads, modes, args.rounds, steps, args.quick, args.before)
    loss_steps = {"keras": DECISION_WARMUP + steps["keras"], "tf1": TF1_WARMUP + steps["tf1"]}
    cells = {w: {m: cell([r for r in runs if r["workload"] == w and r["mode"] == m], loss_steps[kind(w)])
                 for m in modes} for w in args.workloads}
    elapsed = time.perf_counter() - started
    print("\n".join(header(args, steps, runs, elapsed, (load, os.getloadavg())) + table(args.workloads, modes, cells)
                    + line_list(args.workloads, modes, cells)))
    if args.out:
        Path(args.out).write_text(json.dumps({
            "cpu": {"model": profiling.cpu_model(), "flags": profiling.cpu_flags()}, "versions": versions(),
            "rounds": args.rounds, "steps": steps, "quick": args.quick, "elapsed_s": elapsed,
            "cells": cells, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
