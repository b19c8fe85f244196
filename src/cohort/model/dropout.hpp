// defines: DropoutRows, sample_dropout, SampleDropout
//
// Dropout whose masks do not depend on which rank computes a sample
// (model.dropout-rng = sample). An element's keep bit is a counter-based
// hash of its row's key, the layer's site number and the element's
// coordinates. The trainer sets the row keys for the micro-batch it runs
// (DropoutRows): each is a hash of (train.seed, step, sample id). The
// coordinates are hashed one dimension at a time, so padding a sequence
// longer or shorter moves no real element's mask. The loss of a step is
// then the same on any world size and any split of the global batch, up to
// floating-point reduction order.
//
// With no DropoutRows in scope (model.dropout-rng = rank, or a model run
// outside the trainer) masks come from torch's generator, as nn::Dropout's.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace cohort {

// The row keys of the batch the current thread runs; nests.
class DropoutRows {
 public:
  DropoutRows(uint64_t seed, int64_t step, const std::vector<int64_t>& sample_ids);
  ~DropoutRows();
  DropoutRows(const DropoutRows&) = delete;
  DropoutRows& operator=(const DropoutRows&) = delete;

  // The innermost scope on this thread, or nullptr.
  static const DropoutRows* current();
  const std::vector<uint64_t>& keys() const { return keys_; }

 private:
  std::vector<uint64_t> keys_;
  const DropoutRows* outer_;
};

// Drops elements of x [B, ...] with probability p and scales the rest by
// 1 / (1 - p) (in x's dtype, as torch::dropout); the identity when !training or p == 0. Under DropoutRows,
// row b's mask is keyed by keys()[b] and `site` (which must differ between
// the dropout calls of one forward); x.size(0) must be the number of keys.
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
