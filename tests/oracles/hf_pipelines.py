"""oracle.hf_pipelines: what `cohort export` writes loads into the
transformers pipelines users run, with the tokenizer the run trained with.
- AutoTokenizer on an uncased export lowercases and on a cased export keeps
  case, and both give Cohort's own WordPiece ids on GCIDE lines;
- pipeline("fill-mask") runs on a pretraining export;
- pipeline("text-classification") on a bert-classify export gives the
  labels `cohort predict` gives for 200 WordNet test rows, and every class
  probability within 1e-5 (fp32 on both sides)."""
import csv
import json
import os

import torch
from transformers import AutoTokenizer, pipeline

from common import *

torch.set_num_threads(2)
TINY = ["--config", os.path.join(SOURCE, "examples/bert-tiny.toml"), "--train.precision", "fp32",
        "--log.tensorboard=false", "--quiet", "--overwrite"]

# --- the tokenizer: cased and uncased exports, against Cohort's ids --------
with open(LINES, encoding="utf-8", errors="ignore", newline="\n") as f:
    lines = f.read().split("\n")[:-1][:3000]
sample = os.path.join(WORK, "pipelines-lines.txt")
with open(sample, "w", encoding="utf-8", newline="\n") as f:
    f.write("".join(line + "\n" for line in lines))

cased_run = os.path.join(WORK, "bert-cased")
run([COHORT, "train"] + TINY + ["--data.path", DATA_CASED, "--out", cased_run, "--train.max-steps", "1",
                                "--data.global-batch", "8", "--eval.max-samples", "32"])
exports = {"uncased": os.path.join(BERT_RUN, "export"), "cased": os.path.join(WORK, "bert-cased-export")}
run([COHORT, "export", cased_run, "--out", exports["cased"]])
for case, export in exports.items():
    for name in ("tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        check(os.path.exists(os.path.join(export, name)), "%s export has no %s" % (case, name))
    tok = AutoTokenizer.from_pretrained(export)
    vocab = os.path.join(DATA if case == "uncased" else DATA_CASED, "vocab.txt")
    check(open(os.path.join(export, "vocab.txt")).read() == open(vocab).read(),
          "the %s export's vocab.txt is not the one the run trained with" % case)
    words = tok.tokenize("The Sun")
    lowered = all(w == w.lower() for w in words)
    print("%s: %s tokenizes 'The Sun' as %s" % (case, type(tok).__name__, words))
    check(lowered == (case == "uncased"), "the %s export's tokenizer %s: %s" %
          (case, "keeps case" if case == "uncased" else "lowercases", words))
    out = os.path.join(WORK, "pipelines-wordpiece-%s.txt" % case)
    run([TOOL, "wordpiece", vocab, case, sample, out])
    with open(out) as f:
        ours = [[int(t) for t in line.split()] for line in f.read().split("\n")[:-1]]
    theirs = tok(lines, add_special_tokens=False)["input_ids"]
    bad = [i for i in range(len(lines)) if ours[i] != theirs[i]]
    for i in bad[:5]:
        print("line %d: %r\n  cohort: %s\n  hf:     %s" % (i + 1, lines[i][:120], ours[i][:30], theirs[i][:30]))
    print("%s: %d GCIDE lines, %d tokens, %d differ from Cohort's ids" %
          (case, len(lines), sum(len(t) for t in theirs), len(bad)))
    check(not bad, "AutoTokenizer on the %s export differs from Cohort on %d lines" % (case, len(bad)))

# --- fill-mask on the pretraining export -----------------------------------
fill = pipeline("fill-mask", model=exports["uncased"], device="cpu")
guesses = fill("the [MASK] of a plant is green .", top_k=5)
print("fill-mask: %s" % ", ".join("%s %.3f" % (g["token_str"], g["score"]) for g in guesses))
check(len(guesses) == 5 and all(0 <= g["score"] <= 1 for g in guesses), "fill-mask gave %r" % guesses)

# --- text-classification against cohort predict ----------------------------
if not os.path.exists("/usr/share/wordnet/data.noun"):
    print("oracle.hf_pipelines: text-classification SKIPPED (wordnet-base is not installed); the rest passed")
    sys.exit(77)
wordnet = prepare_wordnet("pipelines-wordnet")
with open(os.path.join(wordnet, "test.tsv"), newline="") as f:
    rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[:200]
inputs = os.path.join(WORK, "pipelines-inputs.jsonl")
with open(inputs, "w") as f:
    f.write("".join(json.dumps({"gloss": r["gloss"]}) + "\n" for r in rows))
fine = os.path.join(WORK, "bert-classify")
run([COHORT, "train", "--train.task", "bert-classify", "--model.name", "bert", "--model.hidden", "128",
     "--model.layers", "2", "--model.heads", "2", "--model.intermediate", "512", "--model.init", BERT_RUN,
     "--data.path", wordnet, "--data.vocab", os.path.join(DATA, "vocab.txt"), "--data.text-column", "gloss",
     "--data.label-column", "lexname", "--data.max-seq-length", "64", "--data.global-batch", "32",
     "--train.max-steps", "30", "--train.precision", "fp32", "--optim.lr", "0.001", "--eval.max-samples", "64",
     "--log.tensorboard=false", "--quiet", "--overwrite", "--out", fine])
predictions = os.path.join(WORK, "pipelines-predictions.jsonl")
run([COHORT, "predict", fine, "--input", inputs, "--out", predictions])
with open(predictions) as f:
    ours = [json.loads(line) for line in f]
export = os.path.join(fine, "export")
log = run([COHORT, "export", fine])
check("BertForSequenceClassification" in log, "cohort export does not name the class:\n" + log)
config = json.load(open(os.path.join(export, "config.json")))
labels = json.load(open(os.path.join(fine, "labels.json")))["labels"]
check(config["id2label"] == {str(i): l for i, l in enumerate(labels)}, "id2label is not labels.json's order")
classify = pipeline("text-classification", model=export, device="cpu")
theirs = classify([r["gloss"] for r in rows], top_k=None, truncation=True, max_length=64, batch_size=32)
check(len(ours) == len(theirs) == len(rows), "%d predictions, %d pipeline results, %d rows" %
      (len(ours), len(theirs), len(rows)))
worst, same = 0.0, 0
for mine, hf in zip(ours, theirs):
    hf = {r["label"]: r["score"] for r in hf}
    check(set(hf) == set(mine["probabilities"]), "the pipeline's labels are %s" % sorted(hf))
    same += max(hf, key=hf.get) == mine["label"]
    worst = max(worst, max(abs(hf[k] - v) for k, v in mine["probabilities"].items()))
print("text-classification: %d of %d labels equal cohort predict's; max |probability difference| %.2e over %d classes"
      % (same, len(rows), worst, len(labels)))
check(same == len(rows), "%d labels differ from cohort predict" % (len(rows) - same))
check(worst < 1e-5, "probabilities differ by %.3g" % worst)
print("oracle.hf_pipelines: passed")
