"""keras-io's weather-forecasting example (an LSTM on the Jena climate data), unmodified, with and without amp-rewrite.

The example is ``examples/timeseries/timeseries_weather_forecasting.py`` of
keras-team/keras-io: an ``LSTM(32)`` regressor trained with ``fit`` (batch 256,
MSE, ``EarlyStopping`` and ``ModelCheckpoint`` on ``val_loss``). This tool does
not carry it: pass the path of a copy taken from keras-io. It is run as it is,
in a subprocess per run, under these modes:

- ``float32``: none of amp-rewrite's variables;
- ``auto``: ``ENABLE_AUTO_MP=1`` (float32 on a CPU without fast half kernels);
- ``bfloat16``: ``ENABLE_AUTO_MP=1 AMP_REWRITE_TARGET=bfloat16``;
- ``bfloat16+tune``: the same with ``AMP_REWRITE_TUNE=1`` (now the step
  decision, as unset), and ``AMP_REWRITE_TUNE_CACHE`` a fresh directory per
  run, so every tuned run measures.

Data. The script downloads ``jena_climate_2009_2016.csv.zip`` with
``keras.utils.get_file`` and reads the CSV it extracts into its working
directory. There is no download here: the tool writes a synthetic file with the
real one's columns, in the real one's order and number format (``--rows``
rows, 10-minute steps from 01.01.2009 00:10:00, daily and seasonal cycles plus
seeded weather noise, the humidity columns derived from temperature and
pressure as the station's are), zipped with fixed timestamps, so the same
arguments give the same bytes. It goes where ``get_file`` finds a cached file
and does not download, ``$KERAS_HOME/datasets``, with ``KERAS_HOME`` in the
tool's own directory, so a real cached copy in the user's ``~/.keras`` is
neither used nor overwritten. Each run has its own working directory (the CSV
and the checkpoint are written there), and ``MPLBACKEND=Agg``, since the script
calls ``plt.show()``.

Keras. The current example (last modified 2023/11/22) imports ``keras`` and is
written for Keras 3 (a ``.weights.h5`` checkpoint); it runs with the Keras that
``import keras`` gives (``TF_USE_LEGACY_KERAS`` is removed from the runs'
environment; it would change only ``tf.keras``). Older revisions (``from
tensorflow import keras``) do not run with current libraries: they call
``DataFrame.corr()`` on a frame holding the date column, which pandas 2
refuses, and Keras 3 refuses their ``model_checkpoint.h5`` weights file.

Timing. The time of a training step is taken from the progress bar, with no
code added to the script: the tool reads the script's stdout as it is written
and stamps each progress update (``k/N ...``) with the time it arrived. Keras
writes one after each training batch (at most one per 0.05 s); an epoch's step
time is the time from the update after batch 1 to the last update before the
epoch's closing line (the one carrying ``val_loss``), divided by the batches
between them. That leaves out the first batch (tracing, the rewrite),
validation and the callbacks, and it needs no more of
the progress bar's format than ``k/N`` at the start of an update. Keras 3's own
``ms/step`` of the last training update, computed the same way in-process but
rounded to whole milliseconds, is reported beside it as a check (the figure on
the closing line also counts validation, and is not used). A run's step time
is the median over its epochs; a mode's is the best (lowest) over the rounds.
The modes run in rounds, in an order rotated each round, so another job
loading the machine slows all of them alike; with fewer rounds than modes,
some mode never runs first in a round, so on a machine whose load changes
within a round compare modes by CPU time too. The CPU time of a step is
taken the same way as its wall time: the run's CPU seconds (all its threads,
from ``/proc/PID/stat``, on Linux) read as each update arrives. Another job
on the machine lengthens a step's wall time much more than its CPU time.
The CPU's model and half-precision flags head the report.

Every mode that sets ``ENABLE_AUTO_MP`` gets a fresh tuning cache per run
(``AMP_REWRITE_TUNE_CACHE`` in the run's directory), so every run of the step
decision measures, and no run reads another's verdicts. With ``--before
PYTHON`` each such mode gets a twin, ``MODE (before)``: the same run under
another interpreter, one whose installed amp-rewrite is another version,
taking its turn in the rotated order like any mode.

Per mode the tool also reports each run's per-epoch ``loss`` and ``val_loss``
(the closing line's values), the number of epochs (``EarlyStopping`` may end
before the script's 10), and the stderr lines amp-rewrite wrote (what was
rewritten), counted over the rounds with their timings dropped. Under the half
modes each rewrite is dumped (``AMP_REWRITE_DUMP_DIR``), and for each dumped
graph that changed the tool counts the nodes put in half precision (type
attributes half after the rewrite and not before, the runtime's "converted"
count) and the Casts inserted, in all and in each loop body (``while_body``
functions, tf_keras's ``standard_lstm``). ``--no-dump`` turns that off. A run
that fails reports the last line of its stderr. Each run's stdout and stderr
are saved in its directory, which ``--keep`` keeps.

Usage::

    PYTHONPATH=. python tools/benchmarks/bench_weather_forecast.py PATH/timeseries_weather_forecasting.py \\
        [--rounds 3] [--modes float32,auto,bfloat16,bfloat16+tune] [--rows 30000] [--seed 0] \\
        [--no-dump] [--keep DIR] [--timeout 3600] [--before /path/to/old/python]
"""

from __future__ import annotations

import argparse
import codecs
import datetime
import hashlib
import io
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from profiling import cpu_line

COLUMNS = ("Date Time", "p (mbar)", "T (degC)", "Tpot (K)", "Tdew (degC)", "rh (%)", "VPmax (mbar)",
           "VPact (mbar)", "VPdef (mbar)", "sh (g/kg)", "H2OC (mmol/mol)", "rho (g/m**3)", "wv (m/s)",
           "max. wv (m/s)", "wd (deg)")
ZIP_NAME = "jena_climate_2009_2016.csv.zip"
CSV_NAME = "jena_climate_2009_2016.csv"
FIRST_TIME = datetime.datetime(2009, 1, 1, 0, 10)
STEPS_PER_DAY = 144

TARGET = "AMP_REWRITE_TARGET"
MODES = {
    "float32": {},
    "auto": {"ENABLE_AUTO_MP": "1"},
    "bfloat16": {"ENABLE_AUTO_MP": "1", TARGET: "bfloat16"},
    "bfloat16+tune": {"ENABLE_AUTO_MP": "1", TARGET: "bfloat16", "AMP_REWRITE_TUNE": "1"},
}
BEFORE = " (before)"  # a mode's twin under --before's interpreter
HALF_TYPES = {"bfloat16": 14, "float16": 19}  # DataType enum values
LOOP_FUNCTION = re.compile(r"while_body|standard_lstm|_body_")

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
EPOCH_LINE = re.compile(r"^Epoch (\d+)/(\d+)$")
PROGRESS = re.compile(r"^(\d+)/(\d+)\b")
KERAS_STEP = re.compile(r"\b(\d+)(us|ms|s)/step\b")
METRIC = re.compile(r"\b(\w+): (-?(?:\d+\.\d+(?:e[-+]\d+)?|nan|inf))")
UNIT_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3}
TIMINGS = re.compile(r" \(rewrite [\d.]+ s, reload [\d.]+ s\)")  # dropped when the runs' lines are counted


# ---------------------------------------------------------------- the data

def ar1(rng: np.random.Generator, n: int, keep: float) -> np.ndarray:
    """A seeded AR(1) series of unit variance whose correlation decays by ``keep`` per step."""
    shocks = rng.standard_normal(n) * np.sqrt(1.0 - keep * keep)
    out = np.empty(n)
    out[0] = rng.standard_normal()
    for i in range(1, n):
        out[i] = keep * out[i - 1] + shocks[i]
    return out


def weather(rows: int, seed: int) -> list[np.ndarray]:
    """The 14 numeric columns: smooth daily and seasonal cycles, slow weather, and sensor noise."""
    rng = np.random.default_rng(seed)
    step = np.arange(rows)
    day = (step + 1) / STEPS_PER_DAY  # days since 01.01.2009 00:00
    season = -np.cos(2 * np.pi * (day - 15) / 365.25)  # -1 mid-January, +1 mid-July
    daily = -np.cos(2 * np.pi * (day % 1 - 3 / 24))  # coldest at 03:00, warmest at 15:00
    t = 9.0 + 10.0 * season + (3.0 + 1.5 * season) * daily + 4.0 * ar1(rng, rows, 0.9995)
    t += 0.15 * rng.standard_normal(rows)
    p = 989.0 + 7.0 * ar1(rng, rows, 0.9993) + 0.05 * rng.standard_normal(rows)
    rh = np.clip(78.0 - 14.0 * daily - 6.0 * season + 9.0 * ar1(rng, rows, 0.998)
                 + 0.8 * rng.standard_normal(rows), 12.0, 100.0)
    vp_max = 6.1078 * np.exp(17.27 * t / (t + 237.3))  # Magnus formula, mbar
    vp_act = vp_max * rh / 100.0
    dew_log = np.log(vp_act / 6.1078)
    wind = np.clip(1.8 + 1.3 * ar1(rng, rows, 0.995) + 0.4 * np.abs(rng.standard_normal(rows)), 0.0, None)
    return [p, t, (t + 273.15) * (1000.0 / p) ** 0.286, 237.3 * dew_log / (17.27 - dew_log), rh, vp_max, vp_act,
            vp_max - vp_act, 622.0 * vp_act / (p - 0.378 * vp_act), 1000.0 * vp_act / p,
            1e5 * p / (287.05 * (t + 273.15)), wind, wind * (1.5 + 0.3 * np.abs(rng.standard_normal(rows))),
            (210.0 + 70.0 * ar1(rng, rows, 0.998) + 15.0 * rng.standard_normal(rows)) % 360.0]


def csv_text(rows: int, seed: int) -> str:
    """The CSV, formatted as the real file is (``01.01.2009 00:10:00,996.52,-8.02,265.40,...``)."""
    columns = [np.round(values, 2) + 0.0 for values in weather(rows, seed)]  # + 0.0: no "-0.00"
    lines = [",".join(f'"{name}"' for name in COLUMNS)]
    for i in range(rows):
        stamp = (FIRST_TIME + datetime.timedelta(minutes=10 * i)).strftime("%d.%m.%Y %H:%M:%S")
        lines.append(",".join([stamp] + [f"{column[i]:.2f}" for column in columns]))
    return "\n".join(lines) + "\n"


def write_dataset(home: Path, rows: int, seed: int) -> tuple[Path, str]:
    """Writes the zip into ``home/.keras/datasets`` (``KERAS_HOME`` is ``home/.keras``); returns it and its sha256."""
    info = zipfile.ZipInfo(CSV_NAME, date_time=(2017, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_DEFLATED
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(info, csv_text(rows, seed))
    target = home / ".keras" / "datasets" / ZIP_NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(buffer.getvalue())
    return target, hashlib.sha256(buffer.getvalue()).hexdigest()


# ---------------------------------------------------------------- one run

# When a piece of stdout arrived: (wall seconds, the run's CPU seconds or None).
Stamp = tuple[float, float | None]
NO_STAMP: Stamp = (0.0, None)


@dataclass
class Epoch:
    step_ms: float | None
    keras_ms: float | None
    metrics: dict[str, float]
    cpu_ms: float | None = None


@dataclass
class Run:
    mode: str
    round: int
    returncode: int
    seconds: float
    epochs: list[Epoch] = field(default_factory=list)
    amp_lines: list[str] = field(default_factory=list)
    last_stderr: str = ""
    half_nodes: list[str] = field(default_factory=list)

    @property
    def step_ms(self) -> float | None:
        times = [e.step_ms for e in self.epochs if e.step_ms is not None]
        return statistics.median(times) if times else None

    @property
    def cpu_ms(self) -> float | None:
        times = [e.cpu_ms for e in self.epochs if e.cpu_ms is not None]
        return statistics.median(times) if times else None

    @property
    def keras_ms(self) -> float | None:
        times = [e.keras_ms for e in self.epochs if e.keras_ms is not None]
        return statistics.median(times) if times else None

    @property
    def best_val_loss(self) -> float | None:
        losses = [e.metrics["val_loss"] for e in self.epochs if "val_loss" in e.metrics]
        return min(losses) if losses else None


def clean_environment() -> dict:
    """This process's environment without a variable amp-rewrite reads (each mode sets its own)."""
    from amp_rewrite.environment import read_by_package

    ours = set(read_by_package(os.environ))
    return {k: v for k, v in os.environ.items() if k not in ours and k != "TF_USE_LEGACY_KERAS"}


def run_environment(mode: str, home: Path, workdir: Path, dump: bool) -> dict:
    env = clean_environment()
    env.update(MODES[mode], KERAS_HOME=str(home / ".keras"), MPLBACKEND="Agg", PYTHONUNBUFFERED="1",
               MPLCONFIGDIR=str(home / "matplotlib"))
    if MODES[mode].get("ENABLE_AUTO_MP"):
        env["AMP_REWRITE_TUNE_CACHE"] = str(workdir / "tune-cache")
    if dump and TARGET in MODES[mode]:
        env["AMP_REWRITE_DUMP_DIR"] = str(workdir / "dump")
    return env


def stream(command: list[str], env: dict, cwd: Path, timeout: float) -> tuple[int, list[tuple[Stamp, bytes]], str]:
    """Runs ``command``; returns its exit code, its stdout as (stamp, bytes) chunks, and its stderr.

    A chunk's stamp is when it arrived and the CPU seconds the run had used by then.
    """
    proc = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    errors: list[bytes] = []
    reader = threading.Thread(target=lambda: errors.append(proc.stderr.read()), daemon=True)
    reader.start()
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    chunks = []
    try:
        while chunk := os.read(proc.stdout.fileno(), 1 << 16):
            chunks.append(((time.perf_counter(), cpu_seconds(proc.pid)), chunk))
        proc.wait()
    finally:
        timer.cancel()
    reader.join()
    return proc.returncode, chunks, b"".join(errors).decode("utf-8", "replace")


def cpu_seconds(pid: int) -> float | None:
    """The CPU seconds process ``pid`` has used so far, all threads, user and system; None off Linux."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def segments(chunks: list[tuple[Stamp, bytes]]) -> list[tuple[Stamp, str]]:
    """The stdout split at ``\\r`` and ``\\n``, each piece with the stamp (wall, CPU) of its first character."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    pieces: list[tuple[Stamp, str]] = []
    text, start = "", NO_STAMP
    for stamp, chunk in chunks:
        for piece in re.split(r"([\r\n])", decoder.decode(chunk)):
            if piece in ("\r", "\n"):
                pieces.append((start, text))
                text = ""
            elif piece:
                start = start if text else stamp
                text += piece
    pieces.append((start, text))
    cleaned = [(stamp, ANSI.sub("", text).replace("\b", "").strip()) for stamp, text in pieces]
    return [(stamp, text) for stamp, text in cleaned if text]


def close_epoch(progress: list[tuple[int, Stamp, str]], closing: str) -> Epoch:
    """An epoch from its training updates (batch, stamp, text) and its closing line."""
    step_ms = keras_ms = cpu_ms = None
    if len(progress) >= 2 and progress[-1][0] > progress[0][0]:
        (first, (t0, c0), _), (last, (t1, c1), _) = progress[0], progress[-1]
        step_ms = 1000.0 * (t1 - t0) / (last - first)
        if c0 is not None and c1 is not None:
            cpu_ms = 1000.0 * (c1 - c0) / (last - first)
    if progress and (found := KERAS_STEP.search(progress[-1][2])):
        keras_ms = int(found.group(1)) * UNIT_MS[found.group(2)]
    metrics = {name: float(value) for name, value in METRIC.findall(closing)}
    return Epoch(step_ms, keras_ms, metrics, cpu_ms)


def parse_epochs(pieces: list[tuple[float, str]]) -> list[Epoch]:
    """The epochs of ``fit``: between an ``Epoch k/N`` line and the progress line that carries ``val_loss``."""
    epochs, progress, inside = [], [], False
    for stamp, text in pieces:
        if EPOCH_LINE.match(text):
            progress, inside = [], True
        elif inside and (found := PROGRESS.match(text)):
            if "val_loss" in text:
                epochs.append(close_epoch(progress, text))
                inside = False
            else:
                progress.append((int(found.group(1)), stamp, text))
    return epochs


def amp_lines(stderr: str) -> list[str]:
    """amp-rewrite's lines, from ``amp-rewrite`` on (the logger's prefix dropped)."""
    return ["amp-rewrite" + line.split("amp-rewrite", 1)[1] for line in stderr.splitlines() if "amp-rewrite" in line]


def last_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def run_once(script: Path, mode: str, round_index: int, home: Path, args) -> Run:
    """One run of the script in ``mode``; a ``(before)`` twin runs under ``args.before``."""
    twin = mode.endswith(BEFORE)
    workdir = Path(tempfile.mkdtemp(prefix=f"{mode.replace(' ', '_')}-{round_index}-", dir=home))
    env = run_environment(mode.removesuffix(BEFORE), home, workdir, not args.no_dump)
    began = time.perf_counter()
    python = args.before if twin else sys.executable
    code, chunks, stderr = stream([python, str(script)], env, workdir, args.timeout)
    (workdir / "stdout.txt").write_bytes(b"".join(chunk for _, chunk in chunks))
    (workdir / "stderr.txt").write_text(stderr)
    run = Run(mode, round_index, code, time.perf_counter() - began, parse_epochs(segments(chunks)),
              amp_lines(stderr), last_line(stderr) if code else "")
    if (workdir / "dump").is_dir():
        run.half_nodes = count_half_nodes(workdir / "dump")
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return run


# ---------------------------------------------------------------- half nodes in the dumps

def half_types(node) -> bool:
    """Whether a node's type attributes (``T``, ``dtype``, ``DstT``, lists) name a half type."""
    for value in node.attr.values():
        if value.type in HALF_TYPES.values() or any(t in HALF_TYPES.values() for t in value.list.type):
            return True
    return False


def half_count(before_nodes, after_nodes) -> tuple[int, int, int]:
    """(nodes put in half precision, Casts inserted, nodes before the rewrite) of one graph or function body."""
    before = {node.name: node for node in before_nodes}
    half = sum(1 for node in after_nodes
               if node.name in before and half_types(node) and not half_types(before[node.name]))
    casts = sum(1 for node in after_nodes if node.name not in before and node.op == "Cast")
    return half, casts, len(before)


def entry_name(graph_def) -> str:
    """The tf.function a dumped graph is: the function its main graph calls (``one_step_on_data``)."""
    called = [node.attr["f"].func.name for node in graph_def.node if "f" in node.attr]
    return re.sub(r"^__inference_|_\d+$", "", called[0]) if called else "?"


def describe_rewrite(before, after) -> str | None:
    """One dumped rewrite: its totals and its loop bodies, or None when it changed nothing."""
    originals = {function.signature.name: function for function in before.library.function}
    half, casts, total = half_count(before.node, after.node)
    loops = []
    for function in after.library.function:
        name = function.signature.name
        source = originals.get(name) or originals.get(name.removesuffix("_amp"))
        counts = half_count(source.node_def, function.node_def) if source else (0, 0, 0)
        half, casts, total = half + counts[0], casts + counts[1], total + counts[2]
        if LOOP_FUNCTION.search(name) and (counts[0] or counts[1]):
            loops.append(f"{name} {counts[0]}/{counts[2]} (+{counts[1]} casts)")
    if not half and not casts:
        return None
    return (f"{entry_name(before)}: {half}/{total} nodes half, {casts} casts; loop bodies: "
            + ("; ".join(loops) or "none changed"))


def count_half_nodes(dump_dir: Path) -> list[str]:
    """One line per dumped rewrite that changed something, oldest first (its main graph and functions, together)."""
    from amp_rewrite.graph.io import load_graph_def

    lines = []
    for after_path in sorted(dump_dir.glob("graph_*_after.pb"), key=lambda path: path.stat().st_mtime_ns):
        before = load_graph_def(str(after_path).replace("_after.pb", "_before.pb"))
        if line := describe_rewrite(before, load_graph_def(after_path)):
            lines.append(line)
    return lines


# ---------------------------------------------------------------- the report

def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def report(runs: list[Run], modes: list[str]) -> None:
    by_mode = {mode: [run for run in runs if run.mode == mode] for mode in modes}
    timed = {mode: [r.step_ms for r in group if r.step_ms is not None and r.returncode == 0]
             for mode, group in by_mode.items()}
    base = min(timed.get("float32") or [0.0]) or None
    print(f"\n| mode | ms/step, best of {max(len(g) for g in by_mode.values())} | vs float32 | all rounds (ms) "
          "| CPU ms/step, all rounds | Keras's ms/step | best val_loss per round | epochs per round | failed |")
    print("|---|---:|---:|---|---|---:|---|---|---:|")
    for mode, group in by_mode.items():
        best = min(timed[mode]) if timed[mode] else None
        best_run = next((r for r in group if r.step_ms == best), None)
        print(f"| {mode} | {fmt(best, '.1f')} | {fmt(base / best if base and best else None, '.2f')}x "
              f"| {', '.join(fmt(r.step_ms, '.1f') for r in group)} | {', '.join(fmt(r.cpu_ms, '.1f') for r in group)} "
              f"| {fmt(best_run and best_run.keras_ms, '.0f')} "
              f"| {', '.join(fmt(r.best_val_loss, '.4f') for r in group)} "
              f"| {', '.join(str(len(r.epochs)) for r in group)} | {sum(r.returncode != 0 for r in group)} |")
    for mode, group in by_mode.items():
        print(f"\n{mode}:")
        for run in group:
            print(describe(run))
        for line, count in Counter(TIMINGS.sub("", line) for run in group for line in run.amp_lines).items():
            print(f"  [{count}x] {line}")


def describe(run: Run) -> str:
    head = f"  round {run.round + 1}: {run.seconds:.0f} s"
    if run.returncode != 0:
        return f"{head}, FAILED (exit {run.returncode}): {run.last_stderr}"
    losses = " ".join(f"{e.metrics.get('loss', float('nan')):.4f}/{e.metrics.get('val_loss', float('nan')):.4f}"
                      for e in run.epochs)
    steps = " ".join(fmt(e.step_ms, ".0f") for e in run.epochs)
    cpus = " ".join(fmt(e.cpu_ms, ".0f") for e in run.epochs)
    text = (f"{head}, {len(run.epochs)} epochs; loss/val_loss per epoch: {losses}; ms/step per epoch: {steps}; "
            f"CPU ms/step per epoch: {cpus}")
    return "\n".join([text] + [f"    half nodes: {line}" for line in run.half_nodes])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("script", type=Path,
                        help="path to keras-io's examples/timeseries/timeseries_weather_forecasting.py")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--rows", type=int, default=30000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-dump", action="store_true", help="do not dump the rewrites and count half nodes")
    parser.add_argument("--keep", type=Path, help="keep the data and each run's directory here")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds before a run is killed")
    parser.add_argument("--before", help="an interpreter whose amp-rewrite is another version: each "
                                         "ENABLE_AUTO_MP mode gets a twin run under it")
    args = parser.parse_args()
    modes = args.modes.split(",")
    if unknown := [m for m in modes if m not in MODES]:
        parser.error(f"unknown modes {unknown}; known: {', '.join(MODES)}")
    if args.before:
        modes = [twin for mode in modes
                 for twin in (mode, *([mode + BEFORE] if MODES[mode].get("ENABLE_AUTO_MP") else []))]
    script = args.script.resolve()
    if not script.is_file():
        parser.error(f"{script}: no such file")
    home = Path(tempfile.mkdtemp(prefix="weather-")) if args.keep is None else args.keep.resolve()
    home.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    try:
        zip_path, digest = write_dataset(home, args.rows, args.seed)
        print(f"CPU: {cpu_line()}; load average (1, 5, 15 min) at the start: "
              + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
        if args.before:
            print(f"(before) rows: {args.before}")
        print(f"script: {script} (sha256 {hashlib.sha256(script.read_bytes()).hexdigest()[:16]})")
        print(f"data: {zip_path} ({args.rows} rows, seed {args.seed}, sha256 {digest[:16]})")
        runs = []
        for round_index in range(args.rounds):
            shift = round_index % len(modes)
            for mode in modes[shift:] + modes[:shift]:
                runs.append(run_once(script, mode, round_index, home, args))
                print(f"round {round_index + 1} {mode}: {fmt(runs[-1].step_ms, '.1f')} ms/step, "
                      f"{len(runs[-1].epochs)} epochs, exit {runs[-1].returncode}", file=sys.stderr, flush=True)
        report(runs, modes)
        print(f"\ntotal: {time.perf_counter() - began:.0f} s; load average at the end: "
              + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    finally:
        if args.keep is None:
            shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
