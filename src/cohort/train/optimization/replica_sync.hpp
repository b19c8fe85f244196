// defines: ReplicaSync, make_replica_sync
//
// How the ranks' replicas stay together, dist.sync: `step` sums the
// gradients every step in GradSync (exactly, in bf16/fp16, or PowerSGD's
// rank-r products); `local` lets each rank step alone and meets in LocalSync
// every dist.local-steps.
#pragma once

#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cohort/ckpt/state_part.hpp"
#include "cohort/config/config.hpp"
#include "cohort/sync/islands.hpp"

namespace cohort {

class Comm;
class GradReduction;
class StepOptimizer;

// The outer stage around the inner step, and the gradient reduction inside
// it: `step` (EveryStep) sums the gradients every step in GradSync and has
// no outer sync; `local` (LocalSteps) keeps each rank's gradients its own
// and meets in LocalSync every dist.local-steps. Each owns its state, as
// the state part "sync": beyond the model and rank 0's optimizer, tensors
// the same on every rank and each rank's own (PowerSGD's Qs and
// error-feedback remainders; local sync's outer momentum, and each rank's
// parameters, open-window sample count and inner optimizer state). The
// trainer, the keeper and the hand-over ask the stage, never which it is.
class ReplicaSync : public StatePart {
 public:
  virtual ~ReplicaSync() = default;

  // What train_step reduces gradients with: never null.
  virtual GradReduction& reduction() = 0;
  // After each step: local steps sync every dist.local-steps and at the
  // run's `last` step. Returns true when the replicas met.
  virtual bool after_step(int64_t step, int64_t samples, bool last) = 0;
  // Runs `fn` with the model every rank agrees on in the module (local
  // steps: the last sync's; otherwise the module as it is).
  virtual void with_synced(const std::function<void()>& fn) = 0;
  // Collective (every rank, at one step; an evaluation): as with_synced,
  // with the newest agreed model (a streamed sync's fragment in flight is
  // waited for and shown synced; training does not change).
  virtual void with_newest_synced(const std::function<void()>& fn) { with_synced(fn); }

  std::string state_name() const override { return "sync"; }
  // restore: at another world size, what each rank's own state allows (a
  // merge, a reset), said in the notes. adopt: PowerSGD's remainders belong
  // to the old world (fresh Qs); local sync starts a window from the
  // handed-over model and outer momentum.
  // The replicas meet in windows of several steps (dist.sync = local), and
  // whether this rank's window is open.
  virtual bool local() const = 0;
  virtual bool window_open() const = 0;
  // The start-up line: mode, compression, what goes on the wire; or "".
  std::string describe() const override = 0;
};

// Whom this rank sums its gradients with every step, and whom it meets in
// the outer sync: made before the optimizer, which shards its state over
// the ranks that step together (dist.shard), and outliving both.
struct ReplicaGroups {
  // dist.sync = local: the islands (flat: one rank each); PowerSGD between
  // islands: the islands (none: flat).
  IslandLayout layout;
  IslandGroups islands;  // this rank's island, and its peers across the islands (islands of several ranks)
  Comm* step = nullptr;  // the ranks that sum gradients every step: the world, or this rank's island
};

// Collective under dist.sync = local, and under PowerSGD with dist.islands
// node or sizes (the islands' groups form). ConfigError, one line, for a
// layout the world cannot hold, or dist.shard over islands of one rank.
std::unique_ptr<ReplicaGroups> form_replica_groups(Comm& comm, const Config& cfg);

// After the module's first broadcast (every rank holds the same weights):
// the stage dist.sync names. `optimizer` steps over `groups.step`; its
// sink, when it keeps gradients in ranges, receives GradSync's sums.
std::unique_ptr<ReplicaSync> make_replica_sync(Comm& comm, ReplicaGroups& groups, torch::nn::Module& module,
                                               StepOptimizer& optimizer, const Config& cfg);

}  // namespace cohort
