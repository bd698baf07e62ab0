"""Each node's op time in one profiled step: what a profile of a step says each node cost.

Two sources. A TF1 session's ``RunMetadata`` step stats
(:func:`step_stats_ops`), which the runtime's profile table
(:mod:`amp_rewrite.runtime.profile`) prints. And the trace TensorFlow's
profiler writes (``*.xplane.pb``, :func:`traced_op_seconds`), from which the
step trials' mixed bodies (:mod:`amp_rewrite.runtime.tf2.step_mixing`) and
``--tune`` on a GPU (:mod:`amp_rewrite.tune.graph_sessions`) choose which half
regions stay half.

What a node's time is depends on the device. On a CPU the host thread that
runs an op runs its kernel: the op's event on that thread (named
``node:OpType``, :func:`op_events`) is its time. On a GPU the same event only
*launches* the kernels, a few microseconds each, whatever they then cost:
the time is on the GPU's own plane (``/device:GPU:0``), where CUPTI records
every kernel and copy with a ``tf_op`` stat naming the op whose launch it
was (:func:`gpu_kernel_events`). So on a GPU a node's time is its kernels'
(the device synchronised before the profiler stops, so that every kernel of
the step is in the trace), and where the trace holds no kernel named after
an op, no times are given, only why: launch times would be a guess.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from amp_rewrite import tf_internals
from amp_rewrite.errors import first_line

#: DataType enum → the precision a profile names.
PRECISIONS = {1: "float32", 19: "float16", 14: "bfloat16", 2: "float64"}
#: The planes of a profiler trace that hold a GPU's kernels: ``/device:GPU:0``, ``/device:GPU:1``, ...
GPU_PLANE = "/device:GPU:"
#: The stat of a kernel on a GPU plane that names the TensorFlow op (``node:OpType``) which launched it.
TF_OP_STAT = "tf_op"


@dataclass(frozen=True)
class OpTime:
    """One node's time in the profiled step (summed over its runs), its op and its output precision."""

    node: str
    op: str
    micros: float
    precision: str


def step_stats_ops(step_stats) -> list[OpTime]:
    """Per node: its op (from the timeline label), summed op time and first output's dtype."""
    found: dict[str, list] = {}
    for device in step_stats.dev_stats:
        for stats in device.node_stats:
            if stats.node_name in ("_SOURCE", "_SINK") or "(" not in stats.timeline_label:
                continue
            op = stats.timeline_label.split(" = ", 1)[-1].split("(", 1)[0].strip()
            dtype = stats.output[0].tensor_description.dtype if stats.output else 0
            entry = found.setdefault(stats.node_name, [op, 0.0, PRECISIONS.get(dtype, "other" if dtype else "-")])
            entry[1] += stats.op_end_rel_micros - stats.op_start_rel_micros
    return [OpTime(node, op, micros, precision) for node, (op, micros, precision) in found.items()]


def traced_op_seconds(call: Callable[[], Any], *, device_type: str = "CPU") -> tuple[Any, dict[str, float] | str]:
    """Runs ``call`` once under TensorFlow's profiler: what it returned, and each executed node's op seconds.

    Args:
        call: one step.
        device_type: where the step's ops run: ``GPU`` reads their kernels' times, anything else their op events.

    Nodes are named as the trace names them (behind the calls they were
    inlined through). Where no times could be had (another profile is
    running, the trace cannot be read, a GPU trace names no op beside its
    kernels), ``call`` still runs once and a short reason comes in place of
    the times.
    """
    import tensorflow as tf

    with tempfile.TemporaryDirectory(prefix="amp_rewrite_step_") as logdir:
        try:
            tf.profiler.experimental.start(logdir)
        except Exception as exc:  # noqa: BLE001 - another profiler may be running
            return call(), f"no profile was taken: {first_line(exc)}"
        try:
            outputs = call()
            if device_type == "GPU" and tf.executing_eagerly():  # (a Session.run returns once its step is done)
                tf.test.experimental.sync_devices()  # the kernels still queued belong to this step
        finally:
            tf.profiler.experimental.stop()
        try:
            return outputs, node_seconds(list(Path(logdir).rglob("*.xplane.pb")), device_type=device_type)
        except Exception as exc:  # noqa: BLE001 - a trace this TensorFlow writes otherwise
            return outputs, f"the profile could not be read: {first_line(exc, with_type=True)}"


def node_seconds(paths: Iterable[Path], *, device_type: str = "CPU") -> dict[str, float] | str:
    """Each node's seconds in the trace files (its kernels' on a GPU, its op events' elsewhere), or why none."""
    seconds: dict[str, float] = {}
    if device_type != "GPU":
        for node, _, picos in op_events(paths):
            seconds[node] = seconds.get(node, 0.0) + picos / 1e12
        return seconds or "the profile holds no op times"
    kernels = 0
    for launcher, _, picos in gpu_kernel_events(paths):
        kernels += 1
        if launcher:
            seconds[launcher] = seconds.get(launcher, 0.0) + picos / 1e12
    if not kernels:
        return "TensorFlow's profiler recorded no GPU kernel (it reads them through CUPTI)"
    return seconds or f"none of the {kernels} GPU kernels the profiler recorded names the op that launched it"


def op_events(paths: Iterable[Path]) -> Iterator[tuple[str, str, int]]:
    """(node, op type, duration in picoseconds) of every op event (named ``node:Op``) in the trace files."""
    for space in _spaces(paths):
        for plane in space.planes:
            for line in plane.lines:
                for event in line.events:
                    meta = plane.event_metadata[event.metadata_id]
                    op = meta.display_name
                    if op and meta.name.endswith(":" + op):
                        yield meta.name[:-len(op) - 1], op, event.duration_ps


def gpu_kernel_events(paths: Iterable[Path]) -> Iterator[tuple[str | None, str | None, int]]:
    """(node that launched it and its op type, None where no op is named; picoseconds) of each GPU plane event.

    Kernels, copies and memsets alike: CUPTI's collector puts each on its
    GPU's plane, one line per stream, with the ``tf_op`` stat naming the
    outermost TensorFlow op open when it was launched (``node:OpType``).
    """
    for space in _spaces(paths):
        for plane in space.planes:
            if not plane.name.startswith(GPU_PLANE):
                continue
            tf_op = next((key for key, meta in plane.stat_metadata.items() if meta.name == TF_OP_STAT), None)
            for line in plane.lines:
                for event in line.events:
                    yield (*_launched_by(plane, event, tf_op), event.duration_ps)


def _launched_by(plane, event, tf_op: int | None) -> tuple[str | None, str | None]:
    """The node and op type the event's ``tf_op`` stat names (``node:OpType``), or ``(None, None)``."""
    text = ""
    for stat in event.stats if tf_op is not None else ():
        if stat.metadata_id == tf_op:
            kind = stat.WhichOneof("value")
            text = stat.str_value if kind == "str_value" else \
                plane.stat_metadata[stat.ref_value].name if kind == "ref_value" else ""
            break
    node, _, op = text.partition(":")
    return (node, op or None) if node else (None, None)


def _spaces(paths: Iterable[Path]):
    xplane_pb2 = tf_internals.profiler_trace_format()
    for path in paths:
        space = xplane_pb2.XSpace()
        space.ParseFromString(Path(path).read_bytes())
        yield space
