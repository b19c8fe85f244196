"""oracle.hf_modernbert: a random-initialised Hugging Face ModernBertForMaskedLM
(both attention kinds, a sliding window of 16 on rows of 64 tokens), saved
by save_pretrained and loaded by Cohort (cohort_oracle_tool modernbert-logits,
the loader model.init uses), gives HF's logits (eager attention, fp32) at
every real position and HF's MLM loss within 1e-5 relative, on padded rows
and on the same rows packed. Twice: HF's default config (no biases) and one
with every bias on, mean pooling's config and a tanh GELU."""
import os

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import ModernBertConfig, ModernBertForMaskedLM

from common import *

torch.set_num_threads(2)
CASES = {
    "defaults": {},
    "biases": {"norm_bias": True, "attention_bias": True, "mlp_bias": True, "classifier_bias": True,
               "hidden_activation": "gelu_pytorch_tanh", "global_attn_every_n_layers": 2,
               "global_rope_theta": 50000.0, "local_rope_theta": 5000.0},
}
for name, extra in CASES.items():
    torch.manual_seed(7)
    config = ModernBertConfig(vocab_size=2000, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                              num_attention_heads=4, max_position_embeddings=128, local_attention=16,
                              pad_token_id=0, bos_token_id=2, eos_token_id=3, cls_token_id=2, sep_token_id=3,
                              attn_implementation="eager", **extra)
    model = ModernBertForMaskedLM(config).eval()
    with torch.no_grad():  # HF initialises norms to 1 and biases to 0: perturb them so they count
        for pname, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    hf_dir = os.path.join(WORK, "modernbert-hf-" + name)
    model.save_pretrained(hf_dir)
    out = os.path.join(WORK, "hf_modernbert-%s.safetensors" % name)
    run([TOOL, "modernbert-logits", hf_dir, DATA, "valid", "24", out])
    c = load_file(out)
    ids, mask = c["input_ids"], c["input_mask"]
    pos, targets = c["masked_lm_positions"], c["masked_lm_ids"]
    keep = targets >= 0
    rows = torch.arange(pos.size(0)).unsqueeze(1).expand_as(pos)
    labels = torch.full_like(ids, -100)
    labels[rows[keep], pos[keep]] = targets[keep]
    with torch.no_grad():
        hf = model(input_ids=ids, attention_mask=mask, labels=labels)
    real = mask.bool()
    scale = hf.logits[real].abs().max().item()
    all_diff = (hf.logits[real] - c["all_logits"][real]).abs().max().item() / scale
    mlm_diff = (hf.logits[rows[keep], pos[keep]] - c["mlm_logits"]).abs().max().item() / scale
    packed_diff = (c["mlm_logits_packed"] - c["mlm_logits"]).abs().max().item() / scale
    loss = F.cross_entropy(c["mlm_logits"], c["mlm_labels"]).item()
    packed_loss = F.cross_entropy(c["mlm_logits_packed"], c["mlm_labels_packed"]).item()
    print("%s: batch %s packed into %d rows, %d targets: HF loss %.7f, Cohort %.7f (packed %.7f); "
          "max |logit diff| / max |logit|: every position %.2e, masked %.2e, packed vs padded %.2e"
          % (name, tuple(ids.shape), int(c["packed_rows"]), int(keep.sum()), hf.loss.item(), loss, packed_loss,
             all_diff, mlm_diff, packed_diff))
    check(int(c["packed_rows"]) < ids.size(0), "packing left every row alone: the packed case tests nothing")
    check(torch.equal(c["mlm_labels"], c["mlm_labels_packed"]), "packed rows give other labels")
    check(all_diff <= 1e-5, "logits differ from HF's by %.3g relative" % all_diff)
    check(mlm_diff <= 1e-5, "MLM logits differ from HF's by %.3g relative" % mlm_diff)
    check(packed_diff <= 1e-5, "packed rows' logits differ from padded rows' by %.3g relative" % packed_diff)
    for what, value in (("padded", loss), ("packed", packed_loss)):
        check(abs(hf.loss.item() - value) <= 1e-5 * abs(hf.loss.item()),
              "%s MLM loss %.7f, HF's %.7f" % (what, value, hf.loss.item()))
print("oracle.hf_modernbert: passed")
