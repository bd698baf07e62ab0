#!/usr/bin/env bash
# CI: the distributions a release would publish, checked as a user meets them.
#   1. `python -m build` makes the sdist and the wheel; `twine check` reads both.
#   2. A second wheel is built from the unpacked sdist (what pip does with an
#      sdist). It must hold the same files as the wheel built from the checkout,
#      so a file the sdist leaves out fails here.
#   3. LICENSE is in the sdist and in both wheels' .dist-info.
#   4. The wheel built from the sdist goes into a fresh virtualenv with the
#      `cpu` extra (pip takes TensorFlow from its cache or a local index where
#      it has one; nothing is byte-compiled ahead). From another directory it prints its
#      version, runs the README's first command on the example graph the sdist
#      carries (the summary line must be the one the README shows), writes an
#      HTML report, and ENABLE_AUTO_MP=1 patches TensorFlow at start-up.
# Needs `build` and `twine` (the `test` extra) in the Python it runs with; the fresh
# virtualenv of step 4 is made from that Python too (in CI, the newest leg's: 3.13).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_PROGRESS_BAR=off TF_CPP_MIN_LOG_LEVEL=2
work=$(mktemp -d)
shm=
trap 'rm -rf "$work" ${shm:+"$shm"}' EXIT

fail() {
    echo "check_dists: $*" >&2
    exit 1
}

note() {
    echo "check_dists: $* (${SECONDS}s)"
}

wheel_names() {
    python -c 'import sys, zipfile; print("\n".join(sorted(zipfile.ZipFile(sys.argv[1]).namelist())))' "$1"
}

# 1. The sdist and the wheel from the checkout's files (tracked or new, not ignored), copied:
#    a build/ or .egg-info left in the checkout by an earlier build cannot leak into them.
mkdir "$work/checkout"
tools/dev/copy_checkout.sh "$work/checkout"
python -m build --sdist --wheel --outdir "$work/dist" "$work/checkout" >"$work/build.log" 2>&1 ||
    { tail -n 30 "$work/build.log" >&2; fail "building from the checkout failed"; }
sdist=$(echo "$work"/dist/*.tar.gz)
wheel=$(echo "$work"/dist/*.whl)
twine check --strict "$sdist" "$wheel"
note "built and checked $(basename "$sdist") and $(basename "$wheel")"

# 2. A wheel from the unpacked sdist, with the same files.
mkdir "$work/unpacked"
tar -xzf "$sdist" -C "$work/unpacked"
src=$(echo "$work"/unpacked/*)
python -m build --wheel --outdir "$work/from_sdist" "$src" >"$work/build_sdist.log" 2>&1 ||
    { tail -n 30 "$work/build_sdist.log" >&2; fail "building a wheel from $(basename "$sdist") failed"; }
rebuilt=$(echo "$work"/from_sdist/*.whl)
twine check --strict "$rebuilt"
diff <(wheel_names "$wheel") <(wheel_names "$rebuilt") >&2 ||
    fail "the wheel built from the sdist differs from the one built from the checkout (<: checkout only, >: sdist only)"
note "the wheel built from the sdist holds the same files"

# 3. The licence text in every distribution.
tar -tzf "$sdist" | grep -x '[^/]*/LICENSE' >/dev/null || fail "$(basename "$sdist") has no LICENSE"
for whl in "$wheel" "$rebuilt"; do
    wheel_names "$whl" | grep -x '[^/]*\.dist-info/licenses/LICENSE' >/dev/null || fail "$whl has no LICENSE"
done

# 4. The wheel built from the sdist, installed into a fresh virtualenv and used from elsewhere.
# With TensorFlow the virtualenv is 1.5 GB in 20k files: on a busy disk installing it and
# removing it take over a minute each, in memory (/dev/shm, when it has room) seconds.
if [ -d /dev/shm ] && [ -w /dev/shm ] && [ "$(df -Pk /dev/shm | awk 'NR == 2 {print $4}')" -gt 4000000 ]; then
    shm=$(mktemp -d -p /dev/shm)
fi
venv=${shm:-$work}/venv
python -m venv "$venv"
"$venv/bin/python" -m pip install -q --no-compile "$rebuilt[cpu]"
note "installed the wheel built from the sdist into a fresh virtualenv ($("$venv/bin/python" --version))"
run=$work/run
mkdir "$run"
cd "$run"
version=$(basename "$rebuilt" | cut -d- -f2)
[ "$("$venv/bin/amp-rewrite" --version)" = "amp-rewrite $version" ] || fail "--version does not print $version"
expected=$(grep -m 1 -o '`converted [^`]*`' "$repo/README.md" | tr -d '`')
[ -n "$expected" ] || fail "README.md shows no summary line for its first command"
summary=$("$venv/bin/amp-rewrite" "$src/tools/example/mlp.pb" mlp_amp.pb) ||
    fail "the README's first command failed with the wheel built from the sdist"
[ "$summary" = "$expected" ] || fail "the README's first command printed '$summary', the README says '$expected'"
"$venv/bin/amp-rewrite" "$src/tools/example/mlp.pb" mlp_amp2.pb --report report.html -q ||
    fail "writing an HTML report failed"
grep -q '<canvas' report.html || fail "the HTML report has no canvas"
# float16 asked for: `auto` runs float32 on a CPU without fast bfloat16, and patches nothing.
ENABLE_AUTO_MP=1 AMP_REWRITE_TARGET=float16 "$venv/bin/python" -c '
import sys
import tensorflow
import amp_rewrite
from amp_rewrite import runtime
assert amp_rewrite.__file__.startswith(sys.prefix), amp_rewrite.__file__
sys.exit(0 if runtime.current_target() == "float16" else "ENABLE_AUTO_MP=1 did not patch TensorFlow at start-up")'
note "the installed wheel prints its version, rewrites the README's example, reports, and starts up with ENABLE_AUTO_MP=1"
