#!/usr/bin/env bash
# Writes slimmer copies of the wheels prepare.sh chose, so fewer parts travel to the GPU machine: each part
# is a command of its own, and the machine's minutes are counted.
#
#   bash tools/dev/gpu/slim.sh FROM_FOLDER TO_FOLDER WHEEL...
#
# Left out (nothing the package, its GPU tests or bench_gpu.py runs reads them):
#   - headers (tensorflow/include, nvidia/*/include): nothing is compiled there;
#   - cuSOLVER's multi-GPU library, NVRTC's second ("alt") copy, NVBLAS, cuFFTW and libnvvm (XLA compiles
#     with its own LLVM and ptxas);
# Replaced by empty libraries of the same soname: cuFFT, cuSOLVER and cuSPARSE (780 MB of 1.8 GB left).
#   TensorFlow opens each CUDA library with dlopen when it registers a GPU (none is linked: readelf shows no
#   NEEDED entry for them) and registers none if one is missing; it looks their functions up only when an
#   FFT, linear-algebra solver or sparse op runs, and such a lookup fails as that op's error. No workload
#   here runs one: tf.signal.fft, tf.linalg's solvers and tf.sparse would fail on this install.
# zip -d removes members without decompressing the rest, so a wheel's other files travel byte for byte.
set -euo pipefail
from=${1:?usage: slim.sh FROM_FOLDER TO_FOLDER WHEEL...}
to=$(realpath -m "${2:?usage: slim.sh FROM_FOLDER TO_FOLDER WHEEL...}")
shift 2
dropped=(
  'tensorflow/include/*' 'nvidia/*/include/*'
  'nvidia/cusolver/lib/libcusolverMg.so.*' 'nvidia/cuda_nvrtc/lib/*.alt.so*'
  'nvidia/cublas/lib/libnvblas.so.*' 'nvidia/cufft/lib/libcufftw.so.*' 'nvidia/cuda_nvcc/nvvm/lib64/*'
)
emptied=(nvidia/cufft/lib/libcufft.so.11 nvidia/cusolver/lib/libcusolver.so.11 nvidia/cusparse/lib/libcusparse.so.12)
stubs=$(mktemp -d)
trap 'rm -rf "$stubs"' EXIT
for library in "${emptied[@]}"; do
  mkdir -p "$stubs/$(dirname "$library")"
  printf '' | gcc -shared -x c - -o "$stubs/$library" -Wl,-soname,"$(basename "$library")"
done
rm -rf "$to" && mkdir -p "$to"
for wheel in "$@"; do
  cp "$from/$wheel" "$to/$wheel"
  # zip -d exits 12 when no member matched: most wheels hold none of these.
  zip -q -d "$to/$wheel" "${dropped[@]}" > /dev/null 2>&1 || [ $? -eq 12 ]
  for library in "${emptied[@]}"; do
    if unzip -l "$to/$wheel" "$library" > /dev/null 2>&1; then
      zip -q -d "$to/$wheel" "$library"
      (cd "$stubs" && zip -q "$to/$wheel" "$library")
    fi
  done
done
echo "slimmed $# wheels: $(du -sh "$from" | cut -f1) -> $(du -sh "$to" | cut -f1)"
