// defines: ByteLevelBpe, BpeTrainOptions
//
// Byte-level BPE, the tokenizer of GPT-2, RoBERTa and ModernBERT, as Hugging
// Face's `tokenizers` runs a tokenizer.json: added tokens split off first
// (leftmost-longest; lstrip, rstrip, single_word; matched in the raw text, or
// in the normalized text when `normalized`), then the normalizer (none, NFC,
// NFD, or a Sequence of them), the ByteLevel pre-tokenizer (GPT-2's regex
// over Unicode letters, numbers and whitespace, then each byte as one of 256
// printable characters), BPE merges by rank, and the post-processor
// (TemplateProcessing, RobertaProcessing or BertProcessing: [CLS] ... [SEP]).
// Unicode data: text/byte_level_tables.inc, generated from `tokenizers`
// itself by scripts/gen_byte_level_tables.py. A tokenizer.json using what
// this does not model (another pre-tokenizer, BPE dropout, a Lowercase
// normalizer) is refused by name, not approximated.
//
// train() learns merges from text (byte-level: every byte is in the
// vocabulary, so no text has an unknown token) and to_json() writes a
// tokenizer.json that `tokenizers` loads and encodes the same way.
//
// No torch here: plain C++, as the prepare tool runs it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace cohort::text {

struct BpeTrainOptions {
  int32_t vocab_size = 30522;  // special tokens, the 256 bytes and the merges
  int64_t min_frequency = 2;   // a pair seen fewer times is never merged
  // Added first, as special tokens, in this order: ids 0, 1, ...
  std::vector<std::string> special_tokens = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
  int64_t max_length = 8192;   // the tokenizer_config's model_max_length
};

class ByteLevelBpe {
 public:
  // DataError naming the file and the field for what cannot be read or is
  // not modelled.
  static ByteLevelBpe load(const std::string& tokenizer_json_path);
  static ByteLevelBpe from_json(const std::string& text, const std::string& what);
  // Learns merges from `for_each_text(sink)`, which calls sink(text) once per
  // text (a sentence, a line). Pairs that tie on frequency merge in byte order
  // of their parts, so the result does not depend on threads or hashing.
  static ByteLevelBpe train(const std::function<void(const std::function<void(std::string_view)>&)>& for_each_text,
                            const BpeTrainOptions& opts);

  // tokenizers' encode(text, add_special_tokens).ids. Invalid UTF-8 reads as U+FFFD.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  int32_t size() const { return static_cast<int32_t>(tokens_.size()); }
  // -1 when absent.
  int32_t find(std::string_view token) const;
  const std::string& token(int32_t id) const { return tokens_.at(static_cast<size_t>(id)); }
  // Every token by id (a vocab.txt of it lists them one per line).
  const std::vector<std::string>& tokens() const { return tokens_; }
  // A tokenizer.json that `tokenizers` loads (the one read, or the trained one).
  std::string to_json() const;

  struct Added {
    std::string content;
    int32_t id = -1;
    bool special = false, normalized = false, lstrip = false, rstrip = false, single_word = false;
  };
  enum class Normalization { kNfc, kNfd };

 private:
  static ByteLevelBpe parse(const std::string& text, const std::string& what);
  std::vector<int32_t> bpe_word(const std::string& byte_chars) const;
  std::vector<std::pair<bool, std::vector<uint32_t>>> split_added(const std::vector<uint32_t>& cps,
                                                                   bool normalized_pass,
                                                                   std::vector<int32_t>& ids_out) const;

  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int32_t> ids_;
  std::vector<std::pair<std::string, std::string>> merges_;  // by rank
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merge_of_;  // (left id, right id) -> (rank, merged id)
  std::vector<Added> added_;
  std::vector<Normalization> normalizers_;
  bool add_prefix_space_ = false, use_regex_ = true, ignore_merges_ = false;
  int32_t unk_id_ = -1;
  std::vector<int32_t> before_, after_;  // the post-processor's ids around a single sequence
  std::string json_;                      // the tokenizer.json read or written
};

}  // namespace cohort::text
