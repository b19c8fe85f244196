// defines: Vocab, WordPiece, internal::basic_pass (declared in wordpiece.hpp and
//          basic_pass.hpp)
//
// The reference is Hugging Face's BertTokenizerFast (tokenizers' BertNormalizer,
// BertPreTokenizer and WordPiece), which is what users of BERT run; its
// Unicode behaviour is read off tokenizers itself by
// scripts/gen_unicode_tables.py. Where it differs from Google BERT's
// tokenization.py, Cohort follows HF (docs/design.md, the tokenizer). HF's passes (clean
// text, space CJK characters, strip accents, lowercase, split on whitespace
// and punctuation) each work character by character, so they are fused here
// into one pass over the code points. One known difference: NFD's canonical
// reordering is not modelled, which only shows for two adjacent non-Mn
// combining characters out of canonical order (some musical symbols and
// viramas); they keep their input order.
#include "cohort/text/wordpiece.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "cohort/core/error.hpp"
#include "cohort/text/basic_pass.hpp"
#include "cohort/text/utf8.hpp"

namespace cohort::text {

// ---------------------------------------------------------------------------
// Unicode tables
// ---------------------------------------------------------------------------
namespace {

enum CharClass : uint8_t { kOther = 0, kDrop, kSpace, kPunct, kCjk };
enum FoldKind : uint8_t { kFoldDrop, kFoldConst, kFoldDelta, kFoldSeq };

struct ClassRange {
  uint32_t lo, hi;
  CharClass cls;
};
struct FoldRange {
  uint32_t lo, hi;
  FoldKind kind;
  uint8_t stride;  // kFoldDelta: the step; kFoldSeq: the output length
  int32_t arg;     // kFoldConst: the output; kFoldDelta: the offset; kFoldSeq: pool index
};

#include "cohort/text/unicode_tables.inc"

constexpr uint32_t kBadByte = 0xFFFFFFFF;

// The range holding `cp`, or nullptr. Ranges are sorted and disjoint.
template <class Range, size_t N>
const Range* find_range(const Range (&ranges)[N], uint32_t cp) {
  const Range* it =
      std::upper_bound(ranges, ranges + N, cp, [](uint32_t c, const Range& r) { return c < r.lo; });
  if (it == ranges) return nullptr;
  --it;
  return cp <= it->hi ? it : nullptr;
}

CharClass class_slow(uint32_t cp) {
  const ClassRange* r = find_range(kClassRanges, cp);
  return r ? r->cls : kOther;
}

// Uncased normalization of one code point: NFD, drop Mn, lowercase. Writes
// 0..4 code points to out and returns how many.
size_t fold_slow(uint32_t cp, uint32_t* out) {
  if (cp >= 0xAC00 && cp <= 0xD7A3) {  // Hangul syllable: NFD by rule, to jamo
    uint32_t s = cp - 0xAC00;
    out[0] = 0x1100 + s / 588;
    out[1] = 0x1161 + (s % 588) / 28;
    if (s % 28 == 0) return 2;
    out[2] = 0x11A7 + s % 28;
    return 3;
  }
  const FoldRange* r = find_range(kFoldRanges, cp);
  if (!r) {
    out[0] = cp;
    return 1;
  }
  switch (r->kind) {
    case kFoldDrop:
      return 0;
    case kFoldConst:
      out[0] = static_cast<uint32_t>(r->arg);
      return 1;
    case kFoldDelta:
      out[0] = (cp - r->lo) % r->stride == 0 ? static_cast<uint32_t>(static_cast<int64_t>(cp) + r->arg) : cp;
      return 1;
    case kFoldSeq:
      for (size_t k = 0; k < r->stride; ++k) out[k] = kFoldPool[static_cast<size_t>(r->arg) + k];
      return r->stride;
  }
  return 0;
}

// The same facts for ASCII, looked up without a search: the hot path.
struct AsciiInfo {
  CharClass cls[128];
  char lower[128];
};

const AsciiInfo& ascii_info() {
  static const AsciiInfo info = [] {
    AsciiInfo a{};
    for (uint32_t c = 0; c < 128; ++c) {
      a.cls[c] = class_slow(c);
      uint32_t out[4];
      size_t n = fold_slow(c, out);
      a.lower[c] = static_cast<char>(n == 1 ? out[0] : c);
    }
    return a;
  }();
  return info;
}

CharClass char_class(uint32_t cp, const AsciiInfo& a) { return cp < 128 ? a.cls[cp] : class_slow(cp); }

// Decodes the code point at s[i] and advances i. Invalid UTF-8 (overlong,
// surrogate, above U+10FFFF, truncated) gives kBadByte after consuming the
// longest invalid prefix, so that the next valid character survives, as
// Python's bytes.decode("utf-8", "ignore") does.
uint32_t next_code_point(const unsigned char* s, size_t n, size_t& i) {
  unsigned c = s[i];
  if (c < 0x80) {
    ++i;
    return c;
  }
  size_t len;
  uint32_t cp;
  unsigned lo = 0x80, hi = 0xBF;  // the allowed range of the first continuation byte
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
    cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    cp = c & 0x0F;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    cp = c & 0x07;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    ++i;
    return kBadByte;
  }
  size_t j = i + 1;
  for (size_t k = 1; k < len; ++k, ++j) {
    if (j >= n || s[j] < lo || s[j] > hi) {
      i = j;
      return kBadByte;
    }
    cp = (cp << 6) | (s[j] & 0x3Fu);
    lo = 0x80;
    hi = 0xBF;
  }
  i = j;
  return cp;
}

// The word being built, with its code point offsets.
class WordBuilder {
 public:
  explicit WordBuilder(internal::WordSink& sink) : sink_(sink) {}
  void push(uint32_t cp) {
    starts_.push_back(static_cast<uint32_t>(bytes_.size()));
    append_utf8(bytes_, cp);
  }
  void push_ascii(char c) {
    starts_.push_back(static_cast<uint32_t>(bytes_.size()));
    bytes_ += c;
  }
  void flush() {
    if (starts_.empty()) return;
    sink_.word(bytes_, starts_.data(), starts_.size());
    bytes_.clear();
    starts_.clear();
  }
  void single(uint32_t cp) {
    flush();
    push(cp);
    flush();
  }

 private:
  internal::WordSink& sink_;
  std::string bytes_;
  std::vector<uint32_t> starts_;
};

// ---------------------------------------------------------------------------
// Vocabulary hash tables: lookups by string_view, no allocation
// ---------------------------------------------------------------------------

uint64_t hash_bytes(std::string_view s) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (s.size() * 0xFF51AFD7ED558CCDull);
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t v;
    std::memcpy(&v, s.data() + i, 8);
    h = (h ^ v) * 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 29;
  }
  uint64_t tail = 0;
  std::memcpy(&tail, s.data() + i, s.size() - i);
  h = (h ^ tail) * 0xFF51AFD7ED558CCDull;
  h ^= h >> 32;
  return h;
}

class PieceTable {
 public:
  void add(std::string_view key, int32_t id) {
    offsets_.push_back(static_cast<uint32_t>(keys_.size()));
    keys_.append(key);
    ids_.push_back(id);
    size_t chars = 0;
    for (char c : key) chars += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
    max_chars_ = std::max(max_chars_, chars);
  }
  void build() {
    offsets_.push_back(static_cast<uint32_t>(keys_.size()));
    size_t cap = 16;
    while (cap < 2 * ids_.size()) cap *= 2;
    mask_ = cap - 1;
    slots_.assign(cap, 0);
    for (uint32_t e = 0; e < ids_.size(); ++e) {
      size_t at = hash_bytes(key(e)) & mask_;
      while (slots_[at]) at = (at + 1) & mask_;
      slots_[at] = e + 1;
    }
  }
  int32_t find(std::string_view k) const {
    for (size_t at = hash_bytes(k) & mask_; slots_[at]; at = (at + 1) & mask_) {
      uint32_t e = slots_[at] - 1;
      if (key(e) == k) return ids_[e];
    }
    return -1;
  }
  size_t max_chars() const { return max_chars_; }

 private:
  std::string_view key(uint32_t e) const {
    return std::string_view(keys_).substr(offsets_[e], offsets_[e + 1] - offsets_[e]);
  }
  std::string keys_;
  std::vector<uint32_t> offsets_;
  std::vector<int32_t> ids_;
  std::vector<uint32_t> slots_;  // entry + 1; 0 is empty
  size_t mask_ = 0;
  size_t max_chars_ = 0;
};

}  // namespace

// ---------------------------------------------------------------------------
// The basic pass
// ---------------------------------------------------------------------------
void internal::basic_pass(std::string_view text, bool lowercase, WordSink& sink) {
  const AsciiInfo& a = ascii_info();
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  WordBuilder word(sink);
  uint32_t folded[4];

  for (size_t i = 0; i < n;) {
    if (s[i] < 0x80) {  // ASCII: one table lookup
      unsigned c = s[i++];
      switch (a.cls[c]) {
        case kDrop:
          break;
        case kSpace:
          word.flush();
          break;
        case kPunct:
          word.flush();
          word.push_ascii(static_cast<char>(c));
          word.flush();
          break;
        default:
          word.push_ascii(lowercase ? a.lower[c] : static_cast<char>(c));
          break;
      }
      continue;
    }
    uint32_t cp = next_code_point(s, n, i);
    if (cp == kBadByte) continue;
    CharClass cls = class_slow(cp);
    if (cls == kDrop) continue;
    if (cls == kSpace) {
      word.flush();
      continue;
    }
    if (!lowercase) {
      if (cls == kOther) {
        word.push(cp);
      } else {
        word.single(cp);  // punctuation or CJK
      }
      continue;
    }
    size_t count = fold_slow(cp, folded);
    if (cls == kCjk) {  // its own token; folds to one CJK character or stays
      word.flush();
      for (size_t k = 0; k < count; ++k) word.push(folded[k]);
      word.flush();
      continue;
    }
    // Punctuation is split after lowercasing and stripping: U+2260 (not equal
    // sign, a symbol) strips to '=', which is punctuation.
    for (size_t k = 0; k < count; ++k) {
      CharClass out = char_class(folded[k], a);
      if (out == kPunct) {
        word.single(folded[k]);
      } else if (out == kSpace) {
        word.flush();
      } else {
        word.push(folded[k]);
      }
    }
  }
  word.flush();
}

// ---------------------------------------------------------------------------
// Vocab
// ---------------------------------------------------------------------------
Vocab::Vocab(std::vector<std::string> tokens) : tokens_(std::move(tokens)) {
  ids_.reserve(tokens_.size());
  for (size_t i = 0; i < tokens_.size(); ++i) {
    auto [it, inserted] = ids_.emplace(tokens_[i], static_cast<int32_t>(i));
    COHORT_CHECK(inserted, DataError, "vocabulary: token '", tokens_[i], "' appears twice, as ids ",
                 it->second, " and ", i);
  }
}

Vocab Vocab::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  COHORT_CHECK(in, DataError, "cannot open vocabulary ", path, ": ", std::strerror(errno));
  std::vector<std::string> tokens;
  std::unordered_map<std::string, size_t> line_of;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    auto [it, inserted] = line_of.emplace(line, tokens.size() + 1);
    COHORT_CHECK(inserted, DataError, path, ": token '", line, "' on line ", tokens.size() + 1,
                 " already appears on line ", it->second, " (each token must be unique)");
    tokens.push_back(std::move(line));
  }
  COHORT_CHECK(!in.bad(), DataError, "cannot read vocabulary ", path, ": ", std::strerror(errno));
  COHORT_CHECK(!tokens.empty(), DataError, "vocabulary ", path, " is empty");
  return Vocab(std::move(tokens));
}

void Vocab::save(const std::string& path) const {
  std::string text;
  for (const auto& t : tokens_) {
    COHORT_CHECK(t.find('\n') == std::string::npos && (t.empty() || t.back() != '\r'), DataError,
                 "cannot save vocabulary ", path, ": token '", t, "' holds a line break");
    text += t;
    text += '\n';
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  COHORT_CHECK(out, DataError, "cannot write vocabulary ", path, ": ", std::strerror(errno));
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.close();
  COHORT_CHECK(out, DataError, "cannot write vocabulary ", path, ": ", std::strerror(errno));
}

int32_t Vocab::find(std::string_view token) const {
  auto it = ids_.find(std::string(token));
  return it == ids_.end() ? -1 : it->second;
}

int32_t Vocab::require(std::string_view token) const {
  int32_t id = find(token);
  COHORT_CHECK(id >= 0, DataError, "the vocabulary has no ", token, " token (", size(),
               " tokens; a BERT vocab.txt lists [PAD] [UNK] [CLS] [SEP] [MASK])");
  return id;
}

// ---------------------------------------------------------------------------
// WordPiece
// ---------------------------------------------------------------------------
struct WordPiece::Pieces {
  PieceTable whole;         // every token, for the first piece of a word
  PieceTable continuation;  // "##x" tokens keyed by "x", for the later pieces
};

WordPiece::WordPiece(Vocab vocab, TokenizerOptions opts) : vocab_(std::move(vocab)), opts_(opts) {
  COHORT_CHECK(opts_.max_chars_per_word > 0, UsageError, "max_chars_per_word must be positive, got ",
               opts_.max_chars_per_word);
  unk_ = vocab_.require("[UNK]");
  auto pieces = std::make_shared<Pieces>();
  for (int32_t id = 0; id < vocab_.size(); ++id) {
    std::string_view t = vocab_.token(id);
    pieces->whole.add(t, id);
    if (t.size() > 2 && t.compare(0, 2, "##") == 0) pieces->continuation.add(t.substr(2), id);
  }
  pieces->whole.build();
  pieces->continuation.build();
  pieces_ = std::move(pieces);
}

namespace {

// Greedy longest-match-first over the code points of each word.
class EncodeSink final : public internal::WordSink {
 public:
  EncodeSink(const PieceTable& whole, const PieceTable& cont, size_t max_chars, int32_t unk,
             std::vector<int32_t>& out)
      : whole_(whole), cont_(cont), max_chars_(max_chars), unk_(unk), out_(out) {}

  void word(std::string_view bytes, const uint32_t* starts, size_t chars) override {
    if (chars > max_chars_) {
      out_.push_back(unk_);
      return;
    }
    const size_t mark = out_.size();
    auto byte_at = [&](size_t k) { return k == chars ? bytes.size() : starts[k]; };
    for (size_t start = 0; start < chars;) {
      const PieceTable& table = start == 0 ? whole_ : cont_;
      int32_t id = -1;
      size_t end = std::min(chars, start + table.max_chars());
      for (; end > start; --end) {
        id = table.find(bytes.substr(starts[start], byte_at(end) - starts[start]));
        if (id >= 0) break;
      }
      if (id < 0) {  // some part has no piece: the whole word is unknown
        out_.resize(mark);
        out_.push_back(unk_);
        return;
      }
      out_.push_back(id);
      start = end;
    }
  }

 private:
  const PieceTable& whole_;
  const PieceTable& cont_;
  size_t max_chars_;
  int32_t unk_;
  std::vector<int32_t>& out_;
};

class CollectSink final : public internal::WordSink {
 public:
  explicit CollectSink(std::vector<std::string>& out) : out_(out) {}
  void word(std::string_view bytes, const uint32_t*, size_t) override { out_.emplace_back(bytes); }

 private:
  std::vector<std::string>& out_;
};

}  // namespace

std::vector<std::string> WordPiece::basic_tokenize(std::string_view text) const {
  std::vector<std::string> words;
  CollectSink sink(words);
  internal::basic_pass(text, opts_.lowercase, sink);
  return words;
}

std::vector<int32_t> WordPiece::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  EncodeSink sink(pieces_->whole, pieces_->continuation, static_cast<size_t>(opts_.max_chars_per_word),
                  unk_, ids);
  internal::basic_pass(text, opts_.lowercase, sink);
  return ids;
}

std::vector<std::string> WordPiece::tokenize(std::string_view text) const {
  std::vector<std::string> tokens;
  for (int32_t id : encode(text)) tokens.push_back(vocab_.token(id));
  return tokens;
}

}  // namespace cohort::text
