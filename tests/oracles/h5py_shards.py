"""oracle.h5py_shards: h5py reads every shard `cohort prepare` wrote, with
NVIDIA's dataset names, dtypes (create_pretraining_data.py: i4 ids and
positions, i1 masks, segments and labels), shapes and gzip, and the rows
hold well-formed BERT instances whose row counts match manifest.json."""
import glob
import json
import os

import h5py
import numpy as np

from common import *

NVIDIA = {"input_ids": "int32", "input_mask": "int8", "segment_ids": "int8", "masked_lm_positions": "int32",
          "masked_lm_ids": "int32", "next_sentence_labels": "int8"}

manifest = json.load(open(os.path.join(DATA, "manifest.json")))
vocab = open(os.path.join(DATA, "vocab.txt"), encoding="utf-8").read().split("\n")[:-1]
CLS, SEP = vocab.index("[CLS]"), vocab.index("[SEP]")
L, P = manifest["max_seq_length"], manifest["max_predictions"]
for split, info in manifest["splits"].items():
    shards = sorted(glob.glob(os.path.join(DATA, split, "*.hdf5")))
    check(len(shards) == info["shards"], "%s: %d shards, manifest says %d" % (split, len(shards), info["shards"]))
    rows = tokens = 0
    for path in shards:
        with h5py.File(path, "r") as f:
            check(set(f.keys()) == set(NVIDIA), "%s: datasets %s" % (path, sorted(f.keys())))
            for name, dtype in NVIDIA.items():
                check(str(f[name].dtype) == dtype, "%s: %s is %s, not %s" % (path, name, f[name].dtype, dtype))
                check(f[name].compression == "gzip", "%s: %s is not gzip'd" % (path, name))
            d = {k: f[k][()] for k in NVIDIA}
        n = d["input_ids"].shape[0]
        for k, shape in (("input_ids", (n, L)), ("input_mask", (n, L)), ("segment_ids", (n, L)),
                         ("masked_lm_positions", (n, P)), ("masked_lm_ids", (n, P)), ("next_sentence_labels", (n,))):
            check(d[k].shape == shape, "%s: %s has shape %s, not %s" % (path, k, d[k].shape, shape))
        mask = d["input_mask"].astype(np.int64)
        length = mask.sum(1)
        check((mask == (np.arange(L)[None, :] < length[:, None])).all(), path + ": input_mask is not a prefix of 1s")
        ids = d["input_ids"]
        check(((ids >= 0) & (ids < len(vocab))).all(), path + ": token ids outside the vocabulary")
        check((ids[mask == 0] == 0).all() and (d["segment_ids"][mask == 0] == 0).all(), path + ": padding not zero")
        check((ids[:, 0] == CLS).all(), path + ": a row does not start with [CLS]")
        check((ids[np.arange(n), length - 1] == SEP).all(), path + ": a row does not end with [SEP]")
        check(np.isin(d["segment_ids"], (0, 1)).all() and np.isin(d["next_sentence_labels"], (0, 1)).all(),
              path + ": segment ids or NSP labels outside {0, 1}")
        pos, mid = d["masked_lm_positions"], d["masked_lm_ids"]
        real = pos > 0
        check((real[:, 1:] <= real[:, :-1]).all(), path + ": predictions after the first 0 position")
        check(((pos < length[:, None]) | ~real).all(), path + ": a masked position is past the row's end")
        check((np.diff(np.where(real, pos, L + np.arange(P)), axis=1) > 0).all(), path + ": positions not increasing")
        check((mid[~real] == 0).all() and ((mid[real] > 0) & (mid[real] < len(vocab))).all(),
              path + ": masked_lm_ids out of range")
        rows += n
        tokens += int(length.sum())
    check(rows == info["rows"], "%s: %d rows, manifest says %d" % (split, rows, info["rows"]))
    print("%s: %d shards, %d rows, %d tokens" % (split, len(shards), rows, tokens))
print("oracle.h5py_shards: passed")
