// defines: DataManifest, ManifestRecord, read_manifest, write_manifest, data_vocab_size
//
// DIR/manifest.json, written by `cohort prepare` beside its shards: the
// whole record (what was made, from what, how) is written here, and the
// fields Cohort reads back are read here. This file owns the format.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace cohort {

struct DataManifest {
  int64_t vocab_size = -1;       // -1: not recorded
  int64_t max_seq_length = -1;
  int64_t max_predictions = -1;
  std::optional<bool> lowercase;  // the vocabulary's case; nullopt: not recorded
  bool masked = true;              // "masking": "none" (prepare --masking none): rows carry no targets
  bool next_sentence = true;       // "nsp": false (prepare --nsp false): full-sentence rows, no pairs
  std::string tokenizer = "wordpiece";  // "bpe" (prepare --tokenizer bpe): tokenizer.json beside vocab.txt
};

// What `cohort prepare` made and from what: written whole, read back in
// part (DataManifest).
struct ManifestRecord {
  struct Input {
    std::string path;
    std::string format;  // text | gcide
    int64_t bytes = 0;   // the file's size
    int64_t documents = 0;
    int64_t text_bytes = 0;
  };
  struct Split {
    int64_t documents = 0;
    int64_t rows = 0;
    int64_t shards = 0;
    int64_t tokens = 0;       // real tokens in its rows (input_mask's sum: [CLS]/[SEP], dupes, random B segments)
    int64_t text_tokens = 0;  // WordPiece tokens of the split's documents
  };
  int64_t vocab_size = 0;
  std::string vocab_source;  // "built", or the vocab.txt (tokenizer.json) given
  std::string tokenizer = "wordpiece";  // wordpiece | bpe (OUT/tokenizer.json beside vocab.txt)
  bool lowercase = true;
  int64_t max_seq_length = 0;
  int64_t max_predictions = 0;
  double masked_lm_prob = 0;
  double short_seq_prob = 0;
  int64_t dupe_factor = 0;
  bool whole_word_mask = false;
  bool masked = true;         // --masking static | none
  bool next_sentence = true;  // --nsp
  double valid_fraction = 0;
  double test_fraction = 0;
  int64_t rows_per_shard = 0;
  uint64_t seed = 0;
  std::map<std::string, Split> splits;  // train, valid, test
  std::vector<Input> inputs;
  int64_t tokens = 0;       // real tokens in the rows, every split
  int64_t text_tokens = 0;  // WordPiece tokens of the documents
  double unk_fraction = 0;
  int64_t text_bytes = 0;
  double seconds = 0;
};

// Writes DIR/manifest.json atomically (core/files.hpp).
void write_manifest(const std::string& dir, const ManifestRecord& m);

// DIR/manifest.json, or nullopt when DIR has none. A present field must be a
// positive integer: DataError naming the file and field otherwise.
std::optional<DataManifest> read_manifest(const std::string& dir);

// The vocabulary size the data under DIR was made with: the manifest's, else
// the lines of DIR/vocab.txt, else 0 (unknown).
int64_t data_vocab_size(const std::string& dir);

}  // namespace cohort
