"""Step time, kernel time and peak memory on a GPU: float32, ``ENABLE_AUTO_MP=1``, Grappler's pass, Keras's policy.

Written for one NVIDIA H200 (any CUDA GPU TensorFlow sees will do). The
workloads, in the order they run (each finished before the next starts, so a
budget that runs out keeps the first ones whole):

- ``resnet50``: Keras 3 ``fit`` of ``keras.applications.ResNet50`` (no
  weights, 1000 classes) on 224x224x3 images, batch 64, AdamW;
- ``transformer``: the TF1 transformer block of ``tools/benchmarks/models.py``
  (self-attention, GELU feed-forward, layer norms, Adam), width 1024, 16
  heads, 256 tokens, batch 32, trained through a ``Session``;
- ``gpt``: Keras 3 ``fit`` of a causal transformer of BERT-base's width
  (768, 12 heads, feed-forward 3072), 4 blocks, vocabulary 8192, 512 tokens,
  batch 16, AdamW;
- ``bert``: ``models.bert_like_inference`` (frozen, 4 layers of width 768,
  12 heads, 128 tokens, batch 32) run through a ``Session``;
- ``lstm``: Keras 3 ``fit`` of two stacked LSTMs (1024 units, 128 steps of
  256 features, batch 64, TensorFlow's cuDNN kernel), Adam.

The modes, each in a process of its own:

- ``float32``: no variable. On an Ampere or newer GPU TensorFlow runs float32
  matrix products and convolutions as TF32 on tensor cores by default; the
  header says whether it does here;
- ``amp``: ``ENABLE_AUTO_MP=1``: amp-rewrite's runtime, its step decision on;
- ``grappler``: Grappler's own float16 pass, ``auto_mixed_precision``: for
  the Keras models ``tf.config.optimizer.set_experimental_options`` before
  the model is built, for the TF1 sessions the session's rewrite option
  (the switch ``TF_ENABLE_AUTO_MIXED_PRECISION=1`` set in NVIDIA's TF1
  containers; with amp-rewrite installed that variable turns on amp-rewrite,
  so this tool sets the option itself);
- ``policy``: Keras's ``mixed_float16`` global policy (Keras models only);
- ``amp-unjoined`` (only when ``--modes`` names it): ``amp`` with the loss
  scaling's gradients unscaled and checked one by one
  (``AMP_LOSS_SCALE_GROUPED=0``), what joining them saves on this GPU.

Per workload, a first process in ``amp`` mode warms the machine up (the
CUDA context, cuBLAS's and cuDNN's algorithm choices, anything the driver
compiles into its cache) and its step decision goes into a tuning cache
made fresh for this run of the tool, which the later ``amp`` processes read,
so their steps are the decided ones from the first. It is not counted. Then
each round runs every mode once, the mode order rotated each round; a cell
is the best of the rounds.

In each process: ``--warmup`` untimed steps (as many in every mode; they
cover the ``amp`` step trial where a process still has one; a Keras model
under ``amp`` runs more, up to 30, while its step is still on trial, which
the JSON's ``untimed_steps`` records), then
``--steps`` timed steps, between two device synchronisations (wall ms per
step = their time / steps), then 2 steps under TensorFlow's profiler (the
GPU's kernel time per step, and per op type; on a CPU, the op time). Peak
GPU memory is TensorFlow's allocator's
(``tf.config.experimental.get_memory_info('GPU:0')['peak']``), over the timed
steps and over the whole process. Keras models compile without XLA, so every
mode runs the same graph executor (``--xla`` compiles them with XLA).

Results go to ``OUT_DIR/bench_gpu.json`` and ``OUT_DIR/bench_gpu.md``,
rewritten after every process, so a run cut short keeps what it measured.
``--budget-s`` bounds the whole run: no process starts that the budget
cannot hold (judged from the workload's warm-up process).

``--smoke`` runs the same code on a CPU with tiny sizes and float16 forced
(``AMP_REWRITE_TARGET=float16``), to check the tool itself; its times mean
nothing.

Usage: ``python tools/benchmarks/bench_gpu.py OUT_DIR [--workloads resnet50 transformer gpt bert lstm]
[--modes float32 amp grappler policy amp-unjoined] [--rounds 2] [--steps 20] [--budget-s 420] [--smoke] [--xla]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_step_decision  # noqa: E402
import profiling  # noqa: E402
from bench_keras_policy import rotated  # noqa: E402

KERAS = ("resnet50", "gpt", "lstm")
WORKLOADS = ("resnet50", "transformer", "gpt", "bert", "lstm")
MODES = ("float32", "amp", "grappler", "policy")
#: Not run unless named: amp with the loss scaling's gradients unscaled and checked one by one (a CPU's way).
UNJOINED = "amp-unjoined"
KERAS_ONLY = ("policy",)
AMP_ENV = {"ENABLE_AUTO_MP": "1"}
SMOKE_AMP_ENV = {"ENABLE_AUTO_MP": "1", "AMP_REWRITE_TARGET": "float16"}
#: Sizes on the GPU, and with --smoke.
SIZES = {
    "resnet50": ({"image": 224, "batch": 64}, {"image": 32, "batch": 2}),
    "transformer": ({"batch": 32, "seq": 256, "d_model": 1024, "heads": 16},
                    {"batch": 2, "seq": 8, "d_model": 32, "heads": 2}),
    "gpt": ({"width": 768, "heads": 12, "ffn": 3072, "blocks": 4, "vocab": 8192, "tokens": 512, "batch": 16},
            {"width": 32, "heads": 2, "ffn": 64, "blocks": 1, "vocab": 64, "tokens": 16, "batch": 2}),
    "bert": ({"layers": 4, "d_model": 768, "heads": 12, "seq": 128, "batch": 32},
             {"layers": 1, "d_model": 32, "heads": 2, "seq": 8, "batch": 2}),
    "lstm": ({"units": 1024, "steps": 128, "features": 256, "batch": 64},
             {"units": 16, "steps": 8, "features": 8, "batch": 2}),
}
#: Untimed steps: a Keras step decision takes 17 calls (trial, profiles, confirmation); a session's 10 runs.
WARMUP = {"keras": 19, "tf1": 12}
#: Keras steps the timing may wait beyond WARMUP while amp-rewrite still has a step on trial: its profiles and
#: a mixed body's confirmation follow the trial, and skipped float16 steps make it longer.
TRIAL_WAIT = 30
STEPS, SMOKE_STEPS, PROFILED = 20, 2, 2
PROCESS_CAP_S = 300


def kind(workload: str) -> str:
    return "keras" if workload in KERAS else "tf1"


def modes_of(workload: str, modes: list[str]) -> list[str]:
    return [m for m in modes if kind(workload) == "keras" or m not in KERAS_ONLY]


# --- what a worker measures (in the child process) -------------------------------------------------


def gpu_memory() -> dict | None:
    """TensorFlow's allocator on GPU 0: current and peak bytes; None on a machine without a GPU."""
    import tensorflow as tf

    if not tf.config.list_logical_devices("GPU"):
        return None
    return tf.config.experimental.get_memory_info("GPU:0")


def reset_peak() -> int | None:
    """The peak so far, in bytes; then the allocator's peak starts again from what it holds now."""
    import tensorflow as tf

    memory = gpu_memory()
    if memory is None:
        return None
    tf.config.experimental.reset_memory_stats("GPU:0")
    return memory["peak"]


def sync() -> None:
    """Waits for the device's queue; a TF1 session's graph is the default one, and ``Session.run`` waits itself."""
    import tensorflow as tf

    if tf.executing_eagerly():
        tf.test.experimental.sync_devices()


class Measure:
    """The timed steps (between two synchronisations) and the profiled ones of one process."""

    def __init__(self):
        self.started = 0.0
        self.wall_s = 0.0
        self.peak_before = None
        self.logdir = tempfile.mkdtemp(prefix="bench_gpu_profile_")

    def begin_timed(self) -> None:
        sync()
        self.peak_before = reset_peak()
        self.started = time.perf_counter()

    def end_timed(self) -> None:
        sync()
        self.wall_s = time.perf_counter() - self.started

    def begin_profile(self) -> None:
        import tensorflow as tf

        tf.profiler.experimental.start(self.logdir)

    def end_profile(self) -> None:
        import tensorflow as tf

        sync()
        tf.profiler.experimental.stop()

    def result(self, steps: int, profiled: int) -> dict:
        memory = gpu_memory()
        timed_peak = memory["peak"] if memory else None
        try:
            types = kernel_types(self.logdir, profiled)
        finally:
            shutil.rmtree(self.logdir, ignore_errors=True)
        return {"wall_ms": 1e3 * self.wall_s / steps, "kernel_ms": sum(row["ms"] for row in types.values()),
                "kernel_types": types, "peak_timed_bytes": timed_peak,
                "peak_bytes": max(timed_peak, self.peak_before or 0) if timed_peak is not None else None}


def kernel_types(logdir: str, steps: int) -> dict[str, dict[str, float]]:
    """Per op type, the GPU's kernel ms and kernels per step; on a machine without a GPU, the op events'."""
    import tensorflow as tf

    from amp_rewrite.tune.step_stats import gpu_kernel_events, op_events

    paths = list(Path(logdir).rglob("*.xplane.pb"))
    totals: dict[str, dict[str, float]] = {}
    if tf.config.list_logical_devices("GPU"):
        events = ((op or "(no op)", picos) for _, op, picos in gpu_kernel_events(paths))
    else:
        events = ((op, picos) for _, op, picos in op_events(paths))
    for op, picos in events:
        row = totals.setdefault(op, {"ms": 0.0, "count": 0})
        row["ms"] += picos / 1e9 / steps
        row["count"] += 1 / steps
    return totals


def keras_worker(workload: str, mode: str, sizes: dict, warmup: int, steps: int, xla: bool) -> dict:
    import keras
    import tensorflow as tf

    if mode == "policy":
        keras.mixed_precision.set_global_policy("mixed_float16")
    if mode == "grappler":
        tf.config.optimizer.set_experimental_options({"auto_mixed_precision": True})
    keras.utils.set_random_seed(0)
    model, batch, optimizer, loss = KERAS_MODELS[workload](keras, sizes)
    model.compile(optimizer=optimizer, loss=loss, jit_compile=xla)
    measure = Measure()
    losses: list[float] = []
    began: list[int] = []  # the index of the first timed step, once timing began
    untimed_loss: list[float] = []  # the last untimed step's loss, until timing begins

    class Timer(keras.callbacks.Callback):
        def on_train_batch_begin(self, index, logs=None):
            if not began and index >= warmup and (index >= warmup + TRIAL_WAIT or not on_trial()):
                began.append(index)
                losses.append(untimed_loss[-1])
                measure.begin_timed()
            elif began and index == began[0] + steps:
                measure.end_timed()
                measure.begin_profile()

        def on_train_batch_end(self, index, logs=None):
            if not began:  # reading a loss waits for its step: only untimed steps are read, and the last timed one
                untimed_loss[:] = [float(logs["loss"])]
                if index == 0:
                    losses.append(untimed_loss[0])
            elif index == began[0] + steps - 1:
                losses.append(float(logs["loss"]))
            if began and index == began[0] + steps + PROFILED - 1:
                measure.end_profile()
                self.model.stop_training = True

    data = tf.data.Dataset.from_tensors(batch).repeat()
    model.fit(data, steps_per_epoch=warmup + TRIAL_WAIT + steps + PROFILED, epochs=1, verbose=0,
              callbacks=[Timer()])
    return {**measure.result(steps, PROFILED), "losses": losses, "untimed_steps": began[0],
            "on_trial_when_timed": on_trial()}


def on_trial() -> list[str]:
    """The steps amp-rewrite's runtime still has on trial (none without the runtime)."""
    if "amp_rewrite.runtime.tf2.tracing" not in sys.modules:
        return []
    from amp_rewrite.runtime.tf2 import tracing

    return tracing.steps_on_trial()


def resnet50(keras, sizes):
    import numpy as np

    size, batch = sizes["image"], sizes["batch"]
    model = keras.applications.ResNet50(weights=None, input_shape=(size, size, 3), classes=1000)
    rng = np.random.default_rng(0)
    data = (rng.normal(size=(batch, size, size, 3)).astype(np.float32), rng.integers(0, 1000, batch).astype(np.int32))
    return model, data, keras.optimizers.AdamW(1e-3), "sparse_categorical_crossentropy"


def gpt(keras, sizes):
    import numpy as np

    layers = keras.layers
    width, tokens, vocab = sizes["width"], sizes["tokens"], sizes["vocab"]

    class TokenAndPosition(layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.tokens = layers.Embedding(vocab, width)
            self.positions = layers.Embedding(tokens, width)

        def call(self, ids):
            return self.tokens(ids) + self.positions(keras.ops.arange(keras.ops.shape(ids)[-1]))

    ids = keras.Input((tokens,), dtype="int32")
    x = TokenAndPosition()(ids)
    for _ in range(sizes["blocks"]):
        h = layers.LayerNormalization(epsilon=1e-5)(x)
        x = layers.Add()([x, layers.MultiHeadAttention(sizes["heads"], width // sizes["heads"])(
            h, h, use_causal_mask=True)])
        h = layers.Dense(sizes["ffn"], activation="gelu")(layers.LayerNormalization(epsilon=1e-5)(x))
        x = layers.Add()([x, layers.Dense(width)(h)])
    model = keras.Model(ids, layers.Dense(vocab)(layers.LayerNormalization(epsilon=1e-5)(x)))
    sequences = np.random.default_rng(0).integers(0, vocab, (sizes["batch"], tokens + 1)).astype(np.int32)
    return (model, (sequences[:, :-1], sequences[:, 1:]), keras.optimizers.AdamW(1e-4),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def lstm(keras, sizes):
    import numpy as np

    model = keras.Sequential([keras.Input((sizes["steps"], sizes["features"])),
                              keras.layers.LSTM(sizes["units"], return_sequences=True),
                              keras.layers.LSTM(sizes["units"]), keras.layers.Dense(10)])
    rng = np.random.default_rng(0)
    data = (rng.normal(size=(sizes["batch"], sizes["steps"], sizes["features"])).astype(np.float32),
            rng.integers(0, 10, sizes["batch"]).astype(np.int32))
    return model, data, keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True)


KERAS_MODELS = {"resnet50": resnet50, "gpt": gpt, "lstm": lstm}


def tf1_worker(workload: str, mode: str, sizes: dict, warmup: int, steps: int) -> dict:
    """A TF1 graph stepped in a session: warm-up runs, timed runs, profiled runs (``Session.run`` waits for each)."""
    import models
    import tensorflow as tf
    from tensorflow.core.protobuf import rewriter_config_pb2

    model = (models.tf1_transformer_block_training(**sizes) if workload == "transformer"
             else models.bert_like_inference(**sizes))
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(model.graph_def, name="")
    targets = [graph.get_operation_by_name(name) for name in model.fetches]
    targets = [op.outputs[0] if op.outputs else op for op in targets]
    feeds = {graph.get_tensor_by_name(f"{name}:0"): value for name, value in model.feeds.items()}
    config = tf.compat.v1.ConfigProto()
    if mode == "grappler":
        config.graph_options.rewrite_options.auto_mixed_precision = rewriter_config_pb2.RewriterConfig.ON
    losses: list[float] = []
    with tf.compat.v1.Session(graph=graph, config=config) as session:
        if model.kind == "training":
            session.run(graph.get_operation_by_name(models.INIT_OP_NAME))

        def step(keep: bool = False):
            values = session.run(targets, feeds)
            if keep and model.kind == "training":
                losses.append(float(values[-1]))

        step(keep=True)
        for _ in range(warmup - 1):
            step()
        measure = Measure()
        measure.begin_timed()
        for _ in range(steps):
            step()
        measure.end_timed()
        step(keep=True)
        measure.begin_profile()
        for _ in range(PROFILED):
            step()
        measure.end_profile()
        return {**measure.result(steps, PROFILED), "losses": losses}


def worker(args) -> None:
    import tensorflow as tf

    sizes = SIZES[args.worker][1 if args.smoke else 0]
    if kind(args.worker) == "keras":
        result = keras_worker(args.worker, args.mode, sizes, args.warmup, args.steps, args.xla)
    else:
        result = tf1_worker(args.worker, args.mode, sizes, args.warmup, args.steps)
    result["tf32"] = bool(tf.config.experimental.tensor_float_32_execution_enabled())
    result["gpus"] = [tf.config.experimental.get_device_details(gpu).get("device_name", "?")
                      for gpu in tf.config.list_physical_devices("GPU")]
    Path(args.out).write_text(json.dumps(result))


# --- the driver ------------------------------------------------------------------------------------


def environment(mode: str, smoke: bool, cache_dir: str) -> dict[str, str]:
    env = {"AMP_REWRITE_TUNE_CACHE": cache_dir}
    if mode in ("amp", UNJOINED):
        env.update(SMOKE_AMP_ENV if smoke else AMP_ENV)
    if mode == UNJOINED:
        env["AMP_LOSS_SCALE_GROUPED"] = "0"
    return env


class Run:
    """The measurements of one run of this tool, written to OUT_DIR after each process."""

    def __init__(self, args):
        self.args = args
        self.out_dir = Path(args.out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.cache_dir = str(self.out_dir / "tune-cache")
        self.started = time.perf_counter()
        self.runs: list[dict] = []
        self.skipped: list[str] = []
        self.machine = machine()

    @property
    def left_s(self) -> float:
        return self.args.budget_s - (time.perf_counter() - self.started)

    def process(self, workload: str, mode: str, round_number: int, timeout_s: float) -> dict:
        steps = SMOKE_STEPS if self.args.smoke and self.args.steps is None else (self.args.steps or STEPS)
        warmup = WARMUP[kind(workload)] if not self.args.smoke else min(WARMUP[kind(workload)], 12)
        command = [__file__, "--worker", workload, "--mode", mode, "--steps", str(steps), "--warmup", str(warmup),
                   *(["--smoke"] if self.args.smoke else []), *(["--xla"] if self.args.xla else [])]
        result = profiling.run_worker(command, environment(mode, self.args.smoke, self.cache_dir),
                                      timeout_s=timeout_s)
        record = {"workload": workload, "mode": mode, "round": round_number, "steps": steps, "warmup": warmup,
                  **result, "decision": decision(result.get("amp_rewrite", []))}
        self.runs.append(record)
        print(f"{workload} {mode} round {round_number}: {progress(record)}", file=sys.stderr, flush=True)
        self.write()
        return record

    def workload(self, workload: str) -> None:
        modes = modes_of(workload, self.args.modes)
        if self.left_s < 60:
            self.skipped.append(f"{workload}: not run, {max(self.left_s, 0):.0f} s of the budget left")
            return
        if self.args.warmup_process:
            first = self.process(workload, "amp" if "amp" in modes else modes[0], 0,
                                 min(PROCESS_CAP_S, self.left_s))
            if "failed" in first and "timed out" in first["failed"]:
                self.skipped.append(f"{workload}: its warm-up process ran out of time")
                return
        for round_index in range(self.args.rounds):
            for mode in rotated(modes, round_index):
                longest = max((r.get("process_s", 0.0) for r in self.runs if r["workload"] == workload), default=0)
                if self.left_s < max(30.0, 1.2 * longest):
                    self.skipped.append(f"{workload} {mode} round {round_index + 1}: not run, "
                                        f"{max(self.left_s, 0):.0f} s of the budget left")
                    continue
                self.process(workload, mode, round_index + 1, min(PROCESS_CAP_S, self.left_s))

    def write(self) -> None:
        cells = self.cells()
        (self.out_dir / "bench_gpu.json").write_text(json.dumps({
            "machine": self.machine, "smoke": self.args.smoke, "xla": self.args.xla,
            "budget_s": self.args.budget_s, "elapsed_s": time.perf_counter() - self.started,
            "sizes": {w: SIZES[w][1 if self.args.smoke else 0] for w in self.args.workloads},
            "cells": cells, "runs": self.runs, "skipped": self.skipped}, indent=1))
        (self.out_dir / "bench_gpu.md").write_text("\n".join(self.markdown(cells)) + "\n")

    def cells(self) -> dict:
        """Per workload and mode: the best of its timed rounds (round 0, the warm-up process, never counts)."""
        cells: dict = {}
        for workload in self.args.workloads:
            for mode in modes_of(workload, self.args.modes):
                runs = [r for r in self.runs if r["workload"] == workload and r["mode"] == mode and r["round"] > 0]
                if runs:
                    cells.setdefault(workload, {})[mode] = cell(runs)
        return cells

    def markdown(self, cells: dict) -> list[str]:
        tf32 = {r["tf32"] and bool(r["gpus"]) for r in self.runs if "tf32" in r}
        smoke = " (--smoke: tiny sizes on this machine, float16 forced; times mean nothing)" if self.args.smoke else ""
        lines = [f"# GPU step times{smoke}", "", f"- GPU: {self.machine['gpu']}", f"- host: {self.machine['cpu']}",
                 f"- {self.machine['versions']}",
                 "- float32 is " + ("TF32 on tensor cores (TensorFlow's default on this GPU)" if tf32 == {True}
                                    else "float32 (TF32 off, or no GPU)" if tf32 == {False} else "?"),
                 f"- Keras models compiled {'with' if self.args.xla else 'without'} XLA; "
                 f"best of {self.args.rounds} rounds after a warm-up process per workload; "
                 f"{time.perf_counter() - self.started:.0f} s of a {self.args.budget_s:.0f} s budget", ""]
        lines += [f"- {w}: {describe(w, self.args.smoke)}" for w in self.args.workloads]
        lines += ["", "kernel ms/step: the GPU's kernel time per step in 2 profiled steps (without a GPU, the ops' "
                  "time); a ratio is the mode's over float32's (below 1: faster)"]
        lines += ["", "| workload | mode | wall ms/step | ÷ float32 | kernel ms/step | ÷ float32 | peak GiB (timed) "
                  "| peak GiB (process) | loss first → last | amp-rewrite's decision |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---|---|"]
        for workload, by_mode in cells.items():
            base = by_mode.get("float32", {})
            for mode, c in by_mode.items():
                if "failed" in c:
                    lines.append(f"| {workload} | {mode} | failed: {c['failed'][:120]} ||||||||")
                    continue
                lines.append(f"| {workload} | {MODE_LABELS[mode]} | {c['wall_ms']:.2f} | "
                             f"{ratio(c['wall_ms'], base.get('wall_ms'))} | {fmt(c['kernel_ms'])} | "
                             f"{ratio(c['kernel_ms'], base.get('kernel_ms'))} | {gib(c['peak_timed_bytes'])} | "
                             f"{gib(c['peak_bytes'])} | {losses(c['losses'])} | {c['decision']} |")
        if self.skipped:
            lines += ["", "Not run:", *(f"- {line}" for line in self.skipped)]
        failed = [r for r in self.runs if "failed" in r]
        for r in failed:
            lines += ["", f"{r['workload']} {r['mode']} round {r['round']} failed: {r['failed']}", "```",
                      *r.get("stderr_tail", [])[-15:], "```"]
        return lines


MODE_LABELS = {"float32": "float32", "amp": "`ENABLE_AUTO_MP=1`", "grappler": "Grappler `auto_mixed_precision`",
               "policy": "Keras `mixed_float16`", UNJOINED: "`ENABLE_AUTO_MP=1`, gradients one by one"}


def cell(runs: list[dict]) -> dict:
    good = [r for r in runs if "failed" not in r]
    if not good:
        return {"failed": runs[-1]["failed"]}
    fastest = min(good, key=lambda r: r["wall_ms"])
    return {"wall_ms": fastest["wall_ms"], "kernel_ms": min(r["kernel_ms"] for r in good),
            "peak_timed_bytes": fastest["peak_timed_bytes"], "peak_bytes": fastest["peak_bytes"],
            "losses": fastest["losses"], "decision": fastest["decision"], "rounds": len(good),
            "kernel_types": fastest["kernel_types"]}


def decision(lines: list[str]) -> str:
    """amp-rewrite's step decisions in short (its whole lines are in the JSON file)."""
    found = bench_step_decision.decision_lines(lines)
    return "; ".join(bench_step_decision.short(match) for match in found) or "—"


def progress(record: dict) -> str:
    if "failed" in record:
        return f"FAILED: {record['failed']}"
    waited = f", timed from step {record['untimed_steps'] + 1}" if "untimed_steps" in record else ""
    return (f"{record['wall_ms']:.2f} ms/step wall{waited}, {fmt(record['kernel_ms'])} ms/step kernels, "
            f"peak {gib(record['peak_bytes'])} GiB, decision {record['decision']}, process {record['process_s']:.0f} s")


def describe(workload: str, smoke: bool) -> str:
    sizes = SIZES[workload][1 if smoke else 0]
    return ", ".join(f"{name} {value}" for name, value in sizes.items())


def fmt(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def ratio(value, base) -> str:
    return "-" if value is None or not base else f"{value / base:.2f}"


def gib(value) -> str:
    return "-" if value is None else f"{value / 2**30:.2f}"


def losses(values: list[float]) -> str:
    return "-" if not values else f"{values[0]:.4f} → {values[-1]:.4f}"


def machine() -> dict:
    """The GPU (from nvidia-smi), the host CPU, and the versions, without importing TensorFlow here."""
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        gpu = ""
    return {"gpu": gpu or "none seen by nvidia-smi", "cpu": profiling.cpu_line(),
            "versions": f"{bench_step_decision.versions()}; Python {platform.python_version()}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", nargs="?", help="where bench_gpu.json and bench_gpu.md go")
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=(*MODES, UNJOINED))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, help=f"timed steps per process (default {STEPS}; {SMOKE_STEPS} with "
                                                  "--smoke)")
    parser.add_argument("--budget-s", type=float, default=420.0, help="seconds the whole run may take")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, float16 forced: the tool checked on a CPU")
    parser.add_argument("--xla", action="store_true", help="compile the Keras models with XLA")
    parser.add_argument("--no-warmup-process", dest="warmup_process", action="store_false",
                        help="skip each workload's first, uncounted process")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--warmup", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if not args.out_dir:
        parser.error("OUT_DIR is required")
    if args.rounds < 1 or (args.steps is not None and args.steps < 1):
        parser.error("--rounds and --steps must be at least 1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    run = Run(args)
    for workload in args.workloads:
        run.workload(workload)
    run.write()
    print((run.out_dir / "bench_gpu.md").read_text())


if __name__ == "__main__":
    main()
