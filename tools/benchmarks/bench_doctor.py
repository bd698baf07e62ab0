"""The doctor's bound beside the measured speed-up, on the benchmark models of ``models.py``.

For each model: rewrite it for this machine's device type, run
:func:`amp_rewrite.report.doctor.diagnose` and :func:`amp_rewrite.report.measure.measure_speedup`
(float32 and rewritten steps in turn, the best of each), and print one row: the half
FLOP share, the Casts' bytes, the bound, both step times and the measured
speed-up, with the CPU flags that decide half speed.

Usage: python tools/benchmarks/bench_doctor.py [--models NAME,...] [--target float16|bfloat16] [--runs 4]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import models  # noqa: E402

from amp_rewrite import Config, rewrite  # noqa: E402
from amp_rewrite.report.doctor import diagnose  # noqa: E402
from amp_rewrite.report.measure import HALF_CPU_FEATURES, cpu_features, measure_speedup  # noqa: E402

DEFAULT = ("small_mlp_inference", "keras_mobilenetv2_frozen", "tf1_cnn_training", "tf1_transformer_block_training")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(DEFAULT))
    parser.add_argument("--target", choices=("float16", "bfloat16"), default="float16")
    parser.add_argument("--runs", type=int, default=4)
    args = parser.parse_args()
    have = cpu_features()
    print(f"CPU flags: {' '.join(have)}; missing: {' '.join(f for f in HALF_CPU_FEATURES if f not in have)}")
    print(f"{'model':32} {'half FLOPs':>10} {'Cast MB':>8} {'bound':>7} {'float32 ms':>10} "
          f"{args.target + ' ms':>11} {'measured':>8}")
    for name in args.models.split(","):
        model = getattr(models, name)()
        result = rewrite(model.graph_def, fetches=list(model.fetches),
                         config=Config(device_type="CPU", target=args.target))
        bound = diagnose(result).bound
        init = models.INIT_OP_NAME if model.kind == "training" else None
        m = measure_speedup(model.graph_def, result.graph_def, feeds=model.feeds, fetches=list(model.fetches),
                            runs=args.runs, init_op=init)
        share = "?" if bound.half_flop_share is None else f"{bound.half_flop_share:.1%}"
        limit = "?" if bound.speedup_bound is None else f"{bound.speedup_bound:.2f}x"
        print(f"{name:32} {share:>10} {bound.cast_bytes / 1e6:8.2f} {limit:>7} {m.float32_seconds * 1e3:10.2f} "
              f"{m.half_seconds * 1e3:11.2f} {m.speedup:7.2f}x", flush=True)


if __name__ == "__main__":
    main()
