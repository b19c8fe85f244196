"""oracle.safetensors_files: the safetensors library loads every
.safetensors file Cohort wrote (checkpoints' model and RNG states, the
export), with the header metadata intact, and the tensors agree with each
other where they must: the export holds the last checkpoint's weights."""
import glob
import os

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from common import *

# The runs oracle.setup made (other checks write beside them concurrently).
files = sorted(f for run_dir in (BERT_RUN, FMNIST_RUN)
               for f in glob.glob(os.path.join(run_dir, "**", "*.safetensors"), recursive=True))
check(any("/checkpoints/" in f for f in files), "no checkpoint files under " + WORK)
check(any(f.endswith("export/model.safetensors") for f in files), "no export under " + WORK)
for path in files:
    tensors = load_file(path)
    check(len(tensors) > 0, path + " holds no tensors")
    with safe_open(path, framework="pt") as f:
        meta = f.metadata() or {}
        check(set(f.keys()) == set(tensors), path + ": keys differ between safe_open and load_file")
    for name, t in tensors.items():
        check(t.dtype in (torch.float32, torch.float64, torch.int64, torch.uint8, torch.bfloat16, torch.float16),
              "%s: %s has dtype %s" % (path, name, t.dtype))
    print("%s: %d tensors, metadata %s" % (os.path.relpath(path, WORK), len(tensors), sorted(meta)))

latest = open(os.path.join(BERT_RUN, "checkpoints", "latest")).read().strip()
ckpt = load_file(os.path.join(BERT_RUN, "checkpoints", os.path.basename(latest), "model.safetensors"))
export = load_file(os.path.join(BERT_RUN, "export", "model.safetensors"))
for name, t in ckpt.items():
    check(torch.equal(t, export[name]), "export and latest checkpoint differ at " + name)
check(torch.equal(export["cls.predictions.decoder.weight"], export["bert.embeddings.word_embeddings.weight"]),
      "the export's decoder is not tied to the word embeddings")
print("oracle.safetensors_files: %d files passed" % len(files))
