"""Step time of a graph in float32 and rewritten, measured on this machine: ``amp-rewrite doctor --benchmark``.

:func:`measure_speedup` imports both graphs into their own sessions, runs an
optional initializer once in each, warms each up, then times one step of
each in turn (float32, rewritten, float32, ...) so that both see the same
load on a shared machine, and keeps the median of each. Inputs are the ones
``--validate`` uses (:func:`amp_rewrite.validate.random_feeds` or an
``.npz``). The clock is a parameter, so tests can drive the plumbing without
timing anything.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from amp_rewrite import tf_internals
from amp_rewrite.errors import AmpRewriteError
from amp_rewrite.graph.facts import tensor_name

#: CPU features that decide whether half math is fast, in the order the benchmark line names them.
HALF_CPU_FEATURES = ("avx2", "fma", "f16c", "avx512f", "avx512_fp16", "avx512_bf16", "amx_bf16", "amx_fp16")


#: A measured speed-up closer to 1 than this is no difference on a shared machine.
SAME_SPEED = 0.05


class BenchmarkError(AmpRewriteError):
    """A graph could not be run to time it; the message names the graph and the node."""


@dataclass(frozen=True)
class Measurement:
    """Median step times, in seconds, of the float32 and the rewritten graph, timed in turn."""

    float32_seconds: float
    half_seconds: float
    runs: int
    device: str
    cpu_features: tuple[str, ...] = ()

    @property
    def speedup(self) -> float:
        return self.float32_seconds / self.half_seconds if self.half_seconds > 0 else float("inf")

    def as_dict(self) -> dict:
        return {"float32_seconds": self.float32_seconds, "half_seconds": self.half_seconds, "runs": self.runs,
                "speedup": self.speedup, "device": self.device, "cpu_features": list(self.cpu_features)}


def measure_speedup(float32_graph, half_graph, *, feeds: dict, fetches, runs: int = 10, warmup: int = 2,
                    init_op: str | None = None, timer: Callable[[], float] = time.perf_counter) -> Measurement:
    """Times ``fetches`` of both graphs on ``feeds``, interleaved, and returns the medians.

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
    graphs = [_Step(float32_graph, "float32", feeds, fetches, init_op),
              _Step(half_graph, "rewritten", feeds, fetches, init_op)]
    try:
        for _ in range(warmup):
            for step in graphs:
                step()
        seconds: list[list[float]] = [[], []]
        for _ in range(runs):
            for k, step in enumerate(graphs):
                start = timer()
                step()
                seconds[k].append(timer() - start)
    finally:
        for step in graphs:
            step.close()
    return Measurement(float32_seconds=statistics.median(seconds[0]), half_seconds=statistics.median(seconds[1]),
                       runs=runs, device=graphs[0].device, cpu_features=cpu_features())


class _Step:
    """One graph in its own session, ready to run a step."""

    def __init__(self, graph_def, label: str, feeds: dict, fetches, init_op: str | None):
        import tensorflow as tf

        self.label = label
        self.graph = tf.Graph()
        try:
            with self.graph.as_default():
                tf.compat.v1.import_graph_def(graph_def, name="")
            self.fetches = [self._fetch(name) for name in fetches]
            self.feed_dict = {self.graph.get_tensor_by_name(tensor_name(k)): np.asarray(v) for k, v in feeds.items()}
        except (KeyError, ValueError, tf.errors.OpError) as exc:
            raise BenchmarkError(f"cannot run the {label} graph: {_first_line(exc)}") from None
        self.session = tf.compat.v1.Session(graph=self.graph,
                                            config=tf.compat.v1.ConfigProto(allow_soft_placement=True))
        self.device = "GPU" if any(d.device_type == "GPU" for d in self.session.list_devices()) else "CPU"
        if init_op:
            self._run([self.graph.get_operation_by_name(init_op)])

    def _fetch(self, name: str):
        if ":" in name:
            return self.graph.get_tensor_by_name(name)
        op = self.graph.get_operation_by_name(name)
        return op.outputs[0] if op.outputs else op

    def __call__(self) -> None:
        self._run(self.fetches)

    def _run(self, fetches) -> None:
        import tensorflow as tf

        try:
            tf_internals.run_unpatched(self.session, fetches, self.feed_dict)
        except tf.errors.OpError as exc:
            raise BenchmarkError(f"the {self.label} graph fails at node {getattr(exc.op, 'name', '?')}: "
                                 f"{_first_line(exc)}") from None

    def close(self) -> None:
        self.session.close()


def _first_line(exc: BaseException) -> str:
    text = (getattr(exc, "message", None) or str(exc)).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def cpu_features(path: str = "/proc/cpuinfo") -> tuple[str, ...]:
    """Which of :data:`HALF_CPU_FEATURES` this CPU has (empty where ``/proc/cpuinfo`` is missing)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as info:
            flags = next((line.split(":", 1)[1].split() for line in info if line.startswith("flags")), [])
    except OSError:
        return ()
    return tuple(f for f in HALF_CPU_FEATURES if f in flags)


def measurement_line(m: Measurement, *, target: str, bound: float | None) -> str:
    """The benchmark's line: both step times, the measured speed-up beside the bound, and what to do."""
    features = ""
    if m.device == "CPU":
        missing = [f for f in HALF_CPU_FEATURES if f not in m.cpu_features]
        features = (f" (CPU: {' '.join(m.cpu_features) or 'flags unknown'}"
                    + (f"; no {' '.join(missing)}" if missing and m.cpu_features else "") + ")")
    bound_text = "unknown" if bound is None else f"{bound:.2f}x"
    head = (f"measured on this machine's {m.device}{features}: float32 {m.float32_seconds * 1e3:.2f} ms, "
            f"{target} {m.half_seconds * 1e3:.2f} ms per step (median of {m.runs}, interleaved): "
            f"{m.speedup:.2f}x; bound {bound_text}")
    if m.speedup < 1 - SAME_SPEED:
        return (f"{head}. {target} is SLOWER than float32 here ({1 / m.speedup:.1f}x the time): stay float32 "
                f"on this machine")
    if m.speedup <= 1 + SAME_SPEED:
        return (f"{head}. {target} gains nothing measurable here (within {SAME_SPEED:.0%}): stay float32 on this "
                "machine unless memory is what you need")
    return f"{head}. {target} is faster here"
