// defines: Keeper
//
// What a run keeps as it goes: a checkpoint when one is due (the trainer
// says when), the best one by ckpt.best-metric, and, with
// train.early-stop-patience, the decision to stop because that metric
// stopped improving. Every rank takes the same decisions from the same
// reduced metrics; a checkpoint is written collectively.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cohort/ckpt/checkpoint.hpp"
#include "cohort/train/lifecycle/best.hpp"

namespace cohort {

class Comm;
class ReplicaSync;
class Reporter;
class RunDir;
class StatePart;
class StepOptimizer;
class Task;
struct TrainState;

class Keeper {
 public:
  // `best`: ckpt.best-metric and its patience, checked already. The
  // checkpoint's model is the one `replicas` says every rank agrees on;
  // the state `parts`' tensors go beside the RNG streams.
  Keeper(Comm& comm, Task& task, StepOptimizer& optimizer, ReplicaSync& replicas,
         std::vector<const StatePart*> parts, TrainState& state,
         const std::string& out_dir, int keep, std::string config_toml, BestMetric best);

  // A continued run's best so far and the evaluations since: read by rank 0
  // (note_best_so_far, while it sets up the run dir), then given to every
  // rank (agree_best_so_far, collective: keep_best's decision is one).
  void note_best_so_far(const RunDir& dir, const std::string& eval_split);
  void agree_best_so_far();

  // Writes this step's checkpoint, once per step (collective).
  void save(Reporter& reporter);
  // An evaluation at this step: a new best is written and marked.
  void after_eval(const EvalReport& r, Reporter& reporter);
  // "early stop: ..." when patience ran out before `total_steps`, told to
  // the reporter; "" to go on. The same on every rank, without a collective.
  std::string early_stop(int64_t total_steps, Reporter& reporter);

 private:
  Comm& comm_;
  Task& task_;
  StepOptimizer& optimizer_;
  ReplicaSync& replicas_;
  std::vector<const StatePart*> parts_;
  TrainState& state_;
  std::string out_dir_;
  std::string config_toml_;
  Checkpoints checkpoints_;
  BestMetric best_;
  std::vector<double> so_far_ = {0.0, 0.0, 0.0, 0.0};  // rank 0's: has one, its value, its step, evaluations since
  int64_t last_step_ = -1;                             // the step last written
};

}  // namespace cohort
