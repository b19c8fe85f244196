#include "cohort/sync/grad_buckets.hpp"

#include <torch/torch.h>

#include <algorithm>

#include "cohort/core/error.hpp"

namespace cohort {

GradBuckets::GradBuckets(torch::nn::Module& module, int64_t first_bytes, int64_t cap_bytes) {
  COHORT_CHECK(cap_bytes > 0, ConfigError, "dist.bucket-cap-mb must be > 0");
  for (auto& item : module.named_parameters()) {
    if (!item.value().requires_grad()) continue;
    params_.push_back(item.value());
    names_.push_back(item.key());
  }
  bucket_of_.assign(params_.size(), 0);
  int64_t filled = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    int64_t bytes = params_[k].numel() * static_cast<int64_t>(params_[k].element_size());
    bool start_new = buckets_.empty();
    if (!start_new) {
      int64_t cap = buckets_.size() == 1 ? std::min(first_bytes, cap_bytes) : cap_bytes;
      start_new = filled + bytes > cap;
    }
    if (start_new) {
      buckets_.emplace_back();
      filled = 0;
    }
    buckets_.back().push_back(k);
    bucket_of_[k] = buckets_.size() - 1;
    filled += bytes;
  }
  numel_.assign(buckets_.size(), 0);
  offset_.assign(params_.size(), 0);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    for (size_t k : buckets_[b]) {
      offset_[k] = numel_[b];
      numel_[b] += params_[k].numel();
    }
  }
}

int64_t GradBuckets::total_numel() const {
  int64_t n = 0;
  for (auto v : numel_) n += v;
  return n;
}

std::vector<torch::Tensor> GradBuckets::params_of(size_t b) const {
  std::vector<torch::Tensor> out;
  for (size_t k : buckets_[b]) out.push_back(params_[k]);
  return out;
}

std::vector<torch::Tensor> GradBuckets::grads(size_t b) const {
  std::vector<torch::Tensor> out;
  for (size_t k : buckets_[b]) out.push_back(params_[k].grad());
  return out;
}

void GradBuckets::make_views() {
  torch::NoGradGuard no_grad;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    auto flat = torch::zeros({numel_[b]}, params_[buckets_[b].front()].options());
    for (size_t k : buckets_[b]) {
      auto& p = params_[k];
      auto view = flat.narrow(0, offset_[k], p.numel()).view_as(p);
      if (p.grad().defined()) view.copy_(p.grad());
      p.mutable_grad() = view;
    }
    flat_.push_back(flat);
  }
}

void GradBuckets::attach(size_t b) {
  torch::NoGradGuard no_grad;
  for (size_t k : buckets_[b]) {
    auto& p = params_[k];
    auto view = flat_[b].narrow(0, offset_[k], p.numel()).view_as(p);
    if (!p.grad().defined()) {
      view.zero_();
      p.mutable_grad() = view;
    } else if (p.grad().data_ptr() != view.data_ptr()) {
      view.copy_(p.grad());
      p.mutable_grad() = view;
    }
  }
}

}  // namespace cohort
