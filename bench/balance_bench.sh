#!/usr/bin/env bash
# data.balance on two ranks of different speeds, one thread each: rank 1's
# compute is made FACTOR times slower (COHORT_DEBUG_SLOWDOWN sleeps that
# long after each of its micro-batches, as a slower device would compute).
# Runs, interleaved for ROUNDS rounds, and prints each one's median
# throughput (metrics.jsonl tokens_per_s, the first log interval left out):
#   solo-fast   rank 0's speed alone (1 rank)
#   solo-slow   rank 1's speed alone (1 rank, slowed)
#   equal       2 ranks, data.balance = equal
#   auto        2 ranks, data.balance = auto
# ideal = solo-fast + solo-slow. Targets: auto >= 0.9 ideal, >= 1.3 equal.
#   bench/balance_bench.sh [ROUNDS] [FACTOR] [extra cohort train args...]
# Default workload: the CNN on Fashion-MNIST, global batch 512, 40 steps.
set -euo pipefail
rounds=${1:-3} factor=${2:-2}
shift $(( $# > 2 ? 2 : $# ))
src=$(cd "$(dirname "$0")/.." && pwd)
bin=${COHORT_BIN:-$src/build/cohort}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--model.name cnn --data.global-batch 512 --train.max-steps 40 --log.every-steps 10
        --eval.every-steps 1000000 --eval.max-samples 100 --threads 1 "$@")
declare -A ARGS=([solo-fast]="--nproc-per-node 1" [solo-slow]="--nproc-per-node 1"
                 [equal]="--nproc-per-node 2" [auto]="--nproc-per-node 2 --data.balance auto")
declare -A SLOW=([solo-fast]="" [solo-slow]="0:$factor" [equal]="1:$factor" [auto]="1:$factor")
order=(solo-fast solo-slow equal auto)
declare -A RATES IDLE SPLIT
run() {  # name round
  local dir=$work/$1-$2
  env ${SLOW[$1]:+COHORT_DEBUG_SLOWDOWN=${SLOW[$1]}} "$bin" train --quiet --log.tensorboard=false --out "$dir" \
    ${ARGS[$1]} "${common[@]}" > "$dir.log" 2>&1 || { cat "$dir.log"; exit 1; }
  python3 - "$dir/metrics.jsonl" <<'PY'
import json, sys
lines = [json.loads(x) for x in open(sys.argv[1]) if '"train"' in x][1:]
rate = sum(x["tokens_per_s"] for x in lines) / len(lines)
idle = sum(x["idle_ms"] for x in lines) / len(lines)
split = "/".join(str(s) for s in lines[-1].get("balance", [])) or "-"
print(f"{rate:.1f} {idle:.1f} {split}")
PY
}
median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
for ((i = 0; i < rounds; i++)); do
  for name in "${order[@]}"; do
    read -r rate idle split < <(run "$name" "$i")
    RATES[$name]+=" $rate" IDLE[$name]+=" $idle" SPLIT[$name]=$split
  done
done
declare -A MED
for name in "${order[@]}"; do MED[$name]=$(echo ${RATES[$name]} | median); done
ideal=$(python3 -c "print(${MED[solo-fast]} + ${MED[solo-slow]})")
echo "two ranks, rank 1 ${factor}x slower; median of $rounds interleaved rounds; samples/s"
printf '%-10s %10s %9s %9s %10s %8s   %s\n' run "samples/s" "/ideal" "/equal" "idle ms" split rounds
for name in "${order[@]}"; do
  printf '%-10s %10.1f %9.2f %9.2f %10s %8s   %s\n' "$name" "${MED[$name]}" \
    "$(python3 -c "print(${MED[$name]} / $ideal)")" "$(python3 -c "print(${MED[$name]} / ${MED[equal]})")" \
    "$(echo ${IDLE[$name]} | median)" "${SPLIT[$name]}" "${RATES[$name]}"
done
printf '%-10s %10.1f\n' ideal "$ideal"
