// defines: DropoutRows, sample_dropout, SampleDropout
//
// Dropout whose masks do not depend on which rank computes a sample
// (model.dropout-rng = sample). An element's keep bit is a counter-based
// hash of its sample's key, the layer's site number and the element's
// coordinates within the sample. The trainer sets the sample keys for the
// micro-batch it runs (DropoutRows): each is a hash of (train.seed, step,
// sample id). The coordinates are hashed one dimension at a time, so padding
// a sequence longer or shorter moves no real element's mask, and a sample
// packed into a row with others (data.pack) keeps the mask it has alone:
// there a token's coordinates are its position within its own sample. The
// loss of a step is then the same on any world size, any split of the global
// batch and packed or not, up to floating-point reduction order.
//
// On the CPU, dropout is one pass that hashes and scales together, and its
// backward hashes again instead of keeping a mask.
//
// With no DropoutRows in scope (model.dropout-rng = rank, or a model run
// outside the trainer) masks come from torch's generator, as nn::Dropout's.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <array>
#include <cstdint>
#include <vector>

namespace cohort {

// The sample keys of the batch the current thread runs; nests.
class DropoutRows {
 public:
  // Row b of every batch tensor is sample_ids[b].
  DropoutRows(uint64_t seed, int64_t step, const std::vector<int64_t>& sample_ids);
  // Packed rows (data.pack): token (r, t) is position position_ids[r, t] of
  // the sample samples.keys()[seq_ids[r, t]], or padding where seq_ids < 0.
  // seq_ids and position_ids are [R, L], on any device.
  DropoutRows(const DropoutRows& samples, const torch::Tensor& seq_ids, const torch::Tensor& position_ids);
  // What a scope holds, to open the same scope again later: activation
  // checkpointing recomputes a layer in backward, after the forward's scope
  // has closed, and must draw the same masks.
  struct Saved {
    std::vector<uint64_t> keys, token_keys;
    std::vector<int64_t> token_positions;
    int64_t rows = 0, width = 0;
  };
  Saved save() const { return {keys_, token_keys_, token_positions_, rows_, width_}; }
  explicit DropoutRows(const Saved& saved);
  ~DropoutRows();
  DropoutRows(const DropoutRows&) = delete;
  DropoutRows& operator=(const DropoutRows&) = delete;

  // The innermost scope on this thread, or nullptr.
  static const DropoutRows* current();
  const std::vector<uint64_t>& keys() const { return keys_; }

  bool packed() const { return width_ > 0; }
  int64_t rows() const { return packed() ? rows_ : static_cast<int64_t>(keys_.size()); }
  int64_t width() const { return width_; }  // packed: L
  // Packed: each token's sample key and position within its sample, [R*L].
  const std::vector<uint64_t>& token_keys() const { return token_keys_; }
  const std::vector<int64_t>& token_positions() const { return token_positions_; }

  // keys(), token_keys() or token_positions() as int64 on `device`, copied
  // there once per scope (the device path hashes with tensor ops).
  enum class Table { kKeys, kTokenKeys, kTokenPositions };
  const torch::Tensor& on_device(Table table, const c10::Device& device) const;

 private:
  std::vector<uint64_t> keys_;
  std::vector<uint64_t> token_keys_;
  std::vector<int64_t> token_positions_;
  int64_t rows_ = 0, width_ = 0;
  mutable std::array<torch::Tensor, 3> device_tables_;
  const DropoutRows* outer_;
};

// Drops elements of x [B, ...] with probability p and scales the rest by
// 1 / (1 - p) (in x's dtype, as torch::dropout); the identity when !training
// or p == 0. Under DropoutRows, row b's mask is keyed by keys()[b] and `site`
// (which must differ between the dropout calls of one forward); x.size(0)
// must be the number of keys. Under packed DropoutRows, x is [R, L, H] (hidden
// states) or [R, A, L, L] (attention probabilities, whose last coordinate is
// then the key's position within the query's sample).
torch::Tensor sample_dropout(const torch::Tensor& x, double p, uint64_t site, bool training);

// The keep mask sample_dropout applies: bool, x's shape, on x's device.
// Needs DropoutRows. On the CPU one parallel pass; elsewhere the same bits
// from tensor ops on the device (sample_keep_mask_tensor_ops, which tests
// compare with the CPU pass).
torch::Tensor sample_keep_mask(const torch::Tensor& x, double p, uint64_t site);
torch::Tensor sample_keep_mask_tensor_ops(const torch::Tensor& x, double p, uint64_t site);

// A dropout layer with its site number: a drop-in for nn::Dropout.
class SampleDropoutImpl : public torch::nn::Module {
 public:
  SampleDropoutImpl(double p, uint64_t site) : p_(p), site_(site) {}
  torch::Tensor forward(const torch::Tensor& x) { return sample_dropout(x, p_, site_, is_training()); }
  double p() const { return p_; }
  uint64_t site() const { return site_; }

 private:
  double p_;
  uint64_t site_;
};
TORCH_MODULE(SampleDropout);

}  // namespace cohort
