#!/usr/bin/env python3
"""Generates src/cohort/text/byte_level_tables.inc: the Unicode data the
byte-level BPE tokenizer (GPT-2 style) needs, read off Hugging Face's
`tokenizers` itself (the ByteLevel pre-tokenizer and the NFD/NFC normalizers),
one code point at a time, so the C++ tokenizer gives the ids its users get
from HF. Run it with the Python that holds the pinned tokenizers
(scripts/requirements.txt):

    /opt/cohort/venv/bin/python3 scripts/gen_byte_level_tables.py > src/cohort/text/byte_level_tables.inc

and check the tables (pure-Python NFC and GPT-2 split from the tables alone,
against tokenizers; prints counts to stderr, exits 1 on any mismatch):

    /opt/cohort/venv/bin/python3 scripts/gen_byte_level_tables.py --check

Four tables, sorted, none overlapping (the including .cpp defines the types):

kRegexClasses  (lo, hi, class): how the GPT-2 regex that
  ByteLevel(add_prefix_space=False, use_regex=True) runs,
    's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+
  sees a code point: kLetter (\\p{L}), kNumber (\\p{N}), kSpace (\\s); any code
  point not listed is "other". Each class is probed on the real pre-tokenizer
  (Oniguruma's Unicode data, not Python's): c is a letter iff "a"+c stays one
  piece, a number iff "1"+c does, other iff "!"+c does, else whitespace (then
  "!"+c must split into "!" and c); exactly one probe may hold.

kDecomp, kDecompPool  (cp, offset, length): the full canonical decomposition
  (recursive, canonically ordered) of every code point that has one, as
  tokenizers' NFD gives it, as kDecompPool[offset : offset + length]. Hangul
  syllables U+AC00..U+D7A3 are not listed (the C++ decomposes them by rule).

kCombining  (lo, hi, ccc): maximal runs of consecutive code points with the
  same nonzero canonical combining class. The values are Python's
  unicodedata.combining, but tokenizers' normalizer (the unicode-normalization-
  alignments crate) carries older Unicode data (9.0) than Python: marks it does
  not know it treats as starters (class 0) and never reorders, so such marks
  are left out here. Every value kept is confirmed on tokenizers' NFD against
  marks of each other class.

kCompositions  (first, second, composite), sorted by (first, second): the
  primary composites canonical composition uses: every p whose one-level
  canonical decomposition (unicodedata.decomposition, no <tag>) is two code
  points a b and for which tokenizers' NFC turns a b into p (this drops
  composition exclusions, singletons and characters tokenizers does not know).
  Hangul is composed by rule and not listed.
"""

import random
import sys
import time
import unicodedata

import tokenizers
from tokenizers.normalizers import NFC, NFD
from tokenizers.pre_tokenizers import ByteLevel

MAX = 0x110000

OTHER, LETTER, NUMBER, SPACE = 0, 1, 2, 3
CLASS_NAMES = {LETTER: "kLetter", NUMBER: "kNumber", SPACE: "kSpace"}

PRE = ByteLevel(add_prefix_space=False, use_regex=True)
NFD_ = NFD()
NFC_ = NFC()

S_BASE, L_BASE, V_BASE, T_BASE = 0xAC00, 0x1100, 0x1161, 0x11A7
L_COUNT, V_COUNT, T_COUNT = 19, 21, 28
N_COUNT = V_COUNT * T_COUNT
S_COUNT = L_COUNT * N_COUNT


def is_surrogate(cp):
    return 0xD800 <= cp <= 0xDFFF  # never decoded from valid UTF-8


def is_hangul_syllable(cp):
    return S_BASE <= cp < S_BASE + S_COUNT


def hangul_nfd(cp):
    s = cp - S_BASE
    out = [L_BASE + s // N_COUNT, V_BASE + (s % N_COUNT) // T_COUNT]
    if s % T_COUNT:
        out.append(T_BASE + s % T_COUNT)
    return out


def byte_decoder():
    """The inverse of GPT-2's bytes_to_unicode: piece character -> byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


BYTE_DECODER = byte_decoder()


def hf_split(s):
    """The pieces ByteLevel's regex cuts s into, as text (not byte-mapped)."""
    return [bytes(BYTE_DECODER[ch] for ch in w).decode("utf-8") for w, _ in PRE.pre_tokenize_str(s)]


def one_piece(s):
    return len(PRE.pre_tokenize_str(s)) == 1


def regex_class(cp):
    if is_surrogate(cp):
        return OTHER
    c = chr(cp)
    letter, number, other = one_piece("a" + c), one_piece("1" + c), one_piece("!" + c)
    assert letter + number + other <= 1, hex(cp)
    if letter:
        return LETTER
    if number:
        return NUMBER
    if other:
        return OTHER
    assert hf_split("!" + c) == ["!", c], hex(cp)
    return SPACE


# Known characters, to check the probes themselves.
KNOWN_CLASSES = {
    "a": LETTER, "\u00e9": LETTER, "\u65e5": LETTER, "s": LETTER,
    "1": NUMBER, "\u0663": NUMBER, "\u2167": NUMBER, "\u00bd": NUMBER,
    " ": SPACE, "\t": SPACE, "\n": SPACE, "\u00a0": SPACE, "\u3000": SPACE, "\u2028": SPACE,
    "\u0301": OTHER, "_": OTHER, "'": OTHER, "!": OTHER, "\U0001F600": OTHER, "\u200d": OTHER,
}


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


def nfd_cps(s):
    return [ord(c) for c in NFD_.normalize_str(s)]


def hf_knows_ccc(cp, ccc, reps):
    """Whether tokenizers' NFD orders cp as a mark of class ccc: it must move
    in front of every representative mark of a higher class and stay behind
    every one of a lower or equal class."""
    c = chr(cp)
    if nfd_cps(c) != [cp]:
        # It decomposes, so tokenizers knows it, and classes never change
        # once assigned; the C++ only looks up the class of NFD's output.
        return True
    for v, r in reps.items():
        got = nfd_cps(chr(r) + c)
        want = [cp, r] if v > ccc else [r, cp]
        if got != want:
            return False
    return True


def build():
    t0 = time.time()
    for ch, want in KNOWN_CLASSES.items():
        assert regex_class(ord(ch)) == want, (hex(ord(ch)), regex_class(ord(ch)), want)
    classes = [regex_class(cp) for cp in range(MAX)]
    t1 = time.time()

    decomp = {}
    for cp in range(MAX):
        if is_surrogate(cp):
            continue
        d = nfd_cps(chr(cp))
        if is_hangul_syllable(cp):
            assert d == hangul_nfd(cp), hex(cp)
            continue
        if d != [cp]:
            decomp[cp] = d
    pool = []
    decomp_entries = []
    for cp in sorted(decomp):
        decomp_entries.append((cp, len(pool), len(decomp[cp])))
        pool.extend(decomp[cp])

    # Combining classes: Python's values, kept where tokenizers knows the mark.
    ccc = [0] * MAX
    py_ccc = {cp: unicodedata.combining(chr(cp)) for cp in range(MAX) if not is_surrogate(cp)}
    py_ccc = {cp: v for cp, v in py_ccc.items() if v}
    # One representative per class value, chosen among marks tokenizers orders
    # like Python does against U+0334 (class 1) and U+0301 (class 230).
    reps = {}
    for cp, v in sorted(py_ccc.items()):
        if v in reps:
            continue
        a = nfd_cps(chr(cp) + "\u0334")
        b = nfd_cps("\u0301" + chr(cp))
        if a == ([0x334, cp] if v > 1 else [cp, 0x334]) and b == ([cp, 0x301] if v < 230 else [0x301, cp]):
            reps[v] = cp
    unknown = []
    for cp, v in py_ccc.items():
        if hf_knows_ccc(cp, v, {k: r for k, r in reps.items() if r != cp}):
            ccc[cp] = v
        else:
            unknown.append(cp)
    # Marks Python calls class 0 must be starters to tokenizers too.
    for cp in range(MAX):
        if is_surrogate(cp) or ccc[cp] or cp in py_ccc:
            continue
        c = chr(cp)
        if nfd_cps(c) != [cp]:
            continue
        assert nfd_cps(c + "\u0334") == [cp, 0x334] and nfd_cps("\u0301" + c) == [0x301, cp], hex(cp)
    combining = runs(ccc, 0)

    comps = []
    for p in range(MAX):
        if is_surrogate(p) or is_hangul_syllable(p):
            continue
        dec = unicodedata.decomposition(chr(p))
        if not dec or dec.startswith("<"):
            continue
        parts = [int(x, 16) for x in dec.split()]
        if len(parts) != 2:
            continue
        a, b = parts
        if NFC_.normalize_str(chr(a) + chr(b)) == chr(p):
            comps.append((a, b, p))
    comps.sort()
    for x, y in zip(comps, comps[1:]):
        assert x[:2] != y[:2]
    t2 = time.time()
    print("regex classes probed in %.1f s, normalization tables in %.1f s (%d marks Python knows but "
          "tokenizers does not, left out)" % (t1 - t0, t2 - t1, len(unknown)), file=sys.stderr)
    return classes, decomp_entries, pool, combining, comps


def emit(classes, decomp_entries, pool, combining, comps):
    w = sys.stdout.write
    w("// Generated by scripts/gen_byte_level_tables.py from Hugging Face tokenizers %s (and Python's "
      "unicodedata %s for combining classes). Do not edit; rerun the script.\n\n"
      % (tokenizers.__version__, unicodedata.unidata_version))
    w("constexpr RegexClassRange kRegexClasses[] = {\n")
    for lo, hi, v in runs(classes, OTHER):
        w("    {0x%04X, 0x%04X, %s},\n" % (lo, hi, CLASS_NAMES[v]))
    w("};\n\n")
    w("constexpr DecompEntry kDecomp[] = {\n")
    for cp, off, n in decomp_entries:
        w("    {0x%04X, %d, %d},\n" % (cp, off, n))
    w("};\n\n")
    w("constexpr uint32_t kDecompPool[] = {\n")
    for k in range(0, len(pool), 8):
        w("    " + " ".join("0x%04X," % x for x in pool[k:k + 8]) + "\n")
    w("};\n\n")
    w("constexpr CombiningRange kCombining[] = {\n")
    for lo, hi, v in combining:
        w("    {0x%04X, 0x%04X, %d},\n" % (lo, hi, v))
    w("};\n\n")
    w("constexpr Composition kCompositions[] = {\n")
    for a, b, p in comps:
        w("    {0x%04X, 0x%04X, 0x%04X},\n" % (a, b, p))
    w("};\n")


# ---------------------------------------------------------------------------
# --check: NFC and the GPT-2 split from the tables alone, against tokenizers.


class Tables:
    def __init__(self, classes, decomp_entries, pool, combining, comps):
        ranges = runs(classes, OTHER)
        self.cls = {}
        for lo, hi, v in ranges:  # expand the emitted ranges, not `classes`
            for cp in range(lo, hi + 1):
                self.cls[cp] = v
        self.decomp = {cp: pool[off:off + n] for cp, off, n in decomp_entries}
        self.ccc = {}
        for lo, hi, v in combining:
            for cp in range(lo, hi + 1):
                self.ccc[cp] = v
        self.comp = {(a, b): p for a, b, p in comps}

    def nfd(self, cps):
        out = []
        for cp in cps:
            if is_hangul_syllable(cp):
                out.extend(hangul_nfd(cp))
            else:
                out.extend(self.decomp.get(cp, (cp,)))
        # canonical ordering: stable sort of each run of nonzero-class marks
        i = 0
        while i < len(out):
            if self.ccc.get(out[i], 0) == 0:
                i += 1
                continue
            j = i
            while j < len(out) and self.ccc.get(out[j], 0) != 0:
                j += 1
            out[i:j] = sorted(out[i:j], key=lambda c: self.ccc[c])
            i = j
        return out

    def compose_pair(self, a, b):
        if L_BASE <= a < L_BASE + L_COUNT and V_BASE <= b < V_BASE + V_COUNT:
            return S_BASE + ((a - L_BASE) * V_COUNT + (b - V_BASE)) * T_COUNT
        if is_hangul_syllable(a) and (a - S_BASE) % T_COUNT == 0 and T_BASE < b < T_BASE + T_COUNT:
            return a + (b - T_BASE)
        return self.comp.get((a, b))

    def nfc(self, s):
        d = self.nfd([ord(c) for c in s])
        out = []
        starter = None  # index in out of the last starter, if nothing blocks since
        last_ccc = 0
        for cp in d:
            c = self.ccc.get(cp, 0)
            if starter is not None:
                # blocked unless adjacent to the starter, or every char since
                # has a lower nonzero class (last_ccc is the highest so far
                # because the marks are canonically ordered)
                adjacent = starter == len(out) - 1
                if adjacent or (last_ccc != 0 and last_ccc < c):
                    p = self.compose_pair(out[starter], cp)
                    if p is not None:
                        out[starter] = p
                        continue
            if c == 0:
                starter = len(out)
            last_ccc = c
            out.append(cp)
        return "".join(map(chr, out))

    def split(self, s):
        """GPT-2's regex, alternatives in order, leftmost-first."""
        n = len(s)
        cls = [self.cls.get(ord(ch), OTHER) for ch in s]
        pieces = []
        i = 0
        while i < n:
            j = self.match_at(s, cls, i)
            pieces.append(s[i:j])
            i = j
        return pieces

    @staticmethod
    def match_at(s, cls, i):
        n = len(s)
        if s[i] == "'":
            for suf in ("s", "t", "re", "ve", "m", "ll", "d"):
                if s.startswith(suf, i + 1):
                    return i + 1 + len(suf)
        k = i + 1 if s[i] == " " and i + 1 < n else i
        for want in (LETTER, NUMBER, OTHER):
            if cls[k] == want:
                j = k
                while j < n and cls[j] == want:
                    j += 1
                return j
        # \s+(?!\S), then \s+
        assert cls[i] == SPACE
        j = i
        while j < n and cls[j] == SPACE:
            j += 1
        if j == n or j - 1 == i:
            return j
        return j - 1


def sample_pools(t):
    decomposable = sorted(t.decomp) + list(range(S_BASE, S_BASE + S_COUNT, 97))
    marks = sorted(t.ccc) + [cp for cp in range(MAX) if not is_surrogate(cp) and unicodedata.combining(chr(cp))]
    jamo = list(range(0x1100, 0x1100 + L_COUNT)) + list(range(V_BASE, V_BASE + V_COUNT)) + \
        list(range(T_BASE, T_BASE + T_COUNT)) + [0x115F, 0x1160, 0x11FF, 0xAC00, 0xAC01, 0xD7A3, 0xAE4C]
    comp_parts = [a for a, _ in t.comp] + [b for _, b in t.comp] + list(t.comp.values())
    return decomposable, marks, jamo, comp_parts


def random_cp(rng):
    while True:
        cp = rng.randrange(MAX) if rng.random() < 0.5 else rng.randrange(0x3000)
        if not is_surrogate(cp):
            return cp


def check(tables):
    rng = random.Random(20240611)
    bad = 0
    t0 = time.time()

    # NFC (a): every code point alone.
    n_single = 0
    for cp in range(MAX):
        if is_surrogate(cp):
            continue
        n_single += 1
        s = chr(cp)
        if tables.nfc(s) != NFC_.normalize_str(s):
            bad += 1
            if bad <= 20:
                print("NFC mismatch on U+%04X" % cp, file=sys.stderr)
    # NFC (b): random short strings.
    pools = sample_pools(tables)
    n_rand = 200000
    nfc_rand_bad = 0
    for _ in range(n_rand):
        cps = []
        for _ in range(rng.randint(1, 6)):
            r = rng.random()
            if r < 0.8:
                cps.append(rng.choice(pools[int(r * 5)]))
            else:
                cps.append(random_cp(rng))
        s = "".join(map(chr, cps))
        if tables.nfc(s) != NFC_.normalize_str(s):
            nfc_rand_bad += 1
            if nfc_rand_bad <= 20:
                print("NFC mismatch on %s" % " ".join("U+%04X" % c for c in cps), file=sys.stderr)
    print("NFC: %d single code points, %d random strings; mismatches %d + %d (%.1f s)"
          % (n_single, n_rand, bad, nfc_rand_bad, time.time() - t0), file=sys.stderr)

    # GPT-2 split.
    t1 = time.time()
    cls_pools = {v: [cp for cp, c in tables.cls.items() if c == v] for v in (LETTER, NUMBER, SPACE)}
    atoms = (["a", "Z", "s", "t", "re", "ve", "m", "ll", "d", "S", "\u00e9", "\u03b1", "\u65e5\u672c", "\u0628",
              "1", "42", "\u0663", "\u2167", "\u00bd", "\uff11",
              " ", " ", " ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "\u2028", "\u2029", "\u0085",
              "\u200b", "\ufeff", "\u180e", "\u2009", "\u1680", "\x0b", "\x0c", "\x1c",
              "!", "?", ".", ",", "_", "-", "\"", "(", ")", "$", "\u2019", "\u00bf",
              "'", "'", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'x",
              "\U0001F600", "\U0001F44D\U0001F3FD", "\u200d", "\u0301", "\u0308", "\u094d", "\u0e31",
              "\u4e2d\u6587", "\uac00", "\u3042"])
    n_split = 100000
    split_bad = 0
    for _ in range(n_split):
        parts = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            if r < 0.75:
                parts.append(rng.choice(atoms))
            elif r < 0.9:
                parts.append(chr(rng.choice(cls_pools[rng.choice((LETTER, NUMBER, SPACE))])))
            else:
                parts.append(chr(random_cp(rng)))
        s = "".join(parts)
        if tables.split(s) != hf_split(s):
            split_bad += 1
            if split_bad <= 20:
                print("split mismatch on %r: %r vs %r" % (s, tables.split(s), hf_split(s)), file=sys.stderr)
    print("split: %d random strings; mismatches %d (%.1f s)" % (n_split, split_bad, time.time() - t1),
          file=sys.stderr)
    return bad + nfc_rand_bad + split_bad == 0


def main():
    t0 = time.time()
    tables = build()
    if "--check" in sys.argv[1:]:
        ok = check(Tables(*tables))
        print("total %.1f s" % (time.time() - t0), file=sys.stderr)
        sys.exit(0 if ok else 1)
    emit(*tables)
    print("total %.1f s" % (time.time() - t0), file=sys.stderr)


if __name__ == "__main__":
    main()
