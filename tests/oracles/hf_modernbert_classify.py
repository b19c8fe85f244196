"""oracle.hf_modernbert_classify: fine-tuning a ModernBERT that comes from
Hugging Face. A directory as the Hub has them (a random ModernBertForMaskedLM
saved by save_pretrained, with a byte-level BPE tokenizer.json trained by
`tokenizers` and saved by PreTrainedTokenizerFast) is model.init of a 30-step
bert-classify run on WordNet glosses: the encoder and the prediction head
load from it, the classifier is new. `cohort export` writes a
ModernBertForSequenceClassification with the run's tokenizer, and
pipeline("text-classification") on it gives the labels `cohort predict`
gives for 200 test rows, every class probability within 1e-5 (fp32)."""
import csv
import json
import os

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import ModernBertConfig, ModernBertForMaskedLM, PreTrainedTokenizerFast, pipeline

from common import *

torch.set_num_threads(2)
if not os.path.exists("/usr/share/wordnet/data.noun"):
    print("oracle.hf_modernbert_classify: SKIPPED (wordnet-base is not installed)")
    sys.exit(77)
wordnet = prepare_wordnet("modernbert-wordnet")

hub = os.path.join(WORK, "modernbert-hub")
with open(LINES, encoding="utf-8", errors="replace", newline="\n") as f:
    lines = [next(f).rstrip("\n") for _ in range(20000)]
tok = Tokenizer(models.BPE())
tok.normalizer = normalizers.NFC()
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=3000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                   special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
tok.post_processor = processors.TemplateProcessing(
    single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
    special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
PreTrainedTokenizerFast(tokenizer_object=tok, cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]",
                        mask_token="[MASK]", unk_token="[UNK]", model_max_length=128).save_pretrained(hub)
torch.manual_seed(5)
config = ModernBertConfig(vocab_size=3000, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                          num_attention_heads=4, max_position_embeddings=128, local_attention=16,
                          pad_token_id=0, bos_token_id=2, eos_token_id=3, cls_token_id=2, sep_token_id=3)
ModernBertForMaskedLM(config).save_pretrained(hub)

fine = os.path.join(WORK, "modernbert-classify")
log = run([COHORT, "train", "--train.task", "bert-classify", "--model.name", "modernbert", "--model.init", hub,
           "--data.path", wordnet, "--data.text-column", "gloss", "--data.label-column", "lexname",
           "--data.max-seq-length", "64", "--data.global-batch", "32", "--train.max-steps", "30",
           "--model.dropout", "0", "--model.attention-dropout", "0", "--train.precision", "fp32", "--optim.lr", "0.001",
           "--eval.max-samples", "64", "--log.tensorboard=false", "--overwrite", "--out", fine])
check("model.init: initialised (not in the file): classifier.weight, classifier.bias" in log,
      "model.init did not load all but the classifier:\n" + log[-3000:])
check("decoder.bias" in log, "model.init should leave the MLM decoder out:\n" + log[-3000:])
with open(os.path.join(wordnet, "test.tsv"), newline="") as f:
    rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[:200]
inputs = os.path.join(WORK, "modernbert-inputs.jsonl")
with open(inputs, "w") as f:
    f.write("".join(json.dumps({"gloss": r["gloss"]}) + "\n" for r in rows))
predictions = os.path.join(WORK, "modernbert-predictions.jsonl")
run([COHORT, "predict", fine, "--input", inputs, "--out", predictions])
with open(predictions) as f:
    ours = [json.loads(line) for line in f]
export = os.path.join(fine, "export")
said = run([COHORT, "export", fine])
check("ModernBertForSequenceClassification" in said, "cohort export does not name the class:\n" + said)
exported = json.load(open(os.path.join(export, "config.json")))
labels = json.load(open(os.path.join(fine, "labels.json")))["labels"]
check(exported["id2label"] == {str(i): l for i, l in enumerate(labels)}, "id2label is not labels.json's order")
check(exported["layer_types"] == config.layer_types, "the export's layer types are not the hub model's")
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
print("ModernBertForSequenceClassification (%s): %d of %d labels equal cohort predict's; max |probability "
      "difference| %.2e over %d classes" % (type(classify.model).__name__, same, len(rows), worst, len(labels)))
check(type(classify.model).__name__ == "ModernBertForSequenceClassification", type(classify.model).__name__)
check(same == len(rows), "%d labels differ from cohort predict" % (len(rows) - same))
check(worst < 1e-5, "probabilities differ by %.3g" % worst)
print("oracle.hf_modernbert_classify: passed")
