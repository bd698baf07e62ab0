# Sourced on the device machine, in the project's working tree, once every part is in /tmp/stage
# (tools/dev/gpu/stage.sh):
#
#   . tools/dev/gpu/setup.sh
#
# Installs the wheels into /tmp/site (once per machine: later calls on the same machine skip it), copies
# the package from the working tree beside them with its ENABLE_AUTO_MP start-up file (read through a
# sitecustomize, as an installed package's .pth would be), and exports what every later process needs:
# PYTHONPATH, Keras's backend, unbuffered output, and a CUDA cache big enough to keep what the driver
# compiles (XLA's kernels where ptxas is not used) for the next processes of this machine.
# TensorFlow finds the CUDA libraries mostly itself: its RUNPATH names ../nvidia/*/lib, which is where the
# nvidia-* wheels put them beside it in /tmp/site (cuSOLVER's folder excepted: see below).
AMP_SITE=/tmp/site
if [ ! -f "$AMP_SITE/.installed" ]; then
  if [ ! -f /tmp/stage/manifest.txt ]; then
    echo "setup.sh: /tmp/stage/manifest.txt is missing: stage every part first (the last one holds it)"
    return 1
  fi
  while read -r amp_part amp_size; do
    if [ "$(stat -c %s "/tmp/stage/$amp_part" 2>/dev/null)" != "$amp_size" ]; then
      echo "setup.sh: /tmp/stage/$amp_part is missing or not $amp_size bytes: stage its folder again"
      return 1
    fi
  done < /tmp/stage/manifest.txt
  rm -rf /tmp/wheels "$AMP_SITE" && mkdir -p /tmp/wheels || return 1
  cat /tmp/stage/part* | tar x -C /tmp/wheels || return 1
  python3 tools/dev/gpu/install_wheels.py /tmp/wheels "$AMP_SITE" || return 1
  rm -rf /tmp/wheels /tmp/stage
  touch "$AMP_SITE/.installed"
fi
rm -rf "$AMP_SITE/amp_rewrite" && cp -r amp_rewrite "$AMP_SITE/" && cp -r lists "$AMP_SITE/amp_rewrite/lists" \
  && cp _amp_rewrite_autoload.py _amp_rewrite_import_hook.py amp_rewrite_autoload.pth "$AMP_SITE/" || return 1
printf 'import site\nsite.addsitedir("%s")\n' "$AMP_SITE" > "$AMP_SITE/sitecustomize.py"
# libtensorflow_framework.so.2 opens the CUDA libraries, and its RUNPATH names every nvidia/*/lib folder but
# cuSOLVER's: TensorFlow 2.21 registers no GPU unless that folder is on the loader's path.
export LD_LIBRARY_PATH="$AMP_SITE/nvidia/cusolver/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONPATH="$AMP_SITE" KERAS_BACKEND=tensorflow PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
  CUDA_CACHE_DISABLE=0 CUDA_CACHE_MAXSIZE=4294967296 CUDA_CACHE_PATH=/tmp/cuda-cache
python3 --version
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>&1 | head -4
