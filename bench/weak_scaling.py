#!/usr/bin/env python3
"""Weak scaling: 2 ranks x 1 thread against 1 rank x 1 thread, same per-rank
batch, Cohort and PyTorch DDP side by side in one run.

Model: the MLP of `--model.name mlp` with hidden width H (H=1024: 1.86 M
parameters, 7.4 MB of fp32 gradients per step). Cohort trains on Fashion-MNIST
through its loader; the peer (bench/peers/ddp_mlp.py) on a fixed in-memory
batch. Runs are interleaved and repeated; medians are printed.

Efficiency = samples/s at 2 ranks / (2 x samples/s at 1 rank).

Usage: bench/weak_scaling.py [--build build] [--hidden 1024] [--batch 64] [--repeats 3]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def cohort_rate(args, ranks, run_dir):
    cmd = [os.path.join(args.build, "cohort"), "train", "--model.name", "mlp", "--model.hidden", str(args.hidden),
           "--data.global-batch", str(args.batch * ranks), "--train.max-steps", str(args.steps),
           "--log.every-steps", "10", "--eval.max-samples", "512", "--threads", "1", "--quiet",
           "--out", run_dir, "--overwrite", "--nproc-per-node", str(ranks), "--oversubscribe"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    rates = []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            j = json.loads(line)
            if j["kind"] == "train":
                rates.append(j["tokens_per_s"])
    steady = sorted(rates[1:])  # the first interval includes start-up
    return steady[len(steady) // 2]


def peer_rate(args, ranks):
    out = subprocess.run([sys.executable, os.path.join(HERE, "peers", "ddp_mlp.py"), "--ranks", str(ranks),
                          "--hidden", str(args.hidden), "--batch", str(args.batch), "--steps", str(args.steps)],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["samples_per_s"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    rates = {("cohort", 1): [], ("cohort", 2): [], ("pytorch-ddp", 1): [], ("pytorch-ddp", 2): []}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for ranks in (1, 2):
                rates[("cohort", ranks)].append(cohort_rate(args, ranks, os.path.join(tmp, "run")))
                rates[("pytorch-ddp", ranks)].append(peer_rate(args, ranks))
            print(f"repeat {rep + 1}/{args.repeats} done", file=sys.stderr)
    params = 784 * args.hidden + args.hidden + args.hidden * args.hidden + args.hidden + args.hidden * 10 + 10
    print(f"weak scaling, MLP hidden {args.hidden} ({params / 1e6:.2f} M params, {params * 4 / 2**20:.1f} MiB grads), "
          f"{args.batch} samples/rank/step, 1 thread/rank, median of {args.repeats}")
    print(f"{'system':<12} {'1 rank/s':>10} {'2 ranks/s':>10} {'efficiency':>10}")
    for system in ("cohort", "pytorch-ddp"):
        one = statistics.median(rates[(system, 1)])
        two = statistics.median(rates[(system, 2)])
        print(f"{system:<12} {one:>10.0f} {two:>10.0f} {two / (2 * one):>10.3f}")


if __name__ == "__main__":
    main()
