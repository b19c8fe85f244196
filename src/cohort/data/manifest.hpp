// defines: DataManifest, read_manifest, data_vocab_size
//
// DIR/manifest.json, written by `cohort prepare` beside its shards
// (text/prepare.cpp writes the whole record). These are the fields Cohort
// reads back; this is the one reader.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace cohort {

struct DataManifest {
  int64_t vocab_size = -1;       // -1: not recorded
  int64_t max_seq_length = -1;
  int64_t max_predictions = -1;
  std::optional<bool> lowercase;  // the vocabulary's case; nullopt: not recorded
};

// DIR/manifest.json, or nullopt when DIR has none. A present field must be a
// positive integer: DataError naming the file and field otherwise.
std::optional<DataManifest> read_manifest(const std::string& dir);

// The vocabulary size the data under DIR was made with: the manifest's, else
// the lines of DIR/vocab.txt, else 0 (unknown).
int64_t data_vocab_size(const std::string& dir);

}  // namespace cohort
