"""The rewrite against TensorFlow's Grappler pass: time, nodes converted, Casts and half FLOPs, on five model graphs.

The graphs (built by ``models.py``): ResNet-50 training (tf-slim), Keras
ResNet-50 and MobileNetV2 frozen, a TF1 transformer block training, and a
TF1 CNN training. For each graph it runs both passes in this process
(Grappler as ``auto_mixed_precision_cpu`` with real fp16, the same device
type as ours) and prints a Markdown table: nodes, wall and CPU time (median
of N runs, the two passes alternating), converted nodes, Casts added, and
the share of MatMul/Conv FLOPs in half.

"Converted" is counted the same way for both outputs: original nodes whose
type attrs differ afterwards. Ours includes Consts stored in half, which
Grappler leaves to a later constant-folding pass as ``Cast(Const)``.

Usage: python tools/benchmarks/bench_rewrite.py [--runs 3] [--models NAME,...] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import models  # noqa: E402

from amp_rewrite import Config, rewrite  # noqa: E402
from amp_rewrite.graph.flops import half_flop_share  # noqa: E402
from amp_rewrite.report.grappler import grappler_rewrite  # noqa: E402

BENCHMARK_MODELS = {
    "resnet50_tf1_training (tf-slim)": models.tf1_resnet50_training,
    "resnet50_keras_frozen": models.keras_resnet50_frozen,
    "mobilenetv2_keras_frozen": models.keras_mobilenetv2_frozen,
    "transformer_block_tf1_training": models.tf1_transformer_block_training,
    "cnn_tf1_training": models.tf1_cnn_training,
}


def type_signature(node) -> tuple:
    return tuple(sorted((k, v.type, tuple(v.list.type)) for k, v in node.attr.items()
                        if v.type or len(v.list.type)))


def converted_nodes(original, rewritten) -> int:
    """Original nodes whose type attrs (or op, for FusedBatchNorm V1 → V2) changed."""
    before = {n.name: (n.op, type_signature(n)) for n in original.node}
    return sum(1 for n in rewritten.node if n.name in before and before[n.name] != (n.op, type_signature(n)))


def new_casts(original, rewritten) -> int:
    names = {n.name for n in original.node}
    return sum(1 for n in rewritten.node if n.op == "Cast" and n.name not in names)


def measure(name: str, build, runs: int) -> dict:
    model = build()
    graph_def, fetches = model.graph_def, list(model.fetches)
    config = Config(device_type="CPU")
    rewrite(graph_def, fetches=fetches, config=config)  # warm caches, as Grappler's are after one call
    grappler_rewrite(graph_def, fetches)
    ours_times, theirs_times, ours_cpu, theirs_cpu = [], [], [], []
    for _ in range(runs):
        start, cpu = time.perf_counter(), time.process_time()
        ours = rewrite(graph_def, fetches=fetches, config=config)
        ours_times.append(time.perf_counter() - start)
        ours_cpu.append(time.process_time() - cpu)
        cpu = time.process_time()
        theirs, seconds = grappler_rewrite(graph_def, fetches)
        theirs_cpu.append(time.process_time() - cpu)
        theirs_times.append(seconds)
    return {
        "graph": name,
        "nodes": len(graph_def.node),
        "ours_seconds": statistics.median(ours_times),
        "grappler_seconds": statistics.median(theirs_times),
        "ours_cpu_seconds": statistics.median(ours_cpu),
        "grappler_cpu_seconds": statistics.median(theirs_cpu),
        "ours_converted": converted_nodes(graph_def, ours.graph_def),
        "grappler_converted": converted_nodes(graph_def, theirs),
        "ours_casts": new_casts(graph_def, ours.graph_def),
        "grappler_casts": new_casts(graph_def, theirs),
        "ours_half_flops": half_flop_share(ours.graph_def),
        "grappler_half_flops": half_flop_share(theirs),
    }


def _pct(x) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def markdown(rows: list[dict]) -> str:
    lines = [
        "| graph | nodes | wall ours / Grappler (ms) | CPU ours / Grappler (ms) | ratio wall / CPU "
        "| converted ours / Grappler | casts ours / Grappler | half MatMul/Conv FLOPs ours / Grappler |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['graph']} | {r['nodes']} | {r['ours_seconds'] * 1e3:.0f} / {r['grappler_seconds'] * 1e3:.0f} "
            f"| {r['ours_cpu_seconds'] * 1e3:.0f} / {r['grappler_cpu_seconds'] * 1e3:.0f} "
            f"| {r['ours_seconds'] / r['grappler_seconds']:.2f} "
            f"/ {r['ours_cpu_seconds'] / r['grappler_cpu_seconds']:.2f} "
            f"| {r['ours_converted']} / {r['grappler_converted']} "
            f"| {r['ours_casts']} / {r['grappler_casts']} "
            f"| {_pct(r['ours_half_flops'])} / {_pct(r['grappler_half_flops'])} |")
    return "\n".join(lines)


def machine() -> str:
    import tensorflow as tf

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{cpu}, {os.cpu_count()} cores; Python {platform.python_version()}, "
            f"TensorFlow {tf.__version__}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--models", default=None, help="comma-separated subset of: " + ", ".join(BENCHMARK_MODELS))
    parser.add_argument("--json", default=None, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    chosen = BENCHMARK_MODELS
    if args.models:
        wanted = [m.strip() for m in args.models.split(",")]
        chosen = {k: v for k, v in BENCHMARK_MODELS.items() if any(k.startswith(w) for w in wanted)}
    rows = []
    for name, build in chosen.items():
        rows.append(measure(name, build, args.runs))
        print(f"measured {name}", file=sys.stderr)
    print(f"Machine: {machine()}; median of {args.runs} runs.\n")
    print(markdown(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
