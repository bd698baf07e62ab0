"""The device's first process: what TensorFlow sees, and one small run of each kind of GPU work the checks use.

Run by ``tools/dev/gpu/run_checks.sh`` after ``setup.sh``; it exits non-zero
(and says why) when TensorFlow sees no GPU, so nothing after it wastes the
machine's time. Each step prints one line as it ends; a failed step prints
its error and the others still run:

- TensorFlow's version and build (CUDA and cuDNN versions), the GPUs it sees;
- a float32 and a float16 MatMul on the GPU, against NumPy (float32 is TF32
  on tensor cores by default: ``tf.config.experimental.tensor_float_32_execution_enabled``);
- a convolution (cuDNN), a ``jit_compile=True`` function (XLA: ptxas and
  libdevice from ``nvidia/cuda_nvcc``), and one profiled call with its GPU
  kernels (CUPTI).

Being the first process on the machine, it also pays what a first use costs
(the CUDA context, cuBLAS's and cuDNN's start, XLA's first compile) before
anything is timed.
"""

from __future__ import annotations

import os
import time
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")


def step(name: str, run) -> bool:
    began = time.perf_counter()
    try:
        said = run()
    except Exception:  # noqa: BLE001 - every step is tried, each failure said
        print(f"FAILED {name} ({time.perf_counter() - began:.1f} s):\n{traceback.format_exc(limit=3)}", flush=True)
        return False
    print(f"ok {name} ({time.perf_counter() - began:.1f} s): {said}", flush=True)
    return True


def main() -> int:
    import numpy as np
    import tensorflow as tf

    build = tf.sysconfig.get_build_info()
    gpus = tf.config.list_physical_devices("GPU")
    print(f"tensorflow {tf.__version__}, CUDA {build.get('cuda_version')}, cuDNN {build.get('cudnn_version')}, "
          f"GPUs {gpus}", flush=True)
    if not gpus:
        print("TensorFlow sees no GPU: stop here (its log above says which library it could not load)")
        return 1
    details = tf.config.experimental.get_device_details(gpus[0])
    print(f"GPU 0: {details}; TF32 on: {tf.config.experimental.tensor_float_32_execution_enabled()}", flush=True)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((512, 512)).astype(np.float32)

    def matmul(dtype):
        def run():
            with tf.device("/GPU:0"):
                got = tf.matmul(tf.cast(a, dtype), tf.cast(a, dtype))
            error = np.abs(tf.cast(got, tf.float32).numpy() - a @ a).max()
            return f"on {got.device}, largest error {error:.3g}"
        return run

    def convolution():
        with tf.device("/GPU:0"):
            x = tf.random.normal([8, 56, 56, 64], dtype=tf.float16)
            w = tf.random.normal([3, 3, 64, 64], dtype=tf.float16)
            got = tf.nn.conv2d(x, w, 1, "SAME")
        return f"float16 conv on {got.device}, finite: {bool(tf.reduce_all(tf.math.is_finite(got)))}"

    def xla():
        compiled = tf.function(lambda x: tf.nn.gelu(tf.matmul(x, x)) + tf.exp(-x), jit_compile=True)
        got = compiled(tf.constant(a[:64, :64]))
        return f"XLA result on {got.device}, finite: {bool(tf.reduce_all(tf.math.is_finite(got)))}"

    def profile():
        from amp_rewrite.tune.step_stats import traced_op_seconds

        step_function = tf.function(lambda x: tf.matmul(x, x, name="big"))
        x = tf.constant(rng.standard_normal((4096, 4096)).astype(np.float32))
        step_function(x)
        _, seconds = traced_op_seconds(lambda: step_function(x), device_type="GPU")
        return f"kernel seconds per node: {seconds}"

    results = [step("float32 MatMul", matmul(tf.float32)), step("float16 MatMul", matmul(tf.float16)),
               step("cuDNN convolution", convolution), step("XLA jit_compile", xla),
               step("profile with GPU kernels", profile)]
    return 0 if all(results[:3]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
