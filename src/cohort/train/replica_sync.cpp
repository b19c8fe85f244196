#include "cohort/train/replica_sync.hpp"

#include <torch/serialize.h>

#include <sstream>

#include "cohort/core/error.hpp"
#include "cohort/core/format.hpp"
#include "cohort/distributed/comm.hpp"
#include "cohort/distributed/grad_sync.hpp"
#include "cohort/distributed/local_sync.hpp"
#include "cohort/train/step_optimizer.hpp"

namespace cohort {

namespace {

constexpr char kOptimizer[] = "local.optimizer";

torch::Tensor archive_bytes(torch::optim::Optimizer& optimizer) {
  std::ostringstream os;
  torch::save(optimizer, os);
  std::string bytes = os.str();
  return torch::from_blob(bytes.data(), {static_cast<int64_t>(bytes.size())}, torch::kUInt8).clone();
}

// Saved where the writer's parameters were: loaded onto this rank's device.
void load_archive(torch::optim::Optimizer& optimizer, const torch::Tensor& bytes, const torch::Device& device) {
  auto t = bytes.contiguous().cpu();
  std::istringstream in(std::string(static_cast<const char*>(t.data_ptr()), static_cast<size_t>(t.numel())));
  torch::load(optimizer, in, device);
}

torch::Tensor find(const NamedTensors& tensors, const std::string& name) {
  for (const auto& [n, t] : tensors) {
    if (n == name) return t;
  }
  return torch::Tensor();
}

}  // namespace

ReplicaSync::ReplicaSync(Comm& comm, torch::nn::Module& module, StepOptimizer& optimizer, const Config& cfg)
    : comm_(comm),
      optimizer_(optimizer.optimizer()),
      mode_(cfg.dist.sync),
      compression_(cfg.dist.grad_compression),
      dist_(cfg.dist),
      optim_(cfg.optim) {
  if (mode_ == SyncMode::kStep) {
    GradSyncOptions o = grad_sync_options(cfg.dist, cfg.train.seed);
    o.sink = optimizer.sink();  // dist.shard = gradients: sums go straight into the ranges
    grad_sync_ = std::make_unique<GradSync>(comm, module, o);
    return;
  }
  LocalSyncOptions o;
  o.every = cfg.dist.local_steps;
  o.outer_lr = cfg.optim.outer_lr;
  o.outer_momentum = cfg.optim.outer_momentum;
  o.wire = cfg.dist.grad_compression;
  local_sync_ = std::make_unique<LocalSync>(comm, module, o);
}

ReplicaSync::~ReplicaSync() = default;

bool ReplicaSync::after_step(int64_t step, int64_t samples, bool last) {
  return local_sync_ && local_sync_->after_step(step, samples, last);
}

void ReplicaSync::with_synced(const std::function<void()>& fn) {
  if (local_sync_) local_sync_->with_synced(fn);
  else fn();
}

SyncState ReplicaSync::state() const {
  SyncState s;
  if (grad_sync_) {
    s.shared = grad_sync_->shared_state();
    s.own = grad_sync_->own_state();
  }
  if (local_sync_) {
    s.shared = local_sync_->shared_state();
    s.own = local_sync_->own_state();
    s.own.emplace_back(kOptimizer, archive_bytes(optimizer_));  // each rank's inner optimizer is its own
  }
  return s;
}

std::vector<std::string> ReplicaSync::restore(const NamedTensors& shared, const std::vector<NamedTensors>& by_rank) {
  std::vector<std::string> notes;
  const bool same_world = static_cast<int>(by_rank.size()) == comm_.size();
  if (grad_sync_ && compression_ == Compression::kPowerSgd) {
    if (same_world) {
      grad_sync_->load_state(shared, by_rank.at(static_cast<size_t>(comm_.rank())));
    } else {
      grad_sync_->load_state(shared, {});
      notes.push_back(strf("powersgd: the error-feedback remainders of the checkpoint's %zu rank(s) are dropped at "
                           "%d rank(s); the Qs are kept", by_rank.size(), comm_.size()));
    }
  }
  if (local_sync_) {
    std::string note = local_sync_->load_state(shared, by_rank, comm_.rank());
    if (!note.empty()) notes.push_back(note);
    // Each rank's inner optimizer state; at another world size rank r takes
    // the writer r mod (its world size)'s.
    COHORT_CHECK(!by_rank.empty(), DataError, "local sync: the checkpoint holds no rank's state");
    auto bytes = find(by_rank[static_cast<size_t>(comm_.rank()) % by_rank.size()], kOptimizer);
    COHORT_CHECK(bytes.defined(), DataError, "local sync: the checkpoint lacks the ranks' inner optimizer state "
                 "(was it written with dist.sync = step?)");
    load_archive(optimizer_, bytes, comm_.world().device);
  }
  return notes;
}

std::string ReplicaSync::start_new_world(const torch::Tensor& outer_momentum) {
  if (local_sync_) {
    local_sync_->restart(outer_momentum);
    return "";
  }
  if (!grad_sync_ || compression_ != Compression::kPowerSgd) return "";
  grad_sync_->reset_state();
  return "powersgd: a new world starts with fresh Qs and no error-feedback remainders (the old world's are per rank)";
}

bool ReplicaSync::window_open() const { return local_sync_ && local_sync_->window_open(); }

torch::Tensor ReplicaSync::outer_momentum() const {
  return local_sync_ ? local_sync_->momentum().clone() : torch::Tensor();
}

std::string ReplicaSync::describe() const {
  const double mib = 1.0 / (1 << 20);
  if (local_sync_) {
    const bool half = compression_ == Compression::kBf16 || compression_ == Compression::kFp16;
    return strf("cohort: sync local: an outer Nesterov step (lr %g, momentum %g) every %lld step(s), %.2f MiB in %s "
                "per sync",
                optim_.outer_lr, optim_.outer_momentum, static_cast<long long>(dist_.local_steps),
                static_cast<double>(local_sync_->wire_floats()) * (half ? 2 : 4) * mib,
                half ? name_of(compression_) : "fp32");
  }
  if (compression_ == Compression::kPowerSgd && comm_.size() > 1) {
    return strf("cohort: gradients powersgd rank %lld: %zu of %zu tensors compressed, %.2f MiB per step instead of "
                "%.2f",
                static_cast<long long>(dist_.powersgd_rank), grad_sync_->compressed_tensors(), grad_sync_->tensors(),
                static_cast<double>(grad_sync_->wire_floats()) * 4 * mib,
                static_cast<double>(grad_sync_->exact_floats()) * 4 * mib);
  }
  return "";
}

}  // namespace cohort
