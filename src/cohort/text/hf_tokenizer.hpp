// defines: kTokenizerDir, hf_tokenizer_files, hf_wordpiece_json, hf_bpe_tokenizer_files
//
// The files Hugging Face's AutoTokenizer loads a BERT WordPiece tokenizer
// from: vocab.txt, tokenizer_config.json (do_lower_case as the vocabulary
// was built, model_max_length, the tokenizer class) and
// special_tokens_map.json. A BERT run keeps them in RUN_DIR/tokenizer/
// (written at its start), so that `cohort export` takes the vocabulary the
// run was trained with, not whatever data.path holds later.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace cohort::text {

inline constexpr const char* kTokenizerDir = "tokenizer";

// (file name, contents) for each file. `lowercase`: Cohort's uncased
// WordPiece (lowercase and strip accents), which is BertTokenizer's
// do_lower_case with strip_accents left to follow it.
std::vector<std::pair<std::string, std::string>> hf_tokenizer_files(const std::string& vocab_text, bool lowercase,
                                                                     int64_t model_max_length);

// The same WordPiece tokenizer as `tokenizers` serialises it (tokenizer.json:
// BertNormalizer, BertPreTokenizer, WordPiece, [CLS] A [SEP] and [CLS] A
// [SEP] B [SEP]), for classes whose AutoTokenizer needs that file (ModernBERT's).
std::string hf_wordpiece_json(const std::string& vocab_text, bool lowercase);

// The files AutoTokenizer loads a byte-level BPE from (`cohort prepare
// --tokenizer bpe`, text/bpe.hpp): the tokenizer.json itself, and a
// tokenizer_config.json (PreTrainedTokenizerFast, BERT's special tokens,
// model_max_length) and special_tokens_map.json.
std::vector<std::pair<std::string, std::string>> hf_bpe_tokenizer_files(const std::string& tokenizer_json,
                                                                         int64_t model_max_length);

}  // namespace cohort::text
