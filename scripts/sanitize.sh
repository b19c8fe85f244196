#!/bin/bash
# Cohort under the sanitizers and libFuzzer (clang: apt-get install clang).
#
#   scripts/sanitize.sh address [REGEX]   the suite (or the tests matching REGEX) under ASan + UBSan
#   scripts/sanitize.sh thread  [REGEX]   the threaded tests under TSan (default: loader and order,
#                                          GradSync hooks, Comm heartbeat, launcher, faults, balance)
#   scripts/sanitize.sh fuzz [SECONDS]    every fuzz target (fuzz/) for SECONDS each (default 600)
#                                          or 10^6 runs, whichever comes first, two at a time
#
# Builds go to build-asan/, build-tsan/ and build-fuzz/ beside build/. libtorch
# is not instrumented; see tests/sanitizers/tsan.supp for what that means for
# TSan. Findings of a fuzz run are in build-fuzz/findings/, its corpus in
# build-fuzz/corpus-TARGET/ (merge the new inputs worth keeping into fuzz/corpus/).
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:?usage: scripts/sanitize.sh address|thread|fuzz [ARG]}
configure() {  # DIR OPTIONS...
  local dir=$1
  shift
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang \
    -DCOHORT_CUDA=OFF -DCOHORT_BUILD_BENCH=OFF "$@" >/dev/null
}
# Leaks in libtorch's own static state are not ours; CUDA-less torch still
# maps its shadow-gap-sensitive regions. A malloc too large returns NULL, as
# glibc's does (libhdf5 asks for such sizes on corrupt files).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:protect_shadow_gap=0:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
case "$kind" in
  address)
    configure build-asan -DCOHORT_SANITIZE=address
    cmake --build build-asan -j2 --target cohort cohort_tests
    (cd build-asan && ctest --output-on-failure -j2 --timeout 1800 ${2:+-R "$2"} -E '^oracle\.|^extend\.')
    ;;
  thread)
    configure build-tsan -DCOHORT_SANITIZE=thread
    cmake --build build-tsan -j2 --target cohort cohort_tests
    export TSAN_OPTIONS="suppressions=$PWD/tests/sanitizers/tsan.supp halt_on_error=1 second_deadlock_stack=1"
    (cd build-tsan && ctest --output-on-failure -j2 --timeout 1800 \
      -R "${2:-^(Balance|GradSync|Buckets/GradSync|WireDtypes/GradSync|Methods/FormWorld|Comm|Platform|Order|Shapes/Dealing|Launch|Fault|Restart)}")
    ;;
  fuzz)
    seconds=${2:-600}
    configure build-fuzz -DCOHORT_FUZZ=ON -DCOHORT_BUILD_TESTS=OFF
    cmake --build build-fuzz -j2 --target fuzz_targets
    mkdir -p build-fuzz/findings
    lane() {
      for t in "$@"; do
        mkdir -p "build-fuzz/corpus-$t"
        cp -n fuzz/corpus/$t/* "build-fuzz/corpus-$t/"
        local rss=4096
        # libhdf5 asks for up to 8 GiB on some malformed files (its metadata
        # cache), which libFuzzer's malloc limit would count as a finding.
        if [ "$t" = hdf5_shard ]; then rss=12000; fi
        "build-fuzz/fuzz/fuzz_$t" -max_total_time="$seconds" -runs=1000000 -rss_limit_mb=$rss \
          -timeout=10 -print_final_stats=1 -artifact_prefix="build-fuzz/findings/$t-" "build-fuzz/corpus-$t" \
          >"build-fuzz/fuzz-$t.log" 2>&1 && r=ok || r="FINDING (see build-fuzz/fuzz-$t.log)"
        echo "fuzz_$t: $(grep -E '^#[0-9]+.*(DONE|pulse)' "build-fuzz/fuzz-$t.log" | tail -1 | cut -d' ' -f1) runs, $r"
      done
    }
    lane toml safetensors hdf5_shard &
    lane idx vocab tokenizer state_json
    wait
    ;;
  *) echo "usage: scripts/sanitize.sh address|thread|fuzz [ARG]" >&2; exit 2 ;;
esac
