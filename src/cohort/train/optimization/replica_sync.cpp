#include "cohort/train/optimization/replica_sync.hpp"

#include <algorithm>
#include <cstring>

#include "cohort/core/error.hpp"
#include "cohort/core/format.hpp"
#include "cohort/distributed/comm.hpp"
#include "cohort/sync/grad_sync.hpp"
#include "cohort/sync/islands.hpp"
#include "cohort/sync/local_sync.hpp"
#include "cohort/train/optimization/step_optimizer.hpp"

namespace cohort {

namespace {

// Each rank's inner optimizer state in the sync stage's own state, under
// this prefix ("local.optimizer", "local.optimizer.exp_avg", ...).
constexpr char kPrefix[] = "local.";

// dist.sync = step: GradSync sums every step's gradients; no outer stage.
class EveryStep : public ReplicaSync {
 public:
  EveryStep(Comm& comm, ReplicaGroups& groups, torch::nn::Module& module, StepOptimizer& optimizer,
            const Config& cfg)
      : comm_(comm), dist_(cfg.dist), layout_(groups.layout) {
    GradSyncOptions o = grad_sync_options(cfg.dist, cfg.train.seed);
    o.sink = optimizer.sink();  // dist.shard = gradients: sums go straight into the ranges
    if (groups.islands.inside) {  // PowerSGD between islands, the exact sum inside each
      o.inside = groups.islands.inside.get();
      o.across = groups.islands.across;
      o.width = groups.layout.width();
    }
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
    std::string out = strf("cohort: gradients powersgd rank %lld: %zu of %zu tensors compressed, %.2f MiB per step "
                           "instead of %.2f", static_cast<long long>(dist_.powersgd_rank),
                           grad_sync_->compressed_tensors(), grad_sync_->tensors(),
                           static_cast<double>(grad_sync_->wire_floats()) * 4 * mib,
                           static_cast<double>(grad_sync_->exact_floats()) * 4 * mib);
    if (layout_.islands.empty()) return out;
    const std::string who = layout_.width() == 1 ? std::string("an island's first rank compresses every bucket")
                                                 : strf("island rank i compresses buckets i, i + %d, ...",
                                                        layout_.width());
    return out + strf(" from each island; %s, gradients summed exactly inside each, compressed between them (%s) and "
                      "broadcast inside", layout_.describe().c_str(), who.c_str());
  }

 private:
  Comm& comm_;
  DistOptions dist_;
  const IslandLayout& layout_;  // empty: flat
  std::unique_ptr<GradSync> grad_sync_;
};

// dist.sync = local: each island (dist.islands; flat: each rank) steps on
// its own gradients, summed over its ranks (dist.island-compression), and
// the islands meet in LocalSync every dist.local-steps. Each island's inner
// optimizer state (whole on each rank, or its ranks' ranges) is its own, so
// every rank's is part of this stage's state.
class LocalSteps : public ReplicaSync {
 public:
  LocalSteps(Comm& comm, ReplicaGroups& groups, torch::nn::Module& module, StepOptimizer& optimizer,
             const Config& cfg)
      : comm_(comm), optimizer_(optimizer), dist_(cfg.dist), optim_(cfg.optim), layout_(groups.layout) {
    Comm& inside = *groups.islands.inside;
    if (inside.size() > 1) {
      GradSyncOptions o = grad_sync_options(cfg.dist, cfg.train.seed);
      o.compression = cfg.dist.island_compression;  // dist.grad-compression is the change's dtype between
      o.sink = optimizer.sink();  // dist.shard = gradients: the island's sums go straight into the ranges
      grad_sync_ = std::make_unique<GradSync>(inside, module, o);
    }
    LocalSyncOptions o;
    o.every = cfg.dist.local_steps;
    o.outer_lr = cfg.optim.outer_lr;
    o.outer_momentum = cfg.optim.outer_momentum;
    o.wire = cfg.dist.grad_compression;
    o.fragments = cfg.dist.outer_fragments;
    o.delay = cfg.dist.outer_delay;
    o.mix = cfg.optim.outer_mix;
    o.error_feedback = cfg.dist.outer_error_feedback;
    COHORT_CHECK(!comm.elastic() || (o.fragments == 1 && o.delay == 0), ConfigError, "dist.outer-fragments ",
                 o.fragments, ", dist.outer-delay ", o.delay, ": an elastic world goes on from its last whole sync, "
                 "which a streamed sync does not have between its fragments; use 1 and 0");
    for (int r = 0; r < comm.size(); ++r) o.island_of.push_back(layout_.island_of(r));
    local_sync_ = std::make_unique<LocalSync>(inside, *groups.islands.across, module, o);
  }

  GradReduction& reduction() override { return grad_sync_ ? static_cast<GradReduction&>(*grad_sync_) : own_; }
  bool after_step(int64_t step, int64_t samples, bool last) override {
    return local_sync_->after_step(step, samples, last);
  }
  void with_synced(const std::function<void()>& fn) override { local_sync_->with_synced(fn); }
  void with_newest_synced(const std::function<void()>& fn) override { local_sync_->with_newest_synced(fn); }

  PartState capture() const override {
    PartState s{local_sync_->shared_state(), local_sync_->own_state()};
    for (auto& [name, t] : optimizer_.own_state()) s.own.emplace_back(kPrefix + name, t);  // each island's own
    return s;
  }

  std::vector<std::string> restore(const SavedPart& saved) override {
    const auto& by_rank = saved.by_rank;
    std::vector<std::string> notes;
    std::string note = local_sync_->load_state(saved.shared, by_rank, comm_.rank());
    if (!note.empty()) notes.push_back(note);
    // The inner optimizer state of this rank's island: at another grouping,
    // island i takes the writer's island i mod (its islands)'s.
    COHORT_CHECK(!by_rank.empty(), DataError, "local sync: the checkpoint holds no rank's state");
    std::vector<int> writer_island;
    for (size_t r = 0; r < by_rank.size(); ++r) {
      writer_island.push_back(LocalSync::writer_island(by_rank[r], static_cast<int>(r)));
    }
    const int islands = *std::max_element(writer_island.begin(), writer_island.end()) + 1;
    const int from = layout_.island_of(comm_.rank()) % islands;
    std::vector<NamedTensors> island;
    const std::string prefix = std::string(kPrefix) + "optimizer";
    for (size_t r = 0; r < by_rank.size(); ++r) {
      if (writer_island[r] != from) continue;
      NamedTensors own;
      for (const auto& [name, t] : by_rank[r]) {
        if (name.rfind(prefix, 0) == 0) own.emplace_back(name.substr(std::strlen(kPrefix)), t);
      }
      COHORT_CHECK(!own.empty(), DataError, "local sync: the checkpoint lacks rank ", r, "'s inner optimizer state "
                   "(was it written with dist.sync = step?)");
      island.push_back(std::move(own));
    }
    note = optimizer_.restore_own(island);
    if (!note.empty()) notes.push_back(note);
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
    const char* dtype = rounding_wire(dist_.grad_compression) ? name_of(dist_.grad_compression) : "fp32";
    const double per_rank = static_cast<double>(local_sync_->wire_bytes()) * mib;
    std::string out = strf("cohort: sync local: an outer Nesterov step (lr %g, momentum %g) every %lld step(s), "
                           "%.2f MiB in %s per sync", optim_.outer_lr, optim_.outer_momentum,
                           static_cast<long long>(dist_.local_steps), per_rank, dtype);
    if (dist_.outer_error_feedback) out += " with error feedback";
    if (dist_.outer_fragments > 1 || dist_.outer_delay > 0) {
      out += strf(", streamed in %lld fragment(s) (one every %lld step(s)), each applied %lld step(s) after it is sent",
                  static_cast<long long>(dist_.outer_fragments),
                  static_cast<long long>(dist_.local_steps / dist_.outer_fragments),
                  static_cast<long long>(dist_.outer_delay));
      if (dist_.outer_delay > 0) out += strf(" and mixed %g local to %g synced", optim_.outer_mix, 1 - optim_.outer_mix);
    }
    if (layout_.largest() == 1) return out;
    const std::string inside = dist_.island_compression == Compression::kNone
                                   ? "exactly" : std::string("in ") + name_of(dist_.island_compression);
    const std::string who = layout_.width() == layout_.largest()
                                ? std::string("each island rank sums")
                                : strf("each of the first %d rank(s) of an island sums", layout_.width());
    return out + strf(" from each rank; %s, gradients summed %s inside each, and %s its 1/%d of the change with the "
                      "other islands'", layout_.describe().c_str(), inside.c_str(), who.c_str(), layout_.width());
  }

 private:
  Comm& comm_;
  StepOptimizer& optimizer_;
  DistOptions dist_;
  OptimOptions optim_;
  const IslandLayout& layout_;
  OwnGradients own_;                      // islands of one rank
  std::unique_ptr<GradSync> grad_sync_;   // islands of several: the exact sum inside
  std::unique_ptr<LocalSync> local_sync_;
};

}  // namespace

std::unique_ptr<ReplicaGroups> form_replica_groups(Comm& comm, const Config& cfg) {
  auto g = std::make_unique<ReplicaGroups>();
  g->step = &comm;
  const bool local = cfg.dist.sync == SyncMode::kLocal;
  // dist.sync = step: islands only for PowerSGD between them, when asked.
  const bool between = cfg.dist.grad_compression == Compression::kPowerSgd && cfg.dist.islands != "auto" &&
                       cfg.dist.islands != "rank";
  if (!local && !between) return g;
  // Where every rank runs, for dist.islands = node (auto).
  std::vector<int> node_of;
  for (const auto& t : comm.all_gather(torch::tensor({static_cast<int64_t>(comm.world().node_rank)}), "islands")) {
    node_of.push_back(static_cast<int>(t.item<int64_t>()));
  }
  const std::string& spec = cfg.dist.islands;
  // An elastic world plans its islands anew in every generation, from the
  // members it has: a lost node is a lost island (dist.islands = node), a
  // lost rank leaves its island smaller (sizes), and one island left trains
  // on alone until others join.
  g->layout = plan_islands(spec, node_of, comm.elastic());
  const int per_island = g->layout.largest();
  COHORT_CHECK(g->layout.islands.size() > 1 || comm.size() == 1 || comm.elastic(), ConfigError, "dist.islands '",
               spec, "' makes one island of the whole world, which has nobody to meet: ",
               local ? "use dist.sync = step" : "drop dist.islands (flat PowerSGD)");
  if (!local) {
    if (per_island > 1) g->islands = form_island_groups(comm, g->layout);
    else g->layout = IslandLayout{};  // islands of one rank: flat PowerSGD
    return g;
  }
  COHORT_CHECK(cfg.dist.shard == ShardMode::kNone || per_island > 1 || comm.size() == 1, ConfigError,
               shard_needs_islands(cfg.dist));
  COHORT_CHECK(cfg.dist.island_compression == Compression::kNone || per_island > 1 || comm.size() == 1,
               ConfigError, "dist.island-compression ", name_of(cfg.dist.island_compression), " applies inside "
               "islands of several ranks, but dist.islands '", spec, "' gives islands of one rank here: drop the key, "
               "or set dist.islands to a size above 1");
  g->islands = form_island_groups(comm, g->layout);
  g->step = g->islands.inside.get();
  return g;
}

std::unique_ptr<ReplicaSync> make_replica_sync(Comm& comm, ReplicaGroups& groups, torch::nn::Module& module,
                                               StepOptimizer& optimizer, const Config& cfg) {
  if (cfg.dist.sync == SyncMode::kLocal) return std::make_unique<LocalSteps>(comm, groups, module, optimizer, cfg);
  return std::make_unique<EveryStep>(comm, groups, module, optimizer, cfg);
}

}  // namespace cohort
