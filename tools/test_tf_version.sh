#!/usr/bin/env bash
# Runs the test suite against one TensorFlow release, in a fresh virtualenv.
#
#   tools/test_tf_version.sh VERSION [--floors] [--lint] [-- PYTEST_ARGS...]
#
# VERSION is a minor release of the supported range, 2.16 to 2.21. The package is
# installed (not editable) with its `cpu` and `test` extras and that release of
# tensorflow-cpu, tf-keras and tf-slim beside it (both with --no-deps: they declare the
# full `tensorflow` wheel), so the tests check what `pip install` delivers.
#   --floors  installs the lowest protobuf, numpy and networkx that pyproject.toml
#             accepts, to show those floors are real (use it with the oldest TensorFlow)
#   --lint    runs ruff and mypy (settings in pyproject.toml) before the tests
# AMP_TF_VENV names the virtualenv's directory (default: a new temporary directory).
# The exit status is pytest's (ruff's or mypy's first, with --lint).
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_PROGRESS_BAR=off TF_CPP_MIN_LOG_LEVEL=2

usage="usage: tools/test_tf_version.sh 2.16|2.17|2.18|2.19|2.20|2.21 [--floors] [--lint] [-- PYTEST_ARGS...]"
version=${1:-}
case "$version" in
    2.16|2.17|2.18|2.19|2.20|2.21) shift ;;
    *) echo "test_tf_version.sh: '$version' is not a supported TensorFlow (2.16 to 2.21); $usage" >&2; exit 2 ;;
esac
floors=0 lint=0
while [ $# -gt 0 ]; do
    case "$1" in
        --floors) floors=1 ;;
        --lint) lint=1 ;;
        --) shift; break ;;
        *) echo "test_tf_version.sh: unknown option '$1'; $usage" >&2; exit 2 ;;
    esac
    shift
done

venv="${AMP_TF_VENV:-$(mktemp -d)/venv-tf$version}"
python3 -m venv "$venv"
# shellcheck disable=SC1091
. "$venv/bin/activate"
python -m pip install -q --upgrade pip

pins=("tensorflow-cpu==$version.*")
if [ "$floors" = 1 ]; then
    # pyproject's ">=X" floors of the base dependencies, installed as "==X".
    mapfile -t floor_pins < <(python - <<'EOF'
import re
import tomllib

with open("pyproject.toml", "rb") as file:
    for requirement in tomllib.load(file)["project"]["dependencies"]:
        name, floor = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+)", requirement).groups()
        print(f"{name}=={floor}")
EOF
    )
    pins+=("${floor_pins[@]}")
fi
# Installed from a copy of the checkout: pip builds in the tree it installs from, and CI runs
# two of these side by side on one checkout.
source_copy="$(mktemp -d)"
tools/copy_checkout.sh "$source_copy"
pip install -q "$source_copy[cpu,test]" "${pins[@]}"
rm -rf "$source_copy"
pip install -q --no-deps "tf-keras==$version.*" "tf-slim==1.1.0"
python - <<'EOF'
import google.protobuf
import keras
import numpy
import tensorflow as tf

print(f"TensorFlow {tf.__version__}, Keras {keras.__version__}, numpy {numpy.__version__}, "
      f"protobuf {google.protobuf.__version__}")
EOF

if [ "$lint" = 1 ]; then
    ruff check --no-cache amp_rewrite/ tests/ tools/ _amp_rewrite_*.py
    mypy --cache-dir=/dev/null amp_rewrite/ _amp_rewrite_*.py
fi
pytest -q -p no:cacheprovider "$@"
