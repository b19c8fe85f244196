// defines: RunOptions, Trainer
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cohort/config/config.hpp"

namespace cohort {

class Comm;

struct RunOptions {
  std::string out_dir;       // RUN_DIR
  std::string config_toml;   // the resolved config, written to RUN_DIR/config.toml
  bool overwrite = false;    // allow an out_dir that already holds a run
  bool quiet = false;        // no console lines (tests)
  std::string resume_dir;    // a verified checkpoint dir to continue from
  std::vector<std::string> notes;  // printed by rank 0 at start (resume warnings)
  int debug_delay_ms = 0;    // testing aid: sleep this long in every forward
  bool eval_only = false;    // `cohort eval`: load resume_dir and evaluate; no
                             // training, and only an eval line is appended to
                             // RUN_DIR/metrics.jsonl
};

struct RunSummary {
  int64_t steps = 0;
  std::vector<double> step_losses;  // every step's mean loss over this rank's share
                                    // (metrics.jsonl has the all-rank means)
  double final_eval_loss = 0;
  double final_eval_accuracy = 0;
  double seconds = 0;
};

// Runs a training job for this rank. Cross-rank contract: every rank
// constructs the Trainer with the same Config and calls run(); steps,
// evaluations and collectives happen in the same order on all ranks, and
// every few steps the ranks check that they agree on step and cursor.
class Trainer {
 public:
  Trainer(Config cfg, Comm& comm, RunOptions run);
  ~Trainer();
  RunSummary run();
  // With RunOptions::eval_only: one evaluation of eval.split at the loaded step.
  RunSummary evaluate();

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace cohort
