"""oracle.hf_modernbert_export: the round trip with Hugging Face. A random
ModernBertForMaskedLM saved by save_pretrained is model.init of a 4-step
Cohort run (packed rows, dynamic masks at 30%, no size keys: the
architecture is the config.json's); every tensor loads and training moves
them. `cohort export` writes a
directory that ModernBertForMaskedLM.from_pretrained loads with no missing,
unexpected or mismatched keys and whose logits equal Cohort's within 1e-5
relative; AutoTokenizer loads its tokenizer (tokenizer.json), which gives
BertTokenizerFast's ids on 500 GCIDE lines."""
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
print("oracle.hf_modernbert_export: passed")
