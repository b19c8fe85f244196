#include "cohort/train/optimization/replica_sync.hpp"

#include <torch/serialize.h>

#include <sstream>

#include "cohort/core/error.hpp"
#include "cohort/core/format.hpp"
#include "cohort/distributed/comm.hpp"
#include "cohort/sync/grad_sync.hpp"
#include "cohort/sync/islands.hpp"
#include "cohort/sync/local_sync.hpp"
#include "cohort/train/optimization/step_optimizer.hpp"

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

// dist.sync = step: GradSync sums every step's gradients; no outer stage.
class EveryStep : public ReplicaSync {
 public:
  EveryStep(Comm& comm, torch::nn::Module& module, StepOptimizer& optimizer, const Config& cfg)
      : comm_(comm), dist_(cfg.dist) {
    GradSyncOptions o = grad_sync_options(cfg.dist, cfg.train.seed);
    o.sink = optimizer.sink();  // dist.shard = gradients: sums go straight into the ranges
    grad_sync_ = std::make_unique<GradSync>(comm, module, o);
  }

  GradReduction& reduction() override { return *grad_sync_; }
  bool after_step(int64_t, int64_t, bool) override { return false; }
  void with_synced(const std::function<void()>& fn) override { fn(); }
  PartState capture() const override { return {grad_sync_->shared_state(), grad_sync_->own_state()}; }

  // PowerSGD: the Qs are the same on every rank; the remainders are each
  // rank's, kept at the same world size only.
  std::vector<std::string> restore(const SavedPart& saved) override {
    if (dist_.grad_compression != Compression::kPowerSgd) return {};
    const auto& by_rank = saved.by_rank;
    if (static_cast<int>(by_rank.size()) == comm_.size()) {
      grad_sync_->load_state(saved.shared, by_rank.at(static_cast<size_t>(comm_.rank())));
      return {};
    }
    grad_sync_->load_state(saved.shared, {});
    return {strf("powersgd: the error-feedback remainders of the checkpoint's %zu rank(s) are dropped at %d rank(s); "
                 "the Qs are kept", by_rank.size(), comm_.size())};
  }

  std::string adopt(const PartState&) override {
    if (dist_.grad_compression != Compression::kPowerSgd) return "";
    grad_sync_->reset_state();
    return "powersgd: a new world starts with fresh Qs and no error-feedback remainders (the old world's are per rank)";
  }

  bool local() const override { return false; }
  bool window_open() const override { return false; }

  std::string describe() const override {
    if (dist_.grad_compression != Compression::kPowerSgd || comm_.size() == 1) return "";
    const double mib = 1.0 / (1 << 20);
    return strf("cohort: gradients powersgd rank %lld: %zu of %zu tensors compressed, %.2f MiB per step instead of "
                "%.2f",
                static_cast<long long>(dist_.powersgd_rank), grad_sync_->compressed_tensors(), grad_sync_->tensors(),
                static_cast<double>(grad_sync_->wire_floats()) * 4 * mib,
                static_cast<double>(grad_sync_->exact_floats()) * 4 * mib);
  }

 private:
  Comm& comm_;
  DistOptions dist_;
  std::unique_ptr<GradSync> grad_sync_;
};

// dist.sync = local: each island (dist.islands; flat: each rank) steps on
// its own gradients, summed exactly over its ranks, and the islands meet in
// LocalSync every dist.local-steps. Each rank's inner optimizer state is
// its own, so it is part of this stage's state.
class LocalSteps : public ReplicaSync {
 public:
  LocalSteps(Comm& comm, torch::nn::Module& module, StepOptimizer& optimizer, const Config& cfg)
      : comm_(comm), optimizer_(optimizer.optimizer()), dist_(cfg.dist), optim_(cfg.optim) {
    // Where every rank runs, for dist.islands = node (auto).
    std::vector<int> node_of;
    for (const auto& t : comm.all_gather(torch::tensor({static_cast<int64_t>(comm.world().node_rank)}), "islands")) {
      node_of.push_back(static_cast<int>(t.item<int64_t>()));
    }
    layout_ = plan_islands(comm.elastic() && dist_.islands == "auto" ? "rank" : dist_.islands, node_of);
    COHORT_CHECK(!comm.elastic() || layout_.ranks_per_island() == 1, ConfigError, "dist.islands '", dist_.islands,
                 "': an elastic world's members are islands of one rank (membership by island is not built); use "
                 "auto or rank");
    COHORT_CHECK(layout_.islands.size() > 1 || comm.size() == 1, ConfigError, "dist.islands '", dist_.islands,
                 "' makes one island of the whole world, which has nobody to meet: use dist.sync = step");
    groups_ = form_island_groups(comm, layout_);
    if (groups_.inside->size() > 1) {
      GradSyncOptions o = grad_sync_options(cfg.dist, cfg.train.seed);
      o.compression = Compression::kNone;  // exact inside; dist.grad-compression is the change's dtype between
      grad_sync_ = std::make_unique<GradSync>(*groups_.inside, module, o);
    }
    LocalSyncOptions o;
    o.every = cfg.dist.local_steps;
    o.outer_lr = cfg.optim.outer_lr;
    o.outer_momentum = cfg.optim.outer_momentum;
    o.wire = cfg.dist.grad_compression;
    o.fragments = cfg.dist.outer_fragments;
    o.delay = cfg.dist.outer_delay;
    o.mix = cfg.optim.outer_mix;
    COHORT_CHECK(!comm.elastic() || (o.fragments == 1 && o.delay == 0), ConfigError, "dist.outer-fragments ",
                 o.fragments, ", dist.outer-delay ", o.delay, ": an elastic world goes on from its last whole sync, "
                 "which a streamed sync does not have between its fragments; use 1 and 0");
    for (int r = 0; r < comm.size(); ++r) o.island_of.push_back(layout_.island_of(r));
    local_sync_ = std::make_unique<LocalSync>(*groups_.inside, *groups_.across, module, o);
  }

  GradReduction& reduction() override { return grad_sync_ ? static_cast<GradReduction&>(*grad_sync_) : own_; }
  bool after_step(int64_t step, int64_t samples, bool last) override {
    return local_sync_->after_step(step, samples, last);
  }
  void with_synced(const std::function<void()>& fn) override { local_sync_->with_synced(fn); }

  PartState capture() const override {
    PartState s{local_sync_->shared_state(), local_sync_->own_state()};
    s.own.emplace_back(kOptimizer, archive_bytes(optimizer_));  // each rank's inner optimizer is its own
    return s;
  }

  std::vector<std::string> restore(const SavedPart& saved) override {
    const auto& by_rank = saved.by_rank;
    std::vector<std::string> notes;
    std::string note = local_sync_->load_state(saved.shared, by_rank, comm_.rank());
    if (!note.empty()) notes.push_back(note);
    // Each rank's inner optimizer state; at another world size rank r takes
    // the writer r mod (its world size)'s.
    COHORT_CHECK(!by_rank.empty(), DataError, "local sync: the checkpoint holds no rank's state");
    auto bytes = find(by_rank[static_cast<size_t>(comm_.rank()) % by_rank.size()], kOptimizer);
    COHORT_CHECK(bytes.defined(), DataError, "local sync: the checkpoint lacks the ranks' inner optimizer state "
                 "(was it written with dist.sync = step?)");
    load_archive(optimizer_, bytes, comm_.world().device);
    return notes;
  }

  std::string adopt(const PartState& handed) override {
    local_sync_->restart(handed.shared);
    return "";
  }

  bool local() const override { return true; }
  bool window_open() const override { return local_sync_->window_open(); }

  std::string describe() const override {
    const double mib = 1.0 / (1 << 20);
    const bool narrow = dist_.grad_compression == Compression::kBf16 ||
                        dist_.grad_compression == Compression::kFp16 || dist_.grad_compression == Compression::kInt8;
    const char* dtype = narrow ? name_of(dist_.grad_compression) : "fp32";
    const double per_rank = static_cast<double>(local_sync_->wire_bytes()) * mib;
    std::string out = strf("cohort: sync local: an outer Nesterov step (lr %g, momentum %g) every %lld step(s), "
                           "%.2f MiB in %s per sync", optim_.outer_lr, optim_.outer_momentum,
                           static_cast<long long>(dist_.local_steps), per_rank, dtype);
    if (dist_.outer_fragments > 1 || dist_.outer_delay > 0) {
      out += strf(", streamed in %lld fragment(s) (one every %lld step(s)), each applied %lld step(s) after it is sent",
                  static_cast<long long>(dist_.outer_fragments),
                  static_cast<long long>(dist_.local_steps / dist_.outer_fragments),
                  static_cast<long long>(dist_.outer_delay));
      if (dist_.outer_delay > 0) out += strf(" and mixed %g local to %g synced", optim_.outer_mix, 1 - optim_.outer_mix);
    }
    if (layout_.ranks_per_island() == 1) return out;
    return out + strf(" from each rank; %s, gradients summed exactly inside each, and each island rank sums its "
                      "1/%d of the change with the other islands'", layout_.describe().c_str(),
                      layout_.ranks_per_island());
  }

 private:
  Comm& comm_;
  torch::optim::Optimizer& optimizer_;
  DistOptions dist_;
  OptimOptions optim_;
  IslandLayout layout_;
  IslandGroups groups_;                   // before the parts that use them, destroyed after
  OwnGradients own_;                      // islands of one rank
  std::unique_ptr<GradSync> grad_sync_;   // islands of several: the exact sum inside
  std::unique_ptr<LocalSync> local_sync_;
};

}  // namespace

std::unique_ptr<ReplicaSync> make_replica_sync(Comm& comm, torch::nn::Module& module, StepOptimizer& optimizer,
                                               const Config& cfg) {
  if (cfg.dist.sync == SyncMode::kLocal) return std::make_unique<LocalSteps>(comm, module, optimizer, cfg);
  return std::make_unique<EveryStep>(comm, module, optimizer, cfg);
}

}  // namespace cohort
