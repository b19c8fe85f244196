#!/usr/bin/env python3
"""What world-size independence costs in speed: the fixed micro-batch cut and
the exact (fp64) gradient sum against what Cohort did before them, measured
side by side in one run, interleaved, medians of the steady steps.

Variants, each at 1 rank x 2 threads and 2 ranks x 1 thread:

  share-fp32   one micro-batch per rank (data.micro-batch = the rank's share)
               and gradients summed in fp32: Cohort before the promise held
               by construction (its step then depended on the world size)
  auto-fp32    the auto cut (a multiple of 12 micro-batches of at most 32),
               fp32 sum: the cost of the cut alone
  auto-exact   the auto cut and the exact sum: the default

Models: the Fashion-MNIST CNN (global batch 192) and bert-mini on GCIDE
(global batch 128, sequence 128, prepared as bench/slow_link.py does).

Usage: bench/micro_batch_cost.py [--build build] [--data data/gcide-128]
                                 [--repeats 3] [--steps 12] [--only cnn|bert]
Prints one JSON line per (model, ranks, variant) and a table of step times
relative to share-fp32.
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile

VARIANTS = ("share-fp32", "auto-fp32", "auto-exact")


def prepare_data(build, data):
    if os.path.exists(os.path.join(data, "manifest.json")):
        return
    print("micro_batch_cost: preparing GCIDE into %s" % data, flush=True)
    subprocess.run([os.path.join(build, "cohort"), "prepare", "--input", "/usr/share/dictd/gcide.dict.dz", "--out",
                    data, "--overwrite", "--vocab-size", "8192", "--max-seq-length", "128", "--max-predictions", "20",
                    "--dupe-factor", "1"], check=True, stdout=subprocess.DEVNULL)


def model_args(model, args):
    if model == "cnn":
        return 192, ["--model.name", "cnn", "--eval.max-samples", "100"]
    return 128, ["--train.task", "bert-pretrain", "--model.name", "bert", "--model.hidden", "256",
                 "--model.layers", "4", "--model.heads", "4", "--model.intermediate", "1024",
                 "--model.max-positions", "128", "--data.path", args.data, "--eval.split", "valid",
                 "--eval.max-samples", "64", "--train.precision", "fp32"]


def step_ms(args, model, ranks, variant, run_dir):
    batch, extra = model_args(model, args)
    micro = ["--data.micro-batch", str(batch // ranks)] if variant == "share-fp32" else []
    wire = ["--dist.grad-compression", "fp32"] if variant.endswith("fp32") else []
    cmd = [os.path.join(args.build, "cohort"), "train", *extra, "--data.global-batch", str(batch),
           "--train.max-steps", str(args.steps), "--log.every-steps", "1", "--eval.every-steps", "100000",
           "--threads", str(2 // ranks), "--nproc-per-node", str(ranks), "--quiet", "--overwrite",
           "--ckpt.every-steps", "0", "--out", run_dir, *micro, *wire]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    times = []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            j = json.loads(line)
            if j["kind"] == "train":
                times.append(j["phase_ms"]["step"])
    return statistics.median(times[2:])  # the first steps warm up


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--data", default="data/gcide-128")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--only", choices=("cnn", "bert"))
    args = p.parse_args()
    models = [args.only] if args.only else ["cnn", "bert"]
    if "bert" in models:
        prepare_data(args.build, args.data)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for model in models:
                for ranks in (1, 2):
                    for variant in VARIANTS:  # interleaved: one of each per round
                        ms = step_ms(args, model, ranks, variant, os.path.join(tmp, "run"))
                        results.setdefault((model, ranks, variant), []).append(ms)
                        print("round %d %s %d rank(s) %s: %.1f ms/step" % (rep + 1, model, ranks, variant, ms),
                              flush=True)
    print()
    print("| model | ranks x threads | share-fp32 ms/step | auto-fp32 | auto-exact |")
    print("|---|---|---|---|---|")
    for model in models:
        for ranks in (1, 2):
            med = {v: statistics.median(results[(model, ranks, v)]) for v in VARIANTS}
            for v in VARIANTS:
                print(json.dumps({"model": model, "ranks": ranks, "variant": v, "median_step_ms": round(med[v], 1),
                                  "runs": results[(model, ranks, v)]}))
            base = med["share-fp32"]
            print("| %s | %d x %d | %.0f | %.0f (%.2fx) | %.0f (%.2fx) |" % (
                model, ranks, 2 // ranks, base, med["auto-fp32"], med["auto-fp32"] / base, med["auto-exact"],
                med["auto-exact"] / base))


if __name__ == "__main__":
    main()
