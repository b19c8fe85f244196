// defines: BertShardInfo, BertShards, shard_files (BertRows, write_bert_shard:
//          data/bert_rows.hpp, included here)
//
// BERT pretraining data in NVIDIA's HDF5 layout, one file per shard:
//
//   input_ids             int [N,L]   token ids, 0-padded
//   input_mask            int [N,L]   1 for real tokens
//   segment_ids           int [N,L]   0 for sentence A, 1 for sentence B
//   masked_lm_positions   int [N,P]   positions of the masked tokens, 0-padded
//   masked_lm_ids         int [N,P]   the original ids at those positions
//   next_sentence_labels  int [N]     1 when sentence B is a random segment
//
// Any integer dtype is accepted on read (NVIDIA: i4/i1, HetSeq: i8). A
// directory holds a split either as DIR/<split>/*.hdf5 or, for NVIDIA-style
// flat directories, as DIR/*.hdf5 whose names contain the split name
// ("training"/"train", "valid", "test").
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cohort/data/bert_rows.hpp"
#include "cohort/data/dataset.hpp"

namespace cohort {

// The sorted shard files of `split` under `dir`. DataError when none.
std::vector<std::string> shard_files(const std::string& dir, const std::string& split);

struct BertShardInfo {
  int64_t rows = 0;
  int64_t seq_len = 0;
  int64_t max_predictions = 0;
  int64_t files = 0;
  int64_t vocab_size = -1;  // from DIR/manifest.json when present, else -1
};

// A Dataset over every shard of one split. Opening reads only each file's
// shapes (validating keys, ranks and dtypes); rows are read on demand in
// blocks through a small cache, so memory does not grow with the shards.
//
// get(i) / get_batch(...) give int64 tensors:
//   input_ids, input_mask, segment_ids      [L]   (batch: [B, Lmax], trimmed
//                                                  to the longest real row)
//   masked_lm_positions                     [P]
//   masked_lm_ids                           [P]   -1 past the first 0 position
//   next_sentence_labels                    []    ([B] in a batch)
class BertShards : public Dataset {
 public:
  BertShards(const std::string& dir, const std::string& split);
  ~BertShards() override;

  int64_t size() const override;
  Example get(int64_t index) const override;
  Example get_batch(const std::vector<int64_t>& indices) const override;
  std::string describe() const override;

  const BertShardInfo& info() const;
  // Real (unpadded) length of each row, for length bucketing; reads input_mask
  // lazily and caches the answer.
  int64_t length(int64_t index) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cohort
