// Readers for `cohort prepare`: plain or gzip'd text, and the GCIDE
// dictionary in dictd format.
#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string_view>

#include "cohort/core/error.hpp"
#include "cohort/core/gz_file.hpp"
#include "cohort/prep/prepare.hpp"

namespace cohort::prep {

namespace {

bool ends_with(std::string_view s, std::string_view suffix);

std::string read_all(const std::string& path) {
  GzFile f = open_gz_input(path);
  std::string out;
  std::vector<char> buf(1 << 20);
  for (size_t got; (got = gz_read_some(f.get(), path, buf.data(), buf.size())) > 0;) out.append(buf.data(), got);
  return out;
}

bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }
bool is_alpha(char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0; }
bool is_digit(char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }
bool is_upper(char c) { return std::isupper(static_cast<unsigned char>(c)) != 0; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// ---- GCIDE markup --------------------------------------------------------
//
// The dictd conversion of GCIDE is ASCII with light markup:
//   Affect \Af*fect"\ ([a^]f*f[e^]kt"), n. [L. affectus.]
//      1. To act upon; to produce an effect or change upon. {Affected}
//         [1913 Webster]
//               As might affect the earth with cold heat. --Milton.
//   \...\            the headword spelt with syllable and stress marks
//   (...)            right after it: the pronunciation
//   [a^] ['e] [ae]   accented letters and ligatures; [deg] [sect] symbols
//   [...]            anything else bracketed: etymology, usage labels
//                    ([Obs.], [R.]), sources ([1913 Webster], [PJC])
//   {...}            cross-references and formulas: the text is kept
//   --Milton.        a quotation's author, to the end of the line
// A few entries carry <tags>; they are dropped too.

// The letters an accent code like "a^", "'e", "=oo", ".t" stands for, or
// empty when `code` is not one.
std::string_view diacritic_letters(std::string_view code) {
  static constexpr std::string_view kPrefix = "'\"=.~^`,*-";
  size_t lo = 0, hi = code.size();
  while (lo < hi && kPrefix.find(code[lo]) != std::string_view::npos) ++lo;
  bool suffix = false;
  if (hi > lo && (code[hi - 1] == '^' || code[hi - 1] == '~')) {
    --hi;
    suffix = true;
  }
  if ((lo == 0 && !suffix) || hi - lo < 1 || hi - lo > 2) return {};
  for (size_t i = lo; i < hi; ++i) {
    if (!is_alpha(code[i])) return {};
  }
  return code.substr(lo, hi - lo);
}

// What a bracketed code stands for; false when `code` is not a code (the
// bracket is then dropped with its contents).
bool bracket_code(std::string_view code, std::string& out) {
  static const std::map<std::string_view, std::string_view> kNamed = {
      {"ae", "ae"},     {"AE", "AE"},     {"oe", "oe"},     {"OE", "OE"},       {"imac", "i"},     {"aum", "a"},
      {"add", "a"},     {"udd", "u"},     {"asl", "a"},     {"eth", "th"},      {"thorn", "th"},   {"th", "th"},
      {"ng", "ng"},     {"yogh", "y"},    {"deg", "\u00b0"}, {"sect", "\u00a7"}, {"pounds", "\u00a3"},
      {"dsdot", "d"},   {"tsdo", "t"},    {"zdot", "z"},    {"nbsp", " "},      {"ldqo", "\""},    {"rdqo", "\""},
      {"middot", "\u00b7"}, {"times", "\u00d7"}, {"para", "\u00b6"}, {"root", ""},
      {"alpha", "alpha"}, {"beta", "beta"}, {"gamma", "gamma"}, {"delta", "delta"}, {"epsilon", "epsilon"},
      {"zeta", "zeta"}, {"eta", "eta"},   {"theta", "theta"}, {"iota", "iota"},  {"kappa", "kappa"},
      {"lambda", "lambda"}, {"mu", "mu"}, {"nu", "nu"},     {"xi", "xi"},       {"omicron", "omicron"},
      {"pi", "pi"},     {"rho", "rho"},   {"sigma", "sigma"}, {"tau", "tau"},    {"upsilon", "upsilon"},
      {"phi", "phi"},   {"chi", "chi"},   {"psi", "psi"},   {"omega", "omega"}, {"digamma", "digamma"},
  };
  if (auto it = kNamed.find(code); it != kNamed.end()) {
    out += it->second;
    return true;
  }
  std::string_view letters = diacritic_letters(code);
  if (letters.empty()) return false;
  out += letters;
  return true;
}

// The index of the bracket closing the one at s[open], or npos.
size_t matching(std::string_view s, size_t open, char opener, char closer) {
  int depth = 0;
  for (size_t i = open; i < s.size(); ++i) {
    if (s[i] == opener) ++depth;
    else if (s[i] == closer && --depth == 0) return i;
  }
  return std::string_view::npos;
}

// The end of an HTML-like tag starting at s[at] ('<'), or npos.
size_t tag_end(std::string_view s, size_t at) {
  size_t i = at + 1;
  if (i < s.size() && s[i] == '/') ++i;
  if (i >= s.size() || !is_alpha(s[i])) return std::string_view::npos;
  for (size_t j = i; j < s.size() && j < at + 80; ++j) {
    if (s[j] == '>') return j;
    if (s[j] == '<' || s[j] == '@') return std::string_view::npos;
  }
  return std::string_view::npos;
}

// Collapses spaces, drops spaces before closing punctuation and after '(',
// empty "()" and doubled separators left where markup was removed.
std::string tidy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  bool space = false;
  for (char c : s) {
    if (is_space(c)) {
      space = true;
      continue;
    }
    bool separator = c == ',' || c == ';' || c == ':';
    if (separator || c == '.' || c == ')' || c == '!' || c == '?') {
      if (out.empty()) continue;
      if (separator && !out.empty() && (out.back() == ',' || out.back() == ';' || out.back() == ':')) continue;
      if (c == ')' && !out.empty() && out.back() == '(') {
        out.pop_back();
        while (!out.empty() && out.back() == ' ') out.pop_back();
        space = true;
        continue;
      }
      space = false;
      out += c;
      continue;
    }
    if (space && !out.empty() && out.back() != '(') out += ' ';
    space = false;
    out += c;
  }
  while (!out.empty() && (out.back() == ',' || out.back() == ';' || out.back() == ':')) out.pop_back();
  return out;
}

// One paragraph (wrapped lines already joined) without markup.
std::string strip_markup(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  bool after_headword = false;  // a pronunciation "(...)" may follow
  size_t i = 0;
  while (i < s.size()) {
    char c = s[i];
    if (c == '\\') {
      size_t j = s.find('\\', i + 1);
      if (j != std::string_view::npos && j - i <= 80) {
        i = j + 1;
        after_headword = true;
      } else {
        ++i;
      }
      continue;
    }
    if (c == '(' && after_headword) {
      size_t k = matching(s, i, '(', ')');
      after_headword = false;
      if (k != std::string_view::npos) {
        i = k + 1;
        continue;
      }
    }
    if (c == '[') {
      size_t k = matching(s, i, '[', ']');
      if (k == std::string_view::npos) {
        ++i;
        continue;
      }
      std::string_view inner = s.substr(i + 1, k - i - 1);
      if (inner.find('[') == std::string_view::npos) bracket_code(inner, out);
      i = k + 1;
      continue;
    }
    if (c == '{' || c == '}') {
      ++i;
      continue;
    }
    if (c == '<') {
      size_t k = tag_end(s, i);
      if (k != std::string_view::npos) {
        out += ' ';
        i = k + 1;
        continue;
      }
    }
    if (c == '?' && (i == 0 || is_space(s[i - 1]))) {
      ++i;  // stands for a character the conversion lost ("[Gr. ?]", "?way")
      continue;
    }
    if (!is_space(c)) after_headword = false;
    out += c;
    ++i;
  }
  return tidy(out);
}

// Whether the '.' at s[dot] ends an abbreviation rather than a sentence:
// a word of one or two letters ("p.", "Cf.", "e.g."), a short capitalized
// one ("Chem.", "Gr.", the dictionary's field and language labels), or a
// usual grammatical abbreviation.
bool is_abbreviation(std::string_view s, size_t dot) {
  size_t begin = dot;
  while (begin > 0 && is_alpha(s[begin - 1])) --begin;
  std::string_view word = s.substr(begin, dot - begin);
  if (word.empty()) return false;
  if (word.size() <= 2 || (begin > 0 && s[begin - 1] == '.')) return true;
  if (is_upper(word[0]) && word.size() <= 4) return true;
  static const std::set<std::string_view> kAbbrev = {"adj", "adv", "imp", "pron", "prep", "conj", "interj", "esp",
                                                     "lit", "prob", "fem", "masc", "sing", "obs", "fig", "usu",
                                                     "viz", "corr", "dim", "var"};
  return kAbbrev.count(word) > 0;
}

bool has_alnum(std::string_view s) {
  return std::any_of(s.begin(), s.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; });
}

// Sentences of a clean paragraph: it is cut after '.', '?' or '!' (and a
// closing quote or parenthesis) followed by a space and a capital letter, a
// digit or a quote, unless the '.' ends an abbreviation. Not at ';': a
// definition's clauses ("To act upon; to produce an effect upon.") belong
// together, and most are short already.
void split_sentences(std::string_view s, std::vector<std::string>& out) {
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c != '.' && c != '?' && c != '!') continue;
    size_t j = i + 1;
    if (j < s.size() && (s[j] == '"' || s[j] == '\'' || s[j] == ')')) ++j;
    if (j + 1 >= s.size() || s[j] != ' ') continue;
    char next = s[j + 1];
    if (!is_upper(next) && !is_digit(next) && next != '"') continue;
    if (c == '.' && is_abbreviation(s, i)) continue;
    std::string_view sentence = trim(s.substr(start, j - start));
    if (has_alnum(sentence)) out.emplace_back(sentence);
    start = j + 1;
  }
  std::string_view rest = trim(s.substr(std::min(start, s.size())));
  if (has_alnum(rest)) out.emplace_back(rest);
}

// "12. " or "(b) " at the start of a line: a numbered sense, which starts a
// paragraph of its own. Returns the prefix length, 0 when there is none.
size_t sense_prefix(std::string_view line) {
  size_t i = 0;
  while (i < line.size() && is_digit(line[i])) ++i;
  if (i > 0 && i + 1 < line.size() && line[i] == '.' && line[i + 1] == ' ') return i + 2;
  if (line.size() > 3 && line[0] == '(' && std::islower(static_cast<unsigned char>(line[1])) && line[2] == ')' &&
      line[3] == ' ')
    return 4;
  return 0;
}

// The line without a trailing quotation author ("--Milton.", "--Bp. Hall.").
std::string_view drop_author(std::string_view line) {
  for (size_t p = line.find("--"); p != std::string_view::npos; p = line.find("--", p + 2)) {
    bool starts_word = p == 0 || line[p - 1] == ' ';
    if (starts_word && p + 2 < line.size() && is_upper(line[p + 2])) return trim(line.substr(0, p));
  }
  return line;
}

// ---- dictd entries --------------------------------------------------------

int64_t decode_b64(std::string_view s, bool& ok) {
  static constexpr std::string_view kDigits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  int64_t v = 0;
  ok = !s.empty() && s.size() <= 10;
  for (char c : s) {
    size_t d = kDigits.find(c);
    if (d == std::string_view::npos) ok = false;
    v = v * 64 + static_cast<int64_t>(d == std::string_view::npos ? 0 : d);
  }
  return v;
}

struct Span {
  size_t begin = 0, end = 0;
};

// The dictd index beside a .dict or .dict.dz file, or "" when there is none.
std::string index_path(const std::string& dict) {
  std::string base = dict;
  if (ends_with(base, ".dz")) base.resize(base.size() - 3);
  if (ends_with(base, ".dict")) base.resize(base.size() - 5);
  std::string idx = base + ".index";
  struct stat st;
  return ::stat(idx.c_str(), &st) == 0 && S_ISREG(st.st_mode) ? idx : std::string();
}

bool is_header_entry(std::string_view headword) { return starts_with(headword, "00-database-"); }

// Entries by the index: (headword, base64 offset, base64 length) lines.
// Headwords of one entry share its span; the 00-database-* spans (which
// the 00-gcide-* and 00-web1913-* headwords alias) are skipped.
std::vector<Span> spans_from_index(const std::string& idx_path, size_t dict_size, const std::string& dict_path) {
  std::string text = read_all(idx_path);
  std::set<std::pair<size_t, size_t>> spans, headers;
  size_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string_view line(text.data() + pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    size_t t1 = line.find('\t');
    size_t t2 = t1 == std::string_view::npos ? t1 : line.find('\t', t1 + 1);
    COHORT_CHECK(t2 != std::string_view::npos, DataError, idx_path, ":", line_no,
                 ": not a dictd index line (expected headword, offset and length separated by tabs)");
    size_t t3 = line.find('\t', t2 + 1);
    bool ok_offset = false, ok_length = false;
    int64_t offset = decode_b64(line.substr(t1 + 1, t2 - t1 - 1), ok_offset);
    int64_t length = decode_b64(line.substr(t2 + 1, t3 == std::string_view::npos ? t3 : t3 - t2 - 1), ok_length);
    COHORT_CHECK(ok_offset && ok_length, DataError, idx_path, ":", line_no, ": bad base64 offset or length");
    COHORT_CHECK(offset >= 0 && length >= 0 && static_cast<size_t>(offset + length) <= dict_size, DataError,
                 idx_path, ":", line_no, ": entry at ", offset, "+", length, " lies outside ", dict_path, " (",
                 dict_size, " bytes); is the index for this dictionary?");
    auto span = std::make_pair(static_cast<size_t>(offset), static_cast<size_t>(offset + length));
    spans.insert(span);
    if (is_header_entry(line.substr(0, t1))) headers.insert(span);
  }
  std::vector<Span> out;
  for (const auto& s : spans) {
    if (!headers.count(s)) out.push_back({s.first, s.second});
  }
  return out;
}

// Entries by layout, when there is no index: an entry starts at a line in
// column 0 that follows a blank line and holds a "\headword\" (every
// dictionary entry does; the license text in the header does not).
std::vector<Span> spans_from_layout(std::string_view dict) {
  std::vector<Span> out;
  bool skipping = false;  // inside a 00-database-* entry
  bool prev_blank = true;
  size_t begin = std::string_view::npos;
  for (size_t pos = 0; pos < dict.size();) {
    size_t eol = dict.find('\n', pos);
    if (eol == std::string_view::npos) eol = dict.size();
    std::string_view line = dict.substr(pos, eol - pos);
    bool blank = trim(line).empty();
    bool starts = prev_blank && !blank && !is_space(line[0]) &&
                  (is_header_entry(line) || line.find('\\') != std::string_view::npos);
    if (starts) {
      if (begin != std::string_view::npos && !skipping) out.push_back({begin, pos});
      begin = pos;
      skipping = is_header_entry(line);
    }
    prev_blank = blank;
    pos = eol + 1;
  }
  if (begin != std::string_view::npos && !skipping) out.push_back({begin, dict.size()});
  return out;
}

// Bytes of `s` that are not part of a well-formed UTF-8 sequence (an
// overlong form, a surrogate or a value above U+10FFFF counts), and NULs.
size_t bad_text_bytes(std::string_view s) {
  size_t bad = 0;
  for (size_t i = 0; i < s.size();) {
    auto b = static_cast<unsigned char>(s[i]);
    if (b == 0) {
      ++bad, ++i;
      continue;
    }
    if (b < 0x80) {
      ++i;
      continue;
    }
    size_t len = b >= 0xF0 && b <= 0xF4 ? 4 : b >= 0xE0 ? 3 : b >= 0xC2 && b <= 0xDF ? 2 : 0;
    if (b > 0xF4) len = 0;
    bool ok = len > 0 && i + len <= s.size();
    uint32_t cp = len == 2 ? b & 0x1F : len == 3 ? b & 0x0F : b & 0x07;
    for (size_t k = 1; ok && k < len; ++k) {
      auto c = static_cast<unsigned char>(s[i + k]);
      ok = (c & 0xC0) == 0x80;
      cp = (cp << 6) | (c & 0x3F);
    }
    ok = ok && !(len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) && !(len == 4 && (cp < 0x10000 || cp > 0x10FFFF));
    if (ok) {
      i += len;
    } else {
      ++bad, ++i;
    }
  }
  return bad;
}

}  // namespace

std::vector<Document> read_text_documents(const std::string& path) {
  GzFile f = open_gz_input(path);
  std::vector<Document> docs(1);
  size_t bytes = 0, bad = 0;
  auto take_line = [&](std::string_view line) {
    bytes += line.size() + 1;
    bad += bad_text_bytes(line);
    line = trim(line);
    if (line.empty()) {
      if (!docs.back().empty()) docs.emplace_back();
    } else {
      docs.back().emplace_back(line);
    }
  };
  std::vector<char> buf(1 << 20);
  std::string carry;
  for (size_t got; (got = gz_read_some(f.get(), path, buf.data(), buf.size())) > 0;) {
    std::string_view chunk(buf.data(), got);
    size_t pos = 0;
    for (size_t eol; (eol = chunk.find('\n', pos)) != std::string_view::npos; pos = eol + 1) {
      if (carry.empty()) {
        take_line(chunk.substr(pos, eol - pos));
      } else {
        carry.append(chunk.substr(pos, eol - pos));
        take_line(carry);
        carry.clear();
      }
    }
    carry.append(chunk.substr(pos));
  }
  take_line(carry);
  // A few stray bytes are kept (the tokenizer maps them to [UNK]); a file
  // that is not text at all (random bytes, a binary, an archive) is not.
  COHORT_CHECK(bad * 100 <= bytes, DataError, path, " is not UTF-8 text: ", bad, " of ", bytes,
               " bytes are NUL or not valid UTF-8. prepare reads plain text (a sentence per line, a blank line "
               "between documents, optionally .gz) or a GCIDE dictionary (.dict/.dict.dz)");
  if (docs.back().empty()) docs.pop_back();
  return docs;
}

std::vector<std::string> gcide_sentences(const std::string& entry) {
  // Lines join into paragraphs; a paragraph ends at a blank line and before
  // a numbered sense, a "Syn:" or "Note:" line or a new headword (column 0).
  std::vector<std::string> sentences;
  std::string para;
  auto flush = [&] {
    if (!para.empty()) split_sentences(strip_markup(para), sentences);
    para.clear();
  };
  std::string_view text(entry);
  for (size_t pos = 0; pos < text.size();) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view raw = text.substr(pos, eol - pos);
    pos = eol + 1;
    std::string_view line = trim(raw);
    if (line.empty()) {
      flush();
      continue;
    }
    bool new_paragraph = !is_space(raw[0]) || starts_with(line, "Syn:") || starts_with(line, "Note:");
    if (size_t n = sense_prefix(line)) {
      line = trim(line.substr(n));
      new_paragraph = true;
    }
    if (new_paragraph) flush();
    line = drop_author(line);
    if (line.empty()) continue;
    if (!para.empty()) para += ' ';
    para.append(line);
  }
  flush();
  return sentences;
}

std::vector<Document> read_gcide_documents(const std::string& path) {
  const std::string dict = read_all(path);
  // GCIDE's dictd text is ASCII; random bytes would still yield "entries".
  const size_t bad = bad_text_bytes(dict);
  COHORT_CHECK(bad * 100 <= dict.size(), DataError, path, " is not a dictd dictionary: ", bad, " of ", dict.size(),
               " bytes are NUL or not valid UTF-8 (expected a GCIDE .dict or .dict.dz, e.g. /usr/share/dictd/gcide.dict.dz)");
  const std::string idx = index_path(path);
  std::vector<Span> spans = idx.empty() ? spans_from_layout(dict) : spans_from_index(idx, dict.size(), path);
  std::vector<Document> docs;
  docs.reserve(spans.size());
  for (const Span& s : spans) {
    Document doc = gcide_sentences(dict.substr(s.begin, s.end - s.begin));
    if (!doc.empty()) docs.push_back(std::move(doc));
  }
  COHORT_CHECK(!docs.empty(), DataError, path, ": no dictionary entries found; is it a dictd .dict(.dz) file?");
  return docs;
}

}  // namespace cohort::prep
