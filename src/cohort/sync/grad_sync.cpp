#include "cohort/sync/grad_sync.hpp"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/torch.h>

#include "cohort/core/error.hpp"
#include "cohort/distributed/comm.hpp"

namespace cohort {

GradSyncOptions grad_sync_options(const DistOptions& dist, uint64_t seed) {
  GradSyncOptions o;
  o.bucket_cap_bytes = static_cast<int64_t>(dist.bucket_cap_mb * (1 << 20));
  o.compression = dist.grad_compression;
  o.powersgd_rank = dist.powersgd_rank;
  o.seed = seed;
  return o;
}

void broadcast_module(Comm& comm, torch::nn::Module& module) {
  if (comm.size() == 1) return;
  torch::NoGradGuard no_grad;
  for (auto& p : module.parameters()) {
    auto t = p.detach();
    comm.broadcast(t, 0, "initial parameter broadcast");
  }
  for (auto& b : module.buffers()) {
    auto t = b.detach();
    comm.broadcast(t, 0, "initial buffer broadcast");
  }
}

void all_reduce_gradients(Comm& comm, torch::nn::Module& module) {
  if (comm.size() == 1) return;
  std::vector<torch::Tensor> grads;
  for (auto& p : module.parameters()) {
    if (!p.requires_grad()) continue;
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    grads.push_back(p.grad());
  }
  if (grads.empty()) return;
  std::vector<torch::Tensor> parts;
  for (auto& g : grads) parts.push_back(g.reshape({-1}));
  auto flat = torch::cat(parts);
  comm.all_reduce_sum(flat, "gradient all-reduce");
  int64_t offset = 0;
  for (auto& g : grads) {
    g.copy_(flat.narrow(0, offset, g.numel()).view_as(g));
    offset += g.numel();
  }
}

struct GradSync::Hook : torch::autograd::FunctionPostHook {
  Hook(GradSync* owner, size_t param) : owner(owner), param(param) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    owner->mark_ready(param);
    return outputs;
  }
  GradSync* owner;
  size_t param;
};

GradSync::GradSync(Comm& comm, torch::nn::Module& module, GradSyncOptions opts)
    : comm_(comm),
      buckets_(module, opts.first_bucket_bytes, opts.bucket_cap_bytes),
      reducer_(make_bucket_reducer(comm, buckets_, opts)) {
  if (comm_.size() == 1) return;  // nothing to reduce: no hooks, no views
  if (reducer_->views()) buckets_.make_views();
  for (size_t k = 0; k < buckets_.param_count(); ++k) {
    auto acc = torch::autograd::impl::grad_accumulator(buckets_.param(k));
    hook_keys_.push_back(acc->add_post_hook(std::make_unique<Hook>(this, k)));
    accumulators_.push_back(std::move(acc));
  }
}

GradSync::~GradSync() {
  for (size_t k = 0; k < accumulators_.size(); ++k) accumulators_[k]->del_post_hook(hook_keys_[k]);
}

// Before a reducer reads a bucket's flat buffer, every gradient is in it.
void GradSync::fill_views() {
  if (!buckets_.has_views()) return;
  for (size_t b = 0; b < buckets_.size(); ++b) buckets_.attach(b);
}

void GradSync::prepare(bool sync) {
  std::unique_lock<std::mutex> lock(mu_);
  if (micro_in_step_ > 0) {
    if (reducer_->every_micro_batch()) {
      settle(lock);  // the previous micro-batch's sums
    } else {
      fill_views();
      reducer_->fold();
    }
  }
  ++micro_in_step_;
  if (reducer_->every_micro_batch()) sync = true;  // no whole-model gradient is kept
  sync_ = sync && comm_.size() > 1;
  waiting_.assign(buckets_.size(), 0);
  for (size_t b = 0; b < buckets_.size(); ++b) waiting_[b] = buckets_.params(b).size();
  next_launch_ = 0;
}

void GradSync::mark_ready(size_t param) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!sync_) return;
  size_t b = buckets_.bucket_of(param);
  if (waiting_[b] == 0) return;  // already counted this step
  reducer_->take(param);
  --waiting_[b];
  // Launch strictly in bucket order, so all ranks agree on the sequence.
  while (next_launch_ < buckets_.size() && waiting_[next_launch_] == 0) launch(next_launch_++);
}

void GradSync::launch(size_t b) {
  if (buckets_.has_views()) buckets_.attach(b);
  ++collectives_;
  reducer_->launch(b);
}

void GradSync::finalize() {
  std::unique_lock<std::mutex> lock(mu_);
  micro_in_step_ = 0;
  settle(lock);
}

void GradSync::settle(std::unique_lock<std::mutex>& lock) {
  if (sync_) {
    while (next_launch_ < buckets_.size()) {
      waiting_[next_launch_] = 0;
      launch(next_launch_++);
    }
  }
  sync_ = false;
  lock.unlock();
  reducer_->finish();  // no hook fires now: backward is done
  lock.lock();
}

}  // namespace cohort
