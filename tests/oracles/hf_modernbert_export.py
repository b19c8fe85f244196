"""oracle.hf_modernbert_export: the round trip with Hugging Face. A random
ModernBertForMaskedLM saved by save_pretrained is model.init of a 4-step
Cohort run (packed rows, dynamic masks at 30%, no size keys: the
architecture is the config.json's); every tensor loads and training moves
them. `cohort export` writes a
directory that ModernBertForMaskedLM.from_pretrained loads with no missing,
unexpected or mismatched keys and whose logits equal Cohort's within 1e-5
relative; AutoTokenizer loads its tokenizer (tokenizer.json), which gives
BertTokenizerFast's ids on 500 GCIDE lines. Then a ModernBERT pretrained
from scratch on text through `cohort prepare --tokenizer bpe`: its export
loads with no missing keys, gives Cohort's logits, and AutoTokenizer gives
tokenizers' ids for the prepared tokenizer.json."""
import json
import os

import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer, BertTokenizerFast, ModernBertConfig, ModernBertForMaskedLM

from common import *

torch.set_num_threads(2)
torch.manual_seed(11)
config = ModernBertConfig(vocab_size=2000, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                          num_attention_heads=4, max_position_embeddings=256, local_attention=16,
                          pad_token_id=0, bos_token_id=2, eos_token_id=3, cls_token_id=2, sep_token_id=3)
init = os.path.join(WORK, "modernbert-init")
ModernBertForMaskedLM(config).save_pretrained(init)
run_dir = os.path.join(WORK, "modernbert-run")
log = run([COHORT, "train", "--train.task", "bert-pretrain", "--model.name", "modernbert", "--model.init", init,
           "--data.path", DATA, "--data.pack", "--task.nsp=false", "--task.masking", "dynamic",
           "--task.mask-prob", "0.3", "--model.dropout", "0", "--model.attention-dropout", "0", "--out", run_dir,
           "--train.max-steps", "4", "--log.every-steps", "2", "--data.global-batch", "16", "--optim.lr", "1e-3",
           "--ckpt.every-steps", "4", "--train.precision", "fp32", "--overwrite"])
check("model.init: every tensor from " in log, "the run did not load every tensor of the HF model:\n" + log[-2000:])
export = os.path.join(run_dir, "export")
run([COHORT, "export", run_dir, "-o", export])
with open(os.path.join(export, "config.json")) as f:
    exported = json.load(f)
check(exported["architectures"] == ["ModernBertForMaskedLM"], "config.json names %s" % exported["architectures"])
check(exported["layer_types"] == config.layer_types and exported["local_attention"] == 16
      and exported["num_hidden_layers"] == 3 and exported["max_position_embeddings"] == 256,
      "the export's architecture is not model.init's: %s" % exported)
model, info = ModernBertForMaskedLM.from_pretrained(export, output_loading_info=True, attn_implementation="eager")
model.eval()
for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"):
    check(not info.get(kind), "from_pretrained: %s %s" % (kind, info.get(kind)))
start = load_file(os.path.join(init, "model.safetensors"))
trained = load_file(os.path.join(export, "model.safetensors"))
moved = max((trained[k] - start[k]).abs().max().item() for k in start)
check(moved > 0, "4 steps from model.init changed no weight")

out = os.path.join(WORK, "hf_modernbert_export.safetensors")
run([TOOL, "modernbert-logits", export, DATA, "valid", "16", out])
c = load_file(out)
with torch.no_grad():
    hf = model(input_ids=c["input_ids"], attention_mask=c["input_mask"]).logits
real = c["input_mask"].bool()
diff = (hf[real] - c["all_logits"][real]).abs().max().item() / hf[real].abs().max().item()
# AutoTokenizer builds a ModernBERT's tokenizer from tokenizer.json; it must
# tokenize as the run's vocab.txt does under BertTokenizerFast.
tokenizer = AutoTokenizer.from_pretrained(export)
wordpiece = BertTokenizerFast(os.path.join(export, "vocab.txt"), do_lower_case=True)
with open(LINES) as f:
    lines = [next(f).rstrip("\n") for _ in range(500)]
differ = [l for l in lines if tokenizer(l)["input_ids"] != wordpiece(l)["input_ids"]]
print("export: %d tensors, largest change from model.init %.3g; max |logit diff| / max |logit| %.2e; "
      "%s's ids differ from BertTokenizerFast's on %d of %d GCIDE lines"
      % (len(trained), moved, diff, type(tokenizer).__name__, len(differ), len(lines)))
check(diff <= 1e-5, "the export's logits differ from Cohort's by %.3g relative" % diff)
check(not differ, "the export's tokenizer.json tokenizes %r otherwise" % differ[:1])

# Pretraining one on your own text: `cohort prepare --tokenizer bpe` trains a
# byte-level BPE, a fresh ModernBERT trains on packed rows, and the export
# loads in transformers with AutoTokenizer giving tokenizers' ids.
text = os.path.join(WORK, "modernbert-text.txt")
with open(LINES, encoding="utf-8", errors="replace", newline="\n") as f, open(text, "w", encoding="utf-8") as dst:
    for i, line in enumerate(f):
        if i == 20000:
            break
        dst.write(line.rstrip("\n") + ("\n\n" if i % 10 == 9 else "\n"))
bpe_data = os.path.join(WORK, "modernbert-bpe-data")
run([COHORT, "prepare", "--input", text, "--out", bpe_data, "--tokenizer", "bpe", "--vocab-size", "2000",
     "--max-seq-length", "64", "--nsp", "false", "--masking", "none", "--quiet", "--overwrite"])
bpe_run = os.path.join(WORK, "modernbert-bpe-run")
run([COHORT, "train", "--config", os.path.join(SOURCE, "examples/modernbert-tiny.toml"), "--data.path", bpe_data,
     "--out", bpe_run, "--model.max-positions", "64", "--train.max-steps", "4", "--log.every-steps", "2",
     "--data.global-batch", "16", "--eval.every-steps", "0", "--ckpt.every-steps", "4", "--train.precision", "fp32",
     "--overwrite", "--quiet"])
bpe_export = os.path.join(bpe_run, "export")
run([COHORT, "export", bpe_run, "-o", bpe_export])
check(os.path.exists(os.path.join(bpe_export, "tokenizer.json")) and not os.path.exists(os.path.join(bpe_export, "vocab.txt")),
      "the export's tokenizer files: %s" % sorted(os.listdir(bpe_export)))
model, info = ModernBertForMaskedLM.from_pretrained(bpe_export, output_loading_info=True, attn_implementation="eager")
model.eval()
for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"):
    check(not info.get(kind), "from_pretrained (BPE run): %s %s" % (kind, info.get(kind)))
run([TOOL, "modernbert-logits", bpe_export, bpe_data, "valid", "16", out])
c = load_file(out)
with torch.no_grad():
    hf = model(input_ids=c["input_ids"], attention_mask=c["input_mask"]).logits
real = c["input_mask"].bool()
bpe_diff = (hf[real] - c["all_logits"][real]).abs().max().item() / hf[real].abs().max().item()
from tokenizers import Tokenizer
auto = AutoTokenizer.from_pretrained(bpe_export)
plain = Tokenizer.from_file(os.path.join(bpe_data, "tokenizer.json"))
sample = lines[:200] + ["naïve café 👍 it's", "a [MASK] b"]
bpe_differ = [l for l in sample if auto(l)["input_ids"] != plain.encode(l).ids]
print("BPE run: export %s; max |logit diff| / max |logit| %.2e; %s's ids differ from tokenizers' on %d of %d texts"
      % (sorted(os.listdir(bpe_export)), bpe_diff, type(auto).__name__, len(bpe_differ), len(sample)))
check(bpe_diff <= 1e-5, "the BPE run's logits differ by %.3g relative" % bpe_diff)
check(not bpe_differ, "AutoTokenizer tokenizes %r otherwise" % bpe_differ[:1])
check(auto.mask_token == "[MASK]" and auto.cls_token_id == plain.token_to_id("[CLS]"), "special tokens: %s" % auto)
print("oracle.hf_modernbert_export: passed")
