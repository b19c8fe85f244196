"""oracle.tokenizers_gcide: Hugging Face's tokenizers (BertWordPieceTokenizer,
the fast tokenizer behind BertTokenizerFast) and Cohort's WordPiece give the
same ids on every sentence Cohort reads from GCIDE, with an uncased and a
cased vocabulary built by `cohort prepare`."""
import os

from tokenizers import BertWordPieceTokenizer

from common import *


def compare(vocab, cased, lines_path, label):
    """Returns the number of lines whose ids differ; prints the first few."""
    out = os.path.join(WORK, "wordpiece-%s.txt" % label)
    run([TOOL, "wordpiece", vocab, "cased" if cased else "uncased", lines_path, out])
    # A few GCIDE sentences hold stray cp1252 bytes; both sides drop invalid
    # UTF-8, as BERT's convert_to_unicode(text.decode("utf-8", "ignore")) does.
    with open(lines_path, encoding="utf-8", errors="ignore", newline="\n") as f:
        lines = f.read().split("\n")[:-1]
    with open(out) as f:
        ours = [[int(t) for t in line.split()] for line in f.read().split("\n")[:-1]]
    check(len(ours) == len(lines), "%s: %d lines in, %d out" % (label, len(lines), len(ours)))
    hf = BertWordPieceTokenizer(vocab, lowercase=not cased, strip_accents=not cased, clean_text=True,
                                handle_chinese_chars=True)
    theirs = [e.ids for e in hf.encode_batch(lines, add_special_tokens=False)]
    bad = [i for i in range(len(lines)) if ours[i] != theirs[i]]
    for i in bad[:8]:
        print("%s line %d: %r\n  cohort: %s\n  hf:     %s" % (label, i + 1, lines[i][:200], ours[i][:40], theirs[i][:40]))
    tokens = sum(len(t) for t in theirs)
    print("%s: %d lines, %d tokens, %d lines differ" % (label, len(lines), tokens, len(bad)))
    return len(bad)


if __name__ == "__main__":
    bad = compare(os.path.join(DATA, "vocab.txt"), False, LINES, "gcide-uncased")
    bad += compare(os.path.join(DATA_CASED, "vocab.txt"), True, LINES, "gcide-cased")
    check(bad == 0, "%d lines tokenize differently" % bad)
    print("oracle.tokenizers_gcide: passed")
