// defines: internal::WordSink, internal::basic_pass
//
// The streaming form of WordPiece::basic_tokenize, shared by the tokenizer and
// the vocabulary builder: no std::string per word, no vector of words.
// Internal to src/cohort/text; other code uses WordPiece.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace cohort::text::internal {

class WordSink {
 public:
  // One word of the basic pass, in order: `bytes` is its UTF-8 (lowercased and
  // accent-stripped when uncased), `starts[k]` the byte offset of its k-th code
  // point, `chars` its length in code points (never 0). The views are valid
  // only during the call.
  virtual void word(std::string_view bytes, const uint32_t* starts, size_t chars) = 0;

 protected:
  ~WordSink() = default;
};

// BERT's BasicTokenizer over `text` (UTF-8; invalid bytes dropped).
void basic_pass(std::string_view text, bool lowercase, WordSink& sink);

}  // namespace cohort::text::internal
