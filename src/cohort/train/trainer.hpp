// defines: Trainer, default_reporter, rank_reporter
#pragma once

#include <memory>

#include "cohort/config/config.hpp"
#include "cohort/train/run.hpp"
#include "cohort/train/train_state.hpp"

namespace cohort {

class Comm;
class Reporter;
class ReporterFanOut;
struct World;

// Runs a training job for this rank. Cross-rank contract: every rank
// constructs the Trainer with the same Config and calls run(); steps,
// evaluations and collectives happen in the same order on all ranks, and
// every few steps the ranks check that they agree on step and cursor.
//
// Made of parts, each with one job: the run dir (run_dir.hpp), the train
// state a checkpoint captures (train_state.hpp), one step (train_step.hpp),
// the phase timer (phase_timer.hpp), the reporter (obs/reporter.hpp) and
// evaluation (evaluate.hpp).
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

// The console (unless run.quiet), RUN_DIR/metrics.jsonl and, as `log`
// asks, RUN_DIR/tensorboard/ and an MLflow run. Rank 0 only.
std::shared_ptr<ReporterFanOut> default_reporter(const RunOptions& run, const LogOptions& log);

// Where this rank reports: rank 0 to run.reporter, or the default one; the
// other ranks to a silent Reporter.
std::shared_ptr<Reporter> rank_reporter(const RunOptions& run, const World& world, const LogOptions& log);

}  // namespace cohort
