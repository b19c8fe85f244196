#!/usr/bin/env bash
# The whole suite N times on a loaded machine: a CPU hog (stress-ng, one
# worker per core) runs beside ctest, so a test that depends on how fast the
# machine is fails here rather than in CI. Prints each round's summary and
# wall time, then the tests that failed in any round.
#
#   scripts/stress-suite.sh [N] [BUILD_DIR]   N rounds (default 3) of build/'s suite
#   STRESS_CPU=6 scripts/stress-suite.sh 1     a heavier hog: 6 workers (4x oversubscribed on 2 cores)
#
# Needs a built tree (make test, or make build) and stress-ng (installed
# here when missing and run as root). Exits 1 when any round had a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
build=${2:-build}
jobs=${JOBS:-2}
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "stress-suite: error: N must be a positive integer (got '$rounds')" >&2; exit 2; }
[ -f "$build/CTestTestfile.cmake" ] || { echo "stress-suite: error: $build is not a built tree: run make build first" >&2; exit 2; }
if ! command -v stress-ng >/dev/null; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "stress-suite: error: stress-ng is missing (apt-get install stress-ng, as root)" >&2
    exit 2
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends stress-ng >/dev/null ||
    { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends stress-ng >/dev/null; } ||
    { echo "stress-suite: error: cannot install stress-ng" >&2; exit 2; }
fi
cores=${STRESS_CPU:-$(nproc)}
[[ "$cores" =~ ^[1-9][0-9]*$ ]] || { echo "stress-suite: error: STRESS_CPU must be a positive integer (got '$cores')" >&2; exit 2; }
log_dir="$build/stress"
mkdir -p "$log_dir"
stress-ng --cpu "$cores" --timeout 0 --quiet &
hog=$!
trap 'kill "$hog" 2>/dev/null; wait "$hog" 2>/dev/null' EXIT
echo "stress-suite: $rounds round(s) of the suite in $build (ctest -j$jobs) beside stress-ng --cpu $cores (pid $hog)"
failed_rounds=0
declare -A failures
for round in $(seq 1 "$rounds"); do
  log="$log_dir/round-$round.log"
  start=$(date +%s)
  (cd "$build" && ctest --output-on-failure -j"$jobs") >"$log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  summary=$(grep -E '^[0-9]+% tests passed' "$log" | tail -1)
  echo "round $round: ${summary:-no summary (ctest exit $rc)}; wall ${secs} s; log $log"
  if [ "$rc" -ne 0 ]; then
    failed_rounds=$((failed_rounds + 1))
    while read -r name; do
      [ -n "$name" ] && failures["$name"]+="$round "
    done < <(sed -n '/^The following tests FAILED:/,$ s/^[[:space:]]*[0-9]* - \([^ ]*\) (.*/\1/p' "$log")
  fi
done
if [ "$failed_rounds" -eq 0 ]; then
  echo "stress-suite: $rounds of $rounds round(s) passed"
  exit 0
fi
echo "stress-suite: $failed_rounds of $rounds round(s) had failures:"
for name in "${!failures[@]}"; do echo "  $name (round ${failures[$name]% })"; done
exit 1
