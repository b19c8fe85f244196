#!/usr/bin/env bash
# Two cohort builds side by side, interleaved, on the same runs; prints each
# run's median throughput (metrics.jsonl tokens_per_s: images/s or tokens/s,
# the first log interval left out) and the ratio B/A.
#   bench/compare_builds.sh A/cohort B/cohort [ROUNDS] [RUNS]
# RUNS: an extended regex of the run names to measure (default all).
# e.g. A = a worktree of the previous commit, to check that a change costs
# nothing. BERT runs need data/gcide (cohort prepare, see the README).
set -euo pipefail
a=$1 b=$2 rounds=${3:-3} only=${4:-.}
src=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
declare -A RUNS=(
  [fm-cnn-1rank]="--model.name cnn --train.max-steps 300 --data.global-batch 64 --log.every-steps 50 --eval.max-samples 500"
  [fm-cnn-2ranks]="--model.name cnn --train.max-steps 300 --data.global-batch 64 --log.every-steps 50 --eval.max-samples 500 --nproc-per-node 2"
  [bert-tiny-2ranks]="--config $src/examples/bert-tiny.toml --data.path $src/data/gcide --train.max-steps 60 --log.every-steps 10 --eval.max-samples 64 --nproc-per-node 2"
  [bert-mini-lamb-clip]="--config $src/examples/bert-tiny.toml --data.path $src/data/gcide --model.hidden 256 --model.layers 4 --model.heads 4 --model.intermediate 1024 --optim.name lamb --optim.clip-norm 1.0 --train.precision auto --train.max-steps 60 --log.every-steps 10 --eval.max-samples 64"
)
rate() {  # bin run-dir args...
  local bin=$1 dir=$2; shift 2
  "$bin" train --quiet --log.tensorboard=false --out "$dir" "$@" > /dev/null 2>&1
  python3 -c "import json,sys; l=[json.loads(x) for x in open(sys.argv[1]) if '\"train\"' in x][1:]; print(sum(x['tokens_per_s'] for x in l)/len(l))" "$dir/metrics.jsonl"
}
median() { tr ' ' '\n' | sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
for run in "${!RUNS[@]}"; do
  [[ $run =~ $only ]] || continue
  [[ $run == bert* && ! -d $src/data/gcide ]] && { echo "$run: SKIPPED (no data/gcide)"; continue; }
  ra="" rb=""
  for ((i = 0; i < rounds; i++)); do
    ra+=" $(rate "$a" "$work/a$i$run" ${RUNS[$run]})"
    rb+=" $(rate "$b" "$work/b$i$run" ${RUNS[$run]})"
  done
  ma=$(echo $ra | median) mb=$(echo $rb | median)
  printf '%-18s A %10.0f  B %10.0f  B/A %.3f   (A:%s  B:%s)\n' "$run" "$ma" "$mb" "$(python3 -c "print($mb / $ma)")" "$ra" "$rb"
done
