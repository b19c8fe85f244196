"""oracle.hf_masking: task.masking dynamic against transformers'
DataCollatorForLanguageModeling on the same GCIDE rows. For mask rates 0.15
and 0.3, 4000 rows (about 200k maskable tokens) drawn 8 times (Cohort:
epochs 0..7; the collator: seeds 0..7): Cohort's masked fraction and its
[MASK] / random / unchanged proportions are within 3 standard errors of the
configured ones and of the collator's on the same rows; every target is a maskable token and its label is the original id.
Cohort's side: the rows restored and masked by its reader
(cohort_oracle_tool mask-draws)."""
import math
import os

import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer, DataCollatorForLanguageModeling

from common import *

torch.set_num_threads(2)
ROWS = 4000
# The tokenizer as users load it: from the export of a run on these shards.
tok = AutoTokenizer.from_pretrained(os.path.join(BERT_RUN, "export"))
with open(os.path.join(DATA, "vocab.txt")) as f:
    vocab_size = sum(1 for _ in f)
check(len(tok) == vocab_size, "the tokenizer holds %d tokens, vocab.txt %d" % (len(tok), vocab_size))
special = torch.tensor(sorted(tok.all_special_ids))
mask_id = tok.mask_token_id


def stats(original, masked, real, targets):
    """(maskable tokens, targets, [MASK], unchanged, random) over the rows."""
    maskable = real & ~torch.isin(original, special)
    check(not (targets & ~maskable).any(), "a target is not a maskable token")
    t = int(targets.sum())
    m = int((targets & (masked == mask_id)).sum())
    same = int((targets & (masked == original)).sum())
    return int(maskable.sum()), t, m, same, t - m - same


def within(name, got, want, se):
    print("  %-28s %.4f (want %.4f, 3 SE %.4f)" % (name, got, want, 3 * se))
    check(abs(got - want) <= 3 * se, "%s: %.5f is more than 3 standard errors (%.5f) from %.5f"
          % (name, got, 3 * se, want))


def cohort_draws(prob, epoch):
    out = os.path.join(WORK, "mask-draws-%s-%d.safetensors" % (prob, epoch))
    run([TOOL, "mask-draws", DATA, "train", str(ROWS), str(prob), "0", str(epoch), out])
    c = load_file(out)
    original, masked, real = c["original_ids"], c["input_ids"], c["input_mask"].bool()
    pos, lab = c["masked_lm_positions"], c["masked_lm_ids"]
    targets = torch.zeros_like(real)
    rows = torch.arange(pos.size(0)).unsqueeze(1).expand_as(pos)
    keep = lab >= 0
    targets[rows[keep], pos[keep]] = True
    check(torch.equal(lab[keep], original[rows[keep], pos[keep]]), "a label is not the original token")
    check(torch.equal(masked[~targets], original[~targets]), "a token that is no target changed")
    return original, real, stats(original, masked, real, targets)


def collator_draws(prob, seed, original, real):
    """The collator on the same original rows (unpadded, as a user feeds them)."""
    lengths = real.sum(1)
    collator = DataCollatorForLanguageModeling(tok, mlm_probability=prob, seed=seed)
    batch = collator([{"input_ids": original[i, :lengths[i]].tolist()} for i in range(original.size(0))])
    hf_in, hf_labels = batch["input_ids"], batch["labels"]
    width = hf_in.size(1)
    hf_real = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)
    hf_orig = torch.where(hf_labels >= 0, hf_labels, hf_in)
    check(torch.equal(hf_orig[hf_real], original[:, :width][hf_real]), "the collator saw other rows")
    return stats(hf_orig, hf_in, hf_real, hf_labels >= 0)


# Each side pooled over 8 draws of the rows. (With 4, one difference of the
# 24 came to 3.3 SE; over 7M draws the hash shows no bias.)
DRAWS = 8
for prob in (0.15, 0.3):
    ours, theirs = [0] * 5, [0] * 5
    for k in range(DRAWS):
        original, real, a = cohort_draws(prob, k)
        b = collator_draws(prob, k, original, real)
        ours = [x + y for x, y in zip(ours, a)]
        theirs = [x + y for x, y in zip(theirs, b)]
    print("mask-prob %.2f, %d draws of %d rows: Cohort %d targets of %d maskable tokens, collator %d"
          % (prob, DRAWS, ROWS, ours[1], ours[0], theirs[1]))
    for who, (n, t, m, same, rand) in (("Cohort", ours), ("collator", theirs)):
        within("%s masked fraction" % who, t / n, prob, math.sqrt(prob * (1 - prob) / n))
        for name, k, want in (("[MASK]", m, 0.8), ("unchanged", same, 0.1), ("random", rand, 0.1)):
            within("%s %s" % (who, name), k / t, want, math.sqrt(want * (1 - want) / t))
    # Side by side: the difference of two independent estimates.
    (n1, t1, m1, s1, r1), (n2, t2, m2, s2, r2) = ours, theirs
    diff_se = math.sqrt(prob * (1 - prob) * (1 / n1 + 1 / n2))
    within("Cohort - collator fraction", t1 / n1 - t2 / n2, 0.0, diff_se)
    for name, a, b, want in (("[MASK]", m1, m2, 0.8), ("unchanged", s1, s2, 0.1), ("random", r1, r2, 0.1)):
        within("Cohort - collator %s" % name, a / t1 - b / t2, 0.0, math.sqrt(want * (1 - want) * (1 / t1 + 1 / t2)))

# Another epoch draws other masks; the same epoch, the same ones.
a = load_file(os.path.join(WORK, "mask-draws-0.15-0.safetensors"))
again = os.path.join(WORK, "mask-draws-again.safetensors")
run([TOOL, "mask-draws", DATA, "train", str(ROWS), "0.15", "0", "0", again])
check(torch.equal(load_file(again)["input_ids"], a["input_ids"]), "the same epoch drew other masks")
run([TOOL, "mask-draws", DATA, "train", str(ROWS), "0.15", "0", "1", again])
check(not torch.equal(load_file(again)["input_ids"], a["input_ids"]), "epoch 1 drew epoch 0's masks")
print("oracle.hf_masking: passed")
