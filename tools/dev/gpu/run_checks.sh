#!/usr/bin/env bash
# The GPU machine's prepared checks, run in the project's working tree once every part of .device-gpu/ is
# staged (tools/dev/gpu/stage.sh). Everything goes under $OUT as it is written, so a command cut short
# still brings back what it did; a short summary goes to stdout.
#
#   bash tools/dev/gpu/run_checks.sh [PHASE] [SECONDS] [BENCH_ARGS...]
#
# PHASE:
#   setup  installs TensorFlow (tools/dev/gpu/setup.sh; once per machine), then the machine's first
#          process (tools/dev/gpu/check_gpu.py): what TensorFlow sees, one run of each kind of GPU work
#          the checks use (cuBLAS, cuDNN, XLA, the profiler's kernels), paying their first-use costs.
#   tests  the GPU tests: every test marked gpu (pytest -m gpu, in the files that have one), at most
#          SECONDS (default 240); results in $OUT/gpu-tests.txt and $OUT/gpu-tests.xml.
#   bench  tools/benchmarks/bench_gpu.py $OUT/bench --budget-s SECONDS (default 300) BENCH_ARGS.
#   all    (the default) the three in turn, in SECONDS (default 540) in all: the tests get at most 240,
#          the benchmark what is left less 20.
# Each phase sources setup.sh, which only copies the package again once TensorFlow is installed.
set -u
out=${OUT:?OUT must name the folder the results go to}
phase=${1:-all}
[ $# -gt 0 ] && shift
case $phase in
  setup) seconds=${1:-180} ;;
  tests) seconds=${1:-240} ;;
  bench) seconds=${1:-300} ;;
  all) seconds=${1:-540} ;;
  *) echo "run_checks.sh: unknown phase '$phase' (setup, tests, bench or all)"; exit 2 ;;
esac
[ $# -gt 0 ] && shift
began=$(date +%s)
left() { echo $((seconds - ($(date +%s) - began))); }
mkdir -p "$out"
cd "$(dirname "$0")/../../.." || exit 1

echo "== setup ($(date -u +%H:%M:%S))"
# shellcheck source=tools/dev/gpu/setup.sh
if ! . tools/dev/gpu/setup.sh >> "$out/setup.txt" 2>&1; then
  tail -20 "$out/setup.txt"
  exit 1
fi
tail -3 "$out/setup.txt"

first_process() {
  echo "== first process ($(left) s left)"
  timeout 150 python3 tools/dev/gpu/check_gpu.py > "$out/check_gpu.txt" 2>&1
  local status=$?
  grep -E '^(tensorflow|GPU 0|ok |FAILED|TensorFlow sees)' "$out/check_gpu.txt"
  [ $status -eq 0 ] || { echo "the GPU is not usable (exit $status): see check_gpu.txt"; tail -20 "$out/check_gpu.txt"; }
  return $status
}

gpu_tests() {
  local limit=$1
  echo "== GPU tests, at most $limit s ($(left) s left)"
  local files
  files=$(grep -rlE --include='test_*.py' 'pytest\.mark\.gpu' tests | sort)
  # shellcheck disable=SC2086 # one argument per file
  timeout "$limit" python3 -m pytest -p no:cacheprovider -m gpu -q -rA --durations=0 \
    --junitxml="$out/gpu-tests.xml" $files > "$out/gpu-tests.txt" 2>&1
  local status=$?
  [ $status -eq 124 ] && echo "(stopped after $limit s)" >> "$out/gpu-tests.txt"
  grep -E '^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed|skipped|stopped after' "$out/gpu-tests.txt" | tail -30
  return 0
}

bench() {
  local budget=$1
  shift
  echo "== benchmark, $budget s ($(left) s left)"
  python3 tools/benchmarks/bench_gpu.py "$out/bench" --budget-s "$budget" "$@" \
    > /dev/null 2> "$out/bench-progress.txt"
  grep -vE '^[IWE][0-9]{4} ' "$out/bench-progress.txt" | tail -40
  [ -f "$out/bench/bench_gpu.md" ] && cat "$out/bench/bench_gpu.md"
  return 0
}

case $phase in
  setup) first_process ;;
  tests) gpu_tests "$(( $(left) - 5 ))" ;;
  bench) bench "$(( $(left) - 10 ))" "$@" ;;
  all)
    first_process || exit 1
    limit=$(( $(left) - 120 ))
    [ "$limit" -gt 240 ] && limit=240
    gpu_tests "$limit"
    bench "$(( $(left) - 20 ))" "$@"
    ;;
esac
echo "== done in $(( $(date +%s) - began )) s"
