#include "cohort/train/evaluate.hpp"

#include <torch/autograd.h>

#include <filesystem>

#include "cohort/core/error.hpp"
#include "cohort/data/loader.hpp"
#include "cohort/distributed/comm.hpp"
#include "cohort/ckpt/checkpoint.hpp"
#include "cohort/config/config.hpp"
#include "cohort/obs/reporter.hpp"
#include "cohort/train/phase_timer.hpp"
#include "cohort/train/run.hpp"
#include "cohort/train/runtime.hpp"
#include "cohort/train/task.hpp"
#include "cohort/train/trainer.hpp"

namespace cohort {

Tally evaluate(Task& task, const Dataset& data, Comm& comm, const EvalRun& run) {
  const World& world = comm.world();
  int64_t n = run.max_samples > 0 ? std::min(run.max_samples, data.size()) : data.size();
  COHORT_CHECK(n > 0, DataError, "evaluation set is empty (", data.describe(),
               "); set eval.split to a split with samples");
  Slice mine = eval_shard(n, world.rank, world.world_size);

  auto module = task.module();
  bool was_training = module->is_training();
  module->eval();
  torch::NoGradGuard no_grad;
  Tally tally = task.empty_tally();
  for (int64_t begin = mine.begin; begin < mine.end; begin += run.batch) {
    std::vector<int64_t> ids;
    for (int64_t i = begin; i < std::min(mine.end, begin + run.batch); ++i) ids.push_back(i);
    tally.merge(task.forward(to_device(gather(data, ids), world.device)).tally);
  }
  module->train(was_training);
  tally.unflatten(comm.all_reduce_sum(tally.flatten(), "evaluation metrics"));
  return tally;
}

EvalReport evaluate_report(Task& task, const Dataset& data, Comm& comm, const EvalOptions& opts, int64_t step) {
  auto t0 = Clock::now();
  Tally tally = evaluate(task, data, comm, {opts.batch, opts.max_samples});
  EvalReport r;
  r.step = step;
  r.split = opts.split;
  r.count = static_cast<int64_t>(tally.count(task.count_metric()));
  r.metrics = task.report(tally);
  r.seconds = seconds_since(t0);
  return r;
}

RunSummary evaluate_checkpoint(const Config& cfg, Comm& comm, const RunOptions& run) {
  COHORT_CHECK(run.resume.has_value(), UsageError, "cohort eval needs a checkpoint");
  auto start = Clock::now();
  const World& world = comm.world();
  seed_rngs(cfg.train.seed, world.rank);
  std::unique_ptr<Task> task = make_task(cfg, world);
  load_model_weights(*task->module(), (std::filesystem::path(run.resume->dir) / "model.safetensors").string());
  auto data = task->eval_set(cfg.eval.split);
  std::shared_ptr<Reporter> reporter = rank_reporter(run, world, /*tensorboard=*/false);
  for (const auto& note : run.notes) reporter->message("cohort: " + note);
  EvalReport r = evaluate_report(*task, *data, comm, cfg.eval, run.resume->state.step);
  reporter->eval(r);
  RunSummary summary;
  summary.steps = run.resume->state.step;
  summary.final_eval_loss = metric_value(r.metrics, "loss");
  summary.final_eval_accuracy = metric_value(r.metrics, "accuracy");
  summary.seconds = seconds_since(start);
  return summary;
}

}  // namespace cohort
