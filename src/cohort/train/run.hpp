// defines: RunMode, RunOptions, RunSummary, TrainRequest, plan_training,
//          EvalRequest, EvalPlan, plan_evaluation
//
// The run lifecycle, decided here and nowhere else: a fresh run, an
// overwrite, a resume, a restart by the launcher, or an evaluation of a
// checkpoint. A plan names the run directory, the verified checkpoint to
// continue from (verified once) and the resolved config; the Trainer and
// evaluate_checkpoint carry it out.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cohort/ckpt/checkpoint.hpp"
#include "cohort/config/config.hpp"
#include "cohort/obs/reporter.hpp"
#include "cohort/train/step_point.hpp"
#include "cohort/train/train_state.hpp"

namespace cohort {

class Reporter;

enum class RunMode { kFresh, kOverwrite, kResume };

struct RunOptions {
  std::string out_dir;       // RUN_DIR
  std::string config_toml;   // the resolved config, written to RUN_DIR/config.toml
  bool overwrite = false;    // a fresh run may replace the run already in out_dir
  // The job RUN_DIR/.lock belongs to (RunDirLock): shared by all its
  // processes, restarts and elastic worlds. "": this process alone.
  std::string job_id;
  std::optional<ResolvedCheckpoint> resume;  // continue from this checkpoint
  // Elastic (train/elastic.hpp): this process's state from the previous
  // world, if it held one; the new world takes rank 0's.
  std::shared_ptr<const Handover> handover;
  bool from_peers = false;  // elastic: the run goes on from rank 0's memory, not from a checkpoint
  std::optional<MembershipReport> membership;  // elastic: the change that formed this world, for the log
  std::vector<std::string> notes;  // told at start (resume warnings, accepted changes)
  bool quiet = false;        // no console lines
  bool live_progress = false;  // console: redraw a progress bar (a terminal)
  // Where rank 0 reports; null: the console (unless quiet), metrics.jsonl
  // and (log.tensorboard) TensorBoard.
  std::shared_ptr<Reporter> reporter;
  // `cohort eval`: reports add to the run's records (its MLflow run keeps
  // its status); false: a training run.
  bool evaluation = false;
  StepHook at;  // testing aid (step_point.hpp)

  RunMode mode() const { return resume || from_peers ? RunMode::kResume : overwrite ? RunMode::kOverwrite : RunMode::kFresh; }
};

struct RunSummary {
  int64_t steps = 0;
  std::vector<double> step_losses;  // every step's mean loss over all ranks, this world's
  double final_eval_loss = 0;
  double final_eval_accuracy = 0;
  double seconds = 0;
  std::string stopped_by;  // why the run ended before total_steps ("early stop: ..."); "": it did not
};

// What `cohort train` was asked.
struct TrainRequest {
  std::string out_dir;      // --out
  std::string config_path;  // --config
  std::string resume_path;  // --resume: a run dir or a checkpoint dir
  bool overwrite = false;   // --overwrite
  int generation = 0;       // restarts by the launcher so far (COHORT_GENERATION)
  std::string job_id;       // the job this process belongs to (RunDirLock::job_id_from)
};

// Resolves a training run. A restart (generation > 0) continues from the
// run's own newest checkpoint, or repeats the original start when there is
// none. A resume verifies its checkpoint, takes the checkpoint's config as
// the base under --config and the command line (`binding` was parsed from
// it; `cfg` is its target), and refuses a changed kFixed key. Validates
// `cfg`. UsageError/ConfigError/DataError naming what is wrong.
RunOptions plan_training(const TrainRequest& request, ConfigBinding& binding, Config& cfg);

// What `cohort eval` was asked.
struct EvalRequest {
  std::string checkpoint;   // a run dir (its newest checkpoint) or a checkpoint dir
  std::string split = "test";
  int64_t max_samples = 0;  // 0: all
};

struct EvalPlan {
  Config cfg;               // the checkpoint's own, with eval.split and eval.max-samples set
  RunOptions run;           // out_dir: the checkpoint's run; resume: the checkpoint
};

EvalPlan plan_evaluation(const EvalRequest& request);

}  // namespace cohort
