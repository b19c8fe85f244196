#!/usr/bin/env bash
# Fine-tuning end to end: WordNet supersenses (gloss -> lexicographer file)
# from BERT-mini pretrained on GCIDE, against the same model from scratch,
# on the same budget (examples/bert-classify-wordnet.toml), then the test
# split's accuracy and macro-F1 of each run's best checkpoint.
#   scripts/finetune-demo.sh [BUILD_DIR]
# PRETRAIN_STEPS (800) sets the pretraining; a finished run in
# runs/bert-mini-gcide is reused. GCIDE shards come from `make demo`'s
# data/gcide (prepared here when missing).
set -euo pipefail
BUILD_DIR="${1:-build}"
COHORT="$BUILD_DIR/cohort"
PRETRAIN="${PRETRAIN:-runs/bert-mini-gcide}"
PRETRAIN_STEPS="${PRETRAIN_STEPS:-800}"

if [[ ! -f data/gcide/manifest.json ]]; then
  "$COHORT" prepare --input /usr/share/dictd/gcide.dict.dz --out data/gcide --overwrite \
    --vocab-size 8192 --max-seq-length 128 --max-predictions 20 --dupe-factor 1
fi
[[ -f data/wordnet/train.tsv ]] || "$COHORT" prepare-classify --out data/wordnet
if [[ ! -f "$PRETRAIN/checkpoints/step-$PRETRAIN_STEPS/state.json" ]]; then
  "$COHORT" train --config examples/bert-mini.toml --train.max-steps "$PRETRAIN_STEPS" --eval.every-steps 400 \
    --eval.max-samples 1024 --ckpt.every-steps 200 --out "$PRETRAIN" --overwrite
fi
for start in pretrained scratch; do
  init=$([[ $start == pretrained ]] && echo "$PRETRAIN" || echo "")
  "$COHORT" train --config examples/bert-classify-wordnet.toml --model.init "$init" \
    --out "runs/wordnet-$start" --overwrite
done
for start in pretrained scratch; do
  best=$(python3 -c "import json; print(json.load(open('runs/wordnet-$start/checkpoints/best.json'))['step'])")
  echo "== $start: best checkpoint step $best, test split"
  "$COHORT" eval "runs/wordnet-$start/checkpoints/step-$best" --split test | grep '^eval'
done
