// defines: SyncState, ReplicaSync
//
// How the ranks' replicas stay together, dist.sync: `step` sums the
// gradients every step in GradSync (exactly, in bf16/fp16, or PowerSGD's
// rank-r products); `local` lets each rank step alone and meets in LocalSync
// every dist.local-steps. The trainer asks this part, not which mode is on.
#pragma once

#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cohort/ckpt/safetensors.hpp"
#include "cohort/config/config.hpp"

namespace cohort {

class Comm;
class GradSync;
class LocalSync;
class StepOptimizer;

// What a checkpoint holds of it beyond the model and rank 0's optimizer:
// tensors the same on every rank, and each rank's own (PowerSGD's
// error-feedback remainders; local sync's parameters, open-window sample
// count and inner optimizer state).
struct SyncState {
  NamedTensors shared;
  NamedTensors own;
};

class ReplicaSync {
 public:
  // After the module's first broadcast: every rank holds the same weights.
  ReplicaSync(Comm& comm, torch::nn::Module& module, StepOptimizer& optimizer, const Config& cfg);
  ~ReplicaSync();

  // What train_step sums gradients with; null in local mode.
  GradSync* grad_sync() const { return grad_sync_.get(); }
  // After each step: local mode syncs every dist.local-steps and at the
  // run's `last` step. Returns true when the replicas met.
  bool after_step(int64_t step, int64_t samples, bool last);
  // Runs `fn` with the model every rank agrees on in the module (local
  // mode: the last sync's; otherwise the module as it is).
  void with_synced(const std::function<void()>& fn);

  SyncState state() const;
  // From a checkpoint's shared tensors and every writing rank's own, by rank.
  // Returns notes for the log (a reset, a merge).
  std::vector<std::string> restore(const NamedTensors& shared, const std::vector<NamedTensors>& by_rank);
  // A new elastic world, after the handover: PowerSGD's remainders belong
  // to the old one; local sync starts a window from the handed-over model
  // and outer momentum. Returns a note for the log, or "".
  std::string start_new_world(const torch::Tensor& outer_momentum);
  // dist.sync = local, and whether this rank's window is open.
  bool local() const { return local_sync_ != nullptr; }
  bool window_open() const;
  // local: the outer momentum (the elastic handover carries it).
  torch::Tensor outer_momentum() const;
  // The start-up line: mode, compression, what goes on the wire.
  std::string describe() const;

 private:
  Comm& comm_;
  torch::optim::Optimizer& optimizer_;
  SyncMode mode_;
  Compression compression_;
  DistOptions dist_;
  OptimOptions optim_;
  std::unique_ptr<GradSync> grad_sync_;
  std::unique_ptr<LocalSync> local_sync_;
};

}  // namespace cohort
