#!/usr/bin/env python3
"""dist.shard's memory and speed: peak resident memory per rank and step
time for BERT-base with AdamW, against PyTorch's ZeroRedundancyOptimizer.

Every run trains BERT-base (hidden 768, 12 layers, 12 heads, vocabulary
30522) on GCIDE shards from `cohort prepare` (sequences of 128), --batch
samples per rank, one thread per rank, fp32, --steps steps. Per world size
(--worlds, default 2,3) it runs, one after another:

  cohort none         dist.shard none: the whole AdamW state and gradients on every rank
  cohort optimizer    dist.shard optimizer (ZeRO 1)
  cohort gradients    dist.shard gradients (ZeRO 2)
  cohort gradients 2:1  dist.shard-weights 2,1[,1]: rank 0 holds twice a share
  cohort sgd          optim.name sgd (momentum 0): no optimizer state, the baseline
  torch ddp           DDP + torch.optim.AdamW, as users run it (bench/peers/bert_pretrain.py)
  torch zero          DDP (gradient_as_bucket_view) + ZeroRedundancyOptimizer(AdamW)
  torch sgd           DDP (gradient_as_bucket_view) + SGD: the PyTorch baseline

A Cohort run is held before step steps+1 (COHORT_DEBUG_GATE) while the bench
reads every rank's VmHWM (its peak resident set so far) from /proc; a
PyTorch rank prints its own ru_maxrss after its last step. Printed per run
and rank: the peak in MiB, and "state": the peak less the run's baseline
(the sgd run of the same side and world, less its one copy of the
gradients, 4 bytes a parameter): what the optimizer state and the
gradients cost that rank.

Then --time-rounds rounds, interleaved, of none, optimizer and gradients at
world 2, --time-steps steps each: the median step time (the train lines'
phase_ms.step, the first two steps left out) per mode, and its ratio to none.

Usage: /opt/cohort/venv/bin/python3 bench/shard_memory.py [--worlds 2,3] [--steps 3] [--batch 2]
           [--time-rounds 3] [--time-steps 8] [--data data/gcide] [--build build]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from slow_link import prepare_data  # GCIDE shards, as the slow-link bench prepares them

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = sys.executable
BASE = {"hidden": 768, "layers": 12, "heads": 12, "vocab": 30522}


def cohort_cmd(args, world, steps, out, extra):
    return [os.path.join(args.build, "cohort"), "train", "--train.task", "bert-pretrain", "--model.name", "bert",
            "--model.hidden", str(BASE["hidden"]), "--model.layers", str(BASE["layers"]), "--model.heads",
            str(BASE["heads"]), "--model.vocab-size", str(BASE["vocab"]), "--data.path", args.data,
            "--data.global-batch", str(args.batch * world), "--data.workers", "1", "--optim.lr", "1e-4",
            "--optim.clip-norm", "1.0", "--train.precision", "fp32", "--train.threads", "1",
            "--train.max-steps", str(steps), "--eval.every-steps", "0", "--eval.max-samples", "8",
            "--log.every-steps", "1", "--ckpt.every-steps", "0", "--nproc-per-node", str(world), "--oversubscribe",
            "--quiet", "--out", out, "--overwrite"] + extra


def ranks_of(launcher_pid):
    """The launcher's children (its ranks), by pid."""
    kids = []
    for tid in os.listdir("/proc/%d/task" % launcher_pid):
        with open("/proc/%d/task/%s/children" % (launcher_pid, tid)) as f:
            kids += [int(x) for x in f.read().split()]
    return kids


def vm_hwm_mb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def train_steps(metrics):
    if not os.path.exists(metrics):
        return []
    out = []
    for line in open(metrics):
        try:
            j = json.loads(line)
        except ValueError:
            continue  # a line being written
        if j.get("kind") == "train":
            out.append(j)
    return out


def cohort_memory(args, world, extra, work):
    """Every rank's peak RSS (MiB, rank order) after args.steps steps."""
    out = tempfile.mkdtemp(prefix="run-", dir=work)  # a fresh metrics.jsonl: no line of an earlier run
    gate = os.path.join(work, "gate")
    with open(gate, "w") as f:
        f.write(str(args.steps))
    env = dict(os.environ, COHORT_DEBUG_GATE=gate)
    p = subprocess.Popen(cohort_cmd(args, world, args.steps + 1, out, extra), env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    metrics = os.path.join(out, "metrics.jsonl")
    while not any(j["step"] == args.steps for j in train_steps(metrics)):
        if p.poll() is not None:
            raise SystemExit("shard_memory: cohort %s failed: %s" % (" ".join(extra), p.stderr.read()))
        time.sleep(0.2)
    # Every rank finished step `steps` (its line is agreed by all); they wait at the gate.
    ranks = sorted(ranks_of(p.pid))
    peaks = [vm_hwm_mb(pid) for pid in ranks]
    with open(gate, "w") as f:
        f.write(str(args.steps + 1))
    _, err = p.communicate()
    if p.returncode != 0:
        raise SystemExit("shard_memory: cohort %s failed: %s" % (" ".join(extra), err))
    shutil.rmtree(out)
    if len(peaks) != world:
        raise SystemExit("shard_memory: found %d rank processes, expected %d" % (len(peaks), world))
    return peaks


def torch_memory(args, world, optimizer):
    cmd = [PYTHON, os.path.join(ROOT, "bench", "peers", "bert_pretrain.py"), "--model", "mirror", "--mlm", "masked",
           "--vocab", str(BASE["vocab"]), "--hidden", str(BASE["hidden"]), "--layers", str(BASE["layers"]),
           "--heads", str(BASE["heads"]), "--batch", str(args.batch), "--steps", str(args.steps), "--threads", "1",
           "--precision", "fp32", "--data", args.data, "--ranks", str(world), "--optimizer", optimizer,
           "--report-memory", "--port", str(29700 + world)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit("shard_memory: torch %s failed: %s" % (optimizer, r.stderr[-2000:]))
    peaks = {}
    for line in r.stdout.splitlines():
        j = json.loads(line)
        if "peak_rss_mb" in j:
            peaks[j["rank"]] = j["peak_rss_mb"]
    return [peaks[r] for r in range(world)]


def params_of_base():
    """BERT-base pretraining's trainable parameters, as Cohort counts them."""
    h, layers, v, i = BASE["hidden"], BASE["layers"], BASE["vocab"], 4 * BASE["hidden"]
    emb = v * h + 512 * h + 2 * h + 2 * h
    layer = 4 * (h * h + h) + 2 * 2 * h + (h * i + i) + (i * h + h)
    heads = (h * h + h) + (h * 2 + 2) + (h * h + h) + 2 * h + v
    return emb + layers * layer + heads


def timing(args, work):
    modes = [("none", []), ("optimizer", ["--dist.shard", "optimizer"]), ("gradients", ["--dist.shard", "gradients"])]
    per = {m: [] for m, _ in modes}
    for rnd in range(args.time_rounds):
        for name, extra in modes:
            out = os.path.join(work, "time-%s" % name)
            subprocess.run(cohort_cmd(args, 2, args.time_steps, out, extra), check=True, capture_output=True)
            steps = [j["phase_ms"]["step"] for j in train_steps(os.path.join(out, "metrics.jsonl"))][2:]
            per[name].append(statistics.median(steps))
            print("  round %d %-9s median step %.0f ms" % (rnd + 1, name, per[name][-1]), flush=True)
    return {m: statistics.median(v) for m, v in per.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worlds", default="2,3")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=2, help="samples per rank per step")
    ap.add_argument("--time-rounds", type=int, default=3)
    ap.add_argument("--time-steps", type=int, default=8)
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "gcide"))
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--skip-torch", action="store_true")
    args = ap.parse_args()
    prepare_data(args.build, args.data)
    n = params_of_base()
    grad_mb = 4 * n / 2**20
    print("shard_memory: BERT-base, %.1fM parameters (gradients %.0f MiB, AdamW state %.0f MiB); %d sample(s) of "
          "128 a rank a step, fp32, %d steps" % (n / 1e6, grad_mb, 2 * grad_mb, args.batch, args.steps), flush=True)
    work = tempfile.mkdtemp(prefix="shard-memory-")
    for world in [int(w) for w in args.worlds.split(",")]:
        uneven = ",".join(["2"] + ["1"] * (world - 1))
        runs = [("cohort sgd", lambda: cohort_memory(args, world, ["--optim.name", "sgd", "--optim.momentum", "0"], work)),
                ("cohort none", lambda: cohort_memory(args, world, [], work)),
                ("cohort optimizer", lambda: cohort_memory(args, world, ["--dist.shard", "optimizer"], work)),
                ("cohort gradients", lambda: cohort_memory(args, world, ["--dist.shard", "gradients"], work)),
                ("cohort gradients %s" % uneven.replace(",", ":"),
                 lambda: cohort_memory(args, world, ["--dist.shard", "gradients", "--dist.shard-weights", uneven], work))]
        if not args.skip_torch:
            runs += [("torch sgd", lambda: torch_memory(args, world, "sgd")),
                     ("torch ddp", lambda: torch_memory(args, world, "adamw")),
                     ("torch zero", lambda: torch_memory(args, world, "zero"))]
        print("\nworld %d: peak RSS per rank, MiB (state = peak - baseline: optimizer state + gradients)" % world)
        print("  %-24s %s" % ("run", "  ".join("rank %d peak / state" % r for r in range(world))))
        base = {}
        for name, run in runs:
            peaks = run()
            side = name.split()[0]
            if name.endswith("sgd"):
                base[side] = [p - grad_mb for p in peaks]
            state = [p - b for p, b in zip(peaks, base[side])]
            print("  %-24s %s" % (name, "  ".join("%9.0f / %5.0f" % (p, s) for p, s in zip(peaks, state))), flush=True)
            if name == "cohort none":
                none_state = state
            if name == "cohort gradients":
                print("  %-24s %s" % ("  gradients / none", "  ".join(
                    "%17.0f%%" % (100 * s / t) for s, t in zip(state, none_state))), flush=True)
    if args.time_rounds:
        print("\nstep time at world 2, %d rounds interleaved, %d steps each (the first two left out):" %
              (args.time_rounds, args.time_steps))
        t = timing(args, work)
        for m in ("none", "optimizer", "gradients"):
            print("  %-10s %7.0f ms  %.3fx none" % (m, t[m], t[m] / t["none"]))


if __name__ == "__main__":
    main()
