// defines: Trainer::Parts
//
// The trainer's parts and the steps of its loop (trainer.cpp: start-up, one
// step, logs, evaluation, checkpoints, the end; trainer_handover.cpp: what
// an elastic world hands to the next). Private to those two files.
#pragma once

#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include "cohort/config/config.hpp"
#include "cohort/data/balance.hpp"
#include "cohort/data/loader.hpp"
#include "cohort/device/device_feed.hpp"
#include "cohort/distributed/world.hpp"
#include "cohort/obs/reporter.hpp"
#include "cohort/train/lifecycle/handover.hpp"
#include "cohort/train/lifecycle/keeper.hpp"
#include "cohort/train/lifecycle/run.hpp"
#include "cohort/train/lifecycle/run_dir.hpp"
#include "cohort/train/lifecycle/train_state.hpp"
#include "cohort/train/loop/phase_timer.hpp"
#include "cohort/train/loop/train_log.hpp"
#include "cohort/train/loop/train_step.hpp"
#include "cohort/train/loop/trainer.hpp"
#include "cohort/train/optimization/optim.hpp"
#include "cohort/train/optimization/replica_sync.hpp"
#include "cohort/train/optimization/step_optimizer.hpp"
#include "cohort/train/task.hpp"

namespace cohort {

class Comm;

struct Trainer::Parts {
  Parts(Config config, Comm& c, RunOptions options);

  Config cfg;
  Comm& comm;
  World world;
  RunOptions run;
  Precision precision;
  std::unique_ptr<Task> task;
  std::shared_ptr<const Dataset> eval_data;
  std::unique_ptr<GlobalOrder> order;
  int64_t total_steps = 0;
  std::unique_ptr<ReplicaGroups> groups;    // who sums gradients every step, and who meets in the outer sync
  std::unique_ptr<StepOptimizer> optimizer;  // whole, or this rank's range of the state (dist.shard)
  std::unique_ptr<ReplicaSync> replicas;  // dist.sync: gradient sums every step, or local steps
  LrSchedule schedule;
  std::unique_ptr<Balancer> balancer;
  std::unique_ptr<Loader> loader;
  std::unique_ptr<SpeedBalance> speed_balance;  // data.balance = auto; made in begin()
  std::unique_ptr<ComputeClock> compute_clock;  // data.balance = auto: times forward and backward
  std::unique_ptr<DeviceFeed> feed;             // stages each step's batch on the device
  std::unique_ptr<Keeper> keeper;               // checkpoints, the best one, early stopping
  std::unique_ptr<TrainLog> log;                // progress and train lines
  std::unique_ptr<RunDirLock> run_lock;  // rank 0's: RUN_DIR/.lock, released when the run ends cleanly
  std::shared_ptr<Reporter> reporter;  // rank 0's; a silent one elsewhere
  std::ofstream sample_log;            // log.sample-ids: this rank's ids per step
  TrainState state;
  Clock::time_point step_start = Clock::now();
  int64_t world_start_step = 0;  // where this world began (data.balance measures each world afresh)
  int64_t last_eval_step = -1;
  std::string last_eval_text;  // "; test:  accuracy 0.8873  loss 0.3089"
  RunSummary summary;
  torch::Tensor rng_mark;       // this rank's generator at the last step boundary (elastic handover)
  Cursor step_cursor;           // where the last step's global batch started (elastic handover)
  std::optional<TrainReport> last_line;  // the last train line built, written or not (elastic handover)
  bool joiners_agreed = false;  // elastic: the last stop check found newcomers waiting
  std::optional<SyncMark> sync_mark;  // dist.sync = local: the last sync (elastic handover)
  void mark_sync();

  // The parts whose state the checkpoint and the hand-over carry beside the
  // model, optimizer and position (StatePart): one list, in restore order.
  std::vector<StatePart*> state_parts() { return {&state.scaler, replicas.get()}; }
  std::vector<const StatePart*> state_parts() const { return {&state.scaler, replicas.get()}; }

  const Handover* held() const { return run.peers() ? run.peers()->held.get() : nullptr; }
  std::shared_ptr<const Handover> handover() const;
  void admit_joiners() const;
  void open_outputs();
  void begin();
  StepParts step_parts() const;
  StepBatch next_batch();
  void finish_step(const StepBatch& batch, const StepResult& result);
  void rebalance(const StepResult& result);
  void log_train(int64_t epoch);
  bool line_due() const { return due(cfg.log.every_steps) || state.step == total_steps; }
  void save();
  void run_eval();
  bool eval_due(const StepBatch& batch) const;
  bool stop_agreed();
  bool early_stop();
  RunSummary end();
  bool due(int64_t every) const { return every > 0 && state.step % every == 0; }
};

}  // namespace cohort
