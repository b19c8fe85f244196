#!/usr/bin/env python3
"""Hugging Face peer for bench/modernbert_vs_hf.py: ModernBERT masked-LM
pretraining with transformers.Trainer, ModernBertForMaskedLM and
DataCollatorForLanguageModeling, as users run them: one process on the CPU,
the collator masking each batch afresh (--mask-prob, 0.3 by default: the
ModernBERT recipe), dynamic padding to the batch's longest row, fp32
(--precision bf16: the Trainer's bf16=True, CPU autocast), the Trainer's
defaults for the loader (no workers) and the optimizer (AdamW, torch's
fused kernel), attention through torch's SDPA (HF's default on the CPU;
--attn eager for the written-out one).

Rows: DIR/train/*.hdf5, shards from `cohort prepare --masking none --nsp
false` (full-sentence rows, unmasked), each row cut to its real length and
fed as input_ids; a BertTokenizer over DIR/vocab.txt serves the collator
only (its [MASK], [PAD] and special ids, its vocabulary size). With --order
FILE ({"steps": [[row ids of step 1], ...]}, Cohort's order from a
log.sample-ids run) the Trainer reads exactly those rows in that order (the
dataset is the concatenation, train_sampling_strategy="sequential");
without it, every train row, shuffled (the Trainer's default sampler).

Throughput: a TrainerCallback notes the time and the Trainer's own count of
non-padding tokens (include_num_input_tokens_seen="non_padding") at the end
of every optimizer step; the figure is the tokens of steps
--warmup-steps+1 .. --steps over the time from the end of step
--warmup-steps to the end of the last (loader, collator, forward,
backward, clipping and the optimizer step included). Prints one JSON line.

Usage: /opt/cohort/venv/bin/python3 bench/peers/hf_trainer_modernbert.py --data DIR [--order FILE]
           [--steps 20] [--warmup-steps 5] [--batch 32] [--threads 2] [--precision fp32|bf16] [--attn sdpa|eager]
           [--hidden 256 --layers 4 --heads 4 --intermediate 384 --local-attention 128 --global-every 3
            --max-positions 512]
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
from transformers import (BertTokenizer, DataCollatorForLanguageModeling, ModernBertConfig, ModernBertForMaskedLM,
                          Trainer, TrainerCallback, TrainingArguments)


def read_rows(split_dir):
    """Every row of the split's shards (sorted by name: Cohort's sample ids), cut to its real length."""
    rows = []
    for path in sorted(glob.glob(os.path.join(split_dir, "*.hdf5"))):
        with h5py.File(path, "r") as f:
            ids = np.asarray(f["input_ids"][:], dtype=np.int64)
            lengths = np.asarray(f["input_mask"][:], dtype=np.int64).sum(1)
        rows.extend(ids[i, :lengths[i]] for i in range(len(ids)))
    if not rows:
        raise SystemExit("no shards in %s" % split_dir)
    return rows


class Rows(torch.utils.data.Dataset):
    def __init__(self, rows, order=None):
        self.rows = rows
        self.order = order if order is not None else list(range(len(rows)))

    def __len__(self):
        return len(self.order)

    def __getitem__(self, i):
        return {"input_ids": self.rows[self.order[i]].tolist()}


class StepClock(TrainerCallback):
    """The time and the non-padding tokens seen at the end of each optimizer step."""

    def __init__(self):
        self.ends = []  # (global_step, perf_counter, num_input_tokens_seen)

    def on_step_end(self, args, state, control, **kwargs):
        self.ends.append((state.global_step, time.perf_counter(), int(state.num_input_tokens_seen)))


def special_ids(vocab):
    with open(vocab, encoding="utf-8") as f:
        index = {line.rstrip("\n"): i for i, line in enumerate(f)}
    missing = [t for t in ("[PAD]", "[CLS]", "[SEP]", "[MASK]") if t not in index]
    if missing:
        raise SystemExit("%s lacks %s" % (vocab, ", ".join(missing)))
    return {"pad": index["[PAD]"], "cls": index["[CLS]"], "sep": index["[SEP]"], "mask": index["[MASK]"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="prepare --masking none --nsp false output")
    ap.add_argument("--vocab", help="default: DATA/vocab.txt")
    ap.add_argument("--order", help='JSON {"steps": [[row ids], ...]}: train on these rows in this order')
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup-steps", type=int, default=5, help="steps left out of the throughput")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--mask-prob", type=float, default=0.3)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--lr-warmup-ratio", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads; 0: torch's default")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="bf16: TrainingArguments(bf16=True), CPU autocast")
    ap.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=384)
    ap.add_argument("--local-attention", type=int, default=128)
    ap.add_argument("--global-every", type=int, default=3)
    ap.add_argument("--max-positions", type=int, default=512)
    args = ap.parse_args()
    if not 0 <= args.warmup_steps < args.steps:
        raise SystemExit("--warmup-steps must be below --steps")
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    vocab = args.vocab or os.path.join(args.data, "vocab.txt")
    ids = special_ids(vocab)
    tok = BertTokenizer(vocab, do_lower_case=True)
    rows = read_rows(os.path.join(args.data, "train"))
    order = None
    if args.order:
        with open(args.order) as f:
            steps = json.load(f)["steps"]
        if len(steps) < args.steps or any(len(s) != args.batch for s in steps[:args.steps]):
            raise SystemExit("%s: fewer than %d steps of %d rows" % (args.order, args.steps, args.batch))
        order = [i for s in steps[:args.steps] for i in s]
    config = ModernBertConfig(
        vocab_size=len(tok), hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, max_position_embeddings=args.max_positions,
        local_attention=args.local_attention,
        layer_types=["full_attention" if i % args.global_every == 0 else "sliding_attention"
                     for i in range(args.layers)],
        embedding_dropout=0.0, attention_dropout=0.0, mlp_dropout=0.0,
        pad_token_id=ids["pad"], cls_token_id=ids["cls"], bos_token_id=ids["cls"], sep_token_id=ids["sep"],
        eos_token_id=ids["sep"], attn_implementation=args.attn)
    torch.manual_seed(args.seed)
    model = ModernBertForMaskedLM(config)
    out = tempfile.mkdtemp(prefix="hf_trainer_modernbert.")
    targs = TrainingArguments(
        output_dir=out, per_device_train_batch_size=args.batch, max_steps=args.steps, learning_rate=args.lr,
        weight_decay=0.01, adam_epsilon=1e-6, lr_scheduler_type="linear",
        warmup_steps=int(args.lr_warmup_ratio * args.steps), max_grad_norm=1.0, use_cpu=True, report_to=[],
        save_strategy="no", logging_steps=max(1, args.warmup_steps), disable_tqdm=True, seed=args.seed,
        bf16=args.precision == "bf16", include_num_input_tokens_seen="non_padding",
        train_sampling_strategy="sequential" if order is not None else "random")
    clock = StepClock()
    trainer = Trainer(model=model, args=targs, train_dataset=Rows(rows, order),
                      data_collator=DataCollatorForLanguageModeling(tok, mlm_probability=args.mask_prob),
                      callbacks=[clock])
    t0 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t0
    ends = clock.ends
    assert len(ends) == args.steps and ends[-1][0] == args.steps, ends[-3:]
    w = args.warmup_steps
    start_t, start_tok = (ends[w - 1][1], ends[w - 1][2]) if w > 0 else (t0, 0)
    timed_s = ends[-1][1] - start_t
    timed_tokens = ends[-1][2] - start_tok
    expect = sum(len(rows[i]) for i in order[w * args.batch:]) if order is not None else None
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    print(json.dumps({
        "steps": args.steps, "warmup_steps": w, "batch": args.batch, "train_s": round(train_s, 3),
        "timed_steps": args.steps - w, "timed_s": round(timed_s, 3), "timed_tokens": timed_tokens,
        "order_tokens": expect, "tokens_per_s": timed_tokens / timed_s,
        "step_ms": 1000 * timed_s / (args.steps - w), "last_loss": losses[-1] if losses else None,
        "threads": torch.get_num_threads(), "attn": model.config._attn_implementation,
        "optim": getattr(targs.optim, "value", str(targs.optim)),
        "precision": args.precision, "vocab_size": len(tok),
        "params": sum(p.numel() for p in model.parameters())}))


if __name__ == "__main__":
    main()
