#!/usr/bin/env python3
"""ModernBERT masked-LM pretraining at 512 tokens, side by side and
interleaved: Cohort (model.name modernbert, packed and unpacked rows)
against Hugging Face's Trainer with ModernBertForMaskedLM and
DataCollatorForLanguageModeling as users run them
(bench/peers/hf_trainer_modernbert.py: one process on the CPU, the
Trainer's defaults for the loader and optimizer, fp32 unless --precision
bf16).

Both sides: the same ModernBERT (by default H=256, L=4, A=4, GeGLU of 384,
a 128-token window, global attention every 3rd layer from the first, 512
positions, no dropout, the shards' vocabulary), masks drawn afresh at 0.3,
global batch 32, AdamW (lr 5e-4, weight decay 0.01, eps 1e-6), a linear
schedule with 5% warm-up, clipping at 1.0, one process, --threads threads
(torch.set_num_threads; Cohort's train.threads). Both train on the same
rows in the same order: Cohort's order, taken once from a run of a tiny
model with log.sample-ids (the order does not depend on the model), which
the peer reads in sequence; every Cohort run also writes its sample ids
and the bench checks them against that order.

Throughput is real (non-padding) tokens trained per second, the first
--warmup-steps steps left out (start-up, first allocations): Cohort's from
its metrics.jsonl train lines after the first (log.every-steps =
--warmup-steps; each line's tokens_per_s is the interval's input_mask sum
over its wall time, so the interval's seconds are its tokens, known from
the order, over that rate); HF's from step-end times and the Trainer's own
non-padding token count (include_num_input_tokens_seen). Each round runs
[HF, Cohort packed, Cohort unpacked]; the summary gives medians over
--repeats rounds and the Cohort/HF ratios of the medians.

Data: shards from `cohort prepare --input GCIDE --vocab-size 8192
--max-seq-length 512 --nsp false --masking none` in --data (made there
when missing; under half a minute for GCIDE).

Usage: /opt/cohort/venv/bin/python3 bench/modernbert_vs_hf.py [--data data/gcide-full-512] [--steps 20]
           [--warmup-steps 5] [--batch 32] [--repeats 3] [--threads N] [--precision fp32|bf16] [--hf-attn sdpa|eager]
           [--cohort-precision fp32|bf16|auto] [--micro-batch N]
"""
import argparse
import glob
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time

import h5py
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GCIDE = "/usr/share/dictd/gcide.dict.dz"
PY = sys.executable


def cpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def show(cmd):
    return " ".join(shlex.quote(c) for c in cmd)


def run(cmd, what):
    """Runs cmd, its output captured; on failure prints its tail and exits."""
    t0 = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-4000:])
        sys.exit("%s failed (exit %d): %s" % (what, p.returncode, show(cmd)))
    return p.stdout, time.time() - t0


def prepare(args):
    manifest = os.path.join(args.data, "manifest.json")
    if not os.path.exists(manifest):
        if os.path.exists(args.data) and os.listdir(args.data):
            sys.exit("%s exists without a manifest.json: remove it or name another --data" % args.data)
        cmd = [args.cohort, "prepare", "--input", args.input, "--out", args.data, "--vocab-size",
               str(args.vocab_size), "--max-seq-length", str(args.max_seq_length), "--nsp", "false", "--masking",
               "none", "--quiet"]
        print("preparing %s (not found): %s" % (args.data, show(cmd)), flush=True)
        _, secs = run(cmd, "cohort prepare")
        print("prepared in %.1f s" % secs, flush=True)
    with open(manifest) as f:
        m = json.load(f)
    if m.get("nsp") is not False or m.get("masking") != "none":
        sys.exit("%s: want shards from prepare --nsp false --masking none (found nsp %s, masking %s)" %
                 (args.data, m.get("nsp"), m.get("masking")))
    if m.get("max_seq_length") != args.max_seq_length:
        print("note: %s holds rows of %s tokens, not --max-seq-length %d" %
              (args.data, m.get("max_seq_length"), args.max_seq_length), flush=True)
    return m


def row_lengths(data):
    """Real tokens of every train row, indexed by Cohort's sample id (the shards in name order)."""
    parts = []
    for path in sorted(glob.glob(os.path.join(data, "train", "*.hdf5"))):
        with h5py.File(path, "r") as f:
            parts.append(np.asarray(f["input_mask"][:], dtype=np.int64).sum(1))
    return np.concatenate(parts)


def model_keys(args):
    return ["--model.hidden", str(args.hidden), "--model.layers", str(args.layers), "--model.heads", str(args.heads),
            "--model.intermediate", str(args.intermediate), "--model.local-attention", str(args.local_attention),
            "--model.global-every", str(args.global_every), "--model.max-positions", str(args.max_positions)]


def cohort_cmd(args, out, packed, tiny=False):
    model = (["--model.hidden", "16", "--model.layers", "1", "--model.heads", "1", "--model.intermediate", "16",
              "--model.max-positions", str(args.max_positions)] if tiny else model_keys(args))
    cmd = [args.cohort, "train", "--train.task", "bert-pretrain", "--model.name", "modernbert"] + model + [
        "--model.dropout", "0", "--model.attention-dropout", "0", "--data.path", args.data,
        "--data.global-batch", str(args.batch), "--data.micro-batch", str(args.micro_batch), "--train.max-steps",
        str(args.steps), "--train.threads", str(args.threads), "--train.precision",
        "fp32" if tiny else args.cohort_precision, "--train.seed", str(args.seed),
        "--task.nsp=false", "--task.masking", "dynamic", "--task.mask-prob", str(args.mask_prob),
        "--optim.name", "adamw", "--optim.lr", str(args.lr), "--optim.weight-decay", "0.01", "--optim.eps", "1e-6",
        "--optim.schedule", "linear", "--optim.warmup-ratio", "0.05", "--optim.clip-norm", "1.0",
        "--log.every-steps", str(args.warmup_steps), "--eval.every-steps", "1000000", "--eval.max-samples", "64",
        "--ckpt.every-steps", "0", "--log.tensorboard=false", "--log.sample-ids", "--quiet", "--overwrite",
        "--out", out]
    if packed:
        cmd.append("--data.pack")
    return cmd


def sample_ids(out):
    steps = {}
    for line in open(os.path.join(out, "sample-ids", "rank-0.jsonl")):
        j = json.loads(line)
        steps[j["step"]] = j["ids"]
    return [steps[s] for s in sorted(steps)]


def take_order(args):
    """Cohort's rows per step, from a tiny model's log.sample-ids run."""
    out = os.path.join(args.work, "order")
    cmd = cohort_cmd(args, out, packed=False, tiny=True)
    print("order: %s" % show(cmd), flush=True)
    _, secs = run(cmd, "cohort (order run)")
    steps = sample_ids(out)
    if len(steps) != args.steps or any(len(s) != args.batch for s in steps):
        sys.exit("order run: %d steps, sizes %s" % (len(steps), sorted({len(s) for s in steps})))
    path = os.path.join(args.work, "order.json")
    with open(path, "w") as f:
        json.dump({"steps": steps}, f)
    print("order: %d steps of %d rows (%.0f s)" % (len(steps), args.batch, secs), flush=True)
    return path, steps


def hf_cmd(args, order_path):
    return [PY, os.path.join(ROOT, "bench", "peers", "hf_trainer_modernbert.py"), "--data", args.data, "--order",
            order_path, "--steps", str(args.steps), "--warmup-steps", str(args.warmup_steps), "--batch",
            str(args.batch), "--mask-prob", str(args.mask_prob), "--lr", str(args.lr), "--seed", str(args.seed),
            "--threads", str(args.threads), "--precision", args.precision, "--attn", args.hf_attn, "--hidden",
            str(args.hidden), "--layers", str(args.layers), "--heads", str(args.heads), "--intermediate",
            str(args.intermediate), "--local-attention", str(args.local_attention), "--global-every",
            str(args.global_every), "--max-positions", str(args.max_positions)]


def hf_run(args, cmd, step_tokens):
    out, wall = run(cmd, "the HF peer")
    j = json.loads(out.strip().splitlines()[-1])
    want = int(sum(step_tokens[args.warmup_steps:]))
    if j["timed_tokens"] != want:
        print("  warning: HF counted %d tokens in the timed steps, the order holds %d" % (j["timed_tokens"], want))
    return {"tokens_per_s": j["tokens_per_s"], "step_ms": j["step_ms"], "wall_s": wall, "loss": j["last_loss"],
            "extra": "attn %s, optim %s, threads %d" % (j["attn"], j["optim"], j["threads"])}


def cohort_run(args, cmd, out, order, step_tokens):
    shutil.rmtree(out, ignore_errors=True)
    _, wall = run(cmd, "cohort train")
    if sample_ids(out) != order:
        sys.exit("%s: the run's sample ids differ from the order the HF peer read" % out)
    lines = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    train = [l for l in lines if l.get("kind") == "train"]
    if not train or train[-1]["step"] != args.steps:
        sys.exit("%s: no train line at step %d" % (out, args.steps))
    assert all(l.get("unit") == "tokens" for l in train), train[0]
    tokens = secs = step_secs = 0.0
    prev, loss = None, None
    for l in train:
        if prev is None:  # the first interval includes start-up
            prev = l["step"]
            continue
        t = float(sum(step_tokens[prev:l["step"]]))
        tokens += t
        secs += t / l["tokens_per_s"]
        step_secs += l["phase_ms"]["step"] * (l["step"] - prev) / 1000
        prev, loss = l["step"], l["mlm_loss"]
    timed = args.steps - train[0]["step"]
    return {"tokens_per_s": tokens / secs, "step_ms": 1000 * secs / timed, "wall_s": wall, "loss": loss,
            "extra": "step phase %.0f ms/step (%.0f tok/s)" % (1000 * step_secs / timed, tokens / step_secs)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--cohort", default=os.path.join(ROOT, "build", "cohort"))
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "gcide-full-512"),
                    help="shards from prepare --nsp false --masking none (made when missing)")
    ap.add_argument("--input", default=GCIDE, help="what --data is prepared from when missing")
    ap.add_argument("--vocab-size", type=int, default=8192, help="when preparing --data")
    ap.add_argument("--max-seq-length", type=int, default=512, help="when preparing --data")
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "modernbert_vs_hf"), help="runs and the order")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup-steps", type=int, default=5, help="steps left out of the throughput (and log interval)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3, help="rounds of [HF, Cohort packed, Cohort unpacked]")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="HF: TrainingArguments(bf16=True); Cohort: --train.precision bf16")
    ap.add_argument("--cohort-precision", choices=["fp32", "bf16", "auto"],
                    help="Cohort's train.precision when not --precision's (auto: Cohort's default, bf16 on a CPU "
                         "with AMX), to compare each side as users run it: HF's default is fp32")
    ap.add_argument("--micro-batch", type=int,
                    help="Cohort's data.micro-batch (default --batch: one process computes the step at once, as "
                         "Cohort's start-up note advises; 0 = its automatic cut of 12 micro-batches)")
    ap.add_argument("--hf-attn", choices=["sdpa", "eager"], default="sdpa")
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--mask-prob", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=384)
    ap.add_argument("--local-attention", type=int, default=128)
    ap.add_argument("--global-every", type=int, default=3)
    ap.add_argument("--max-positions", type=int, default=512)
    args = ap.parse_args()
    args.cohort_precision = args.cohort_precision or args.precision
    args.micro_batch = args.batch if args.micro_batch is None else args.micro_batch
    if not 0 < args.warmup_steps < args.steps:
        sys.exit("need 0 < --warmup-steps < --steps")
    args.data = os.path.abspath(args.data)
    os.makedirs(args.work, exist_ok=True)

    manifest = prepare(args)
    lengths = row_lengths(args.data)
    order_path, order = take_order(args)
    step_tokens = [int(lengths[s].sum()) for s in order]
    timed = step_tokens[args.warmup_steps:]
    print("machine: %s, %d threads per run, one process" % (cpu_model(), args.threads))
    print("data: %s (%d train rows of up to %s tokens, vocabulary %s); the timed steps hold %.0f real tokens a "
          "step (%.0f a row)" % (args.data, len(lengths), manifest.get("max_seq_length"), manifest.get("vocab_size"),
                                 statistics.mean(timed), statistics.mean(timed) / args.batch))
    print("ModernBERT H=%d L=%d A=%d I=%d window %d global every %d, batch %d, %d steps (the first %d untimed), "
          "mask prob %g; HF %s, Cohort %s, Cohort's micro-batch %s" %
          (args.hidden, args.layers, args.heads, args.intermediate, args.local_attention, args.global_every, args.batch,
           args.steps, args.warmup_steps, args.mask_prob, args.precision, args.cohort_precision,
           args.micro_batch or "auto"))
    sides = {
        "hf": ("HF Trainer (%s)" % args.hf_attn, hf_cmd(args, order_path)),
        "packed": ("Cohort packed", cohort_cmd(args, os.path.join(args.work, "packed"), packed=True)),
        "unpacked": ("Cohort unpacked", cohort_cmd(args, os.path.join(args.work, "unpacked"), packed=False)),
    }
    for key, (name, cmd) in sides.items():
        print("%s: %s" % (name, show(cmd)))
    sys.stdout.flush()
    results = {k: [] for k in sides}
    for r in range(args.repeats):
        for key, (name, cmd) in sides.items():
            if key == "hf":
                res = hf_run(args, cmd, step_tokens)
            else:
                res = cohort_run(args, cmd, os.path.join(args.work, key), order, step_tokens)
            results[key].append(res)
            print("  round %d %-20s %8.0f tok/s %8.0f ms/step  wall %5.0f s  loss %.3f  (%s)" %
                  (r + 1, name, res["tokens_per_s"], res["step_ms"], res["wall_s"], res["loss"], res["extra"]),
                  flush=True)
    med = {k: statistics.median(x["tokens_per_s"] for x in v) for k, v in results.items()}
    print("\nmedians of %d rounds, real tokens/s:" % args.repeats)
    for key, (name, _) in sides.items():
        print("  %-20s %8.0f  (runs: %s)" % (name, med[key],
                                            ", ".join("%.0f" % x["tokens_per_s"] for x in results[key])))
    print("  Cohort/HF: packed %.2f, unpacked %.2f; packed/unpacked %.2f" %
          (med["packed"] / med["hf"], med["unpacked"] / med["hf"], med["packed"] / med["unpacked"]))

    print("\n| precision | HF Trainer (%s) | Cohort unpacked | Cohort packed | unpacked / HF | packed / HF | "
          "packed / unpacked |" % args.hf_attn)
    print("|---|---|---|---|---|---|---|")
    print("| %s | %.0f | %.0f | %.0f | %.2f | %.2f | %.2f |" %
          (args.precision if args.cohort_precision == args.precision else
           "HF %s, Cohort %s" % (args.precision, args.cohort_precision), med["hf"], med["unpacked"], med["packed"], med["unpacked"] / med["hf"],
           med["packed"] / med["hf"], med["packed"] / med["unpacked"]))
    print("\n(Real tokens/s, median of %d interleaved rounds; per run: HF %s; unpacked %s; packed %s. "
          "%s, %d threads, one process; %d steps of %d rows of up to %s tokens, steps %d.. timed.)" %
          (args.repeats, ", ".join("%.0f" % x["tokens_per_s"] for x in results["hf"]),
           ", ".join("%.0f" % x["tokens_per_s"] for x in results["unpacked"]),
           ", ".join("%.0f" % x["tokens_per_s"] for x in results["packed"]), cpu_model(), args.threads, args.steps,
           args.batch, manifest.get("max_seq_length"), args.warmup_steps + 1))


if __name__ == "__main__":
    main()
