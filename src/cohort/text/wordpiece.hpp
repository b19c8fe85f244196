// defines: Vocab, TokenizerOptions, WordPiece, VocabBuildOptions, build_vocab
//
// BERT's tokenizer: a basic pass (clean text, split CJK characters, lowercase
// and strip accents when uncased, split punctuation on whitespace-separated
// words), then greedy longest-match-first WordPiece with `##` continuations.
// A word with no match, or longer than max_chars_per_word, becomes [UNK].
// Text is UTF-8; invalid bytes are dropped like control characters.
//
// No torch here: this is plain C++ and the prepare tool's hot loop.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace cohort::text {

// The special tokens every Cohort vocabulary starts with, in this order.
inline const std::vector<std::string>& special_tokens() {
  static const std::vector<std::string> tokens = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
  return tokens;
}

// A token <-> id table, loaded from a standard vocab.txt (one token per line,
// the id is the line number).
class Vocab {
 public:
  Vocab() = default;
  explicit Vocab(std::vector<std::string> tokens);  // DataError on a duplicate
  static Vocab load(const std::string& path);       // DataError naming the file
  void save(const std::string& path) const;

  int32_t size() const { return static_cast<int32_t>(tokens_.size()); }
  // -1 when absent.
  int32_t find(std::string_view token) const;
  // The id of a required special token; DataError naming it when absent.
  int32_t require(std::string_view token) const;
  const std::string& token(int32_t id) const { return tokens_.at(static_cast<size_t>(id)); }
  const std::vector<std::string>& tokens() const { return tokens_; }

 private:
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int32_t> ids_;
};

struct TokenizerOptions {
  bool lowercase = true;  // uncased: lowercase and strip accents
  int max_chars_per_word = 100;
};

class WordPiece {
 public:
  WordPiece(Vocab vocab, TokenizerOptions opts);

  // The basic pass alone: whitespace/punctuation/CJK split words.
  std::vector<std::string> basic_tokenize(std::string_view text) const;
  // Basic pass, then WordPiece: tokens as strings ("un", "##want", "[UNK]").
  std::vector<std::string> tokenize(std::string_view text) const;
  // tokenize() as ids. Thread-safe.
  std::vector<int32_t> encode(std::string_view text) const;

  const Vocab& vocab() const { return vocab_; }
  const TokenizerOptions& options() const { return opts_; }

 private:
  struct Pieces;  // the vocabulary as hash tables over string_views, built once
  Vocab vocab_;
  TokenizerOptions opts_;
  int32_t unk_ = -1;
  std::shared_ptr<const Pieces> pieces_;  // immutable, so copies may share it
};

struct VocabBuildOptions {
  int32_t size = 30522;     // total, special tokens and the alphabet included
  bool lowercase = true;    // the basic pass used to count words
  int64_t min_count = 2;    // words seen fewer times are ignored
  int threads = 0;          // 0: every core
  std::function<void(const std::string&)> progress;  // optional status lines
};

// Learns a WordPiece vocabulary from `texts` (each a document or a line):
// the special tokens, every character seen (as itself, and as ##c when seen
// inside a word; the most frequent ones if they alone exceed `size`), then
// merged pieces until `size`. Deterministic for the same input.
Vocab build_vocab(const std::vector<std::string>& texts, const VocabBuildOptions& opts);

}  // namespace cohort::text
