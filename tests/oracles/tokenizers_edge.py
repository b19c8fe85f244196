"""oracle.tokenizers_edge: the same check as tokenizers_gcide on hand-made
edge cases: accents (composed and combining), CJK and other scripts, control,
format and private-use characters, odd whitespace, words at and past the
100-character limit, and punctuation of every kind. The vocabularies are
GCIDE's plus every character of these lines (bare and as ##-pieces), so both
the found and the [UNK] paths are exercised."""
import os
import unicodedata

from tokenizers_gcide import compare
from common import *

LINES = [
    "Café naïve résumé Ångström façade Crème brûlée ÉCOLE",
    "e\u0301te\u0301 cafe\u0301 n\u0303 combining marks",
    "我爱北京天安门 日本語のテキスト abc中文def 한국어 텍스트",
    "\U00020000\U0002a700 extension-B ideographs, \u3400 extension-A, \uf900 compatibility",
    "tab\there\tand\vvertical\fform feed\rcarriage",
    "null\x00byte bell\x07 escape\x1b[31mred del\x7f c1\x85next \x9f",
    "zero\u200bwidth soft\u00adhyphen bom\ufeffmark joiner\u200dx rtl\u202emark",
    "replacement \ufffd char, private \ue000\uf8ff and \U000f0000\U0010fffd",
    "a\u00a0b c\u3000d e\u2002f g\u2028h i\u2029j k\u1680l",
    "a" * 99 + " " + "b" * 100 + " " + "c" * 101 + " " + "d" * 250,
    "é" * 99 + " " + "é" * 101 + " " + "中" * 120 + " " + "x" * 60 + "é" * 41,
    "pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianism",
    "Hello, world!!! (yes) [no] {maybe} — – … «quote» “smart” ‘single’ ¿qué? ¡sí!",
    "$100 ^caret^ `tick` ~tilde~ |pipe| a.b.c e-mail don't #hash @at 50% a+b=c <tag> \\slash/",
    "§ ¶ † ‡ • ‰ ′ ″ ‹ › ※ ‼ ⁇ 、。〃〈〉《》「」『』【】〔〕",
    "ﬁ ﬂ ligatures, Ⅻ roman, ＡＢＣ full-width, ｶﾀｶﾅ half-width, ² ³ ½ ¼",
    "Straße İstanbul ıi ΟΔΥΣΣΕΥΣ ς Москва ЁЖ مرحبا שלום नमस्ते ไทย",
    "👍🏽 😀 🇫🇷 👨‍👩‍👧 emoji, 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝐛𝐨𝐥𝐝 math letters, Ǆ ǅ ǆ digraphs",
    "   leading and trailing spaces   ",
    "",
    "   ",
    "\x00\x01\x02",
    "UPPER lower MiXeD CamelCase iPhone McDonald's O'Neill",
    "numbers 3.14159 1,000,000 1e-10 0x1F 2026-12-01 12:30:45",
]


def vocab_with_edge_chars(base, cased, path):
    with open(base, encoding="utf-8") as f:
        tokens = f.read().split("\n")
    tokens = [t for t in tokens if t]
    seen = set(tokens)
    for line in LINES:
        for ch in line:
            for c in {ch, ch.lower(), unicodedata.normalize("NFD", ch)[0]}:
                if len(c) != 1 or c.isspace() or unicodedata.category(c)[0] == "C":
                    continue
                for t in (c, "##" + c):
                    if t not in seen:
                        seen.add(t)
                        tokens.append(t)
    for word in ("straße", "istanbul", "cafe", "café", "москва", "résumé", "resume", "##é"):
        if word not in seen:
            seen.add(word)
            tokens.append(word)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("\n".join(tokens) + "\n")
    return path


if __name__ == "__main__":
    lines = os.path.join(WORK, "edge-lines.txt")
    with open(lines, "w", encoding="utf-8", newline="\n") as f:
        for line in LINES:
            check("\n" not in line, "an edge case holds a newline")
            f.write(line + "\n")
    bad = compare(vocab_with_edge_chars(os.path.join(DATA, "vocab.txt"), False, os.path.join(WORK, "edge-uncased.txt")),
                  False, lines, "edge-uncased")
    bad += compare(vocab_with_edge_chars(os.path.join(DATA_CASED, "vocab.txt"), True, os.path.join(WORK, "edge-cased.txt")),
                   True, lines, "edge-cased")
    check(bad == 0, "%d edge-case lines tokenize differently" % bad)
    print("oracle.tokenizers_edge: passed")
