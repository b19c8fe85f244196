#!/usr/bin/env bash
# examples/extend built the way a user builds it: Cohort installed to a
# prefix, the example configured against it with find_package(Cohort), then
# its own task and model trained by the launcher on 2 ranks.
#   extend_example.sh BUILD_DIR SOURCE_DIR PYTHON
set -euo pipefail
build=$1 src=$2 python=$3
work=$build/extend-example
data=/usr/share/datasets/fashion-mnist
if [ ! -e "$data/train-images-idx3-ubyte.gz" ] && [ ! -e "$data/train-images-idx3-ubyte" ]; then
  echo "SKIPPED: dataset-fashion-mnist is not installed"
  exit 77
fi
rm -rf "$work"
cmake --install "$build" --prefix "$work/prefix" > "$work.install.log"
cmake -S "$src/examples/extend" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" > "$work.configure.log" 2>&1 ||
  { cat "$work.configure.log"; exit 1; }
cmake --build "$work/build" -j2
tool=$work/build/cohort-footwear

# The registries are open: the program's names sit beside the built-in ones.
if "$tool" train --train.task nope --out "$work/bad" 2> "$work/bad.err"; then
  echo "an unknown task was accepted"; exit 1
fi
grep -q "train.task must be one of bert-classify | bert-pretrain | footwear | image-classify (got 'nope')" "$work/bad.err" ||
  { cat "$work/bad.err"; exit 1; }

"$tool" train --train.task footwear --model.name linear --nproc-per-node 2 --train.max-steps 40 \
  --data.global-batch 64 --optim.lr 0.01 --eval.max-samples 2000 --log.every-steps 10 --quiet --out "$work/run" \
  --data.footwear-classes 5,7,9
# The task's own key is a config key like the built-in ones: in [data] of the run's config.toml.
"$python" - "$work/run/config.toml" <<'PY'
import sys, tomllib
cfg = tomllib.load(open(sys.argv[1], "rb"))
assert cfg["data"]["footwear-classes"] == "5,7,9", cfg["data"]
PY
if "$tool" train --train.task footwear --data.footwear-class 5 --out "$work/bad" 2> "$work/bad.err"; then
  echo "a misspelt task key was accepted"; exit 1
fi
grep -q "footwear-classes" "$work/bad.err" || { cat "$work/bad.err"; exit 1; }
"$python" - "$work/run/metrics.jsonl" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
train = [l for l in lines if l["kind"] == "train"]
evals = [l for l in lines if l["kind"] == "eval"]
assert [l["step"] for l in train] == [10, 20, 30, 40], train
assert len(evals) == 1 and evals[0]["count"] == 2000, evals
# 30% of Fashion-MNIST is footwear: "never footwear" scores 0.7 and recall 0.
assert evals[0]["accuracy"] > 0.9 and evals[0]["recall"] > 0.8, evals[0]
print("footwear after 40 steps on 2 ranks:", {k: round(evals[0][k], 4) for k in ("accuracy", "recall", "loss")})
PY
# The same run's checkpoint evaluates with the program's task, too.
"$tool" eval "$work/run" --max-samples 500 | grep -q "eval  step 40  test:  accuracy"
