// defines: Trainer
#pragma once

#include <memory>

#include "cohort/config/config.hpp"
#include "cohort/train/lifecycle/run.hpp"
#include "cohort/train/lifecycle/train_state.hpp"

namespace cohort {

class Comm;

// Runs a training job for this rank. Cross-rank contract: every rank
// constructs the Trainer with the same Config and calls run(); steps,
// evaluations and collectives happen in the same order on all ranks, and
// every few steps the ranks check that they agree on step and cursor.
//
// Made of parts, each with one job: the start-up checks every rank passes
// (startup.hpp), the data's order and step count (data_plan.hpp), one step
// (train_step.hpp), speed balancing (data/balance.hpp), the run dir
// (run_dir.hpp), the train state a checkpoint captures (train_state.hpp),
// the best checkpoint and early stopping (best.hpp), evaluation
// (evaluate.hpp), where reports go (reporting.hpp), the optimizer stage
// (step_optimizer.hpp), the outer stage and its gradient reduction
// (replica_sync.hpp) and the elastic hand-over (handover.hpp). Trainer::run
// is the loop that strings them together (trainer_parts.hpp holds them).
class Trainer {
 public:
  Trainer(Config cfg, Comm& comm, RunOptions run);
  ~Trainer();
  RunSummary run();
  // This process's state at the last completed step, in memory, without
  // collectives: what an elastic world hands to the next one after run()
  // threw MembershipChanged.
  std::shared_ptr<const Handover> handover() const;

 private:
  struct Parts;
  std::unique_ptr<Parts> p_;
};

}  // namespace cohort
