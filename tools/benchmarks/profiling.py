"""What the benchmark tools share about timing training steps: the profiler's op times and this CPU.

- :func:`op_types` reads a TensorFlow profiler trace (the ``*.xplane.pb``
  files that ``tf.profiler.experimental.start(logdir)`` / ``stop()`` write)
  and sums, per op type, the durations and the number of the op events
  (events named ``node:OpType``, whose display name is the op type);
  :func:`op_ms` is their total.
- :func:`step_timer` makes a Keras callback that times each training step
  (wall and process CPU time), profiles a few chosen consecutive steps, and
  keeps the loss ``fit`` reports after each step; :func:`profile_calls`
  profiles any other step (a ``Session.run``) the same way.
- :func:`run_worker` runs one measurement in a fresh Python process with
  its own amp-rewrite variables, and keeps amp-rewrite's lines from its
  stderr (:func:`own_line`).
- :func:`cpu_model` and :func:`cpu_flags` say which CPU this is and which of
  the instruction sets that matter for half precision it has.

Not a tool to run: the benchmarks beside it import it (they run as
``python tools/benchmarks/bench_X.py``, so this folder is first on ``sys.path``).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HALF_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile")


# --- the profiler's trace --------------------------------------------------------------------------


def op_types(logdir: Path | str) -> dict[str, dict[str, float]]:
    """Per op type, ``{"ms": summed duration, "count": events}`` over every trace file under ``logdir``."""
    from amp_rewrite.tune.step_stats import op_events

    totals: dict[str, dict[str, float]] = {}
    for _, op, picos in op_events(Path(logdir).rglob("*.xplane.pb")):
        row = totals.setdefault(op, {"ms": 0.0, "count": 0})
        row["ms"] += picos / 1e9
        row["count"] += 1
    return totals


def op_ms(logdir: Path | str) -> float:
    """Op durations summed over a profiler trace, in milliseconds."""
    return sum(row["ms"] for row in op_types(logdir).values())


def per_step(types: dict[str, dict[str, float]], steps: int) -> dict[str, dict[str, float]]:
    """``types`` divided by the number of steps the trace holds."""
    return {name: {key: value / steps for key, value in row.items()} for name, row in types.items()}


def profile_calls(call: Callable[[], object], times: int) -> dict[str, dict[str, float]]:
    """Runs ``call`` ``times`` times under the profiler; its op types per call, as :func:`per_step` gives them."""
    import tensorflow as tf

    with tempfile.TemporaryDirectory(prefix="amp_rewrite_profile_") as logdir:
        tf.profiler.experimental.start(logdir)
        try:
            for _ in range(times):
                call()
        finally:
            tf.profiler.experimental.stop()
        return per_step(op_types(logdir), times)


# --- the Keras callback ----------------------------------------------------------------------------


def step_timer(*, warmup: int, profile_epoch: int, profile_batch: int, profiled: int):
    """A Keras callback timing each step after the first ``warmup`` of epoch 0.

    Steps ``profile_batch`` to ``profile_batch + profiled - 1`` of epoch
    ``profile_epoch`` run under the profiler and are not timed; their op
    types (per step) go to ``timer.op_types`` and their op time to
    ``timer.op_ms``. ``timer.losses`` holds the loss ``fit`` reports after
    every step, ``timer.summary()`` the median wall and CPU milliseconds
    (and each warm-up step's wall milliseconds).
    """
    import keras

    class StepTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.walls, self.cpus, self.losses, self.warmup_walls = [], [], [], []
            self.op_types, self.op_ms = None, None
            self.epoch, self.logdir, self.started = 0, None, (0.0, 0.0)

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            if self.epoch == profile_epoch and batch == profile_batch:
                import tensorflow as tf

                self.logdir = tempfile.mkdtemp(prefix="amp_rewrite_profile_")
                tf.profiler.experimental.start(self.logdir)
            self.started = time.perf_counter(), time.process_time()

        def on_train_batch_end(self, batch, logs=None):
            wall, cpu = time.perf_counter() - self.started[0], time.process_time() - self.started[1]
            self.losses.append(float(logs["loss"]))
            if self.logdir is not None:
                if batch == profile_batch + profiled - 1:
                    self._stop_profiler()
            elif self.epoch == 0 and batch < warmup:
                self.warmup_walls.append(wall)
            else:
                self.walls.append(wall)
                self.cpus.append(cpu)

        def _stop_profiler(self):
            import tensorflow as tf

            tf.profiler.experimental.stop()
            try:
                self.op_types = per_step(op_types(self.logdir), profiled)
            finally:
                shutil.rmtree(self.logdir, ignore_errors=True)  # a trace is megabytes; a run takes dozens
            self.op_ms = sum(row["ms"] for row in self.op_types.values())
            self.logdir = None

        def summary(self):
            return {"wall_ms": 1e3 * statistics.median(self.walls), "cpu_ms": 1e3 * statistics.median(self.cpus),
                    "op_ms": self.op_ms, "warmup_ms": [1e3 * wall for wall in self.warmup_walls]}

    return StepTimer()


# --- a measurement in its own process -------------------------------------------------------------


def run_worker(command: list[str], env_vars: dict[str, str], *, timeout_s: float, python: str | None = None) -> dict:
    """Runs ``python *command --out FILE`` in a fresh process; the JSON it wrote there, or ``{"failed": why}``.

    The child gets this process's environment without any variable
    amp-rewrite reads, then ``env_vars`` (so each measurement sets its own
    mode), with TensorFlow's C++ logging quiet and hashing seeded. It runs
    this interpreter (``sys.executable``), so it imports the same
    amp-rewrite, or ``python``: another environment's, whose installed
    amp-rewrite is another version (a "before" measurement). Added to the
    result: ``process_s`` (the child's whole run),
    ``amp_rewrite`` (amp-rewrite's own lines from its stderr, in order) and
    ``warnings`` (the other stderr lines that mention a warning).
    """
    from bench_auto_mp import clean_environment

    env = clean_environment()
    env.update(env_vars, TF_CPP_MIN_LOG_LEVEL="2", PYTHONHASHSEED="0")
    with tempfile.TemporaryDirectory(prefix="amp_rewrite_bench_") as tmp:
        out = os.path.join(tmp, "result.json")
        started = time.perf_counter()
        try:
            done = subprocess.run([python or sys.executable, *command, "--out", out], env=env, capture_output=True,
                                  text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"failed": f"timed out after {timeout_s:.0f} s"}
        lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        if done.returncode != 0 or not os.path.exists(out):
            return {"failed": lines[-1] if lines else f"exit status {done.returncode}", "stderr_tail": lines[-30:]}
        result = json.loads(Path(out).read_text())
    result["process_s"] = time.perf_counter() - started
    result["amp_rewrite"] = [ours for ours in map(own_line, lines) if ours]
    result["warnings"] = sorted({line for line in lines if "warning" in line.lower() and not own_line(line)})
    return result


def own_line(line: str) -> str | None:
    """amp-rewrite's message in a stderr line (``INFO amp_rewrite.runtime: amp-rewrite: ...``), with its level."""
    if "amp-rewrite" not in line:
        return None
    level = line.split(" ", 1)[0] if line.split(" ", 1)[0].isupper() else ""
    return f"{level} {line[line.index('amp-rewrite'):]}".strip()


# --- this CPU --------------------------------------------------------------------------------------


def _cpuinfo_field(name: str) -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.split(":", 1)[0].strip() == name),
                        None)
    except OSError:
        return None


def cpu_model() -> str:
    """The CPU's model name and the number of cores this process sees."""
    return f"{_cpuinfo_field('model name') or platform.processor() or '?'}, {os.cpu_count()} cores"


def cpu_flags() -> dict[str, bool]:
    """Whether the CPU has each of :data:`HALF_FLAGS` (all False where ``/proc/cpuinfo`` is missing)."""
    have = set((_cpuinfo_field("flags") or "").split())
    return {flag: flag in have for flag in HALF_FLAGS}


def cpu_line() -> str:
    """One line: the CPU model and each flag of :data:`HALF_FLAGS` present or absent (``no avx512f``)."""
    flags = " ".join(flag if present else f"no {flag}" for flag, present in cpu_flags().items())
    return f"{cpu_model()}; {flags}"
