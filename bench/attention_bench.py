#!/usr/bin/env python3
"""Attention for packed BERT rows on the CPU: which kernel libtorch runs best.

Packed rows (data.pack) need a block-diagonal mask. libtorch has no
variable-length attention kernel on the CPU (its varlen flash attention is
CUDA only), so the choices are scaled_dot_product_attention with a bool
[R,1,L,L] mask, or the attention written out (QK^T, masked softmax, AV).
This times both, forward + backward, for the rows of a GCIDE-like batch: 32
instances of the given lengths packed first-fit into rows of 128, bert-mini's
heads (A=4, D=64). The unpacked batch (key-padding mask [B,1,1,W], W its
longest instance) is timed too. Interleaved, median of --reps.

Usage: /opt/cohort/venv/bin/python3 bench/attention_bench.py [--threads 2] [--reps 30]
"""
import argparse
import random
import statistics
import time

import torch


def pack(lengths, row_len):
    used, rows = [], []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        r = next((r for r in range(len(used)) if used[r] + lengths[i] <= row_len), None)
        if r is None:
            used.append(0)
            rows.append([])
            r = len(used) - 1
        rows[r].append((i, used[r]))
        used[r] += lengths[i]
    seq = torch.full((len(rows), row_len), -1, dtype=torch.long)
    for r, members in enumerate(rows):
        for i, off in members:
            seq[r, off:off + lengths[i]] = i
    return seq


def explicit(q, k, v, keep):
    scores = (q / q.size(-1) ** 0.5) @ k.transpose(-2, -1)
    return torch.softmax(scores.masked_fill(~keep, float("-inf")), -1) @ v


def sdpa(q, k, v, keep):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep)


def timed(fn, q, k, v, keep):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    t0 = time.perf_counter()
    fn(q, k, v, keep).sum().backward()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=30)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    random.seed(1)
    # GCIDE-like: mean about 62 of 128 tokens.
    lengths = [max(8, min(128, int(random.gauss(62, 30)))) for _ in range(32)]
    seq = pack(lengths, 128)
    rows, width = seq.size(0), max(lengths)
    print("32 instances, mean length %.0f: %d packed rows of 128, or 32 rows of %d unpacked; A=4, D=64, %d thread(s)"
          % (sum(lengths) / 32, rows, width, a.threads))
    packed_keep = (seq.unsqueeze(2) == seq.unsqueeze(1)).unsqueeze(1)
    pad = torch.tensor([[t < n for t in range(width)] for n in lengths]).view(32, 1, 1, width)
    print("%-6s %-26s %10s" % ("dtype", "kernel", "ms fwd+bwd"))
    for dtype in (torch.float32, torch.bfloat16):
        shapes = {"packed": (rows, 128, packed_keep), "unpacked": (32, width, pad)}
        times = {}
        for _ in range(a.reps):
            for name, (b, l, keep) in shapes.items():
                q, k, v = (torch.randn(b, 4, l, 64, dtype=dtype) for _ in range(3))
                for kname, fn in (("sdpa", sdpa), ("explicit", explicit)):
                    times.setdefault((name, kname), []).append(timed(fn, q, k, v, keep))
        for (name, kname), ts in times.items():
            print("%-6s %-26s %10.2f" % (str(dtype).split(".")[-1], f"{name}, {kname}", 1e3 * statistics.median(ts)))


if __name__ == "__main__":
    main()
