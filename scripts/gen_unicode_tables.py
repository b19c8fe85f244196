#!/usr/bin/env python3
"""Generates src/cohort/text/unicode_tables.inc: the Unicode data the WordPiece
tokenizer needs, read off Hugging Face's `tokenizers` itself (BertNormalizer
and BertPreTokenizer, what BertTokenizerFast runs), one code point at a time,
so the C++ tokenizer gives the ids its users get from HF. Run it with the
Python that holds the pinned tokenizers (scripts/requirements.txt):

    /opt/cohort/venv/bin/python3 scripts/gen_unicode_tables.py > src/cohort/text/unicode_tables.inc

Where HF differs from Google BERT's tokenization.py, these tables follow HF:
  - clean_text also drops private-use characters (Co), not only Cc and Cf;
  - lowercasing is per character (Rust's char::to_lowercase): a final capital
    sigma becomes U+03C3, not str.lower()'s final U+03C2;
  - accents are stripped before lowercasing, and the CJK ranges are HF's.
tests/oracles/tokenizers_*.py check the result against tokenizers on GCIDE.

Two range tables, sorted by code point, none overlapping:

kClassRanges  how the basic pass treats an input character:
  kDrop   removed by clean_text (HF: U+0000, U+FFFD, Cc, Cf, Co but \\t \\n \\r)
  kSpace  mapped to a space by clean_text, or split on by the pre-tokenizer
  kPunct  split off as its own word by the pre-tokenizer
  kCjk    spaced out by handle_chinese_chars
  (anything else: kOther)

kFoldRanges   the uncased normalization of one code point: strip accents (NFD,
  drop Mn), then lowercase. Code points not listed map to themselves; Hangul
  syllables (decomposed by rule in C++) are not listed.
  kFoldDrop   -> nothing
  kFoldConst  every code point in the range -> arg
  kFoldDelta  cp -> cp + arg for cp = lo, lo+stride, ...; the code points
              between them map to themselves
  kFoldSeq    the single code point lo -> kFoldPool[arg : arg + stride]

Known gap: NFD's canonical reordering is not modelled; it could only matter for
two adjacent non-Mn combining characters of different classes (a few musical
symbols and viramas), which then keep their input order.
"""

import sys

import tokenizers
from tokenizers.normalizers import BertNormalizer
from tokenizers.pre_tokenizers import BertPreTokenizer

MAX = 0x110000

OTHER, DROP, SPACE, PUNCT, CJK = 0, 1, 2, 3, 4
CLASS_NAMES = {DROP: "kDrop", SPACE: "kSpace", PUNCT: "kPunct", CJK: "kCjk"}

CLEAN = BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=False, lowercase=False)
FOLD = BertNormalizer(clean_text=False, handle_chinese_chars=False, strip_accents=True, lowercase=True)
PRE = BertPreTokenizer()


def is_surrogate(cp):
    return 0xD800 <= cp <= 0xDFFF  # never decoded from valid UTF-8


def split_class(s):
    """How the pre-tokenizer treats the text s between two letters."""
    parts = [w for w, _ in PRE.pre_tokenize_str("a" + s + "a")]
    if parts == ["a", "a"]:
        return SPACE
    if parts == ["a", s, "a"]:
        return PUNCT
    assert parts == ["a" + s + "a"], (s, parts)
    return OTHER


def char_class(cp):
    if is_surrogate(cp):
        return OTHER
    ch = chr(cp)
    clean = CLEAN.normalize_str(ch)
    if clean == "":
        return DROP
    if clean == " ":
        return SPACE
    if clean == " " + ch + " ":
        return CJK
    assert clean == ch, hex(cp)
    return split_class(ch)


def fold(cp):
    return FOLD.normalize_str(chr(cp))


def hangul_nfd(cp):
    s = cp - 0xAC00
    out = [0x1100 + s // 588, 0x1161 + (s % 588) // 28]
    if s % 28:
        out.append(0x11A7 + s % 28)
    return out


def runs(values, skip):
    """(lo, hi, value) for maximal runs of equal values other than `skip`."""
    out = []
    lo = 0
    for cp in range(1, MAX + 1):
        if cp == MAX or values[cp] != values[lo]:
            if values[lo] != skip:
                out.append((lo, cp - 1, values[lo]))
            lo = cp
    return out


def fold_ranges(mapping):
    """Compresses {cp: (out...)} into fold ranges (see the module comment)."""
    cps = sorted(mapping)
    pool = []
    out = []
    i = 0
    while i < len(cps):
        cp = cps[i]
        o = mapping[cp]
        if len(o) == 0:
            j = i
            while j + 1 < len(cps) and cps[j + 1] == cps[j] + 1 and mapping[cps[j + 1]] == ():
                j += 1
            out.append((cp, cps[j], "kFoldDrop", 1, 0))
            i = j + 1
            continue
        if len(o) > 1:
            out.append((cp, cp, "kFoldSeq", len(o), len(pool)))
            pool.extend(o)
            i += 1
            continue
        # const run
        jc = i
        while jc + 1 < len(cps) and cps[jc + 1] == cps[jc] + 1 and mapping[cps[jc + 1]] == o:
            jc += 1
        d = o[0] - cp
        j1 = i
        while (j1 + 1 < len(cps) and cps[j1 + 1] == cps[j1] + 1 and len(mapping[cps[j1 + 1]]) == 1
               and mapping[cps[j1 + 1]][0] == cps[j1 + 1] + d):
            j1 += 1
        j2 = i
        while (j2 + 1 < len(cps) and cps[j2 + 1] == cps[j2] + 2 and len(mapping[cps[j2 + 1]]) == 1
               and mapping[cps[j2 + 1]][0] == cps[j2 + 1] + d):
            j2 += 1
        best = max((jc - i, 0, "c"), (j1 - i, 1, "1"), (j2 - i, 2, "2"))
        if best[2] == "c" and jc > i:
            out.append((cp, cps[jc], "kFoldConst", 1, o[0]))
            i = jc + 1
        elif best[2] == "2" and j2 > i:
            out.append((cp, cps[j2], "kFoldDelta", 2, d))
            i = j2 + 1
        else:
            out.append((cp, cps[j1], "kFoldDelta", 1, d))
            i = j1 + 1
    return out, pool


def expand(ranges, pool):
    """The inverse of fold_ranges, to check it."""
    m = {}
    for lo, hi, kind, stride, arg in ranges:
        if kind == "kFoldDrop":
            for cp in range(lo, hi + 1):
                m[cp] = ()
        elif kind == "kFoldConst":
            for cp in range(lo, hi + 1):
                m[cp] = (arg,)
        elif kind == "kFoldDelta":
            for cp in range(lo, hi + 1, stride):
                m[cp] = (cp + arg,)
        else:
            m[lo] = tuple(pool[arg:arg + stride])
    return m


def main():
    classes = [char_class(cp) for cp in range(MAX)]

    mapping = {}
    for cp in range(MAX):
        if is_surrogate(cp):
            continue
        o = fold(cp)
        if 0xAC00 <= cp <= 0xD7A3:
            assert [ord(c) for c in o] == hangul_nfd(cp), hex(cp)
            continue
        if o != chr(cp):
            mapping[cp] = tuple(ord(c) for c in o)
    # The C++ applies the fold once per input character and classifies its
    # output only as punctuation, whitespace or neither; check that suffices.
    for cp, o in mapping.items():
        assert classes[cp] != DROP, hex(cp)
        for x in o:
            assert classes[x] in (OTHER, PUNCT, SPACE, CJK), hex(cp)
            assert fold(x) == chr(x), hex(cp)  # idempotent
            assert (classes[x] == CJK) == (classes[cp] == CJK), hex(cp)

    ranges, pool = fold_ranges(mapping)
    assert max(r[3] for r in ranges) <= 4  # the C++ output buffer
    assert expand(ranges, pool) == mapping
    for a, b in zip(ranges, ranges[1:]):
        assert a[1] < b[0]

    w = sys.stdout.write
    w("// Generated by scripts/gen_unicode_tables.py from Hugging Face tokenizers %s.\n"
      % tokenizers.__version__)
    w("// Do not edit; rerun the script.\n\n")
    w("constexpr ClassRange kClassRanges[] = {\n")
    for lo, hi, v in runs(classes, OTHER):
        w("    {0x%04X, 0x%04X, %s},\n" % (lo, hi, CLASS_NAMES[v]))
    w("};\n\n")
    w("constexpr FoldRange kFoldRanges[] = {\n")
    for lo, hi, kind, stride, arg in ranges:
        arg_text = "0x%04X" % arg if kind == "kFoldConst" else "%d" % arg
        w("    {0x%04X, 0x%04X, %s, %d, %s},\n" % (lo, hi, kind, stride, arg_text))
    w("};\n\n")
    w("constexpr uint32_t kFoldPool[] = {\n")
    for k in range(0, len(pool), 8):
        w("    " + " ".join("0x%04X," % x for x in pool[k:k + 8]) + "\n")
    w("};\n")


if __name__ == "__main__":
    main()
