// defines: BertRows, write_bert_shard
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

// Writes one gzip-compressed shard (chunked by rows) atomically: a temporary
// name, then rename. Throws DataError naming the file.
void write_bert_shard(const std::string& path, const BertRows& rows);

}  // namespace cohort
