#!/usr/bin/env bash
# The CUDA suite under each compute-sanitizer tool, sanitizer-sized (suite_size.hpp:
# MASKLENS_CUDA_SANITIZER=1 runs every test, at sizes that take the same kernels and paths
# in seconds). On a GPU, after building the suite (docs/gpu.md):
#
#   tests/cuda/sanitize.sh build-gpu [tool ...]      # default: memcheck racecheck initcheck synccheck
#
# Each tool runs each test program over every test but the four that make a CUDA call
# fail on purpose (suite cuda_api_error_on_purpose), with API errors reported, where a
# clean run reads 0 errors (racecheck: 0 hazards); then those four run under memcheck,
# where a clean run reads one failed cudaMalloc each, and no error but that allocation
# error (the test's own cudaPeekAtLastError / cudaGetLastError report it again, as they
# must: that is what the test checks is still pending). Prints one line a run and
# exits non-zero if any run is not clean. MASKLENS_SANITIZE_TIMEOUT (seconds, default
# 1800) bounds each run.
set -uo pipefail
build=${1:?usage: tests/cuda/sanitize.sh BUILD_DIR [tool ...]}
shift
tools=("$@")
[ ${#tools[@]} -gt 0 ] || tools=(memcheck racecheck initcheck synccheck)
command -v compute-sanitizer >/dev/null || { echo "compute-sanitizer not found (it ships with the CUDA toolkit)"; exit 2; }
programs=("$build/tests/cuda_tests" "$build/tests/cuda_load_kernels_tests")
for p in "${programs[@]}"; do [ -x "$p" ] || { echo "$p not built"; exit 2; }; done
on_purpose=cuda_api_error_on_purpose
logs=$(mktemp -d)
bad=0

# run NAME EXPECTED_FAILED_MALLOCS TOOL_ARGS... -- PROGRAM ARGS...
run() {
  local name=$1 expected=$2; shift 2
  local log="$logs/$name.log" start=$SECONDS rc
  timeout "${MASKLENS_SANITIZE_TIMEOUT:-1800}" env MASKLENS_CUDA_SANITIZER=1 CUDA_MODULE_LOADING=LAZY \
    compute-sanitizer --print-limit 20 "$@" >"$log" 2>&1
  rc=$?
  [ $rc -eq 124 ] && echo "$name: timed out after ${MASKLENS_SANITIZE_TIMEOUT:-1800} s (MASKLENS_SANITIZE_TIMEOUT)"
  local errors allocation mallocs tests
  # racecheck sums up its hazards on a line of its own; the other tools print ERROR SUMMARY.
  errors=$(grep -oE '(ERROR SUMMARY: [0-9]+|RACECHECK SUMMARY: [0-9]+)' "$log" | grep -oE '[0-9]+$' | tail -1)
  allocation=$(grep -c 'Program hit cudaErrorMemoryAllocation' "$log")
  mallocs=$(grep -c 'cudaErrorMemoryAllocation .*on CUDA API call to cudaMalloc\.' "$log")
  tests=$(grep -oE 'test cases: *[0-9]+ \| *[0-9]+ passed \| *[0-9]+ failed' "$log" | tail -1)
  local verdict=clean
  if [ -z "$errors" ] || [ "$errors" -ne "$allocation" ] || [ "$mallocs" -ne "$expected" ] ||
     ! echo "$tests" | grep -q ' 0 failed'; then
    verdict="NOT CLEAN (exit $rc; log below)"; bad=1
  fi
  printf '%-44s %4s s  errors %s (of them failed cudaMalloc %s, expected %s)  [%s]  %s\n' "$name" \
    $((SECONDS - start)) "${errors:-?}" "$mallocs" "$expected" "${tests:-no doctest summary}" "$verdict"
  grep -E '^[0-9.]+ s: ' "$log" | sort -rn | head -3 | sed 's/^/    slowest: /'
  if [ "$verdict" != clean ]; then grep -E '=========|ERROR|FAILED|error' "$log" | head -40; fi
}

for tool in "${tools[@]}"; do
  extra=()
  [ "$tool" = memcheck ] && extra=(--leak-check full)
  for p in "${programs[@]}"; do
    run "$tool $(basename "$p")" 0 --tool "$tool" "${extra[@]}" --error-exitcode 99 -- "$p" -tse="$on_purpose" --duration=true
  done
done
# The calls that fail on purpose: one reported API error a test, nothing else.
for p in "${programs[@]}"; do
  count=$("$p" -ts="$on_purpose" -ltc 2>/dev/null | grep -oE 'passing the current filters: [0-9]+' | grep -oE '[0-9]+$')
  if [ -z "$count" ] || [ "$count" -eq 0 ]; then
    echo "memcheck $(basename "$p") ($on_purpose): no such test listed (the program did not run?)"; bad=1; continue
  fi
  run "memcheck $(basename "$p") ($on_purpose)" "$count" --tool memcheck -- "$p" -ts="$on_purpose" --duration=true
done
rm -rf "$logs"
exit $bad
