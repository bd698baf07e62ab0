"""bfloat16 step time on the CPU: float32, our bfloat16 graph, and Grappler's oneDNN bfloat16 pass.

The models (built by ``models.py``): ResNet-50 training (tf-slim), a TF1
transformer block training, Keras ResNet-50 frozen and a 4-layer BERT-like
encoder. For each model, three sessions live in one process:
- ``float32``: the graph as built;
- ``ours``: ``amp_rewrite.rewrite(..., target="bfloat16")`` of it;
- ``grappler``: the graph Grappler's ``auto_mixed_precision_onednn_bfloat16``
  pass makes of it (run alone, as :mod:`amp_rewrite.report.grappler` does).
All three run in sessions with TensorFlow's default Grappler pipeline
(remapper fusions, constant folding, ...). After warm-up steps the three are stepped in turn,
round after round, so they share the machine's load; the table gives the
median step time of each and the speed-ups against float32. Training
graphs start from the same initial values (the initializers' seeds are in
the GraphDef), and the loss of each step is kept to show that the bfloat16
runs track float32.

Grappler's oneDNN pass does nothing on a CPU where oneDNN has no bfloat16
support (no AVX512F; TensorFlow's ``IsDataTypeSupportedByOneDNNOnThisCPU``);
the tool says so, and its "Casts added by Grappler" column is then 0.

``--stats`` also traces one step of each with ``RunMetadata`` and prints
the Cast ops executed, their total time, and the ops taking the most time.

Usage: python tools/benchmarks/bench_bfloat16_steps.py [--rounds 7] [--warmup 3] [--models NAME,...] [--stats]
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import models  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from amp_rewrite import Config, rewrite  # noqa: E402
from amp_rewrite.report.grappler import grappler_rewrite  # noqa: E402

MODELS = {
    "resnet50_tf1_training (tf-slim)": lambda: models.tf1_resnet50_training(batch=2),
    "transformer_block_tf1_training": lambda: models.tf1_transformer_block_training(
        batch=8, seq=128, d_model=256, heads=4),
    "resnet50_keras_frozen": models.keras_resnet50_frozen,
    "bert_like_inference": lambda: models.bert_like_inference(layers=4, batch=8, seq=64, d_model=256),
}
VARIANTS = ("float32", "ours", "grappler")


class Runner:
    """One session on one GraphDef, stepping the model's fetches on its feeds."""

    def __init__(self, model, graph_def):
        self.graph = tf.Graph()
        with self.graph.as_default():
            tf.compat.v1.import_graph_def(graph_def, name="")
        self.targets = []
        for name in model.fetches:
            op = self.graph.get_operation_by_name(name)
            self.targets.append(op.outputs[0] if op.outputs else op)
        self.feeds = {self.graph.get_tensor_by_name(f"{k}:0"): v for k, v in model.feeds.items()}
        self.session = tf.compat.v1.Session(graph=self.graph)
        if model.kind == "training":
            self.session.run(self.graph.get_operation_by_name(models.INIT_OP_NAME))
        self.losses: list[float] = []

    def step(self, options=None, run_metadata=None) -> float:
        start = time.perf_counter()
        values = self.session.run(self.targets, feed_dict=self.feeds, options=options, run_metadata=run_metadata)
        seconds = time.perf_counter() - start
        scalars = [v for v in values if v is not None and np.ndim(v) == 0]
        if scalars:
            self.losses.append(float(scalars[-1]))
        return seconds

    def stats(self, top: int) -> str:
        options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        metadata = tf.compat.v1.RunMetadata()
        self.step(options, metadata)
        by_op: dict[str, float] = collections.defaultdict(float)
        casts = cast_us = 0
        for device in metadata.step_stats.dev_stats:
            for node in device.node_stats:
                name = node.node_name.split(":")[0]
                us = (node.op_end_rel_micros - node.op_start_rel_micros) or node.all_end_rel_micros
                op = node.timeline_label.split("(")[0].split("=")[-1].strip() or name
                kind = op.split()[-1] if op else name
                by_op[kind] += us
                if kind == "Cast":
                    casts += 1
                    cast_us += us
        worst = sorted(by_op.items(), key=lambda kv: -kv[1])[:top]
        return (f"{casts} Casts, {cast_us / 1e3:.1f} ms; top ops: "
                + ", ".join(f"{op} {us / 1e3:.1f} ms" for op, us in worst))


def measure(name: str, build, rounds: int, warmup: int, show_stats: bool) -> dict:
    model = build()
    fetches = list(model.fetches)
    ours = rewrite(model.graph_def, fetches=fetches, config=Config(target="bfloat16", device_type="CPU"))
    theirs, _ = grappler_rewrite(model.graph_def, fetches, optimizer="auto_mixed_precision_onednn_bfloat16")
    runners = {
        "float32": Runner(model, model.graph_def),
        "ours": Runner(model, ours.graph_def),
        "grappler": Runner(model, theirs),
    }
    for runner in runners.values():
        for _ in range(warmup):
            runner.step()
    times = {v: [] for v in VARIANTS}
    for _ in range(rounds):
        for variant in VARIANTS:
            times[variant].append(runners[variant].step())
    row = {"graph": name, "nodes": len(model.graph_def.node), "kind": model.kind, "casts": len(ours.casts),
           "grappler_casts": sum(1 for n in theirs.node if n.op == "Cast")
           - sum(1 for n in model.graph_def.node if n.op == "Cast")}
    for variant in VARIANTS:
        row[f"{variant}_ms"] = statistics.median(times[variant]) * 1e3
        row[f"{variant}_losses"] = runners[variant].losses
    if show_stats:
        for variant in VARIANTS:
            print(f"{name} {variant}: {runners[variant].stats(8)}", file=sys.stderr)
    for runner in runners.values():
        runner.session.close()
    return row


def markdown(rows: list[dict]) -> str:
    lines = [
        "| graph | kind | float32 (ms) | ours (ms) | Grappler oneDNN bf16 (ms) | speed-up ours / Grappler "
        "| ours vs Grappler | Casts added ours / Grappler |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        f32, ours, theirs = r["float32_ms"], r["ours_ms"], r["grappler_ms"]
        lines.append(f"| {r['graph']} | {r['kind']} | {f32:.0f} | {ours:.0f} | {theirs:.0f} "
                     f"| {f32 / ours:.2f}x / {f32 / theirs:.2f}x | {theirs / ours - 1:+.0%} "
                     f"| {r['casts']} / {r['grappler_casts']} |")
    return "\n".join(lines)


def loss_lines(rows: list[dict]) -> str:
    lines = []
    for r in rows:
        if r["kind"] != "training":
            continue
        for variant in VARIANTS:
            losses = r[f"{variant}_losses"]
            lines.append(f"{r['graph']} {variant} loss by step: " + " ".join(f"{x:.4f}" for x in losses))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--models", default=None, help="comma-separated prefixes of: " + ", ".join(MODELS))
    parser.add_argument("--stats", action="store_true", help="print Casts and the costliest ops of one traced step")
    args = parser.parse_args(argv)
    chosen = MODELS
    if args.models:
        wanted = [m.strip() for m in args.models.split(",")]
        chosen = {k: v for k, v in MODELS.items() if any(k.startswith(w) for w in wanted)}
    rows = []
    for name, build in chosen.items():
        rows.append(measure(name, build, args.rounds, args.warmup, args.stats))
        print(f"measured {name}: {markdown(rows[-1:]).splitlines()[-1]}", file=sys.stderr)
    from tensorflow.python.util import _pywrap_utils

    supported = _pywrap_utils.IsDataTypeSupportedByOneDNNOnThisCPU(tf.bfloat16.as_datatype_enum)
    print(f"oneDNN supports bfloat16 on this CPU: {supported}\n")
    print(markdown(rows))
    print()
    print(loss_lines(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
