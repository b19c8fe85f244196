#!/usr/bin/python3
"""PyTorch peer for Cohort's BERT benchmarks: BERT pretraining (MLM + NSP) in
PyTorch eager, single process or DDP over gloo.

The model is BERT as Hugging Face's BertForPreTraining computes it: the MLM
decoder runs over every position (--mlm all, the default; what HetSeq and HF
do) or only at the masked ones (--mlm masked, what Cohort does). Batches are
synthetic, every row full length with P predictions, so every token is real.
AdamW, one optimizer step per batch. Prints one JSON line:
{"ranks": R, "step_ms": ..., "tokens_per_s": ..., "samples_per_s": ...}

Usage: bench/peers/bert_pretrain.py --hidden 256 --layers 4 --heads 4 --seq 128 \
           --batch 16 --precision bf16 --threads 2 [--ranks 2]
"""
import argparse
import json
import math
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


class Layer(nn.Module):
    def __init__(self, h, a, i, p):
        super().__init__()
        self.a, self.d = a, h // a
        self.qkv = nn.ModuleList([nn.Linear(h, h) for _ in range(3)])
        self.attn_out, self.ln1 = nn.Linear(h, h), nn.LayerNorm(h, eps=1e-12)
        self.inter, self.out, self.ln2 = nn.Linear(h, i), nn.Linear(i, h), nn.LayerNorm(h, eps=1e-12)
        self.drop = nn.Dropout(p)

    def forward(self, x, bias):
        b, l, h = x.shape
        q, k, v = (m(x).view(b, l, self.a, self.d).transpose(1, 2) for m in self.qkv)
        probs = self.drop(torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.d) + bias, -1))
        ctx = (probs.to(v.dtype) @ v).transpose(1, 2).reshape(b, l, h)
        a = self.ln1(self.drop(self.attn_out(ctx)) + x)
        return self.ln2(self.drop(self.out(F.gelu(self.inter(a)))) + a)


class Bert(nn.Module):
    def __init__(self, v, h, layers, a, i, maxpos, p):
        super().__init__()
        self.word, self.pos, self.typ = nn.Embedding(v, h), nn.Embedding(maxpos, h), nn.Embedding(2, h)
        self.ln, self.drop = nn.LayerNorm(h, eps=1e-12), nn.Dropout(p)
        self.layers = nn.ModuleList([Layer(h, a, i, p) for _ in range(layers)])
        self.pool, self.nsp = nn.Linear(h, h), nn.Linear(h, 2)
        self.tr, self.tr_ln = nn.Linear(h, h), nn.LayerNorm(h, eps=1e-12)
        self.bias = nn.Parameter(torch.zeros(v))
        # BERT's initialisation (as Cohort and HF use): N(0, 0.02) weights,
        # zero biases, unit LayerNorm. PyTorch's defaults (N(0,1) embeddings)
        # drive the softmax into denormals, which run ~8x slower on CPU.
        for name, t in self.named_parameters():
            with torch.no_grad():
                if t.dim() >= 2:
                    t.normal_(0.0, 0.02)
                elif "ln" in name and name.endswith("weight"):
                    t.fill_(1.0)
                else:
                    t.zero_()

    def forward(self, ids, seg, mask, positions, labels, nsp_labels, masked_only):
        x = self.word(ids) + self.pos(torch.arange(ids.shape[1]))[None] + self.typ(seg)
        x = self.drop(self.ln(x))
        bias = ((1.0 - mask.float()) * -10000.0)[:, None, None, :]
        for layer in self.layers:
            x = layer(x, bias)
        nsp = self.nsp(torch.tanh(self.pool(x[:, 0])))
        if masked_only:
            rows = x.gather(1, positions[..., None].expand(-1, -1, x.shape[-1])).reshape(-1, x.shape[-1])
            target = labels.reshape(-1)
        else:  # HF: logits at every position, loss where labels != -100
            rows = x.reshape(-1, x.shape[-1])
            target = torch.full(ids.shape, -100, dtype=torch.long)
            target.scatter_(1, positions, labels)
            target = target.reshape(-1)
        # LayerNorm in fp32: CPU autocast (torch 1.13) does not cast its input.
        # The tied decoder as Hugging Face applies it (an nn.Linear sharing the
        # embedding's weight): F.linear, not `@ weight.t()`, whose backward
        # OpenBLAS runs ~15x slower here.
        logits = F.linear(self.tr_ln(F.gelu(self.tr(rows)).float()), self.word.weight, self.bias)
        return F.cross_entropy(logits.float(), target, ignore_index=-100) + F.cross_entropy(nsp.float(), nsp_labels)


def worker(rank, args, out):
    torch.set_num_threads(args.threads)
    if args.ranks > 1:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(args.port)
        dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    torch.manual_seed(1)
    model = Bert(args.vocab, args.hidden, args.layers, args.heads, args.intermediate or 4 * args.hidden, 512, 0.1)
    if args.ranks > 1:
        model = nn.parallel.DistributedDataParallel(model)
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, eps=1e-6)
    g = torch.Generator().manual_seed(rank)
    b, s, p = args.batch, args.seq, args.predictions
    ids = torch.randint(5, args.vocab, (b, s), generator=g)
    seg = torch.zeros(b, s, dtype=torch.long)
    seg[:, s // 2:] = 1
    mask = torch.ones(b, s, dtype=torch.long)
    positions = torch.stack([torch.randperm(s - 1, generator=g)[:p] + 1 for _ in range(b)]).sort(1).values
    labels = torch.randint(5, args.vocab, (b, p), generator=g)
    nsp_labels = torch.randint(0, 2, (b,), generator=g)
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = model(ids, seg, mask, positions, labels, nsp_labels, args.mlm == "masked")
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    if args.ranks > 1:
        dist.barrier()
    if rank == 0:
        steady = sorted(times[args.steps // 4:])
        step_s = steady[len(steady) // 2]
        out.put({"ranks": args.ranks, "step_ms": step_s * 1e3, "tokens_per_s": b * s * args.ranks / step_s,
                 "samples_per_s": b * args.ranks / step_s})
    if args.ranks > 1:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=30522)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=0)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--predictions", type=int, default=20)
    ap.add_argument("--batch", type=int, default=16, help="per-rank batch")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--mlm", choices=["all", "masked"], default="all")
    ap.add_argument("--port", type=int, default=29741)
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    if args.ranks > 1:
        mp.spawn(worker, args=(args, out), nprocs=args.ranks, join=True)
    else:
        worker(0, args, out)
    print(json.dumps(out.get()))


if __name__ == "__main__":
    main()
