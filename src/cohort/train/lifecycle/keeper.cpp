#include "cohort/train/lifecycle/keeper.hpp"

#include "cohort/core/clock.hpp"
#include "cohort/core/format.hpp"
#include "cohort/distributed/comm.hpp"
#include "cohort/obs/metrics_log.hpp"
#include "cohort/obs/reporter.hpp"
#include "cohort/train/lifecycle/run_dir.hpp"
#include "cohort/train/lifecycle/startup.hpp"
#include "cohort/train/lifecycle/train_state.hpp"
#include "cohort/train/optimization/replica_sync.hpp"
#include "cohort/train/optimization/step_optimizer.hpp"
#include "cohort/train/task.hpp"

namespace cohort {

Keeper::Keeper(Comm& comm, Task& task, StepOptimizer& optimizer, ReplicaSync& replicas,
               std::vector<const StatePart*> parts, TrainState& state,
               const std::string& out_dir, int keep, std::string config_toml, BestMetric best)
    : comm_(comm),
      task_(task),
      optimizer_(optimizer),
      replicas_(replicas),
      parts_(std::move(parts)),
      state_(state),
      out_dir_(out_dir),
      config_toml_(std::move(config_toml)),
      checkpoints_(out_dir, keep),
      best_(std::move(best)) {}

void Keeper::note_best_so_far(const RunDir& dir, const std::string& eval_split) {
  auto b = Checkpoints::best(out_dir_);
  if (b.step >= 0 && b.metric == best_.metric()) {
    so_far_ = {1.0, b.value, static_cast<double>(b.step), static_cast<double>(dir.eval_steps_after(eval_split, b.step))};
  }
}

void Keeper::agree_best_so_far() {
  so_far_ = comm_.all_reduce_sum(so_far_, "best checkpoint so far");
  if (so_far_[0] > 0) best_.restore(so_far_[1], static_cast<int64_t>(so_far_[2]), static_cast<int64_t>(so_far_[3]));
}

void Keeper::save(Reporter& reporter) {
  if (last_step_ == state_.step) return;  // already written this step (ckpt.best-metric)
  last_step_ = state_.step;
  auto t0 = Clock::now();
  TrainState::Snapshot snapshot = state_.capture(comm_, task_.train_set().size(), parts_);
  optimizer_.write_ranges(comm_, checkpoints_, state_.step, snapshot.state);  // dist.shard: each range's file
  // Every rank fails with rank 0's write error (a full disk: exit 1, the
  // file named), instead of waiting in a barrier for a rank that is gone.
  on_main_then_agree(comm_, "checkpoint write", [&] {
    std::string dir;
    replicas_.with_synced([&] {
      dir = checkpoints_.write(snapshot.state, module_tensors(*task_.module()), optimizer_.optimizer(), snapshot.rng,
                               config_toml_);
    });
    reporter.message(strf("ckpt  step %lld  %s  (%s)", static_cast<long long>(state_.step), dir.c_str(),
                          format_duration(seconds_since(t0)).c_str()));
  });
}

void Keeper::after_eval(const EvalReport& r, Reporter& reporter) {
  if (!best_.improved(r, state_.step)) return;
  save(reporter);
  if (comm_.world().is_main()) {
    checkpoints_.mark_best(state_.step, best_.metric(), best_.value());
    reporter.message(strf("best  step %lld  %s %.4f", static_cast<long long>(state_.step), best_.metric().c_str(),
                          best_.value()));
  }
}

std::string Keeper::early_stop(int64_t total_steps, Reporter& reporter) {
  std::string why = best_.patience_ran_out();
  if (why.empty() || state_.step == total_steps) return "";
  reporter.message(strf("cohort: %s at step %lld; the best checkpoint is kept (checkpoints/best.json)", why.c_str(),
                        static_cast<long long>(state_.step)));
  return why;
}

}  // namespace cohort
