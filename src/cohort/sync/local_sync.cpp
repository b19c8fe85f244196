#include "cohort/sync/local_sync.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <map>

#include "cohort/core/error.hpp"
#include "cohort/core/format.hpp"
#include "cohort/distributed/comm.hpp"

namespace cohort {

namespace {

constexpr char kMomentum[] = "local.momentum";
constexpr char kParams[] = "local.params";
constexpr char kSamples[] = "local.window-samples";
constexpr char kIsland[] = "local.island";

torch::Tensor find(const NamedTensors& tensors, const std::string& name) {
  for (const auto& [n, t] : tensors) {
    if (n == name) return t;
  }
  return torch::Tensor();
}

}  // namespace

LocalSync::LocalSync(Comm& inside, Comm& across, torch::nn::Module& module, LocalSyncOptions opts)
    : inside_(inside), across_(across), opts_(opts) {
  COHORT_CHECK(opts_.every >= 1, ConfigError, "dist.local-steps must be >= 1, got ", opts_.every);
  for (auto& p : module.parameters()) {
    if (p.requires_grad()) params_.push_back(p);
  }
  for (auto& b : module.buffers()) {
    if (b.is_floating_point()) params_.push_back(b);
  }
  anchor_ = flat_params();
  momentum_ = torch::zeros_like(anchor_);
}

torch::Tensor LocalSync::flat_params() const {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> parts;
  for (const auto& p : params_) parts.push_back(p.detach().reshape({-1}).to(torch::kFloat32));
  return parts.empty() ? torch::zeros({0}) : torch::cat(parts);
}

void LocalSync::set_params(const torch::Tensor& flat) {
  torch::NoGradGuard no_grad;
  int64_t offset = 0;
  for (auto& p : params_) {
    p.detach().copy_(flat.narrow(0, offset, p.numel()).view_as(p));
    offset += p.numel();
  }
}

// anchor -= lr * (change + momentum * buf), buf = momentum * buf + change
// (torch.optim.SGD's Nesterov form), on every rank alike.
void LocalSync::outer_step(const torch::Tensor& mean_change) {
  momentum_.mul_(opts_.outer_momentum).add_(mean_change);
  anchor_.sub_(mean_change.add(momentum_, opts_.outer_momentum), opts_.outer_lr);
}

std::pair<int64_t, int64_t> LocalSync::slice() const {
  const int64_t n = anchor_.numel(), k = inside_.size();
  const int64_t per = (n + k - 1) / k;
  const int64_t lo = std::min(n, per * inside_.rank());
  return {lo, std::min(n, lo + per)};
}

int64_t LocalSync::wire_floats() const {
  auto [lo, hi] = slice();
  return hi - lo;
}

torch::Tensor LocalSync::sum_islands(const torch::Tensor& change) {
  auto [lo, hi] = slice();
  torch::Tensor mine = change.narrow(0, lo, hi - lo);
  if (opts_.wire == Compression::kBf16) mine = mine.to(torch::kBFloat16);
  if (opts_.wire == Compression::kFp16) mine = mine.to(torch::kFloat16);
  mine = mine.contiguous();
  across_.all_reduce_sum(mine, "local sync all-reduce");
  mine = mine.to(torch::kFloat32);
  if (inside_.size() == 1) return mine;
  return torch::cat(inside_.all_gather(mine, "local sync island gather"));
}

bool LocalSync::after_step(int64_t step, int64_t samples, bool force) {
  window_samples_ += static_cast<double>(samples);
  if (step % opts_.every != 0 && !force) return false;
  torch::NoGradGuard no_grad;
  // Each island's change, weighted by its share of the window's samples, so
  // that an island dealt more (data.balance, more ranks) counts for more.
  // Its ranks hold one model; their samples are the island's.
  const double island = inside_.all_reduce_sum(std::vector<double>{window_samples_}, "island sample count")[0];
  const double total = across_.all_reduce_sum(std::vector<double>{island}, "local sync sample count")[0];
  torch::Tensor change = anchor_ - flat_params();
  change.mul_(total > 0 ? island / total : 1.0 / across_.size());
  outer_step(sum_islands(change));
  set_params(anchor_);
  window_samples_ = 0;
  ++syncs_;
  return true;
}

void LocalSync::with_synced(const std::function<void()>& fn) {
  if (stash_.defined()) return fn();  // already in
  stash_ = flat_params();
  set_params(anchor_);
  try {
    fn();
  } catch (...) {
    set_params(stash_);
    stash_ = torch::Tensor();
    throw;
  }
  set_params(stash_);
  stash_ = torch::Tensor();
}

void LocalSync::restart(const NamedTensors& shared) {
  const torch::Tensor momentum = find(shared, kMomentum);
  anchor_ = flat_params();
  momentum_ = torch::zeros_like(anchor_);
  if (momentum.defined()) {
    COHORT_CHECK(momentum.numel() == anchor_.numel(), Error, "local sync: the handed-over outer momentum holds ",
                 momentum.numel(), " values, the model ", anchor_.numel());
    momentum_.copy_(momentum.reshape({-1}));  // copy_ crosses devices
  }
  window_samples_ = 0;
  stash_ = torch::Tensor();
}

NamedTensors LocalSync::shared_state() const { return {{kMomentum, momentum_}}; }

NamedTensors LocalSync::own_state() const {
  return {{kParams, stash_.defined() ? stash_ : flat_params()},
          {kSamples, torch::tensor({window_samples_}, torch::kFloat64)},
          {kIsland, torch::tensor({static_cast<int64_t>(across_.rank())}, torch::kInt64)}};
}

std::string LocalSync::load_state(const NamedTensors& shared, const std::vector<NamedTensors>& by_rank, int rank) {
  torch::NoGradGuard no_grad;
  anchor_ = flat_params();
  // A checkpoint's tensors are read on the CPU: the state moves to the
  // parameters' device; the sample counts stay host numbers.
  auto check = [&](const torch::Tensor& t, const std::string& name, int64_t numel,
                   const torch::TensorOptions& to) {
    COHORT_CHECK(t.defined(), DataError, "local sync: the checkpoint lacks ", name,
                 " (was it written with dist.sync = step?)");
    COHORT_CHECK(t.numel() == numel, DataError, "local sync: the checkpoint's ", name, " holds ", t.numel(),
                 " values, the model ", numel);
    return t.to(to).reshape({-1});
  };
  const auto on_device = anchor_.options();
  auto samples = [&](const NamedTensors& r) {
    return check(find(r, kSamples), kSamples, 1, torch::TensorOptions(torch::kFloat64)).item<double>();
  };
  momentum_ = check(find(shared, kMomentum), kMomentum, anchor_.numel(), on_device).clone();
  // The writer's islands (checkpoints from before islands: one per rank).
  auto same_islands = [&] {
    if (static_cast<int>(by_rank.size()) != inside_.size() * across_.size()) return false;
    for (size_t r = 0; r < by_rank.size(); ++r) {
      const torch::Tensor t = find(by_rank[r], kIsland);
      const int64_t theirs = t.defined() ? t.item<int64_t>() : static_cast<int64_t>(r);
      const int64_t ours = opts_.island_of.empty() ? static_cast<int64_t>(r) : opts_.island_of.at(r);
      if (theirs != ours) return false;
    }
    return true;
  };
  if (same_islands()) {
    const auto& mine = by_rank.at(static_cast<size_t>(rank));
    set_params(check(find(mine, kParams), kParams, anchor_.numel(), on_device));
    window_samples_ = samples(mine);
    return "";
  }
  // Other islands: merge the open window as a sync would have.
  double total = 0;
  for (const auto& r : by_rank) total += samples(r);
  window_samples_ = 0;
  if (total == 0) return "";  // written at a sync: nothing open
  torch::Tensor mean_change = torch::zeros_like(anchor_);
  for (const auto& r : by_rank) {
    double w = samples(r) / total;
    mean_change.add_(anchor_ - check(find(r, kParams), kParams, anchor_.numel(), on_device), w);
  }
  outer_step(mean_change);
  set_params(anchor_);
  return strf("local sync: the checkpoint's %zu rank(s) had %.0f samples in an open window; merged by one outer step "
              "before going on with %d rank(s) in %d island(s)", by_rank.size(), total,
              inside_.size() * across_.size(), across_.size());
}

}  // namespace cohort
