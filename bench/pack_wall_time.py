#!/usr/bin/env python3
"""Wall time to the same validation loss, with and without data.pack.

Trains bert-mini (examples/bert-mini.toml) on GCIDE shards once per variant,
one after another, and reads each run's validation loss and the wall time it
was reached from the run's TensorBoard events (every event carries its wall
clock). Prints a table of the loss at every evaluation and the seconds since
the run started, and with --png draws the curves against wall time (gnuplot).

Variants: padded (data.bucket 0), packed (data.bucket 0, data.pack),
bucketed (the example's data.bucket 16) and bucketed-packed.

Usage: /opt/cohort/venv/bin/python3 bench/pack_wall_time.py [--cohort build/cohort]
           [--data data/gcide] [--steps 200] [--variants padded,packed,bucketed,bucketed-packed]
           [--png docs/pack_wall_time.png]
"""
import argparse
import glob
import os
import subprocess
import sys
import tempfile
import time

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = {
    "padded": ["--data.bucket", "0"],
    "packed": ["--data.bucket", "0", "--data.pack"],
    "bucketed": [],
    "bucketed-packed": ["--data.pack"],
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cohort", default=os.path.join(ROOT, "build", "cohort"))
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "gcide"))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--every", type=int, default=40, help="evaluate every N steps")
    ap.add_argument("--variants", default="padded,packed,bucketed,bucketed-packed")
    ap.add_argument("--png", default="", help="draw validation loss against wall time here")
    args = ap.parse_args()
    common = ["train", "--config", os.path.join(ROOT, "examples", "bert-mini.toml"), "--data.path", args.data,
              "--train.max-steps", str(args.steps), "--data.global-batch", "64", "--eval.every-steps",
              str(args.every), "--eval.max-samples", "1024", "--train.precision", "fp32", "--quiet"]
    print("bert-mini on %s, %d steps of 64, fp32, validation on 1024 samples every %d steps" %
          (args.data, args.steps, args.every))
    work = tempfile.mkdtemp(prefix="pack_wall_time.")
    curves = {}
    for name in args.variants.split(","):
        out = os.path.join(work, name)
        t0 = time.time()
        subprocess.run([args.cohort] + common + VARIANTS[name] + ["--out", out], check=True,
                       stdout=subprocess.DEVNULL)
        total = time.time() - t0
        events = EventAccumulator(glob.glob(os.path.join(out, "tensorboard", "events.out.tfevents.*"))[0],
                                  size_guidance={"scalars": 0})
        events.Reload()
        points = [(e.step, e.wall_time - t0, e.value) for e in events.Scalars("valid/loss")]
        curves[name] = (points, total)
        print("%-16s " % name + "  ".join("step %d %.3f at %.0f s" % (s, v, t) for s, t, v in points) +
              "   whole run %.0f s" % total)
        sys.stdout.flush()
    if args.png:
        table = os.path.join(work, "curves.dat")
        with open(table, "w") as f:
            for name, (points, _) in curves.items():
                f.write("# %s\n" % name)
                for s, t, v in points:
                    f.write("%.2f %.5f\n" % (t, v))
                f.write("\n\n")
        plots = ", ".join("'%s' index %d with linespoints title '%s'" % (table, i, name)
                          for i, name in enumerate(curves))
        script = ("set terminal pngcairo noenhanced size 800,480; set output '%s'; set xlabel 'wall time (s)'; "
                  "set ylabel 'validation loss'; set grid; set key top right; "
                  "set title 'bert-mini on GCIDE: validation loss against wall time'; plot %s" % (args.png, plots))
        subprocess.run(["gnuplot", "-e", script], check=True)
        print("wrote", args.png)


if __name__ == "__main__":
    main()
