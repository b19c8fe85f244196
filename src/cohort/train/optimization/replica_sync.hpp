// defines: SyncState, ReplicaSync, make_replica_sync
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

#include "cohort/ckpt/safetensors.hpp"
#include "cohort/config/config.hpp"

namespace cohort {

class Comm;
class GradReduction;
class StepOptimizer;

// What a checkpoint holds of it beyond the model and rank 0's optimizer:
// tensors the same on every rank, and each rank's own (PowerSGD's
// error-feedback remainders; local sync's parameters, open-window sample
// count and inner optimizer state).
struct SyncState {
  NamedTensors shared;
  NamedTensors own;
};

// The outer stage around the inner step, and the gradient reduction inside
// it: `step` (EveryStep) sums the gradients every step in GradSync and has
// no outer sync; `local` (LocalSteps) keeps each rank's gradients its own
// and meets in LocalSync every dist.local-steps. Each owns its state; the
// trainer, the keeper and the hand-over ask the stage, never which it is.
class ReplicaSync {
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

  virtual SyncState state() const = 0;
  // From a checkpoint's shared tensors and every writing rank's own, by rank.
  // Returns notes for the log (a reset, a merge).
  virtual std::vector<std::string> restore(const NamedTensors& shared, const std::vector<NamedTensors>& by_rank) = 0;
  // A new elastic world, after the handover: PowerSGD's remainders belong
  // to the old one; local sync starts a window from the handed-over model
  // and outer momentum. Returns a note for the log, or "".
  virtual std::string start_new_world(const torch::Tensor& outer_momentum) = 0;
  // The replicas meet in windows of several steps (dist.sync = local), and
  // whether this rank's window is open.
  virtual bool local() const = 0;
  virtual bool window_open() const = 0;
  // The outer momentum the elastic handover carries (undefined without).
  virtual torch::Tensor outer_momentum() const = 0;
  // The start-up line: mode, compression, what goes on the wire; or "".
  virtual std::string describe() const = 0;
};

// After the module's first broadcast (every rank holds the same weights):
// the stage dist.sync names. `optimizer`'s sink, when it keeps gradients in
// ranges, receives GradSync's sums.
std::unique_ptr<ReplicaSync> make_replica_sync(Comm& comm, torch::nn::Module& module, StepOptimizer& optimizer,
                                               const Config& cfg);

}  // namespace cohort
