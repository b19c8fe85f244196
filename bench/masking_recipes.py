#!/usr/bin/env python3
"""Pretraining recipes side by side: static masks with NSP (NVIDIA's 2019
recipe) against dynamic masks at 0.15 and 0.3, with and without NSP
(RoBERTa's and today's), and Hugging Face's Trainer with
DataCollatorForLanguageModeling on the no-NSP recipe (bench/peers/hf_trainer_mlm.py).

bert-mini (examples/bert-mini.toml's model and optimizer) on GCIDE, every run
the same steps, global batch and schedule (linear, 5% warm-up), 2 threads,
one process. Cohort runs at the example's train.precision auto (bf16 on a
CPU with AMX); HF in fp32, the Trainer's default, and with bf16=True. Each run is scored once at its end on the same
held-out rows with the same fixed masks: the valid split of full-sentence
rows masked by `cohort prepare` at 0.15 (so a run's own mask rate does not
change what it is scored on). Prints a table: validation MLM accuracy and
loss, and the wall time of the whole command (start-up, training, the final
evaluation); then the Cohort/HF ratios. The recipes in --repeat run again
in rounds 2..--rounds, interleaved; the table shows medians.

Data (made once under --work, about 1 minute each, with data/gcide's
vocabulary): the pair shards (--pairs, `make demo`'s data/gcide: static
masks, NSP pairs), full-sentence unmasked shards (`--masking none --nsp
false`), and full-sentence masked shards for scoring.

Usage: /opt/cohort/venv/bin/python3 bench/masking_recipes.py [--steps 200] [--batch 64]
           [--rounds 2] [--recipes static-nsp,dyn15-nsp,dyn30-nsp,dyn15-mlm,dyn30-mlm,hf15-mlm,hf15-mlm-bf16]
           [--repeat dyn15-mlm,hf15-mlm,hf15-mlm-bf16]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GCIDE = "/usr/share/dictd/gcide.dict.dz"
PY = sys.executable

# name -> (data: pairs | full, extra cohort keys); hf* runs the Hugging Face peer.
RECIPES = {
    "static-nsp": ("pairs", []),
    "dyn15-nsp": ("pairs", ["--task.masking", "dynamic", "--task.mask-prob", "0.15"]),
    "dyn30-nsp": ("pairs", ["--task.masking", "dynamic", "--task.mask-prob", "0.3"]),
    "dyn15-mlm": ("full", ["--task.nsp=false", "--task.masking", "dynamic", "--task.mask-prob", "0.15"]),
    "dyn30-mlm": ("full", ["--task.nsp=false", "--task.masking", "dynamic", "--task.mask-prob", "0.3"]),
    "hf15-mlm": ("full", (0.15, "fp32")),
    "hf15-mlm-bf16": ("full", (0.15, "bf16")),
    "hf30-mlm": ("full", (0.3, "fp32")),
}


def prepare(cohort, out, vocab, extra):
    if os.path.exists(os.path.join(out, "manifest.json")):
        return
    print("preparing", out, flush=True)
    subprocess.run([cohort, "prepare", "--input", GCIDE, "--out", out, "--vocab", vocab, "--max-seq-length", "128",
                    "--max-predictions", "20", "--dupe-factor", "1", "--quiet", "--overwrite"] + extra, check=True)


def run_data(work, name, train_dir, score_dir):
    """WORK/name: train_dir's train split and manifest, score_dir's valid split."""
    d = os.path.join(work, name)
    if not os.path.exists(d):
        os.makedirs(d)
        os.symlink(os.path.join(train_dir, "train"), os.path.join(d, "train"))
        os.symlink(os.path.join(score_dir, "valid"), os.path.join(d, "valid"))
        shutil.copy(os.path.join(train_dir, "vocab.txt"), d)
        with open(os.path.join(train_dir, "manifest.json")) as f:
            manifest = json.load(f)
        manifest["masking"] = "static"  # the valid split is masked; dynamic runs restore train rows anyway
        with open(os.path.join(d, "manifest.json"), "w") as f:
            json.dump(manifest, f, indent=2)
    return d


def cohort_run(args, data, extra, out):
    shutil.rmtree(out, ignore_errors=True)
    cmd = [args.cohort, "train", "--config", os.path.join(ROOT, "examples", "bert-mini.toml"), "--data.path", data,
           "--train.max-steps", str(args.steps), "--data.global-batch", str(args.batch), "--data.bucket", "0",
           "--data.pack", "--optim.schedule", "linear", "--optim.warmup-ratio", "0.05", "--eval.every-steps",
           str(args.steps), "--eval.max-samples", "0", "--log.every-steps", "50",
           "--quiet", "--out", out] + extra
    t0 = time.time()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.time() - t0
    evals, train_s, prev = [], 0.0, 0
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for line in f:
            j = json.loads(line)
            if j.get("kind") == "eval":
                evals.append(j)
            elif j.get("kind") == "train":  # the interval's mean step time, times its steps
                train_s += j["phase_ms"]["step"] * (j["step"] - prev) / 1000
                prev = j["step"]
    last = evals[-1]
    return {"mlm_accuracy": last["mlm_accuracy"], "mlm_loss": last["mlm_loss"], "wall_s": wall, "train_s": train_s}


def hf_run(args, data, score, prob, precision):
    cmd = [PY, os.path.join(ROOT, "bench", "peers", "hf_trainer_mlm.py"), "--data", data, "--eval", score,
           "--vocab", os.path.join(data, "vocab.txt"), "--steps", str(args.steps), "--batch", str(args.batch),
           "--mask-prob", str(prob), "--precision", precision]
    t0 = time.time()
    p = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    wall = time.time() - t0
    j = json.loads(p.stdout.strip().splitlines()[-1])
    return {"mlm_accuracy": j["mlm_accuracy"], "mlm_loss": j["mlm_loss"], "wall_s": wall, "train_s": j["train_s"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cohort", default=os.path.join(ROOT, "build", "cohort"))
    ap.add_argument("--pairs", default=os.path.join(ROOT, "data", "gcide"), help="make demo's shards")
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "masking_recipes"))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2, help="rounds of --repeat; the table shows medians")
    ap.add_argument("--recipes", default="static-nsp,dyn15-nsp,dyn30-nsp,dyn15-mlm,dyn30-mlm,hf15-mlm,hf15-mlm-bf16")
    ap.add_argument("--repeat", default="dyn15-mlm,hf15-mlm,hf15-mlm-bf16",
                    help="the recipes run again, interleaved, in rounds 2.. (the others run once)")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    vocab = os.path.join(args.pairs, "vocab.txt")
    if not os.path.exists(vocab):
        sys.exit("no %s: run make demo (or cohort prepare into --pairs) first" % vocab)
    full = os.path.join(args.work, "full")
    score = os.path.join(args.work, "full-masked")
    prepare(args.cohort, full, vocab, ["--masking", "none", "--nsp", "false"])
    prepare(args.cohort, score, vocab, ["--masking", "static", "--nsp", "false"])
    data = {"pairs": run_data(args.work, "pairs-scored", args.pairs, score),
            "full": run_data(args.work, "full-scored", full, score)}
    names = args.recipes.split(",")
    print("bert-mini on GCIDE, %d steps of %d, linear schedule; Cohort at train.precision auto (bf16 on a CPU "
          "with AMX), HF in fp32 (its default) or bf16; scored on the valid split of full-sentence rows masked "
          "at 0.15; %s repeated in %d rounds" % (args.steps, args.batch, args.repeat, args.rounds), flush=True)
    results = {n: [] for n in names}
    repeat = args.repeat.split(",") if args.repeat else []
    for r in range(args.rounds):
        for n in names:
            if r > 0 and n not in repeat:
                continue
            kind, extra = RECIPES[n]
            if n.startswith("hf"):
                res = hf_run(args, full, score, *extra)
            else:
                res = cohort_run(args, data[kind], extra, os.path.join(args.work, "runs", n))
            results[n].append(res)
            print("  round %d %-11s accuracy %.4f loss %.4f wall %.0f s" %
                  (r + 1, n, res["mlm_accuracy"], res["mlm_loss"], res["wall_s"]), flush=True)
    med = {n: {k: statistics.median(x[k] for x in v) for k in v[0]} for n, v in results.items()}
    print("\n| recipe | data | runs | validation MLM accuracy | validation MLM loss | wall time (s) |")
    print("|---|---|---|---|---|---|")
    for n in names:
        m = med[n]
        print("| %s | %s | %d | %.4f | %.4f | %.0f |" % (n, RECIPES[n][0], len(results[n]), m["mlm_accuracy"],
                                                      m["mlm_loss"], m["wall_s"]))
    for n in names:
        if not n.startswith("hf"):
            continue
        mine = "dyn" + n[2:].replace("-bf16", "")
        if mine in med:
            print("%s against %s: accuracy %+.4f, wall time %.2fx less (median of %d); the training steps alone: "
                  "Cohort %.0f s, HF's trainer.train() %.0f s, %.2fx" %
                  (mine, n, med[mine]["mlm_accuracy"] - med[n]["mlm_accuracy"], med[n]["wall_s"] / med[mine]["wall_s"],
                   len(results[n]), med[mine]["train_s"], med[n]["train_s"], med[n]["train_s"] / med[mine]["train_s"]))


if __name__ == "__main__":
    main()
