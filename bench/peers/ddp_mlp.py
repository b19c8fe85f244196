#!/usr/bin/env python3
"""PyTorch DDP peer for Cohort's weak-scaling benchmark.

Trains the same MLP as `cohort train --model.name mlp` (784 -> H -> H -> 10,
ReLU, dropout) with AdamW over gloo, one thread per rank, on a fixed per-rank
batch of Fashion-MNIST-shaped data, and prints one JSON line:
{"ranks": R, "samples_per_s": X, "step_ms": Y}.

Usage: bench/peers/ddp_mlp.py --ranks 2 --hidden 1024 --batch 64 --steps 60
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn


def mlp(hidden, dropout):
    return nn.Sequential(nn.Flatten(), nn.Linear(784, hidden), nn.ReLU(), nn.Dropout(dropout),
                         nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, 10))


def worker(rank, args, port, out):
    torch.set_num_threads(args.threads)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    torch.manual_seed(1)
    model = nn.parallel.DistributedDataParallel(mlp(args.hidden, 0.1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch, 1, 28, 28, generator=gen)
    y = torch.randint(0, 10, (args.batch,), generator=gen)
    loss_fn = nn.CrossEntropyLoss()
    times = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    dist.barrier()
    if rank == 0:
        steady = sorted(times[args.steps // 5:])
        step_s = steady[len(steady) // 2]
        out.put({"ranks": args.ranks, "step_ms": step_s * 1e3,
                 "samples_per_s": args.batch * args.ranks / step_s})
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--batch", type=int, default=64, help="per-rank batch")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--port", type=int, default=29731)
    args = p.parse_args()
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    mp.spawn(worker, args=(args, args.port, out), nprocs=args.ranks, join=True)
    print(json.dumps(out.get()))


if __name__ == "__main__":
    main()
