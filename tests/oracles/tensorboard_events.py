"""oracle.tensorboard_events: TensorBoard's own EventAccumulator reads the
event file of a Cohort run and finds every number of every metrics.jsonl
line (train lines as train/<key>, eval lines as <split>/<key>, nested
objects as <prefix>/<key>/<sub>, the rate as train/<unit>_per_s) at the
line's step, with the value rounded to float32, and nothing else."""
import glob
import os

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from common import *


def flatten(prefix, obj, out):
    for k, v in obj.items():
        if isinstance(v, bool):
            continue
        if isinstance(v, (int, float)):
            out[prefix + "/" + k] = float(v)
        elif isinstance(v, dict):
            flatten(prefix + "/" + k, v, out)


for run_dir in (FMNIST_RUN, BERT_RUN):
    files = glob.glob(os.path.join(run_dir, "tensorboard", "events.out.tfevents.*"))
    check(len(files) == 1, "%s: %d event files" % (run_dir, len(files)))
    acc = EventAccumulator(files[0], size_guidance={"scalars": 0})
    acc.Reload()
    got = {}
    for tag in acc.Tags()["scalars"]:
        for e in acc.Scalars(tag):
            got[(tag, e.step)] = e.value
    expected = {}
    for line in metrics(run_dir):
        prefix = "train" if line["kind"] == "train" else line["split"]
        values = {}
        fields = {k: v for k, v in line.items() if k not in ("step", "kind", "split", "source", "unit")}
        if "unit" in line and "tokens_per_s" in fields:
            fields[line["unit"] + "_per_s"] = fields.pop("tokens_per_s")
        flatten(prefix, fields, values)
        for tag, v in values.items():
            expected[(tag, line["step"])] = v
    kinds = sorted({m["kind"] for m in metrics(run_dir)})
    check(kinds == ["eval", "train"], "%s: metrics.jsonl has kinds %s" % (run_dir, kinds))
    for key, v in expected.items():
        check(key in got, "%s: TensorBoard has no scalar %s at step %d" % (run_dir, key[0], key[1]))
        check(np.float32(v) == np.float32(got[key]),
              "%s: %s at step %d is %r in TensorBoard, %r in metrics.jsonl" % (run_dir, key[0], key[1], got[key], v))
    extra = sorted(set(got) - set(expected))
    check(not extra, "%s: TensorBoard scalars not in metrics.jsonl: %s" % (run_dir, extra[:5]))
    print("%s: %d scalars (%d tags) agree" % (os.path.basename(run_dir), len(expected), len(acc.Tags()["scalars"])))
print("oracle.tensorboard_events: passed")
