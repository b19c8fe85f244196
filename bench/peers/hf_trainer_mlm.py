#!/usr/bin/env python3
"""Hugging Face peer for bench/masking_recipes.py: masked-LM pretraining
(no NSP) with transformers.Trainer, BertForMaskedLM and
DataCollatorForLanguageModeling, as users run them: one process on the CPU,
the collator masking each batch afresh (dynamic masking), dynamic padding,
fp32 (--precision bf16: the Trainer's bf16=True), the Trainer's defaults for the loader (no workers) and optimizer
(AdamW, torch's).

Training rows: DIR/train/*.hdf5, shards from `cohort prepare --masking none
--nsp false` (full-sentence rows, unmasked), each row cut to its real length.
After training it scores the rows of EVAL/valid/*.hdf5 (shards with static
masks: the same held-out masked rows every run is scored on) and prints one
JSON line: {"steps", "train_s" (trainer.train()), "mlm_accuracy",
"mlm_loss", "eval_targets"}.

Usage: /opt/cohort/venv/bin/python3 bench/peers/hf_trainer_mlm.py --data DIR --eval EVAL
           --vocab DIR/vocab.txt --steps 300 --batch 64 --mask-prob 0.15 [--lr 5e-4]
"""
import argparse
import glob
import json
import os
import tempfile
import time

import h5py
import numpy as np
import torch
import torch.nn.functional as F
from transformers import (BertConfig, BertForMaskedLM, BertTokenizer, DataCollatorForLanguageModeling, Trainer,
                          TrainingArguments)


def read(split_dir, keys):
    parts = {k: [] for k in keys}
    for path in sorted(glob.glob(os.path.join(split_dir, "*.hdf5"))):
        with h5py.File(path, "r") as f:
            for k in keys:
                parts[k].append(np.asarray(f[k][:], dtype=np.int64))
    return {k: np.concatenate(v) for k, v in parts.items()}


class Rows(torch.utils.data.Dataset):
    def __init__(self, ids, mask):
        self.ids, self.lengths = ids, mask.sum(1)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i, :self.lengths[i]].tolist()}


def evaluate(model, rows, batch=256):
    """MLM loss and accuracy over the stored targets of every row."""
    model.eval()
    loss_sum, right, n = 0.0, 0, 0
    with torch.no_grad():
        for lo in range(0, len(rows["input_ids"]), batch):
            sl = slice(lo, lo + batch)
            ids = torch.from_numpy(rows["input_ids"][sl])
            mask = torch.from_numpy(rows["input_mask"][sl])
            width = int(mask.sum(1).max())
            logits = model(input_ids=ids[:, :width], attention_mask=mask[:, :width],
                           token_type_ids=torch.from_numpy(rows["segment_ids"][sl])[:, :width]).logits
            pos = torch.from_numpy(rows["masked_lm_positions"][sl])
            lab = torch.from_numpy(rows["masked_lm_ids"][sl])
            # NVIDIA's layout: positions are 0-padded, the first 0 ends a row's targets.
            keep = (pos > 0).cumprod(1).bool()
            r = torch.arange(pos.size(0)).unsqueeze(1).expand_as(pos)[keep]
            picked = logits[r, pos[keep]]
            loss_sum += F.cross_entropy(picked, lab[keep], reduction="sum").item()
            right += int((picked.argmax(1) == lab[keep]).sum())
            n += int(keep.sum())
    return loss_sum / n, right / n, n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="prepare --masking none --nsp false output")
    ap.add_argument("--eval", required=True, help="a directory whose valid/ split holds statically masked rows")
    ap.add_argument("--vocab", required=True)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--mask-prob", type=float, default=0.15)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--warmup-ratio", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="bf16: TrainingArguments(bf16=True), CPU autocast")
    args = ap.parse_args()

    tok = BertTokenizer(args.vocab, do_lower_case=True)
    train = read(os.path.join(args.data, "train"), ["input_ids", "input_mask"])
    config = BertConfig(vocab_size=len(tok), hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                        intermediate_size=1024, max_position_embeddings=512, layer_norm_eps=1e-12)
    torch.manual_seed(args.seed)
    model = BertForMaskedLM(config)
    out = tempfile.mkdtemp(prefix="hf_trainer_mlm.")
    targs = TrainingArguments(
        output_dir=out, per_device_train_batch_size=args.batch, max_steps=args.steps, learning_rate=args.lr,
        weight_decay=0.01, adam_epsilon=1e-6, lr_scheduler_type="linear",
        warmup_steps=int(args.warmup_ratio * args.steps), max_grad_norm=1.0, use_cpu=True, report_to=[],
        save_strategy="no", logging_steps=max(1, args.steps // 10), disable_tqdm=True, seed=args.seed,
        bf16=args.precision == "bf16")
    trainer = Trainer(model=model, args=targs, train_dataset=Rows(train["input_ids"], train["input_mask"]),
                      data_collator=DataCollatorForLanguageModeling(tok, mlm_probability=args.mask_prob))
    t0 = time.time()
    trainer.train()
    train_s = time.time() - t0
    rows = read(os.path.join(args.eval, "valid"),
                ["input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids"])
    loss, acc, n = evaluate(model, rows)
    print(json.dumps({"steps": args.steps, "train_s": round(train_s, 1), "mlm_accuracy": acc, "mlm_loss": loss,
                      "eval_targets": n}))


if __name__ == "__main__":
    main()
