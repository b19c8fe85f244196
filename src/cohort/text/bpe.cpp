#include "cohort/text/bpe.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <fstream>
#include <optional>
#include <queue>
#include <sstream>
#include <unordered_set>

#include "cohort/core/error.hpp"
#include "cohort/text/utf8.hpp"

namespace cohort::text {

namespace {

// The tables' types (byte_level_tables.inc).
enum RegexClass : uint8_t { kOther, kLetter, kNumber, kSpace };
struct RegexClassRange {
  uint32_t lo, hi;
  RegexClass cls;
};
struct DecompEntry {
  uint32_t cp, offset, length;
};
struct CombiningRange {
  uint32_t lo, hi, ccc;
};
struct Composition {
  uint32_t first, second, composite;
};

#include "cohort/text/byte_level_tables.inc"

RegexClass regex_class(uint32_t cp) {
  auto it = std::upper_bound(std::begin(kRegexClasses), std::end(kRegexClasses), cp,
                             [](uint32_t c, const RegexClassRange& r) { return c < r.lo; });
  if (it == std::begin(kRegexClasses)) return kOther;
  --it;
  return cp <= it->hi ? it->cls : kOther;
}

uint32_t combining_class(uint32_t cp) {
  auto it = std::upper_bound(std::begin(kCombining), std::end(kCombining), cp,
                             [](uint32_t c, const CombiningRange& r) { return c < r.lo; });
  if (it == std::begin(kCombining)) return 0;
  --it;
  return cp <= it->hi ? it->ccc : 0;
}

// Hangul syllables, decomposed and composed by rule.
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

// UTF-8 -> code points; an invalid byte reads as U+FFFD.
std::vector<uint32_t> decode(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
    bool ok = len > 0 && i + static_cast<size_t>(len) <= n;
    for (int k = 1; ok && k < len; ++k) {
      ok = (p[i + static_cast<size_t>(k)] >> 6) == 2;
      cp = (cp << 6) | (p[i + static_cast<size_t>(k)] & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (!ok || cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      out.push_back(0xFFFD);
      ++i;
      continue;
    }
    out.push_back(cp);
    i += static_cast<size_t>(len);
  }
  return out;
}

std::string encode_utf8(const uint32_t* cps, size_t n) {
  std::string out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) append_utf8(out, cps[i]);
  return out;
}

// Canonical decomposition, then canonical ordering of combining marks.
std::vector<uint32_t> nfd(const std::vector<uint32_t>& in) {
  std::vector<uint32_t> out;
  out.reserve(in.size());
  for (uint32_t cp : in) {
    if (cp >= kSBase && cp < kSBase + kSCount) {
      const uint32_t s = cp - kSBase;
      out.push_back(kLBase + s / kNCount);
      out.push_back(kVBase + (s % kNCount) / kTCount);
      if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
      continue;
    }
    auto it = std::lower_bound(std::begin(kDecomp), std::end(kDecomp), cp,
                               [](const DecompEntry& e, uint32_t c) { return e.cp < c; });
    if (it != std::end(kDecomp) && it->cp == cp) {
      out.insert(out.end(), kDecompPool + it->offset, kDecompPool + it->offset + it->length);
    } else {
      out.push_back(cp);
    }
  }
  for (size_t i = 0; i < out.size();) {  // stable sort of each run of marks by class
    if (combining_class(out[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < out.size() && combining_class(out[j]) != 0) ++j;
    std::stable_sort(out.begin() + static_cast<std::ptrdiff_t>(i), out.begin() + static_cast<std::ptrdiff_t>(j),
                     [](uint32_t a, uint32_t b) { return combining_class(a) < combining_class(b); });
    i = j;
  }
  return out;
}

std::optional<uint32_t> compose(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount)
    return a + (b - kTBase);
  auto it = std::lower_bound(std::begin(kCompositions), std::end(kCompositions), std::make_pair(a, b),
                             [](const Composition& c, const std::pair<uint32_t, uint32_t>& k) {
                               return std::make_pair(c.first, c.second) < k;
                             });
  if (it != std::end(kCompositions) && it->first == a && it->second == b) return it->composite;
  return std::nullopt;
}

// Canonical composition of NFD text (Unicode's sample algorithm).
std::vector<uint32_t> nfc(const std::vector<uint32_t>& in) {
  std::vector<uint32_t> d = nfd(in);
  if (d.empty()) return d;
  size_t starter = 0, out = 1;
  uint32_t last_class = combining_class(d[0]);
  if (last_class != 0) last_class = 256;  // a leading mark: nothing composes with it
  for (size_t i = 1; i < d.size(); ++i) {
    const uint32_t ch = d[i], cls = combining_class(ch);
    auto composite = compose(d[starter], ch);
    if (composite && (last_class < cls || last_class == 0)) {
      d[starter] = *composite;
      continue;
    }
    if (cls == 0) starter = out;
    last_class = cls;
    d[out++] = ch;
  }
  d.resize(out);
  return d;
}

// GPT-2's pre-tokenizer regex, by hand over code points:
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// alternatives tried in order at each position ("?" is U+0020 only).
// Appends each piece's [begin, end).
void regex_split(const std::vector<uint32_t>& t, size_t begin, size_t end,
                 std::vector<std::pair<size_t, size_t>>& pieces) {
  auto cls = [&](size_t i) { return regex_class(t[i]); };
  for (size_t i = begin; i < end;) {
    if (t[i] == '\'' && i + 1 < end) {
      const uint32_t a = t[i + 1], b = i + 2 < end ? t[i + 2] : 0;
      size_t len = (a == 's' || a == 't' || a == 'm' || a == 'd') ? 2
                   : ((a == 'r' || a == 'v') && b == 'e') || (a == 'l' && b == 'l') ? 3
                                                                                     : 0;
      if (len) {
        pieces.emplace_back(i, i + len);
        i += len;
        continue;
      }
    }
    // ` ?\p{L}+`, ` ?\p{N}+` or ` ?[^\s\p{L}\p{N}]+`: a run of one class,
    // with the space before it.
    const size_t from = t[i] == ' ' && i + 1 < end && cls(i + 1) != kSpace ? i + 1 : i;
    if (const RegexClass c = cls(from); c != kSpace) {
      size_t j = from + 1;
      while (j < end && cls(j) == c) ++j;
      pieces.emplace_back(i, j);
      i = j;
      continue;
    }
    // Whitespace: the run, less its last character when a non-space follows
    // (`\s+(?!\S)`), unless that leaves nothing (`\s+`).
    size_t j = i + 1;
    while (j < end && cls(j) == kSpace) ++j;
    if (j < end && j - i >= 2) --j;
    pieces.emplace_back(i, j);
    i = j;
  }
}

// GPT-2's bytes_to_unicode: each byte as one printable character, in UTF-8.
const std::array<std::string, 256>& byte_chars() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      append_utf8(t[b], printable ? b : next++);
    }
    return t;
  }();
  return table;
}

std::string to_byte_chars(const std::string& utf8) {
  std::string out;
  out.reserve(utf8.size() * 2);
  for (unsigned char b : utf8) out += byte_chars()[b];
  return out;
}

// The byte-level characters of a byte-level string, one string each.
std::vector<std::string> split_chars(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
    out.push_back(s.substr(i, len));
    i += len;
  }
  return out;
}

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

bool is_space(uint32_t cp) { return regex_class(cp) == kSpace; }
bool is_word(uint32_t cp) {
  auto c = regex_class(cp);
  return c == kLetter || c == kNumber || cp == '_';
}

template <class T>
T field(const nlohmann::json& j, const char* key, const T& fallback, const std::string& what) {
  if (!j.contains(key) || j.at(key).is_null()) return fallback;
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw DataError(detail::cat(what, ": field '", key, "' has the wrong type (", j.at(key).dump(), ")"));
  }
}

}  // namespace

ByteLevelBpe ByteLevelBpe::load(const std::string& path) {
  std::ifstream in(path);
  COHORT_CHECK(in, DataError, "cannot read ", path);
  std::stringstream buf;
  buf << in.rdbuf();
  return from_json(buf.str(), path);
}

ByteLevelBpe ByteLevelBpe::from_json(const std::string& text, const std::string& what) {
  try {
    return parse(text, what);
  } catch (const nlohmann::json::exception& e) {  // a field of the wrong type or shape
    throw DataError(detail::cat(what, ": ", e.what()));
  }
}

ByteLevelBpe ByteLevelBpe::parse(const std::string& text, const std::string& what) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw DataError(detail::cat(what, " is not JSON: ", e.what()));
  }
  COHORT_CHECK(j.is_object() && j.contains("model") && j.at("model").is_object(), DataError, what,
               " has no 'model': is it a Hugging Face tokenizer.json?");
  ByteLevelBpe t;
  t.json_ = text;
  const auto& m = j.at("model");
  COHORT_CHECK(field<std::string>(m, "type", "BPE", what) == "BPE", DataError, what, ": model type '",
               m.value("type", ""), "' (Cohort reads BPE tokenizer.json files here; WordPiece vocabularies are vocab.txt)");
  COHORT_CHECK(m.value("dropout", nlohmann::json()).is_null(), DataError, what,
               ": BPE dropout is not modelled (it makes encoding random)");
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"})
    COHORT_CHECK(field<std::string>(m, affix, "", what).empty(), DataError, what, ": ", affix,
                 " is not modelled (byte-level BPE has none)");
  COHORT_CHECK(!field<bool>(m, "byte_fallback", false, what), DataError, what,
               ": byte_fallback is not modelled (byte-level BPE needs none)");
  t.ignore_merges_ = field<bool>(m, "ignore_merges", false, what);
  // The vocabulary and the added tokens, by id.
  std::map<int32_t, std::string> by_id;
  COHORT_CHECK(m.contains("vocab") && m.at("vocab").is_object(), DataError, what, ": model.vocab is missing");
  for (auto it = m.at("vocab").begin(); it != m.at("vocab").end(); ++it) {
    COHORT_CHECK(it.value().is_number_integer() && it.value().get<int64_t>() >= 0 &&
                     it.value().get<int64_t>() < (int64_t{1} << 30),
                 DataError, what, ": the id of '", it.key(), "' is ", it.value().dump());
    by_id[it.value().get<int32_t>()] = it.key();
  }
  if (j.contains("added_tokens") && j.at("added_tokens").is_array()) {
    for (const auto& a : j.at("added_tokens")) {
      Added added;
      added.content = field<std::string>(a, "content", "", what);
      added.id = field<int32_t>(a, "id", -1, what);
      COHORT_CHECK(!added.content.empty() && added.id >= 0, DataError, what, ": an added token without content or id: ",
                   a.dump());
      added.special = field<bool>(a, "special", false, what);
      added.normalized = field<bool>(a, "normalized", !added.special, what);
      added.lstrip = field<bool>(a, "lstrip", false, what);
      added.rstrip = field<bool>(a, "rstrip", false, what);
      added.single_word = field<bool>(a, "single_word", false, what);
      by_id[added.id] = added.content;
      t.added_.push_back(added);
    }
  }
  COHORT_CHECK(!by_id.empty(), DataError, what, ": the vocabulary is empty");
  t.tokens_.assign(static_cast<size_t>(by_id.rbegin()->first) + 1, std::string());
  for (const auto& [id, token] : by_id) {
    t.tokens_[static_cast<size_t>(id)] = token;
    t.ids_.emplace(token, id);
  }
  if (auto unk = field<std::string>(m, "unk_token", "", what); !unk.empty()) t.unk_id_ = t.find(unk);
  // Merges: "a b" (older files) or ["a", "b"].
  if (m.contains("merges") && m.at("merges").is_array()) {
    for (const auto& merge : m.at("merges")) {
      std::string a, b;
      if (merge.is_string()) {
        const auto s = merge.get<std::string>();
        const auto space = s.find(' ', 1);
        COHORT_CHECK(space != std::string::npos, DataError, what, ": merge '", s, "' is not two tokens");
        a = s.substr(0, space);
        b = s.substr(space + 1);
      } else {
        COHORT_CHECK(merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string(), DataError,
                     what, ": merge ", merge.dump(), " is not two tokens");
        a = merge[0].get<std::string>();
        b = merge[1].get<std::string>();
      }
      const int32_t ia = t.find(a), ib = t.find(b), merged = t.find(a + b);
      COHORT_CHECK(ia >= 0 && ib >= 0 && merged >= 0, DataError, what, ": merge '", a, "' '", b,
                   "' names a token the vocabulary lacks");
      t.merge_of_.emplace(pair_key(ia, ib), std::make_pair(static_cast<int32_t>(t.merges_.size()), merged));
      t.merges_.emplace_back(a, b);
    }
  }
  // The normalizer.
  std::function<void(const nlohmann::json&)> normalizer = [&](const nlohmann::json& n) {
    if (n.is_null()) return;
    const auto type = field<std::string>(n, "type", "", what);
    if (type == "NFC") {
      t.normalizers_.push_back(Normalization::kNfc);
    } else if (type == "NFD") {
      t.normalizers_.push_back(Normalization::kNfd);
    } else if (type == "Sequence") {
      for (const auto& part : n.value("normalizers", nlohmann::json::array())) normalizer(part);
    } else {
      throw DataError(detail::cat(what, ": normalizer '", type, "' is not modelled (NFC, NFD and Sequences of them are)"));
    }
  };
  normalizer(j.value("normalizer", nlohmann::json()));
  // The pre-tokenizer: ByteLevel, alone or as a Sequence's one part.
  nlohmann::json pre = j.value("pre_tokenizer", nlohmann::json());
  if (pre.is_object() && pre.value("type", "") == "Sequence" && pre.value("pretokenizers", nlohmann::json()).size() == 1)
    pre = pre.at("pretokenizers")[0];
  COHORT_CHECK(pre.is_object() && pre.value("type", "") == "ByteLevel", DataError, what, ": pre_tokenizer ",
               pre.is_object() ? "'" + pre.value("type", "") + "'" : pre.dump(),
               " is not modelled (Cohort reads byte-level BPE: the ByteLevel pre-tokenizer)");
  t.add_prefix_space_ = field<bool>(pre, "add_prefix_space", true, what);
  t.use_regex_ = field<bool>(pre, "use_regex", true, what);
  // The post-processor's special tokens around a single sequence.
  std::function<void(const nlohmann::json&)> post = [&](const nlohmann::json& p) {
    if (p.is_null()) return;
    const auto type = field<std::string>(p, "type", "", what);
    if (type == "Sequence") {
      for (const auto& part : p.value("processors", nlohmann::json::array())) post(part);
    } else if (type == "TemplateProcessing") {
      bool seen_a = false;
      for (const auto& piece : p.value("single", nlohmann::json::array())) {
        if (piece.contains("Sequence")) {
          seen_a = true;
          continue;
        }
        COHORT_CHECK(piece.contains("SpecialToken"), DataError, what, ": template piece ", piece.dump());
        const auto name = piece.at("SpecialToken").value("id", "");
        const auto& special = p.value("special_tokens", nlohmann::json::object());
        COHORT_CHECK(special.contains(name), DataError, what, ": the template names '", name,
                     "', which special_tokens lacks");
        for (const auto& id : special.at(name).value("ids", nlohmann::json::array()))
          (seen_a ? t.after_ : t.before_).push_back(id.get<int32_t>());
      }
    } else if (type == "RobertaProcessing" || type == "BertProcessing") {
      COHORT_CHECK(p.contains("cls") && p.contains("sep"), DataError, what, ": ", type, " without cls and sep");
      t.before_ = {p.at("cls")[1].get<int32_t>()};
      t.after_ = {p.at("sep")[1].get<int32_t>()};
    } else if (type != "ByteLevel") {
      throw DataError(detail::cat(what, ": post_processor '", type, "' is not modelled"));
    }
  };
  post(j.value("post_processor", nlohmann::json()));
  return t;
}

int32_t ByteLevelBpe::find(std::string_view token) const {
  auto it = ids_.find(std::string(token));
  return it == ids_.end() ? -1 : it->second;
}

std::vector<int32_t> ByteLevelBpe::bpe_word(const std::string& word) const {
  if (ignore_merges_) {
    if (int32_t id = find(word); id >= 0) return {id};
  }
  std::vector<int32_t> symbols;
  for (const auto& ch : split_chars(word)) {
    const int32_t id = find(ch);
    if (id >= 0) {
      symbols.push_back(id);
    } else if (unk_id_ >= 0) {
      symbols.push_back(unk_id_);
    }  // no unk token: the character is dropped, as tokenizers does
  }
  // Merge the lowest-ranked adjacent pair, the leftmost on a tie, until none is left.
  while (symbols.size() > 1) {
    int32_t best_rank = -1, merged = -1;
    size_t at = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      auto it = merge_of_.find(pair_key(symbols[i], symbols[i + 1]));
      if (it != merge_of_.end() && (best_rank < 0 || it->second.first < best_rank)) {
        best_rank = it->second.first;
        merged = it->second.second;
        at = i;
      }
    }
    if (best_rank < 0) break;
    // Every occurrence of the pair, left to right, as one rank's merges do.
    const int32_t a = symbols[at], b = symbols[at + 1];
    std::vector<int32_t> next;
    next.reserve(symbols.size());
    for (size_t i = 0; i < symbols.size();) {
      if (i + 1 < symbols.size() && symbols[i] == a && symbols[i + 1] == b) {
        next.push_back(merged);
        i += 2;
      } else {
        next.push_back(symbols[i++]);
      }
    }
    symbols.swap(next);
  }
  return symbols;
}

// Splits the code points `cps` on the added tokens of this pass: those
// matched in the raw text (normalized_pass false) or in the normalized text.
// Leftmost-longest, as tokenizers' AddedVocabulary; a match's ids go
// straight to `ids_out` in order, through the pieces returned as (true, {})
// markers; the text between matches is returned as (false, code points).
std::vector<std::pair<bool, std::vector<uint32_t>>> ByteLevelBpe::split_added(const std::vector<uint32_t>& cps,
                                                                             bool normalized_pass,
                                                                             std::vector<int32_t>& ids_out) const {
  std::vector<std::pair<bool, std::vector<uint32_t>>> out;
  std::vector<const Added*> candidates;
  for (const auto& a : added_)
    if (a.normalized == normalized_pass) candidates.push_back(&a);
  if (candidates.empty()) {
    out.emplace_back(false, cps);
    return out;
  }
  auto between = [&](size_t b, size_t e) {
    return std::vector<uint32_t>(cps.begin() + static_cast<std::ptrdiff_t>(b), cps.begin() + static_cast<std::ptrdiff_t>(e));
  };
  std::vector<std::vector<uint32_t>> contents;
  for (const auto* a : candidates) contents.push_back(decode(a->content));
  size_t done = 0;  // code points consumed
  for (size_t i = 0; i < cps.size();) {
    // The longest candidate matching at i.
    int best = -1;
    size_t best_len = 0;
    for (size_t k = 0; k < candidates.size(); ++k) {
      const auto& c = contents[k];
      if (c.size() > best_len && i + c.size() <= cps.size() && std::equal(c.begin(), c.end(), cps.begin() + static_cast<std::ptrdiff_t>(i))) {
        best = static_cast<int>(k);
        best_len = c.size();
      }
    }
    if (best < 0) {
      ++i;
      continue;
    }
    const Added& a = *candidates[static_cast<size_t>(best)];
    size_t start = i, stop = i + best_len;
    if (a.single_word && ((start > 0 && is_word(cps[start - 1])) || (stop < cps.size() && is_word(cps[stop])))) {
      i = stop;  // not a word of its own: tokenizers discards the match and searches on after it
      continue;
    }
    if (a.lstrip)
      while (start > done && is_space(cps[start - 1])) --start;
    if (a.rstrip)
      while (stop < cps.size() && is_space(cps[stop])) ++stop;
    if (start > done) out.emplace_back(false, between(done, start));
    out.emplace_back(true, std::vector<uint32_t>());
    ids_out.push_back(a.id);
    done = stop;
    i = std::max(stop, i + best_len);
  }
  if (done < cps.size()) out.emplace_back(false, between(done, cps.size()));
  return out;
}

std::vector<int32_t> ByteLevelBpe::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> ids;
  if (add_special_tokens) ids = before_;
  // Raw-text added tokens first; each rest normalized, then the normalized added tokens.
  std::vector<int32_t> raw_ids;
  auto raw = split_added(decode(text), false, raw_ids);
  size_t next_raw = 0;
  for (auto& [is_added, cps] : raw) {
    if (is_added) {
      ids.push_back(raw_ids[next_raw++]);
      continue;
    }
    for (auto n : normalizers_) cps = n == Normalization::kNfc ? nfc(cps) : nfd(cps);
    std::vector<int32_t> normalized_ids;
    auto parts = split_added(cps, true, normalized_ids);
    size_t next_normalized = 0;
    for (auto& [part_added, p] : parts) {
      if (part_added) {
        ids.push_back(normalized_ids[next_normalized++]);
        continue;
      }
      if (add_prefix_space_ && !p.empty() && p[0] != ' ') p.insert(p.begin(), ' ');  // tokenizers: starts_with(' ')
      std::vector<std::pair<size_t, size_t>> pieces;
      if (use_regex_) {
        regex_split(p, 0, p.size(), pieces);
      } else if (!p.empty()) {
        pieces.emplace_back(0, p.size());
      }
      for (const auto& [b, e] : pieces) {
        for (int32_t id : bpe_word(to_byte_chars(encode_utf8(p.data() + b, e - b)))) ids.push_back(id);
      }
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), after_.begin(), after_.end());
  return ids;
}

std::string ByteLevelBpe::to_json() const { return json_; }

ByteLevelBpe ByteLevelBpe::train(const std::function<void(const std::function<void(std::string_view)>&)>& for_each_text,
                                 const BpeTrainOptions& opts) {
  const int32_t specials = static_cast<int32_t>(opts.special_tokens.size());
  COHORT_CHECK(opts.vocab_size >= specials + 256, UsageError, "a byte-level BPE vocabulary of ", opts.vocab_size,
               " tokens cannot hold its ", specials, " special tokens and 256 bytes: ask for at least ", specials + 256);
  // Every pre-tokenized word, counted.
  std::unordered_map<std::string, int64_t> counts;
  for_each_text([&](std::string_view text) {
    std::vector<uint32_t> cps = nfc(decode(text));
    std::vector<std::pair<size_t, size_t>> pieces;
    regex_split(cps, 0, cps.size(), pieces);
    for (const auto& [b, e] : pieces) ++counts[to_byte_chars(encode_utf8(cps.data() + b, e - b))];
  });
  // Special tokens, then the 256 byte characters in code point order.
  std::vector<std::string> tokens = opts.special_tokens;
  std::vector<std::string> alphabet(byte_chars().begin(), byte_chars().end());
  std::sort(alphabet.begin(), alphabet.end(), [](const std::string& a, const std::string& b) {
    return decode(a)[0] < decode(b)[0];
  });
  std::unordered_map<std::string, int32_t> ids;
  for (const auto& t : opts.special_tokens) ids.emplace(t, static_cast<int32_t>(ids.size()));
  for (const auto& ch : alphabet) {
    ids.emplace(ch, static_cast<int32_t>(tokens.size()));
    tokens.push_back(ch);
  }
  // Words as symbol ids, sorted so that the result does not depend on hashing.
  std::vector<std::pair<std::string, int64_t>> sorted(counts.begin(), counts.end());
  std::sort(sorted.begin(), sorted.end());
  counts.clear();
  std::vector<std::vector<int32_t>> words;
  std::vector<int64_t> freq;
  for (const auto& [w, n] : sorted) {
    std::vector<int32_t> symbols;
    for (const auto& ch : split_chars(w)) symbols.push_back(ids.at(ch));
    words.push_back(std::move(symbols));
    freq.push_back(n);
  }
  sorted.clear();
  std::unordered_map<uint64_t, int64_t> pair_count;
  std::unordered_map<uint64_t, std::vector<int32_t>> where;
  auto add_pairs = [&](size_t w, int64_t sign) {
    const auto& s = words[w];
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      const uint64_t k = pair_key(s[i], s[i + 1]);
      pair_count[k] += sign * freq[w];
      if (sign > 0) where[k].push_back(static_cast<int32_t>(w));
    }
  };
  for (size_t w = 0; w < words.size(); ++w) add_pairs(w, 1);
  // Most frequent first; ties by the parts' bytes.
  struct Entry {
    int64_t count;
    uint64_t pair;
  };
  auto worse = [&](const Entry& x, const Entry& y) {
    if (x.count != y.count) return x.count < y.count;
    const auto& xa = tokens[static_cast<size_t>(x.pair >> 32)];
    const auto& ya = tokens[static_cast<size_t>(y.pair >> 32)];
    if (xa != ya) return xa > ya;
    return tokens[static_cast<size_t>(x.pair & 0xFFFFFFFFu)] > tokens[static_cast<size_t>(y.pair & 0xFFFFFFFFu)];
  };
  std::priority_queue<Entry, std::vector<Entry>, decltype(worse)> heap(worse);
  for (const auto& [k, n] : pair_count) heap.push({n, k});
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<uint32_t> stamp(words.size(), 0);
  uint32_t round = 0;
  while (static_cast<int32_t>(tokens.size()) < opts.vocab_size && !heap.empty()) {
    Entry top = heap.top();
    heap.pop();
    auto it = pair_count.find(top.pair);
    const int64_t now = it == pair_count.end() ? 0 : it->second;
    if (now != top.count) {  // stale: counts fell since it was pushed
      if (now > 0) heap.push({now, top.pair});
      continue;
    }
    if (now < opts.min_frequency) break;
    const int32_t a = static_cast<int32_t>(top.pair >> 32), b = static_cast<int32_t>(top.pair & 0xFFFFFFFFu);
    const std::string joined = tokens[static_cast<size_t>(a)] + tokens[static_cast<size_t>(b)];
    int32_t merged;
    if (auto known = ids.find(joined); known != ids.end()) {
      merged = known->second;  // the same string from another pair of parts
    } else {
      merged = static_cast<int32_t>(tokens.size());
      ids.emplace(joined, merged);
      tokens.push_back(joined);
    }
    merges.emplace_back(tokens[static_cast<size_t>(a)], tokens[static_cast<size_t>(b)]);
    ++round;
    std::vector<int32_t> touched = std::move(where[top.pair]);
    where.erase(top.pair);
    std::unordered_set<uint64_t> changed;
    for (int32_t w : touched) {
      if (stamp[static_cast<size_t>(w)] == round) continue;
      stamp[static_cast<size_t>(w)] = round;
      auto& s = words[static_cast<size_t>(w)];
      bool has = false;
      for (size_t i = 0; i + 1 < s.size() && !has; ++i) has = s[i] == a && s[i + 1] == b;
      if (!has) continue;
      for (size_t i = 0; i + 1 < s.size(); ++i) changed.insert(pair_key(s[i], s[i + 1]));
      add_pairs(static_cast<size_t>(w), -1);
      std::vector<int32_t> next;
      for (size_t i = 0; i < s.size();) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          next.push_back(merged);
          i += 2;
        } else {
          next.push_back(s[i++]);
        }
      }
      s.swap(next);
      add_pairs(static_cast<size_t>(w), 1);
      for (size_t i = 0; i + 1 < s.size(); ++i) changed.insert(pair_key(s[i], s[i + 1]));
    }
    pair_count.erase(top.pair);
    for (uint64_t k : changed) {
      auto c = pair_count.find(k);
      if (c == pair_count.end()) continue;
      if (c->second <= 0) {
        pair_count.erase(c);
      } else {
        heap.push({c->second, k});
      }
    }
  }
  // The tokenizer.json `tokenizers` writes for such a tokenizer.
  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  // [MASK] takes the space before it, as RoBERTa's and ModernBERT's <mask>:
  // "The [MASK] of" fills with " leaf", a word with its space.
  for (int32_t i = 0; i < specials; ++i) {
    const auto& token = opts.special_tokens[static_cast<size_t>(i)];
    added.push_back({{"id", i}, {"content", token}, {"single_word", false}, {"lstrip", token == "[MASK]"},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  }
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (size_t i = 0; i < tokens.size(); ++i) vocab[tokens[i]] = i;
  nlohmann::ordered_json merge_list = nlohmann::ordered_json::array();
  for (const auto& [x, y] : merges) merge_list.push_back({x, y});
  auto special = [](const std::string& t, int type) {
    return nlohmann::ordered_json{{"SpecialToken", {{"id", t}, {"type_id", type}}}};
  };
  auto sequence = [](const char* s, int type) { return nlohmann::ordered_json{{"Sequence", {{"id", s}, {"type_id", type}}}}; };
  nlohmann::ordered_json post = nullptr;
  const bool framed = ids.count("[CLS]") && ids.count("[SEP]");
  if (framed) {
    post = {{"type", "TemplateProcessing"},
            {"single", {special("[CLS]", 0), sequence("A", 0), special("[SEP]", 0)}},
            {"pair", {special("[CLS]", 0), sequence("A", 0), special("[SEP]", 0), sequence("B", 1), special("[SEP]", 1)}},
            {"special_tokens",
             {{"[CLS]", {{"id", "[CLS]"}, {"ids", {ids.at("[CLS]")}}, {"tokens", {"[CLS]"}}}},
              {"[SEP]", {{"id", "[SEP]"}, {"ids", {ids.at("[SEP]")}}, {"tokens", {"[SEP]"}}}}}}};
  }
  nlohmann::ordered_json j = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
      {"post_processor", post},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", merge_list}}},
  };
  return from_json(j.dump(2) + "\n", "the trained tokenizer");
}

}  // namespace cohort::text
