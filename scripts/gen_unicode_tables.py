#!/usr/bin/python3
"""Generates src/cohort/text/unicode_tables.inc: the Unicode data the WordPiece
tokenizer needs, taken from Python's own `unicodedata` and `str.lower`, so the
C++ tokenizer agrees with BERT's reference tokenization.py run under the same
Python.

    /usr/bin/python3 scripts/gen_unicode_tables.py > src/cohort/text/unicode_tables.inc

Three range tables, sorted by code point, none overlapping:

kClassRanges  how the basic pass treats an input character:
  kDrop   removed by _clean_text: U+0000, U+FFFD, categories Cc/Cf except \\t \\n \\r
  kSpace  _is_whitespace (space, \\t \\n \\r, Zs) and whatever str.split() also
          splits on once the rest is removed (U+2028, U+2029)
  kPunct  _is_punctuation: ASCII 33-47, 58-64, 91-96, 123-126 and categories P*
  kCjk    _is_chinese_char
  (anything else: kOther)

kFoldRanges   the uncased normalization of one code point: str.lower(), then NFD,
  then drop category Mn (_run_strip_accents). Code points not listed map to
  themselves; Hangul syllables (decomposed by rule in C++) are not listed.
  kFoldDrop   -> nothing
  kFoldConst  every code point in the range -> arg
  kFoldDelta  cp -> cp + arg for cp = lo, lo+stride, ...; the code points
              between them map to themselves
  kFoldSeq    the single code point lo -> kFoldPool[arg : arg + stride]

kSigmaRanges  what str.lower() needs for its Final_Sigma rule on U+03A3:
  kSigmaCased (Cased and not Case_Ignorable) or kSigmaIgnorable
  (Case_Ignorable). Derived by asking str.lower() itself, so it matches CPython.

Known gap: NFD's canonical reordering is not modelled; it could only matter for
two adjacent non-Mn combining characters of different classes (a few musical
symbols and viramas), which then keep their input order.
"""

import sys
import unicodedata as ud

MAX = 0x110000

OTHER, DROP, SPACE, PUNCT, CJK = 0, 1, 2, 3, 4
CLASS_NAMES = {DROP: "kDrop", SPACE: "kSpace", PUNCT: "kPunct", CJK: "kCjk"}


def is_cjk(cp):
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
            or 0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF
            or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


def is_ascii_punct(cp):
    return 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126


def char_class(cp):
    if 0xD800 <= cp <= 0xDFFF:
        return OTHER  # never decoded from valid UTF-8
    ch = chr(cp)
    cat = ud.category(ch)
    if ch in "\t\n\r ":
        return SPACE
    if cp == 0 or cp == 0xFFFD or cat in ("Cc", "Cf"):
        return DROP
    if cat == "Zs" or ch.isspace():
        return SPACE
    if is_cjk(cp):
        return CJK
    if is_ascii_punct(cp) or cat.startswith("P"):
        return PUNCT
    return OTHER


def strip_accents(s):
    return "".join(c for c in ud.normalize("NFD", s) if ud.category(c) != "Mn")


def fold(cp):
    return strip_accents(chr(cp).lower())


def hangul_nfd(cp):
    s = cp - 0xAC00
    out = [0x1100 + s // 588, 0x1161 + (s % 588) // 28]
    if s % 28:
        out.append(0x11A7 + s % 28)
    return out


SIGMA_OTHER, SIGMA_CASED, SIGMA_IGNORABLE = 0, 1, 2
SIGMA_NAMES = {SIGMA_CASED: "kSigmaCased", SIGMA_IGNORABLE: "kSigmaIgnorable"}


def sigma_kind(cp):
    if 0xD800 <= cp <= 0xDFFF:
        return SIGMA_OTHER
    c = chr(cp)
    # Final_Sigma: cased case-ignorable* SIGMA !(case-ignorable* cased). The
    # backward scan skips case-ignorables first, so a character both cased and
    # case-ignorable acts as ignorable.
    if (c + "\u03a3").lower()[-1] == "\u03c2":
        return SIGMA_CASED
    if ("A" + c + "\u03a3").lower()[-1] == "\u03c2":
        return SIGMA_IGNORABLE
    return SIGMA_OTHER


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
    sigma = [sigma_kind(cp) for cp in range(MAX)]

    mapping = {}
    for cp in range(MAX):
        if 0xD800 <= cp <= 0xDFFF:
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
            assert is_cjk(x) == is_cjk(cp), hex(cp)

    ranges, pool = fold_ranges(mapping)
    assert max(r[3] for r in ranges) <= 4  # the C++ output buffer
    assert expand(ranges, pool) == mapping
    for a, b in zip(ranges, ranges[1:]):
        assert a[1] < b[0]

    w = sys.stdout.write
    w("// Generated by scripts/gen_unicode_tables.py from Python %s unicodedata\n"
      % sys.version.split()[0])
    w("// (Unicode %s). Do not edit; rerun the script.\n\n" % ud.unidata_version)
    w("constexpr ClassRange kClassRanges[] = {\n")
    for lo, hi, v in runs(classes, OTHER):
        w("    {0x%04X, 0x%04X, %s},\n" % (lo, hi, CLASS_NAMES[v]))
    w("};\n\n")
    w("constexpr SigmaRange kSigmaRanges[] = {\n")
    for lo, hi, v in runs(sigma, SIGMA_OTHER):
        w("    {0x%04X, 0x%04X, %s},\n" % (lo, hi, SIGMA_NAMES[v]))
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
