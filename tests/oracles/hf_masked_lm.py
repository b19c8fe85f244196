"""oracle.hf_masked_lm: a run trained with task.nsp false (and dynamic
masking) exports a BertForMaskedLM. transformers loads it with
from_pretrained, no key missing or left over, and on the same batch its MLM
loss (labels at the masked positions) equals the cross-entropy of Cohort's
MLM logits within 1e-5 relative, the logits within 1e-5. Cohort's side:
cohort_oracle_tool bert-logits on the export."""
import json
import os

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import BertForMaskedLM

from common import *

torch.set_num_threads(2)
export = os.path.join(BERT_MLM_RUN, "export")
with open(os.path.join(export, "config.json")) as f:
    config = json.load(f)
check(config["architectures"] == ["BertForMaskedLM"], "config.json names %s" % config["architectures"])
model, info = BertForMaskedLM.from_pretrained(export, output_loading_info=True)
model.eval()
for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"):
    check(not info.get(kind), "from_pretrained: %s %s" % (kind, info.get(kind)))

out = os.path.join(WORK, "hf_masked_lm.safetensors")
run([TOOL, "bert-logits", export, DATA, "valid", "24", out])
c = load_file(out)
check("nsp_logits" not in c, "a BertForMaskedLM export gave NSP logits")
pos, ids = c["masked_lm_positions"], c["masked_lm_ids"]
keep = ids >= 0
rows = torch.arange(pos.size(0)).unsqueeze(1).expand_as(pos)
labels = torch.full_like(c["input_ids"], -100)
labels[rows[keep], pos[keep]] = ids[keep]
with torch.no_grad():
    hf = model(input_ids=c["input_ids"], token_type_ids=c["segment_ids"], attention_mask=c["input_mask"],
               labels=labels)
cohort_loss = F.cross_entropy(c["mlm_logits"], c["mlm_labels"]).item()
logits_diff = (hf.logits[rows[keep], pos[keep]] - c["mlm_logits"]).abs().max().item()
print("batch %s, %d targets: HF loss %.6f, Cohort %.6f; max |logit diff| %.2e"
      % (tuple(c["input_ids"].shape), int(keep.sum()), hf.loss.item(), cohort_loss, logits_diff))
check(abs(hf.loss.item() - cohort_loss) <= 1e-5 * abs(cohort_loss), "MLM losses differ")
check(logits_diff < 1e-5, "MLM logits differ by %.3g" % logits_diff)
print("oracle.hf_masked_lm: passed")
