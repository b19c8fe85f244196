#include "cohort/train/loop/reporting.hpp"

#include <algorithm>

#include "cohort/core/format.hpp"
#include "cohort/data/balance.hpp"
#include "cohort/data/dataset.hpp"
#include "cohort/data/order.hpp"
#include "cohort/distributed/comm.hpp"
#include "cohort/obs/mlflow.hpp"
#include "cohort/train/lifecycle/run_dir.hpp"
#include "cohort/train/lifecycle/runtime.hpp"
#include "cohort/train/task.hpp"

namespace cohort {

std::shared_ptr<ReporterFanOut> default_reporter(const RunOptions& run, const LogOptions& log) {
  auto fan = std::make_shared<ReporterFanOut>();
  RunDir dir(run.out_dir);
  if (!run.quiet) fan->add(std::make_shared<ConsoleReporter>(run.live_progress));
  fan->add(std::make_shared<MetricsFileReporter>(dir.metrics_file()));
  if (log.tensorboard) fan->add(std::make_shared<TensorBoardReporter>(dir.tensorboard_dir()));
  if (!log.mlflow.empty()) {
    MlflowTarget t;
    t.uri = log.mlflow;
    t.experiment = log.mlflow_experiment;
    t.run_name = log.mlflow_run_name;
    t.run_dir = run.out_dir;
    t.config_toml = run.config_toml;
    t.source = run.evaluation ? "cohort eval" : "cohort train";
    t.continue_run = run.mode() == RunMode::kResume;
    t.keep_status = run.evaluation;
    fan->add(std::make_shared<MlflowReporter>(std::move(t)));
  }
  return fan;
}

std::shared_ptr<Reporter> rank_reporter(const RunOptions& run, const World& world, const LogOptions& log) {
  if (!world.is_main()) return std::make_shared<Reporter>();
  if (run.reporter) return run.reporter;
  return default_reporter(run, log);
}

void report_phases(Comm& comm, const PhaseTimer& timer, TrainReport& r) {
  auto mine = torch::tensor(timer.per_step(), torch::kFloat64);
  auto all = torch::stack(comm.all_gather(mine, "step-time report"));  // [ranks, phases]
  auto worst = std::get<0>(all.max(0));
  auto col = [&](Phase p) { return all.select(1, static_cast<int64_t>(p)); };
  auto compute = col(Phase::kForward) + col(Phase::kBackward) + col(Phase::kOptim);
  r.slowest_rank = static_cast<int>(compute.argmax().item<int64_t>());
  r.idle_ms = (compute.max() - compute).mean().item<double>() * 1e3;
  for (int i = 0; i < kPhaseCount; ++i) {
    r.phase_ms.emplace_back(phase_name(static_cast<Phase>(i)), worst[i].item<double>() * 1e3);
  }
}

std::vector<std::string> start_lines(const Config& cfg, Task& task, const Dataset& eval, Precision precision,
                                     const World& world, const GlobalOrder& order, const LrSchedule& schedule,
                                     const Balancer& balancer, int64_t step, int64_t total_steps) {
  std::vector<std::string> out;
  int64_t params = 0;
  for (const auto& p : task.module()->parameters()) params += p.numel();
  out.push_back(strf("cohort: %s, %lld parameters, %s on %s, %d thread(s) of %d core(s)", cfg.model.name.c_str(),
                     static_cast<long long>(params), name_of(precision), world.device.str().c_str(),
                     torch::get_num_threads(), available_cores()));
  out.push_back("cohort: train " + task.train_set().describe());
  out.push_back("cohort: eval  " + eval.describe());
  const MicroBatches cut{cfg.data.micro_batch};
  const int64_t g = cfg.data.global_batch, micro_batches = cut.count(g);
  const int64_t largest = cut.at(g, 0).size(), smallest = cut.at(g, micro_batches - 1).size();
  out.push_back(strf("cohort: global batch %lld = %lld micro-batch(es) of %s sample(s) over %d rank(s); %lld "
                     "steps/epoch, %lld steps total; %s schedule, peak lr %g, %lld warmup steps",
                     static_cast<long long>(g), static_cast<long long>(micro_batches),
                     (largest == smallest ? strf("%lld", static_cast<long long>(largest))
                                          : strf("%lld-%lld", static_cast<long long>(smallest),
                                                 static_cast<long long>(largest))).c_str(),
                     world.world_size, static_cast<long long>(order.steps_per_epoch()),
                     static_cast<long long>(total_steps), name_of(schedule.kind), schedule.peak,
                     static_cast<long long>(schedule.warmup)));
  if (cfg.data.micro_batch == 0 && smallest < 8 && g >= 16) {
    // The automatic cut keeps a multiple of 12 micro-batches: small ones
    // are slow (a BERT step of 5-sample pieces runs several times slower).
    const int64_t larger = std::min<int64_t>(g, MicroBatches::kAutoMost);
    out.push_back(strf("cohort: note: the automatic cut makes micro-batches of only %lld-%lld sample(s), so that 1 "
                       "to 12 ranks get equal shares; data.micro-batch %lld computes %lld larger one(s), faster "
                       "(equal shares for ranks that divide that count)",
                       static_cast<long long>(smallest), static_cast<long long>(largest),
                       static_cast<long long>(larger), static_cast<long long>(MicroBatches{larger}.count(g))));
  }
  if (balancer.mode() == Balance::kEqual && micro_batches % world.world_size != 0) {
    // The step waits for the rank with the most: say what evens it out.
    int64_t even = largest;
    while (even > 1 && MicroBatches{even}.count(g) % world.world_size != 0) --even;
    const bool found = MicroBatches{even}.count(g) % world.world_size == 0;
    even = MicroBatches{even}.at(g, 0).size();  // the same cut, named by its largest
    out.push_back(strf("cohort: note: the %lld micro-batch(es) do not divide evenly over %d ranks (%s)%s",
                       static_cast<long long>(micro_batches), world.world_size,
                       describe_split(balancer.shares()).c_str(),
                       found ? strf("; data.micro-batch %lld deals them evenly", static_cast<long long>(even)).c_str()
                             : ""));
  }
  const int64_t most_per_rank = *std::max_element(balancer.shares().begin(), balancer.shares().end());
  if (cfg.dist.shard == ShardMode::kGradients && world.world_size > 1 && most_per_rank > 1) {
    out.push_back(strf("cohort: note: dist.shard gradients sums every micro-batch over the ranks (%lld a step here); "
                       "a larger data.micro-batch sends fewer sums",
                       static_cast<long long>(most_per_rank)));
  }
  if (balancer.mode() != Balance::kEqual) {
    out.push_back(strf("cohort: balance %s: %s", name_of(balancer.mode()), describe_split(balancer.shares()).c_str()));
  }
  if (step >= total_steps) {
    out.push_back(strf("cohort: nothing to do: already at step %lld of %lld (raise train.max-steps or train.epochs)",
                       static_cast<long long>(step), static_cast<long long>(total_steps)));
  }
  return out;
}

}  // namespace cohort
