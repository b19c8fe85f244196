"""oracle.hf_export: a model written by `cohort export` loads into
transformers.BertForPreTraining with strict=True (and via from_pretrained),
and on the same batch its MLM and NSP logits match Cohort's within 1e-5
(fp32). Cohort's side: the export loaded by load_model_weights, the batch
read and trimmed by its shard reader (cohort_oracle_tool bert-logits)."""
import os

import torch
from safetensors.torch import load_file
from transformers import BertConfig, BertForPreTraining

from common import *

torch.set_num_threads(2)
export = os.path.join(BERT_RUN, "export")
for name in ("config.json", "model.safetensors", "vocab.txt"):
    check(os.path.exists(os.path.join(export, name)), "cohort export wrote no " + name)

model = BertForPreTraining(BertConfig.from_json_file(os.path.join(export, "config.json")))
model.load_state_dict(load_file(os.path.join(export, "model.safetensors")), strict=True)  # raises on any mismatch
model.eval()
pretrained = BertForPreTraining.from_pretrained(export).eval()
for (name, a), (_, b) in zip(model.state_dict().items(), pretrained.state_dict().items()):
    check(torch.equal(a, b), "from_pretrained and load_state_dict differ at " + name)

out = os.path.join(WORK, "hf_export.safetensors")
run([TOOL, "bert-logits", export, DATA, "valid", "24", out])
c = load_file(out)
with torch.no_grad():
    hf = model(input_ids=c["input_ids"], token_type_ids=c["segment_ids"], attention_mask=c["input_mask"])
pos, ids = c["masked_lm_positions"], c["masked_lm_ids"]
keep = ids.reshape(-1) >= 0
rows = torch.arange(pos.size(0)).unsqueeze(1).expand_as(pos).reshape(-1)[keep]
mlm_hf = hf.prediction_logits[rows, pos.reshape(-1)[keep]]
check(torch.equal(c["mlm_labels"], ids.reshape(-1)[keep]), "Cohort's MLM labels are not the batch's masked ids")
check(mlm_hf.shape == c["mlm_logits"].shape, "MLM logits: HF %s vs Cohort %s" % (mlm_hf.shape, c["mlm_logits"].shape))
mlm_diff = (mlm_hf - c["mlm_logits"]).abs().max().item()
nsp_diff = (hf.seq_relationship_logits - c["nsp_logits"]).abs().max().item()
print("batch %s, %d masked positions; max |HF - Cohort|: MLM %.2e, NSP %.2e"
      % (tuple(c["input_ids"].shape), int(keep.sum()), mlm_diff, nsp_diff))
check(mlm_diff < 1e-5, "MLM logits differ by %.3g" % mlm_diff)
check(nsp_diff < 1e-5, "NSP logits differ by %.3g" % nsp_diff)
print("oracle.hf_export: passed")
