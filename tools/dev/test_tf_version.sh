#!/usr/bin/env bash
# Runs the test suite against one TensorFlow release, in a fresh virtualenv.
#
#   tools/dev/test_tf_version.sh VERSION [--floors] [--lint] [--docs] [--python PATH] [-- PYTEST_ARGS...]
#
# VERSION is a minor release of the supported range, 2.16 to 2.21. The package is
# installed (not editable) with its `cpu` and `test` extras and that release of
# tensorflow-cpu, tf-keras and tf-slim beside it (both with --no-deps: they declare the
# full `tensorflow` wheel), so the tests check what `pip install` delivers.
#   --floors  installs the lowest protobuf, numpy and networkx that pyproject.toml
#             accepts, to show those floors are real (use it with the oldest TensorFlow)
#   --lint    runs ruff and mypy (settings in pyproject.toml) before the tests
#   --docs    installs the `docs` extra too and builds the documentation with warnings as
#             errors (the README's build command) before the tests; tests/docs then
#             checks the built site, named in DOCS_SITE_DIR. Sphinx needs Python 3.11+
#   --python PATH  the interpreter the virtualenv is made from (default: python3)
# AMP_TF_VENV names the virtualenv's directory (default: a new temporary directory).
# The exit status is pytest's (ruff's or mypy's first, with --lint; Sphinx's, with --docs).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_PROGRESS_BAR=off TF_CPP_MIN_LOG_LEVEL=2

usage="usage: tools/dev/test_tf_version.sh 2.16|2.17|2.18|2.19|2.20|2.21 [--floors] [--lint] [--docs] [--python PATH] [-- PYTEST_ARGS...]"
version=${1:-}
case "$version" in
    2.16|2.17|2.18|2.19|2.20|2.21) shift ;;
    *) echo "test_tf_version.sh: '$version' is not a supported TensorFlow (2.16 to 2.21); $usage" >&2; exit 2 ;;
esac
floors=0 lint=0 docs=0 python=python3
while [ $# -gt 0 ]; do
    case "$1" in
        --floors) floors=1 ;;
        --lint) lint=1 ;;
        --docs) docs=1 ;;
        --python)
            [ $# -ge 2 ] || { echo "test_tf_version.sh: --python needs a path; $usage" >&2; exit 2; }
            python=$2
            shift ;;
        --) shift; break ;;
        *) echo "test_tf_version.sh: unknown option '$1'; $usage" >&2; exit 2 ;;
    esac
    shift
done
command -v "$python" >/dev/null || { echo "test_tf_version.sh: no Python at '$python'; $usage" >&2; exit 2; }

venv="${AMP_TF_VENV:-$(mktemp -d)/venv-tf$version}"
"$python" -m venv "$venv"
# shellcheck disable=SC1091
. "$venv/bin/activate"
python -m pip install -q --upgrade pip

pins=("tensorflow-cpu==$version.*")
if [ "$floors" = 1 ]; then
    # pyproject's ">=X" floors of the base dependencies, installed as "==X". Read with a
    # pattern, not tomllib, which the oldest Python (3.10) lacks.
    mapfile -t floor_pins < <(python - <<'PY'
import re

with open("pyproject.toml") as file:
    block = re.search(r"^dependencies = \[(.*?)\]", file.read(), re.S | re.M).group(1)
for requirement in re.findall(r'"([^"]+)"', block):
    name, floor = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+)", requirement).groups()
    print(f"{name}=={floor}")
PY
    )
    pins+=("${floor_pins[@]}")
fi
extras=cpu,test
[ "$docs" = 0 ] || extras=cpu,test,docs
# Installed from a copy of the checkout: pip builds in the tree it installs from, and CI runs
# two of these side by side on one checkout.
source_copy="$(mktemp -d)"
tools/dev/copy_checkout.sh "$source_copy"
pip install -q "$source_copy[$extras]" "${pins[@]}"
rm -rf "$source_copy"
pip install -q --no-deps "tf-keras==$version.*" "tf-slim==1.1.0"
python - <<'PY'
import sys

import google.protobuf
import keras
import numpy
import tensorflow as tf

print(f"Python {sys.version.split()[0]}, TensorFlow {tf.__version__}, Keras {keras.__version__}, "
      f"numpy {numpy.__version__}, protobuf {google.protobuf.__version__}")
PY

if [ "$lint" = 1 ]; then
    ruff check --no-cache amp_rewrite/ tests/ tools/ _amp_rewrite_*.py
    # mypy reads the installed libraries' stubs for the Python it runs on, not for
    # pyproject's python_version (3.10): numpy 2.5, which pip gives Python 3.12 and
    # newer, has stubs that read wrongly for 3.10 (`ndarray.max()` without arguments
    # becomes an error). The code's 3.10 compatibility is the oldest leg's to show.
    mypy --cache-dir=/dev/null --python-version "$(python -c 'import sys; print("%d.%d" % sys.version_info[:2])')" \
        amp_rewrite/ _amp_rewrite_*.py
fi
if [ "$docs" = 1 ]; then
    # Built once, here; tests/docs/test_site.py checks this build instead of making its own.
    DOCS_SITE_DIR="$(mktemp -d)/html"
    export DOCS_SITE_DIR
    started=$SECONDS
    sphinx-build -W --keep-going -q -b html docs "$DOCS_SITE_DIR"
    echo "documentation built with warnings as errors in $((SECONDS - started)) s"
else
    unset DOCS_SITE_DIR
fi
pytest -q -p no:cacheprovider "$@"
