// defines: GradBuckets
//
// The trainable parameters grouped into the buckets GradSync launches, and
// (where the reducer wants them) each bucket's flat buffer that the
// parameters' .grad are views into, so backward accumulates straight into
// what goes on the wire.
//
// Cross-rank contract: the same module and caps give the same buckets, in
// the same order, on every rank.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <vector>

namespace cohort {

class GradBuckets {
 public:
  // Buckets in reverse registration order (roughly the order backward
  // produces the gradients): the first capped at `first_bytes`, the rest at
  // `cap_bytes`; a parameter larger than the cap gets a bucket of its own.
  GradBuckets(torch::nn::Module& module, int64_t first_bytes, int64_t cap_bytes);

  size_t size() const { return buckets_.size(); }
  // Parameter indices (registration order among the trainable ones) of each
  // bucket, in launch order.
  const std::vector<std::vector<size_t>>& all() const { return buckets_; }
  const std::vector<size_t>& params(size_t b) const { return buckets_[b]; }
  size_t param_count() const { return params_.size(); }
  const torch::Tensor& param(size_t k) const { return params_[k]; }
  const std::string& name(size_t k) const { return names_[k]; }
  size_t bucket_of(size_t k) const { return bucket_of_[k]; }
  int64_t offset(size_t k) const { return offset_[k]; }  // in its bucket's flat buffer
  int64_t numel(size_t b) const { return numel_[b]; }
  int64_t total_numel() const;
  // The bucket's parameters, and their gradients, in the bucket's order.
  std::vector<torch::Tensor> params_of(size_t b) const;
  std::vector<torch::Tensor> grads(size_t b) const;

  // Gives each bucket a flat buffer and makes every .grad a view into it
  // (a gradient already there is copied in).
  void make_views();
  bool has_views() const { return !flat_.empty(); }
  const torch::Tensor& flat(size_t b) const { return flat_[b]; }
  // Re-attaches any gradient something replaced (rather than updated in
  // place) since the last step, so the flat buffer holds every gradient.
  void attach(size_t b);

 private:
  std::vector<torch::Tensor> params_;
  std::vector<std::string> names_;
  std::vector<std::vector<size_t>> buckets_;
  std::vector<size_t> bucket_of_;
  std::vector<int64_t> offset_;
  std::vector<int64_t> numel_;
  std::vector<torch::Tensor> flat_;
};

}  // namespace cohort
