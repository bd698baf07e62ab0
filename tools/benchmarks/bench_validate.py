"""The accuracy-guarded rewrite (``--validate``) against the plain rewrite, on two frozen models.

The models (built by ``models.py``): Keras ResNet-50 and a 2-layer
BERT-like encoder, both frozen, each checked on its own seeded sample
inputs. For each it reports: graph executions used (reference run
included), half regions and how many went back to float32, wall time of
the validated and of the plain rewrite, and the share of MatMul/Conv FLOPs
left in half.
The run budget it is held to is ``2*log2(regions) + 2``.

Usage: python tools/benchmarks/bench_validate.py
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import models  # noqa: E402

from amp_rewrite import Config, rewrite  # noqa: E402
from amp_rewrite.validate import validated_rewrite  # noqa: E402

MODELS = {"resnet50_keras_frozen": models.keras_resnet50_frozen, "bert_like_inference": models.bert_like_inference}


def main() -> int:
    print("| model | nodes | runs (budget) | half regions returned / total | range / pattern kept "
          "| time validated / plain (s) | half FLOPs validated / plain |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, build in MODELS.items():
        model = build()
        config = Config(device_type="CPU", fetches=model.fetches)
        start = time.perf_counter()
        plain = rewrite(model.graph_def, config=config)
        plain_seconds = time.perf_counter() - start
        start = time.perf_counter()
        result, report = validated_rewrite(model.graph_def, feeds=model.feeds, fetches=model.fetches, config=config)
        seconds = time.perf_counter() - start
        budget = 2 * math.log2(max(report.regions_total, 1)) + 2
        print(f"| {name} | {len(model.graph_def.node)} | {report.runs} ({budget:.1f}) "
              f"| {len(report.regions_returned)} / {report.regions_total} "
              f"| {len(report.range_kept)} / {len(report.pattern_kept)} | {seconds:.2f} / {plain_seconds:.2f} "
              f"| {result.half_flop_share:.1%} / {plain.half_flop_share:.1%} |"
              + ("" if report.passed else f" FAILED: {report.message}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
