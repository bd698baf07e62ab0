"""A profiled step's time per node: op events on a CPU, the kernels each op launched on a GPU.

The traces here are written as TensorFlow's profiler writes them: a host
plane whose op events are named ``node:OpType``, and for a GPU a plane
``/device:GPU:0`` whose kernels carry a ``tf_op`` stat naming the op that
launched them (a reference to a stat metadata, or a string). The GPU test
reads a real trace of a large matrix product and checks that its time is
the kernel's, not the microseconds its launch takes on the host.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import tensorflow as tf

from amp_rewrite import tf_internals
from amp_rewrite.tune.step_stats import gpu_kernel_events, node_seconds, op_events, traced_op_seconds

xplane_pb2 = tf_internals.profiler_trace_format()


def host_plane(space, events: dict[str, int]) -> None:
    """A host thread's op events: ``{"node:Op": picoseconds}``."""
    plane = space.planes.add(id=1, name="/host:CPU")
    line = plane.lines.add(id=1, name="tf_executor")
    for index, (name, picos) in enumerate(events.items(), start=1):
        plane.event_metadata[index].CopyFrom(xplane_pb2.XEventMetadata(id=index, name=name,
                                                                       display_name=name.split(":")[1]))
        line.events.add(metadata_id=index, duration_ps=picos)


def gpu_plane(space, kernels: list[tuple[str, str | None, int]], *, as_reference: bool = True) -> None:
    """A GPU's stream of kernels: ``(kernel name, launching op "node:Op" or None, picoseconds)``."""
    plane = space.planes.add(id=2, name="/device:GPU:0")
    plane.stat_metadata[1].CopyFrom(xplane_pb2.XStatMetadata(id=1, name="tf_op"))
    plane.stat_metadata[2].CopyFrom(xplane_pb2.XStatMetadata(id=2, name="correlation_id"))
    line = plane.lines.add(id=7, name="Stream #7(Kernel)")
    for index, (kernel, op, picos) in enumerate(kernels, start=1):
        plane.event_metadata[index].CopyFrom(xplane_pb2.XEventMetadata(id=index, name=kernel))
        event = line.events.add(metadata_id=index, duration_ps=picos)
        event.stats.add(metadata_id=2, uint64_value=index)
        if op is None:
            continue
        if as_reference:
            reference = 100 + index
            plane.stat_metadata[reference].CopyFrom(xplane_pb2.XStatMetadata(id=reference, name=op))
            event.stats.add(metadata_id=1, ref_value=reference)
        else:
            event.stats.add(metadata_id=1, str_value=op)


def trace(tmp_path, space) -> list:
    path = tmp_path / "host.xplane.pb"
    path.write_bytes(space.SerializeToString())
    return [path]


def launched_step(space) -> None:
    """A step whose MatMul launched two kernels, and whose Cast one; the host saw only their launches."""
    host_plane(space, {"call/mm:MatMul": 9_000_000, "call/cast:Cast": 4_000_000})
    gpu_plane(space, [("sm90_xmma_gemm", "call/mm:MatMul", 3_000_000_000),
                      ("splitK_reduce", "call/mm:MatMul", 500_000_000),
                      ("cast_kernel", "call/cast:Cast", 200_000_000),
                      ("memcpy HtoD", None, 100_000_000)])


@pytest.mark.parametrize("as_reference", [True, False])
def test_on_a_gpu_a_node_takes_its_kernels_time_not_its_launch(tmp_path, as_reference):
    space = xplane_pb2.XSpace()
    host_plane(space, {"call/mm:MatMul": 9_000_000, "call/cast:Cast": 4_000_000})
    gpu_plane(space, [("sm90_xmma_gemm", "call/mm:MatMul", 3_000_000_000),
                      ("cast_kernel", "call/cast:Cast", 200_000_000)], as_reference=as_reference)
    assert node_seconds(trace(tmp_path, space), device_type="GPU") == pytest.approx({"call/mm": 3e-3,
                                                                                     "call/cast": 2e-4})


def test_kernels_sum_per_node_and_unnamed_ones_count_for_none(tmp_path):
    space = xplane_pb2.XSpace()
    launched_step(space)
    paths = trace(tmp_path, space)
    assert list(gpu_kernel_events(paths)) == [("call/mm", "MatMul", 3_000_000_000), ("call/mm", "MatMul", 500_000_000),
                                              ("call/cast", "Cast", 200_000_000), (None, None, 100_000_000)]
    assert node_seconds(paths, device_type="GPU") == pytest.approx({"call/mm": 3.5e-3, "call/cast": 2e-4})
    # elsewhere the host's events are the ops' times, as on a CPU
    assert node_seconds(paths, device_type="CPU") == pytest.approx({"call/mm": 9e-6, "call/cast": 4e-6})
    assert sorted(op_events(paths)) == [("call/cast", "Cast", 4_000_000), ("call/mm", "MatMul", 9_000_000)]


def test_a_gpu_trace_without_kernels_or_without_their_ops_gives_the_reason(tmp_path):
    space = xplane_pb2.XSpace()
    host_plane(space, {"call/mm:MatMul": 9_000_000})
    assert node_seconds(trace(tmp_path, space), device_type="GPU") == (
        "TensorFlow's profiler recorded no GPU kernel (it reads them through CUPTI)")
    gpu_plane(space, [("sm90_xmma_gemm", None, 3_000_000_000), ("cast_kernel", None, 200_000_000)])
    assert node_seconds(trace(tmp_path, space), device_type="GPU") == (
        "none of the 2 GPU kernels the profiler recorded names the op that launched it")


def test_a_real_trace_on_this_cpu(tmp_path):
    step = tf.function(lambda x: tf.matmul(x, x, name="big"))
    x = tf.ones([128, 128])
    step(x)
    outputs, seconds = traced_op_seconds(lambda: step(x))
    np.testing.assert_allclose(outputs.numpy(), 128.0)
    assert isinstance(seconds, dict) and seconds.get("big", 0) > 0, seconds
    if not tf.config.list_physical_devices("GPU"):  # asked for a GPU's kernels, a CPU's trace has none
        _, why = traced_op_seconds(lambda: step(x), device_type="GPU")
        assert why == "TensorFlow's profiler recorded no GPU kernel (it reads them through CUPTI)"


@pytest.mark.gpu
def test_gpu_profile_gives_a_product_its_kernels_time():
    """8192 x 8192 products take milliseconds on the GPU; launching them, microseconds on the host."""
    a = tf.constant(np.random.default_rng(0).uniform(-1, 1, (8192, 8192)).astype(np.float32))
    step = tf.function(lambda: tf.reduce_sum(tf.matmul(tf.matmul(a, a, name="big"), a, name="bigger")))
    step()
    tf.test.experimental.sync_devices()
    began = time.perf_counter()
    step()
    tf.test.experimental.sync_devices()
    wall = time.perf_counter() - began
    _, seconds = traced_op_seconds(step, device_type="GPU")
    assert isinstance(seconds, dict), seconds
    products = sum(t for node, t in seconds.items() if node.split("/")[-1] in ("big", "bigger"))
    assert products >= 0.5 * wall, (seconds, wall)
    # Read as a CPU's trace (op events on the host), the same step gives the products their launches at most:
    # TensorFlow 2.21 on an H200 writes no host op event for a GPU op at all ("the profile holds no op times").
    _, host = traced_op_seconds(step, device_type="CPU")
    launches = sum(t for node, t in host.items() if node.split("/")[-1] in ("big", "bigger")) if isinstance(
        host, dict) else 0.0
    assert launches < 0.2 * products, (host, seconds)
