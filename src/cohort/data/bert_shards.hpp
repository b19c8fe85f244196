// defines: shard_files, BertShardInfo, BertShardsOptions, pack_bert_rows, BertShards
//          (BertRows, write_bert_shard: data/bert_rows.hpp, included here)
//
// One file per concept: shard_files.cpp finds the shards, bert_shards.cpp
// reads them, pack_rows.cpp packs rows, bert_shard_writer.cpp writes them,
// and hdf5_shard.cpp holds the HDF5 plumbing both sides share.
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
#include "cohort/data/masking.hpp"

namespace cohort {

// The sorted shard files (*.hdf5, *.h5) of `split` under `dir`: DIR/<split>/*
// when that directory exists, else the files in DIR whose names contain the
// split name ("train" also matches "training"). DataError when none, listing
// what DIR holds.
std::vector<std::string> shard_files(const std::string& dir, const std::string& split);

struct BertShardInfo {
  int64_t rows = 0;
  int64_t seq_len = 0;
  int64_t max_predictions = 0;
  int64_t files = 0;
  int64_t vocab_size = -1;  // from DIR/manifest.json when present, else -1
  bool masked = true;       // rows carry masked-LM targets (not prepare --masking none)
  bool next_sentence = true;  // sentence pairs (not prepare --nsp false)
};

struct BertShardsOptions {
  // Rows read at once from a file: one cache entry. 0: each file's own HDF5
  // chunk rows (of input_ids), or 256 where it is not chunked.
  int64_t block_rows = 0;
  int64_t cache_blocks = 64;  // blocks kept in memory, least recently used out
  // HDF5 files kept open, least recently used out. Opening one costs ~0.5 ms,
  // keeping it open ~0.5 MiB (HDF5's metadata cache; more for files written
  // with HDF5 1.8's B-tree chunk index). Random rows from more files than
  // this pay an open for most rows.
  int64_t open_files = 32;
  // data.pack: get_batch returns its instances packed (pack_bert_rows) into
  // rows of the shards' sequence length.
  bool pack = false;
  // task.masking = dynamic: draw_batch restores each row's tokens (a stored
  // target's id goes back to its position) and masks them afresh for the
  // epoch; get_batch (evaluation) keeps stored targets, and masks unmasked
  // shards with fixed keys (DynamicMasking::apply_for_evaluation: the same
  // for every evaluation and seed).
  std::shared_ptr<const DynamicMasking> masking;
};

// Puts each row's stored targets back: input_ids[b, masked_lm_positions[b, j]]
// = masked_lm_ids[b, j] wherever the id is >= 0 (in a copy of input_ids);
// then drops the targets (masked_lm_positions/ids become [B, 1] of none).
// A collated, unpacked batch as get_batch gives it.
void restore_masked_tokens(Example& batch);

// data.pack: the instances of a collated batch (get_batch's keys) packed
// into rows of at most `row_len` tokens, first fit in decreasing length
// (ties by position, so the same batch always packs the same way), the rows
// as long as the longest. Adds position_ids (restarting at every instance),
// seq_ids (the instance a token belongs to; -1 on padding, where attention
// stays among padding) and cls_index (each instance's [CLS], flat over the
// rows), and makes masked_lm_positions flat over the rows. The per-instance
// keys (masked_lm_ids, next_sentence_labels) keep their order, so losses
// and unit counts are those of the unpacked batch. A row's real tokens are
// a prefix of it (the NVIDIA layout). `sample_ids`, when given (one per
// instance), name the dataset's samples in errors. CPU tensors only.
Example pack_bert_rows(const Example& batch, int64_t row_len, const std::vector<int64_t>& sample_ids = {});

// A Dataset over every shard of one split. Opening reads only each file's
// shapes (validating keys, ranks and dtypes); rows are read on demand in
// blocks through a small cache, so memory does not grow with the shards.
//
// get(i) / get_batch(...) give int64 tensors:
//   input_ids, input_mask, segment_ids      [L]   (batch: [B, Lmax], trimmed
//                                                  to the longest real row)
//   masked_lm_positions                     [P]
//   masked_lm_ids                           [P]   -1 from the first 0 position on
//   next_sentence_labels                    []    ([B] in a batch)
//
// A batch is trimmed to its longest row: the last real token (input_mask) or
// masked position, whichever is later; for NVIDIA's data, max sum of
// input_mask. Every error is a DataError naming the file, and the dataset
// when one is at fault (a file HDF5 cannot open has none to name).
//
// Thread-safe: the Loader's workers call get_batch() concurrently. HDF5
// (serial build) is not thread-safe, so every HDF5 call in the process goes
// through one global lock; the cache has its own.
class BertShards : public Dataset {
 public:
  BertShards(const std::string& dir, const std::string& split, BertShardsOptions opts = {});
  ~BertShards() override;

  int64_t size() const override;
  Example get(int64_t index) const override;
  Example get_batch(const std::vector<int64_t>& indices) const override;
  Example draw_batch(const std::vector<int64_t>& indices, int64_t epoch) const override;
  std::string describe() const override;

  const BertShardInfo& info() const;
  // Real (unpadded) length of each row, for length bucketing; reads input_mask
  // lazily and caches the answer.
  int64_t length(int64_t index) const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cohort
