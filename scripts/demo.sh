#!/usr/bin/env bash
# The main job, BERT pretraining end to end on this machine:
#   1. prepare the GCIDE dictionary (installed by install-deps) into
#      NVIDIA-layout HDF5 shards with a WordPiece vocabulary (cached in data/);
#   2. train bert-tiny on 2 local ranks for a few minutes: loss falls, MLM
#      accuracy rises (console lines, RUN_DIR/metrics.jsonl);
#   3. evaluate the final checkpoint on the held-out test split;
#   4. draw the curves (RUN_DIR/plots.png) and export the model.
# `make demo` runs this after installing and building.
set -euo pipefail
BUILD_DIR="${1:-build}"
DATA_DIR="${DATA_DIR:-data/gcide}"
RUN_DIR="${RUN_DIR:-runs/demo-bert-tiny}"
STEPS="${STEPS:-600}"
COHORT="$BUILD_DIR/cohort"

if [[ -f "$DATA_DIR/manifest.json" ]]; then
  echo "demo: using the prepared shards in $DATA_DIR (delete it to prepare again)"
else
  echo "demo: preparing GCIDE into $DATA_DIR"
  "$COHORT" prepare --input /usr/share/dictd/gcide.dict.dz --out "$DATA_DIR" --overwrite \
    --vocab-size 8192 --max-seq-length 128 --max-predictions 20 --dupe-factor 1
fi

echo "demo: training examples/bert-tiny.toml on 2 ranks for $STEPS steps into $RUN_DIR"
"$COHORT" train --config examples/bert-tiny.toml --data.path "$DATA_DIR" --nproc-per-node 2 \
  --train.max-steps "$STEPS" --eval.every-steps 200 --ckpt.every-steps 200 --out "$RUN_DIR" --overwrite

echo "demo: evaluating the final checkpoint on the held-out test split"
"$COHORT" eval "$RUN_DIR" --split test

"$COHORT" plot "$RUN_DIR"
"$COHORT" export "$RUN_DIR"
echo "demo: metrics in $RUN_DIR/metrics.jsonl, curves in $RUN_DIR/plots.png, model in $RUN_DIR/export/"
