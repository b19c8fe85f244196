// defines: BertRows, BertShardWriteOptions, write_bert_shard
//
// The rows of one BERT pretraining shard and the function that writes them,
// without torch: `cohort prepare` builds rows here, data/bert_shards.hpp
// reads the shards back as a Dataset.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cohort {

// N rows for one shard, flat row-major.
struct BertRows {
  int64_t seq_len = 0;          // L
  int64_t max_predictions = 0;  // P
  std::vector<int32_t> input_ids;             // N*L
  std::vector<int8_t> input_mask;             // N*L
  std::vector<int8_t> segment_ids;            // N*L
  std::vector<int32_t> masked_lm_positions;   // N*P
  std::vector<int32_t> masked_lm_ids;         // N*P
  std::vector<int8_t> next_sentence_labels;   // N
  int64_t rows() const { return static_cast<int64_t>(next_sentence_labels.size()); }
};

struct BertShardWriteOptions {
  // Rows per HDF5 chunk (clamped to N, and to 1 MiB a chunk). Reading one row
  // decompresses its whole chunk, and training reads rows in a global random
  // order: 32-row chunks serve random rows ~2.5x faster than 256-row ones
  // for ~10% more bytes (shard_read_bench).
  int64_t chunk_rows = 32;
  int gzip_level = 4;  // deflate level 1..9, after HDF5's byte shuffle; 0: none
};

// Writes one gzip-compressed shard (chunked by rows) atomically: PATH.tmp,
// then rename. The file format is HDF5 1.10's (readers need HDF5 >= 1.10):
// its fixed-array chunk index makes finding a row's chunk O(1). Throws
// DataError naming the file, and the field whose size does not match N, L, P.
void write_bert_shard(const std::string& path, const BertRows& rows, const BertShardWriteOptions& opts = {});

}  // namespace cohort
