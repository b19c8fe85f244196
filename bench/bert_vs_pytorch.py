#!/usr/bin/env python3
"""Single-rank BERT pretraining throughput: Cohort (C++) against PyTorch eager,
same model shape, batches, optimizer and threads, run side by side and
interleaved, on the torch of Cohort's environment.

The default shape is bert-mini: H=256, L=4, A=4, S=128, P=20, vocabulary
30522, batch 16. Columns:
  cohort       build/bench/bert_step_bench (Cohort's BERT, MLM at masked positions)
  hf           transformers.BertForPreTraining as users run it (its loss from
               labels, the MLM decoder over every position)
  pt-masked    the same network in PyTorch eager with the decoder at masked
               positions only, Cohort's method, to separate that gain
  packed       with --data: Cohort with data.pack (each batch's instances
               packed into rows of S, block-diagonal attention: no compute
               on padding)
With --data the bench also measures this CPU's matmul peak (torch.matmul of
2048x2048 at each precision on the same threads, best of 6) in every round,
beside the packed run, and prints the model FLOPs Cohort packed reaches on
real tokens (encoder matrices per token, attention per instance, decoder per
prediction) as a share of the bf16 peak (MFU): the median of the rounds'
ratios (each round's printed), and against the best peak of the whole run.
All three: AdamW, global-norm clipping, dropout 0.1 (Cohort's masks per
sample, its default model.dropout-rng, or with --cohort-dropout-rng rank from
torch's generator as PyTorch's). Batches are synthetic and
full length (every token real), or with --data DIR the same rows of DIR's
train shards on every side, in file order, trimmed to each batch's longest
row (vocabulary, length and predictions from the data). tokens/s counts real
tokens.

Usage: /opt/cohort/venv/bin/python3 bench/bert_vs_pytorch.py [--build build] [--rounds 3]
           [--threads 2] [--hidden 256 --layers 4 --heads 4 --seq 128 --batch 16] [--data data/gcide]
           [--cohort-dropout-rng sample|rank]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd, key="tokens_per_s"):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    return json.loads(out)[key]


def matmul_peak(precision, threads, n=2048, reps=6):
    """TFLOP/s of torch.matmul at `precision` on `threads` threads: the best of `reps`."""
    import time
    import torch
    torch.set_num_threads(threads)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    torch.matmul(a, b)
    best = 0.0
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.matmul(a, b)
        best = max(best, 2 * n ** 3 / (time.perf_counter() - t0) / 1e12)
    return best


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
    ap.add_argument("--data", default="", help="shards from cohort prepare; default: synthetic batches")
    ap.add_argument("--cohort-dropout-rng", default="sample",
                    help="Cohort's dropout masks: sample (its default) or rank (torch's generator, as the peers)")
    args = ap.parse_args()
    shape = ["--hidden", str(args.hidden), "--layers", str(args.layers), "--heads", str(args.heads),
             "--batch", str(args.batch), "--steps", str(args.steps), "--threads", str(args.threads)]
    if args.data:
        manifest = json.load(open(os.path.join(args.data, "manifest.json")))
        args.seq = manifest["max_seq_length"]
        shape += ["--data", args.data, "--vocab", str(manifest["vocab_size"]),
                  "--predictions", str(manifest["max_predictions"])]
    shape += ["--seq", str(args.seq)]
    cohort = [os.path.join(args.build, "bench", "bert_step_bench"), "--dropout-rng", args.cohort_dropout_rng] + shape
    peer = [sys.executable, os.path.join(ROOT, "bench", "peers", "bert_pretrain.py")] + shape
    import torch
    print("BERT H=%d L=%d A=%d S=%d batch %d, %d thread(s), %s, torch %s, median of %d interleaved rounds, "
          "real tokens/s" % (args.hidden, args.layers, args.heads, args.seq, args.batch, args.threads,
                             "shards " + args.data if args.data else "synthetic full-length batches",
                             torch.__version__, args.rounds))
    packed = cohort + ["--pack"] if args.data else None
    # The peaks move with the machine's load as much as the runs do, so each
    # round measures them beside its packed run, and the MFU is the median of
    # the rounds' ratios; the MFU against the best peak of the whole run is
    # printed too (the conservative figure).
    peaks = {"fp32": [], "bf16": []}
    packed_tflops = {}
    if packed:
        print("%-9s %10s %10s %10s %10s %10s %14s %12s" % ("precision", "cohort", "packed", "hf", "pt-masked",
                                                          "packed/hf", "packed/cohort", "packed MFU"))
    else:
        print("%-9s %10s %10s %10s %10s %16s" % ("precision", "cohort", "hf", "pt-masked", "cohort/hf",
                                                 "cohort/pt-masked"))
    for precision in args.precisions.split(","):
        rates = {"cohort": [], "pytorch": [], "masked": [], "packed": [], "mfu": [], "packed_tflops": []}
        for _ in range(args.rounds):
            rates["cohort"].append(run(cohort + ["--precision", precision]))
            if packed:
                for peak_precision in ("fp32", "bf16"):
                    peaks[peak_precision].append(matmul_peak(peak_precision, args.threads))
                line = subprocess.run(packed + ["--precision", precision], check=True, capture_output=True,
                                      text=True).stdout.strip().splitlines()[-1]
                rates["packed"].append(json.loads(line)["tokens_per_s"])
                rates["packed_tflops"].append(json.loads(line)["real_tflops"])
                rates["mfu"].append(rates["packed_tflops"][-1] / peaks["bf16"][-1])
            rates["pytorch"].append(run(peer + ["--precision", precision, "--model", "hf"]))
            rates["masked"].append(run(peer + ["--precision", precision, "--model", "mirror", "--mlm", "masked"]))
        c, p, m = (statistics.median(rates[k]) for k in ("cohort", "pytorch", "masked"))
        if packed:
            k = statistics.median(rates["packed"])
            mfu = statistics.median(rates["mfu"])
            packed_tflops[precision] = statistics.median(rates["packed_tflops"])
            print("%-9s %10.0f %10.0f %10.0f %10.0f %10.2f %14.2f %11.1f%%" % (precision, c, k, p, m, k / p, k / c,
                                                                             100 * mfu))
        else:
            print("%-9s %10.0f %10.0f %10.0f %10.2f %16.2f" % (precision, c, p, m, c / p, c / m))
        if packed:
            n = len(rates["mfu"])
            print("%-9s packed MFU by round (model TFLOP/s / bf16 peak): %s" %
                  ("", ", ".join("%.1f%% (%.3f/%.3f)" % (100 * x, t, q) for x, t, q in
                                 zip(rates["mfu"], rates["packed_tflops"], peaks["bf16"][-n:]))))
        sys.stdout.flush()
    if packed:
        print("matmul peak on %d thread(s) (torch.matmul %d^2, best of 6, once a round): fp32 %s TFLOP/s, "
              "bf16 %s TFLOP/s; MFU: model FLOPs on real tokens over the bf16 peak" %
              (args.threads, 2048, " ".join("%.3f" % x for x in peaks["fp32"]),
               " ".join("%.3f" % x for x in peaks["bf16"])))
        print("packed MFU against the run's best bf16 peak (%.3f TFLOP/s): %s" %
              (max(peaks["bf16"]), ", ".join("%s %.1f%% (%.3f TFLOP/s)" % (k, 100 * v / max(peaks["bf16"]), v)
                                            for k, v in packed_tflops.items())))


if __name__ == "__main__":
    main()
