"""oracle.hf_classify: a randomly initialised
transformers.BertForSequenceClassification, saved by save_pretrained beside
the GCIDE vocab.txt, starts a 2-rank bert-classify run on WordNet
supersenses through model.init (every tensor loaded, none initialised), and
Cohort's first loss equals HF's on the same global batch: the synsets named
by log.sample-ids, tokenised by HF's BertTokenizer from the same vocab.txt."""
import csv
import json
import glob
import os
import shutil

import torch
from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

from common import *

wordnet = prepare_wordnet("wordnet")
with open(os.path.join(wordnet, "train.tsv"), newline="") as f:
    rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
labels = sorted({r["lexname"] for r in rows})

torch.set_num_threads(2)
torch.manual_seed(11)
vocab = os.path.join(DATA, "vocab.txt")
size = sum(1 for _ in open(vocab))
config = BertConfig(vocab_size=size, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=256, max_position_embeddings=128, type_vocab_size=2,
                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=len(labels))
model = BertForSequenceClassification(config).eval()
init = os.path.join(WORK, "hf-classify-init")
shutil.rmtree(init, ignore_errors=True)
model.save_pretrained(init)
shutil.copy(vocab, os.path.join(init, "vocab.txt"))

def first_loss(name, extra, ranks):
    out = os.path.join(WORK, name)
    log = run([COHORT, "train", "--train.task", "bert-classify", "--model.name", "bert", "--model.hidden", "64",
               "--model.layers", "2", "--model.heads", "2", "--model.intermediate", "256",
               "--model.max-positions", "128", "--model.dropout", "0", "--model.attention-dropout", "0",
               "--model.init", init, "--data.path", wordnet, "--data.text-column", "gloss",
               "--data.label-column", "lexname", "--data.global-batch", "16", "--train.max-steps", "1",
               "--train.precision", "fp32", "--log.every-steps", "1", "--eval.max-samples", "16",
               "--log.sample-ids", "--log.tensorboard=false", "--nproc-per-node", str(ranks), "--out", out,
               "--overwrite"] + extra)
    check("initialised (not in the file)" not in log, "a HF classifier should fill every tensor:\n" + log)
    check("model.init: " in log, "the log names the weights it loaded:\n" + log)
    first = [m for m in metrics(out) if m["kind"] == "train"][0]
    ids = []
    for path in sorted(glob.glob(os.path.join(out, "sample-ids", "rank-*.jsonl"))):
        with open(path) as f:
            ids += [i for line in f for i in json.loads(line)["ids"] if json.loads(line)["step"] == 1]
    check(len(ids) == 16, "step 1 holds %d samples, not 16" % len(ids))
    return first["loss"], ids


tok = BertTokenizer(vocab, do_lower_case=True)
# Single glosses on 2 ranks; then gloss + lemmas as pairs, cut to 24 tokens
# (most pairs are truncated, longest first).
for name, extra, ranks, pairs, length in [("hf-classify-run", ["--data.max-seq-length", "64"], 2, False, 64),
                                           ("hf-classify-pairs", ["--data.max-seq-length", "24",
                                                                  "--data.text-pair-column", "words"], 1, True, 24)]:
    loss, ids = first_loss(name, extra, ranks)
    texts = [rows[i]["gloss"] for i in ids]
    if pairs:
        enc = tok(texts, [rows[i]["words"] for i in ids], truncation="longest_first", max_length=length,
                  padding=True, return_tensors="pt")
    else:
        enc = tok(texts, truncation=True, max_length=length, padding=True, return_tensors="pt")
    target = torch.tensor([labels.index(rows[i]["lexname"]) for i in ids])
    with torch.no_grad():
        hf = model(**enc, labels=target).loss.item()
    rel = abs(hf - loss) / abs(hf)
    print("%s: first loss HF %.8f, Cohort %.8f (relative difference %.2e)" % (name, hf, loss, rel))
    check(rel < 1e-5, "the first losses differ (%s)" % name)
print("oracle.hf_classify: passed")
