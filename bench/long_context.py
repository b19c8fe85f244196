#!/usr/bin/env python3
"""Long context with activation checkpointing: a bert-tiny-sized ModernBERT
(H=128, L=2, A=2, GeGLU of 256; layer 0 global, layer 1 a 128-token window)
pretrained on rows of 8,192 tokens (GCIDE full-sentence rows, 8 rows a
step in one micro-batch, masks at 30%), with and without
train.activation-checkpointing.

1. Without a limit, each way: peak resident memory (the largest rank's, from
   getrusage of the waited-for processes) and the median step time after
   the first step.
2. Under a memory limit between the two peaks, imposed with a cgroup (v1
   memory.limit_in_bytes, or v2 memory.max; swap off for the group): the run
   without checkpointing is killed by the kernel's OOM killer, the run with it
   trains to the end.

Needs root (the cgroup). Data: `cohort prepare --max-seq-length 8192 --nsp
false --masking none` on GCIDE in --data (made there when missing, about 15 s).

Usage: /opt/cohort/venv/bin/python3 bench/long_context.py [--data data/gcide-8k] [--steps 4] [--rows 8]
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GCIDE = "/usr/share/dictd/gcide.dict.dz"


def cgroup_dir():
    """A fresh memory cgroup: (directory, the file holding its limit, the file to join it)."""
    name = "cohort-long-context-%d" % os.getpid()
    if os.path.isdir("/sys/fs/cgroup/memory"):  # v1
        d = os.path.join("/sys/fs/cgroup/memory", name)
        os.makedirs(d, exist_ok=True)
        return d, "memory.limit_in_bytes", "cgroup.procs"
    d = os.path.join("/sys/fs/cgroup", name)  # v2
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "memory.swap.max"), "w") as f:
        f.write("0")
    return d, "memory.max", "cgroup.procs"


def train(cohort, data, out, checkpoint, steps, rows, limit_bytes=None):
    cmd = [cohort, "train", "--train.task", "bert-pretrain", "--model.name", "modernbert", "--model.hidden", "128",
           "--model.layers", "2", "--model.heads", "2", "--model.intermediate", "256", "--model.max-positions", "8192",
           "--model.local-attention", "128", "--model.dropout", "0", "--model.attention-dropout", "0",
           "--task.nsp=false", "--task.masking", "dynamic", "--task.mask-prob", "0.3", "--data.path", data,
           "--data.global-batch", str(rows), "--data.micro-batch", str(rows), "--train.max-steps", str(steps),
           "--log.every-steps", "1", "--eval.every-steps", "0", "--ckpt.every-steps", "0", "--train.precision", "fp32",
           "--train.threads", "2", "--log.tensorboard=false", "--train.activation-checkpointing=%s" % str(checkpoint).lower(),
           "--quiet", "--overwrite", "--out", out]
    group = None
    preexec = None
    if limit_bytes:
        group, limit_file, procs = cgroup_dir()
        with open(os.path.join(group, limit_file), "w") as f:
            f.write(str(limit_bytes))
        if os.path.exists(os.path.join(group, "memory.memsw.limit_in_bytes")):
            try:  # v1 with swap accounting: no swap either
                with open(os.path.join(group, "memory.memsw.limit_in_bytes"), "w") as f:
                    f.write(str(limit_bytes))
            except OSError:
                pass

        def preexec():
            with open(os.path.join(group, procs), "w") as f:
                f.write(str(os.getpid()))

    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=preexec)
    wall = time.time() - t0
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if group:
        os.rmdir(group)
    steps_ms = []
    metrics = os.path.join(out, "metrics.jsonl")
    if os.path.exists(metrics):
        for line in open(metrics):
            j = json.loads(line)
            if j.get("kind") == "train":
                steps_ms.append(j["phase_ms"]["step"])
    return {"code": p.returncode, "peak_gib": peak_kb / 2**20 if peak_kb > before else None, "wall_s": wall,
            "step_s": statistics.median(steps_ms[1:]) / 1e3 if len(steps_ms) > 1 else None,
            "steps": len(steps_ms), "tail": p.stdout[-600:], "cmd": " ".join(cmd)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "gcide-8k"))
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rows", type=int, default=8)
    args = ap.parse_args()
    cohort = os.path.join(args.build, "cohort")
    if os.geteuid() != 0:
        sys.exit("long_context.py: needs root, for the cgroup that imposes the memory limit")
    if not os.path.exists(os.path.join(args.data, "manifest.json")):
        print("preparing %s from GCIDE at 8192 tokens (about 15 s)" % args.data, flush=True)
        subprocess.run([cohort, "prepare", "--input", GCIDE, "--out", args.data, "--vocab-size", "8192",
                        "--max-seq-length", "8192", "--nsp", "false", "--masking", "none", "--quiet", "--overwrite"],
                       check=True)
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((l.split(":", 1)[1].strip() for l in cpu.splitlines() if l.startswith("Model name")), "?")
    print("CPU: %s; %d rows of 8192 tokens a step, %d steps, 2 threads, fp32" % (model, args.rows, args.steps))
    work = tempfile.mkdtemp(prefix="long_context.")
    try:
        # Each measured alone: RUSAGE_CHILDREN's peak is the largest so far,
        # so the smaller (checkpointed) run goes first.
        free = {}
        for checkpoint in (True, False):
            r = train(cohort, args.data, os.path.join(work, "free-%s" % checkpoint), checkpoint, args.steps, args.rows)
            if r["code"] != 0:
                sys.exit("the run failed:\n%s\n%s" % (r["cmd"], r["tail"]))
            free[checkpoint] = r
            print("no limit, checkpointing %-5s: peak %.2f GiB, %.2f s a step (median after the first)"
                  % (checkpoint, r["peak_gib"], r["step_s"]), flush=True)
        limit = (free[True]["peak_gib"] + free[False]["peak_gib"]) / 2
        print("limit: %.2f GiB (a memory cgroup, swap off), between the two peaks" % limit, flush=True)
        limited = {}
        for checkpoint in (False, True):
            r = train(cohort, args.data, os.path.join(work, "limited-%s" % checkpoint), checkpoint, args.steps,
                      args.rows, limit_bytes=int(limit * 2**30))
            limited[checkpoint] = r
            outcome = "trained %d steps" % r["steps"] if r["code"] == 0 else "exit %d after %d steps: %s" % (
                r["code"], r["steps"], r["tail"].strip().splitlines()[-1] if r["tail"].strip() else "killed")
            print("limit %.2f GiB, checkpointing %-5s: %s" % (limit, checkpoint, outcome), flush=True)
        print("\n| activation checkpointing | peak memory | step time | under a %.1f GiB limit |" % limit)
        print("|---|---|---|---|")
        for checkpoint in (False, True):
            f, l = free[checkpoint], limited[checkpoint]
            print("| %s | %.2f GiB | %.1f s | %s |" % ("on" if checkpoint else "off", f["peak_gib"], f["step_s"],
                                                      "trains" if l["code"] == 0 else "killed (out of memory)"))
        print("\ncommand (no limit, checkpointing on):\n  " + free[True]["cmd"])
        ok = limited[True]["code"] == 0 and limited[False]["code"] != 0
        print("\n%s" % ("as expected: only the checkpointed run fits" if ok else "UNEXPECTED: see above"))
        sys.exit(0 if ok else 1)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
