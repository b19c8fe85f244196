// defines: RunMode, StartFresh, StartFromCheckpoint, StartFromPeers, StartFrom, RunOptions, RunSummary, TrainRequest, plan_training,
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
#include <variant>
#include <vector>

#include "cohort/ckpt/checkpoint.hpp"
#include "cohort/config/config.hpp"
#include "cohort/obs/reporter.hpp"
#include "cohort/train/lifecycle/step_point.hpp"
#include "cohort/train/lifecycle/train_state.hpp"

namespace cohort {

class Reporter;

enum class RunMode { kFresh, kOverwrite, kResume };

// Where a run starts: one of three, decided by plan_training and, in an
// elastic job, again for each world (train/elastic/elastic.cpp).
struct StartFresh {
  bool overwrite = false;  // it may replace the run already in out_dir
};
struct StartFromCheckpoint {
  ResolvedCheckpoint checkpoint;  // verified
};
// Elastic: the run goes on from the new world's rank 0's memory, not from a
// checkpoint; every rank takes rank 0's state (adopt_handover).
struct StartFromPeers {
  std::shared_ptr<const Handover> held;  // this process's state from the previous world; null: it held none
};
using StartFrom = std::variant<StartFresh, StartFromCheckpoint, StartFromPeers>;

struct RunOptions {
  std::string out_dir;       // RUN_DIR
  std::string config_toml;   // the resolved config, written to RUN_DIR/config.toml
  StartFrom start;
  // The job RUN_DIR/.lock belongs to (RunDirLock): shared by all its
  // processes, restarts and elastic worlds. "": this process alone.
  std::string job_id;
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

  // The checkpoint the run starts from; null when it starts otherwise.
  const ResolvedCheckpoint* checkpoint() const {
    const auto* c = std::get_if<StartFromCheckpoint>(&start);
    return c ? &c->checkpoint : nullptr;
  }
  // Elastic: the state from the previous world; null when the run does not go on from peers.
  const StartFromPeers* peers() const { return std::get_if<StartFromPeers>(&start); }
  RunMode mode() const {
    if (const auto* f = std::get_if<StartFresh>(&start)) return f->overwrite ? RunMode::kOverwrite : RunMode::kFresh;
    return RunMode::kResume;
  }
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
  // This process begins a job of its own: a lone process, or the launcher
  // of a one-node job. It cannot be joining the job that holds RUN_DIR's
  // lock, so a live holder is refused before any checkpoint is read.
  bool starts_job = false;
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
  RunOptions run;           // out_dir: the checkpoint's run; start: the checkpoint
};

EvalPlan plan_evaluation(const EvalRequest& request);

}  // namespace cohort
