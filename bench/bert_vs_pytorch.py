#!/usr/bin/python3
"""Single-rank BERT pretraining throughput: Cohort (C++) against PyTorch eager,
same model, batch, optimizer and threads, run side by side and interleaved.

The default shape is bert-small as issue 6 fixes it: H=256, L=4, A=4, S=128,
P=20, vocabulary 30522, batch 16. Both sides train on one synthetic
full-length batch (every token real) with AdamW and global-norm clipping.
The PyTorch peer (bench/peers/bert_pretrain.py) runs the MLM decoder as
Hugging Face's BertForPreTraining does, over every position; the
`pytorch-masked` column is the same peer with the decoder at masked positions
only, Cohort's method, to separate that gain from the rest.

Usage: /usr/bin/python3 bench/bert_vs_pytorch.py [--build build] [--rounds 3]
           [--threads 2] [--hidden 256 --layers 4 --heads 4 --seq 128 --batch 16]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    return json.loads(out)["tokens_per_s"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--precisions", default="fp32,bf16")
    args = ap.parse_args()
    shape = ["--hidden", str(args.hidden), "--layers", str(args.layers), "--heads", str(args.heads),
             "--seq", str(args.seq), "--batch", str(args.batch), "--steps", str(args.steps),
             "--threads", str(args.threads)]
    cohort = [os.path.join(args.build, "bench", "bert_step_bench")] + shape
    peer = [sys.executable, os.path.join(ROOT, "bench", "peers", "bert_pretrain.py")] + shape
    print("BERT H=%d L=%d A=%d S=%d batch %d, %d thread(s), median of %d interleaved rounds, tokens/s"
          % (args.hidden, args.layers, args.heads, args.seq, args.batch, args.threads, args.rounds))
    print("%-9s %10s %10s %16s %8s %16s" % ("precision", "cohort", "pytorch", "pytorch-masked", "ratio",
                                            "ratio (masked)"))
    for precision in args.precisions.split(","):
        rates = {"cohort": [], "pytorch": [], "masked": []}
        for _ in range(args.rounds):
            rates["cohort"].append(run(cohort + ["--precision", precision]))
            rates["pytorch"].append(run(peer + ["--precision", precision, "--mlm", "all"]))
            rates["masked"].append(run(peer + ["--precision", precision, "--mlm", "masked"]))
        c, p, m = (statistics.median(rates[k]) for k in ("cohort", "pytorch", "masked"))
        print("%-9s %10.0f %10.0f %16.0f %8.2f %16.2f" % (precision, c, p, m, c / p, c / m))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
