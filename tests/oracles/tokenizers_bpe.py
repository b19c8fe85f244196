"""oracle.tokenizers_bpe: Cohort's byte-level BPE (text/bpe.hpp) gives the
ids `tokenizers` gives, on 3,000 GCIDE sentences and a set of hard cases
(Unicode that NFC composes, combining marks, emoji, CJK, whitespace runs of
several kinds, contractions, added tokens inside words and beside spaces),
for two tokenizer.json files: one trained by `tokenizers` (ModernBERT's
layout: NFC, ByteLevel, [CLS] $A [SEP], a [MASK] that strips the space before
it, a non-special added token) and one trained by Cohort (cohort_oracle_tool
bpe-train, as `cohort prepare --tokenizer bpe` trains), which `tokenizers`
must load. 0 texts may differ."""
import json
import os

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from common import *

with open(LINES, encoding="utf-8", errors="replace", newline="\n") as f:
    gcide = [line.rstrip("\n") for line in f]
train_lines = os.path.join(WORK, "bpe-train-lines.txt")
with open(train_lines, "w", encoding="utf-8") as f:
    f.write("\n".join(gcide[:20000]) + "\n")

hard = [
    "", " ", "  ", "\t", "\n", "a\n\nb", "a  b", "a   b  ", "a\u00a0b", "a\u00a0\u00a0b", "x\u3000y\u2028z", "\u0085end",
    "it's they're we've I'm you'll he'd it'S don’t", "''s 'll", "naïve café résumé", "nai\u0308ve cafe\u0301",
    "\u1100\u1161\u11a8 \uac01 \u1100\u1161", "ḍ̇ q\u0307\u0323 ", "Å Å Å", "\u212b\u2126", "한국어 日本語 中文",
    "emoji 👍🏽 👨‍👩‍👧 🇫🇷!", "x\u0301\u0301", "\u0301start", "numbers 1234 ٣٤ ½ Ⅷ 3.14 10,000",
    "under_score snake_case __init__", "tabs\tand\rreturns\r\n", "[MASK]", "a [MASK] b", "a[MASK]b", "  [MASK]",
    "[CLS] not special here [SEP]", "<|endoftext|>in a word<|endoftext|>", "x <|endoftext|> y",
    "ZWJ\u200bZWSP\ufeffBOM", "\u00ad soft hyphen", "mixed CASE Words", "a" * 300, "word " * 50,
    "\u0000nul and \u001fcontrol", "surrogate-free 𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "ﬁ ligature ＦＵＬＬ width", "Ǆ ǅ ǆ",
]
texts = gcide[20000:23000] + hard
texts_file = os.path.join(WORK, "bpe-texts.jsonl")
with open(texts_file, "w") as f:
    for t in texts:
        f.write(json.dumps(t) + "\n")


def hf_trained(path):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=3000, min_frequency=2, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"])
    tok.train([train_lines], trainer)
    tok.add_special_tokens([AddedToken("[MASK]", lstrip=True, normalized=False)])
    tok.add_tokens([AddedToken("<|endoftext|>", normalized=True)])
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    tok.save(path)


hf_json = os.path.join(WORK, "bpe-hf-tokenizer.json")
hf_trained(hf_json)
cohort_json = os.path.join(WORK, "bpe-cohort-tokenizer.json")
run([TOOL, "bpe-train", train_lines, "3000", cohort_json])

for name, path in (("trained by tokenizers", hf_json), ("trained by Cohort", cohort_json)):
    tok = Tokenizer.from_file(path)
    out = os.path.join(WORK, "bpe-ids.txt")
    run([TOOL, "bpe", path, texts_file, out])
    with open(out) as f:
        got = [[int(x) for x in line.split()] for line in f.read().split("\n")[:len(texts)]]
    want = [tok.encode(t).ids for t in texts]
    differ = [i for i in range(len(texts)) if got[i] != want[i]]
    print("%s (%d tokens): %d of %d texts differ (%d GCIDE sentences, %d hard cases)"
          % (name, tok.get_vocab_size(), len(differ), len(texts), len(texts) - len(hard), len(hard)))
    for i in differ[:5]:
        print("  %r\n    tokenizers %s\n    Cohort     %s" % (texts[i], want[i], got[i]))
    check(not differ, "%d texts differ" % len(differ))
with open(cohort_json) as f:
    trained = json.load(f)
check(len(trained["model"]["vocab"]) == 3000, "Cohort trained %d tokens, not 3000" % len(trained["model"]["vocab"]))
print("oracle.tokenizers_bpe: passed")
