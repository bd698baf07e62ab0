"""Step time of a graph in float32 and rewritten, measured on this machine: ``amp-rewrite doctor --benchmark``.

:func:`measure_speedup` runs both graphs in their own sessions
(:class:`amp_rewrite.tune.graph_sessions.GraphSessions`), an optional
initializer once in each, and times them the way ``--tune`` and the runtime
do (:mod:`amp_rewrite.tune.trial`): an untimed warm-up step of each, then
steps in the order half, float32, float32, half, ..., the best step of each
kept; the rewritten graph is faster only when its best is at least
:data:`~amp_rewrite.tune.trial.MARGIN` below float32's. Inputs are the ones
``--validate`` uses (:func:`amp_rewrite.validate.random_feeds` or an
``.npz``). The clock is a parameter, so tests can drive the plumbing without
timing anything.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from amp_rewrite.tune.cache import Timing
from amp_rewrite.tune.graph_sessions import GraphRunError, GraphSessions
from amp_rewrite.tune.trial import FLOAT32, HALF, ROUNDS, WARMUP, StepVerdict, run_trial, verdict_of

#: CPU features that decide whether half math is fast, in the order the benchmark line names them.
HALF_CPU_FEATURES = ("avx2", "fma", "f16c", "avx512f", "avx512_fp16", "avx512_bf16", "amx_bf16", "amx_fp16")

#: A graph that cannot be run to time it; the message names the graph and the node.
BenchmarkError = GraphRunError


@dataclass(frozen=True)
class Measurement:
    """The best step times, in seconds, of the float32 and the rewritten graph, timed in turn."""

    float32_seconds: float
    half_seconds: float
    runs: int
    device: str
    cpu_features: tuple[str, ...] = ()

    @property
    def speedup(self) -> float:
        return self.float32_seconds / self.half_seconds if self.half_seconds > 0 else float("inf")

    def verdict(self) -> StepVerdict:
        """Half or float32, by :data:`~amp_rewrite.tune.trial.MARGIN`, as ``--tune`` and the runtime decide."""
        return verdict_of(Timing(float32=self.float32_seconds, half=self.half_seconds))

    def as_dict(self) -> dict:
        return {"float32_seconds": self.float32_seconds, "half_seconds": self.half_seconds, "runs": self.runs,
                "speedup": self.speedup, "device": self.device, "cpu_features": list(self.cpu_features)}


def measure_speedup(float32_graph, half_graph, *, feeds: dict, fetches, runs: int = ROUNDS,
                    warmup: int = WARMUP, init_op: str | None = None,
                    timer: Callable[[], float] = time.perf_counter) -> Measurement:
    """Times ``fetches`` of both graphs on ``feeds``, interleaved, and returns the best step of each.

    Args:
        float32_graph: the original GraphDef.
        half_graph: the rewritten GraphDef.
        feeds: placeholder or tensor name → array.
        fetches: node or tensor names to run in each step.
        runs: timed steps of each graph.
        warmup: untimed steps of each graph first.
        init_op: a node to run once in each session before any step (a training graph's initializer).
        timer: the clock (``time.perf_counter``).
    """
    runner = GraphSessions({FLOAT32: float32_graph, HALF: half_graph}, feeds=feeds, fetches=fetches,
                          init_op=init_op, timer=timer)
    try:
        verdict, rounds = run_trial(runner.step, warmup=warmup, rounds=runs)
        device = runner.device
    finally:
        runner.close()
    return Measurement(float32_seconds=verdict.float32_seconds, half_seconds=verdict.half_seconds, runs=rounds,
                       device=device, cpu_features=cpu_features())


def cpu_features(path: str = "/proc/cpuinfo") -> tuple[str, ...]:
    """Which of :data:`HALF_CPU_FEATURES` this CPU has (empty where ``/proc/cpuinfo`` is missing)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as info:
            flags = next((line.split(":", 1)[1].split() for line in info if line.startswith("flags")), [])
    except OSError:
        return ()
    return tuple(f for f in HALF_CPU_FEATURES if f in flags)


def measurement_line(m: Measurement, *, target: str, bound: float | None) -> str:
    """The benchmark's line: both step times, the measured speed-up beside the bound, and the verdict."""
    features = ""
    if m.device == "CPU":
        missing = [f for f in HALF_CPU_FEATURES if f not in m.cpu_features]
        features = (f" (CPU: {' '.join(m.cpu_features) or 'flags unknown'}"
                    + (f"; no {' '.join(missing)}" if missing and m.cpu_features else "") + ")")
    bound_text = "unknown" if bound is None else f"{bound:.2f}x"
    head = (f"measured on this machine's {m.device}{features}: float32 {m.float32_seconds * 1e3:.2f} ms, "
            f"{target} {m.half_seconds * 1e3:.2f} ms per step (best of {m.runs}, interleaved): "
            f"{m.speedup:.2f}x; bound {bound_text}")
    verdict = m.verdict()
    if verdict.is_half:
        return f"{head}. {target} is faster here"
    return f"{head}. Stays float32 on this machine: {verdict.reason(target, m.device, subject='the graph')}"
