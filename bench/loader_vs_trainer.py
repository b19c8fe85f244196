#!/usr/bin/env python3
"""Loader throughput beside the trainer's consumption, for bert-tiny and
bert-small on the same shards: if the loader's samples/s is well above the
trainer's, training never waits for data (the step-time breakdown's `data`
phase confirms it).

Usage: /opt/cohort/venv/bin/python3 bench/loader_vs_trainer.py DATA_DIR [--build build] [--steps 40]
"""
import argparse
import json
import os
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    cohort = os.path.join(args.build, "cohort")
    print("%-11s %7s %14s %16s %12s %8s" % ("model", "batch", "loader smp/s", "trainer smp/s", "data ms/step",
                                          "headroom"))
    for name, batch in (("bert-tiny", 64), ("bert-small", 64)):
        out = subprocess.run([os.path.join(args.build, "bench", "loader_bench"), args.data, str(batch),
                              str(args.workers), "200"], check=True, capture_output=True, text=True).stdout
        loader = json.loads(out.strip().splitlines()[-1])["samples_per_s"]
        with tempfile.TemporaryDirectory() as run:
            subprocess.run([cohort, "train", "--config", os.path.join(ROOT, "examples", name + ".toml"),
                            "--data.path", args.data, "--data.global-batch", str(batch),
                            "--data.workers", str(args.workers), "--train.max-steps", str(args.steps),
                            "--log.every-steps", str(max(1, args.steps // 4)), "--eval.every-steps", "1000000",
                            "--eval.max-samples", "64", "--ckpt.every-steps", "0", "--log.tensorboard=false",
                            "--quiet", "--overwrite", "--out", run], check=True)
            lines = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
            train = [l for l in lines if l["kind"] == "train"][1:]  # the first interval includes start-up
            step_ms = sorted(l["phase_ms"]["step"] for l in train)[len(train) // 2]
            data_ms = sorted(l["phase_ms"]["data"] for l in train)[len(train) // 2]
        consumed = batch / (step_ms / 1e3)
        print("%-11s %7d %14.0f %16.0f %12.2f %7.1fx" % (name, batch, loader, consumed, data_ms, loader / consumed))


if __name__ == "__main__":
    main()
