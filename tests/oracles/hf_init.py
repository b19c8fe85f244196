"""oracle.hf_init: a randomly initialised transformers.BertForPreTraining,
saved with save_pretrained, starts a 2-rank Cohort run through model.init,
and Cohort's first loss equals HF's loss on the same global batch: the rows
named by log.sample-ids, read with h5py and labelled the way NVIDIA's BERT
loader does (the first 0 in masked_lm_positions ends the predictions)."""
import glob
import json
import os
import shutil

import h5py
import numpy as np
import torch
from transformers import BertConfig, BertForPreTraining

from common import *

torch.set_num_threads(2)
torch.manual_seed(7)
vocab = sum(1 for _ in open(os.path.join(DATA, "vocab.txt")))
config = BertConfig(vocab_size=vocab, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=512, max_position_embeddings=512, type_vocab_size=2,
                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
model = BertForPreTraining(config).eval()
init = os.path.join(WORK, "hf-init")
shutil.rmtree(init, ignore_errors=True)
model.save_pretrained(init)

out = os.path.join(WORK, "hf-init-run")
run([COHORT, "train", "--config", os.path.join(SOURCE, "examples/bert-tiny.toml"), "--data.path", DATA,
     "--out", out, "--overwrite", "--nproc-per-node", "2", "--model.init", init, "--model.dropout", "0",
     "--model.attention-dropout", "0", "--train.precision", "fp32", "--train.max-steps", "1",
     "--log.every-steps", "1", "--data.global-batch", "24", "--data.micro-batch", "6", "--log.sample-ids", "--log.tensorboard=false",
     "--quiet"])
first = [m for m in metrics(out) if m["kind"] == "train"][0]
check(first["step"] == 1, "the first train line is step %s" % first["step"])

ids = []
for path in sorted(glob.glob(os.path.join(out, "sample-ids", "rank-*.jsonl"))):
    with open(path) as f:
        ids += [i for line in f for i in json.loads(line)["ids"] if json.loads(line)["step"] == 1]
check(len(ids) == 24, "step 1 holds %d samples, not the global batch of 24" % len(ids))

# Global index -> (shard, row) over the train shards in name order.
shards = sorted(glob.glob(os.path.join(DATA, "train", "*.hdf5")))
sizes = [h5py.File(p, "r")["input_ids"].shape[0] for p in shards]
starts = np.cumsum([0] + sizes)
cols = {k: [] for k in ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
                        "next_sentence_labels")}
for g in ids:
    s = int(np.searchsorted(starts, g, side="right") - 1)
    with h5py.File(shards[s], "r") as f:
        for k in cols:
            cols[k].append(np.asarray(f[k][g - starts[s]], dtype=np.int64))
batch = {k: torch.from_numpy(np.stack(v)) for k, v in cols.items()}
labels = torch.full_like(batch["input_ids"], -100)
for b in range(len(ids)):
    pos, tok = batch["masked_lm_positions"][b], batch["masked_lm_ids"][b]
    end = (pos == 0).nonzero()
    end = int(end[0]) if len(end) else len(pos)
    labels[b, pos[:end]] = tok[:end]
with torch.no_grad():
    hf = model(input_ids=batch["input_ids"], token_type_ids=batch["segment_ids"],
               attention_mask=batch["input_mask"], labels=labels,
               next_sentence_label=batch["next_sentence_labels"]).loss.item()
rel = abs(hf - first["loss"]) / abs(hf)
print("first loss: HF %.8f, Cohort %.8f (relative difference %.2e)" % (hf, first["loss"], rel))
check(rel < 1e-5, "the first losses differ")
print("oracle.hf_init: passed")
