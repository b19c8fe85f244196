#include "cohort/train/loop/evaluate.hpp"

#include <nlohmann/json.hpp>
#include <torch/autograd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "cohort/ckpt/checkpoint.hpp"
#include "cohort/config/config.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/files.hpp"
#include "cohort/core/format.hpp"
#include "cohort/data/loader.hpp"
#include "cohort/distributed/comm.hpp"
#include "cohort/obs/mlflow.hpp"
#include "cohort/obs/plot.hpp"
#include "cohort/obs/reporter.hpp"
#include "cohort/train/lifecycle/run.hpp"
#include "cohort/train/lifecycle/run_dir.hpp"
#include "cohort/train/lifecycle/runtime.hpp"
#include "cohort/train/loop/phase_timer.hpp"
#include "cohort/train/loop/reporting.hpp"
#include "cohort/train/task.hpp"

namespace cohort {

namespace fs = std::filesystem;

namespace {

// `cohort eval` and `predict` on a terminal: one line on stderr, redrawn at
// most twice a second from rank 0's share (every rank's is the same size,
// to a sample), cleared when done.
class ProgressLine {
 public:
  ProgressLine(std::string what, bool on) : what_(std::move(what)), on_(on), start_(Clock::now()) {}
  ~ProgressLine() {
    if (drawn_) std::fprintf(stderr, "\r\033[K");
  }
  EvalProgress callback() {
    if (!on_) return nullptr;
    return [this](int64_t done, int64_t share) {
      const auto now = Clock::now();
      if (done < share && now - last_ < std::chrono::milliseconds(500)) return;
      last_ = now;
      drawn_ = true;
      std::fprintf(stderr, "\r\033[K%s: %3.0f%% of this rank's %lld samples, %.0f s", what_.c_str(),
                   share > 0 ? 100.0 * static_cast<double>(done) / static_cast<double>(share) : 100.0,
                   static_cast<long long>(share), seconds_since(start_));
      std::fflush(stderr);
    };
  }

 private:
  std::string what_;
  bool on_;
  Clock::time_point start_, last_{};
  bool drawn_ = false;
};

}  // namespace

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
  // The batches' metrics stay on the device until the end: one read.
  DeviceTally sums;
  for (int64_t begin = mine.begin; begin < mine.end; begin += run.batch) {
    std::vector<int64_t> ids;
    for (int64_t i = begin; i < std::min(mine.end, begin + run.batch); ++i) ids.push_back(i);
    Example batch = gather(data, ids);
    task.add_host_inputs(batch);
    sums.merge(task.forward(to_device(batch, world.device)).tally);
    if (run.progress) run.progress(ids.back() + 1 - mine.begin, mine.size());
  }
  module->train(was_training);
  Tally tally = sums.read(task.empty_tally());
  tally.unflatten(comm.all_reduce_sum(tally.flatten(), "evaluation metrics"));
  return tally;
}

EvalReport evaluate_report(Task& task, const Dataset& data, Comm& comm, const EvalOptions& opts, int64_t step,
                           Tally* reduced, const EvalProgress& progress) {
  auto t0 = Clock::now();
  Tally tally = evaluate(task, data, comm, {opts.batch, opts.max_samples, progress});
  if (reduced) *reduced = tally;
  EvalReport r;
  r.step = step;
  r.split = opts.split;
  r.count = static_cast<int64_t>(tally.count(task.count_metric()));
  r.metrics = task.report(tally);
  r.seconds = seconds_since(t0);
  return r;
}

RunSummary evaluate_checkpoint(const Config& cfg, Comm& comm, const RunOptions& run,
                               const std::string& confusion_png) {
  COHORT_CHECK(run.checkpoint() != nullptr, UsageError, "cohort eval needs a checkpoint");
  const ResolvedCheckpoint& from = *run.checkpoint();
  auto start = Clock::now();
  const World& world = comm.world();
  seed_rngs(cfg.train.seed, world.rank);
  std::unique_ptr<Task> task = make_task(cfg, world);
  load_model_weights(*task->module(), from.file("model.safetensors"));
  COHORT_CHECK(confusion_png.empty() || !task->confusion(task->empty_tally()).empty(), UsageError,
               "--plot draws a confusion matrix, and task ", cfg.train.task, " keeps none");
  COHORT_CHECK(confusion_png.empty() || gnuplot_available(), UsageError,
               "--plot needs gnuplot, which is not installed (apt-get install gnuplot-nox)");
  auto data = task->eval_set(cfg.eval.split);
  std::shared_ptr<Reporter> reporter = rank_reporter(run, world, cfg.log);
  for (const auto& note : run.notes) reporter->message("cohort: " + note);
  Tally tally;
  EvalReport r;
  {
    ProgressLine progress("eval " + cfg.eval.split, run.live_progress && world.is_main());
    r = evaluate_report(*task, *data, comm, cfg.eval, from.state.step, &tally, progress.callback());
  }
  r.source = "cohort eval";
  if (world.is_main()) {
    // Another evaluation of a step already evaluated goes beside the earlier
    // ones (MLflow and TensorBoard cannot replace a point): say so.
    if (int64_t before = RunDir(run.out_dir).eval_lines_at(r.split, r.step); before > 0) {
      reporter->message(strf("cohort: metrics.jsonl already holds %lld %s evaluation(s) of step %lld: this one is added "
                             "beside them, marked \"source\": \"cohort eval\" (MLflow and TensorBoard keep each "
                             "point at step %lld)", static_cast<long long>(before), r.split.c_str(),
                             static_cast<long long>(r.step), static_cast<long long>(r.step)));
    }
  }
  reporter->eval(r);
  Task::EvalDetails details = task->eval_details(tally);
  if (!details.summary.empty()) reporter->message(details.summary);
  if (!details.table.empty() && world.is_main()) {
    const std::string table = (fs::path(run.out_dir) / ("confusion-" + r.split + "-step-" + std::to_string(r.step) +
                                                        ".txt")).string();
    write_file_atomically(table, details.table);
    reporter->message("cohort: confusion matrix: " + table);
  }
  if (!confusion_png.empty() && world.is_main()) {
    plot_confusion(confusion_png, task->class_names(), task->confusion(tally),
                   "confusion matrix: " + cfg.eval.split + " at step " + std::to_string(r.step) + ", " +
                       std::to_string(r.count) + " samples");
    reporter->message("cohort: wrote " + confusion_png);
  }
  reporter->finish(true);
  reporter.reset();  // an MLflow run is sent and recorded before the heatmap joins it
  if (!confusion_png.empty() && world.is_main() && !cfg.log.mlflow.empty()) {
    std::string sent = mlflow_upload_to_run(cfg.log.mlflow, run.out_dir,
                                            {{confusion_png, fs::path(confusion_png).filename().string()}});
    if (!run.quiet) std::printf("cohort: %s\n", sent.c_str());
  }
  RunSummary summary;
  summary.steps = from.state.step;
  summary.final_eval_loss = metric_value(r.metrics, "loss");
  summary.final_eval_accuracy = metric_value(r.metrics, "accuracy");
  summary.seconds = seconds_since(start);
  return summary;
}

int64_t predict_checkpoint(const Config& cfg, Comm& comm, const RunOptions& run, const std::string& input,
                           const std::string& output) {
  COHORT_CHECK(run.checkpoint() != nullptr, UsageError, "cohort predict needs a checkpoint");
  const ResolvedCheckpoint& from = *run.checkpoint();
  const World& world = comm.world();
  seed_rngs(cfg.train.seed, world.rank);
  std::unique_ptr<Task> task = make_task(cfg, world);
  load_model_weights(*task->module(), from.file("model.safetensors"));
  auto data = task->input_set(input);
  const auto classes = task->class_names();
  const int64_t n = data->size(), k = static_cast<int64_t>(classes.size());
  COHORT_CHECK(n > 0 && k > 0, DataError, input, ": nothing to predict");
  Slice mine = eval_shard(n, world.rank, world.world_size);
  // This rank's rows, padded to the largest share: [rows, k probabilities + true label].
  const int64_t rows = (n + world.world_size - 1) / world.world_size;
  auto out = torch::zeros({rows, k + 1}, torch::kFloat64);
  auto module = task->module();
  module->eval();
  torch::NoGradGuard no_grad;
  ProgressLine line("predict", run.live_progress && world.is_main());
  auto progress = line.callback();
  for (int64_t begin = mine.begin; begin < mine.end; begin += cfg.eval.batch) {
    std::vector<int64_t> ids;
    for (int64_t i = begin; i < std::min(mine.end, begin + cfg.eval.batch); ++i) ids.push_back(i);
    Example batch = gather(*data, ids);
    auto probs = task->probabilities(to_device(batch, world.device)).to(torch::kCPU, torch::kFloat64);
    auto part = out.narrow(0, begin - mine.begin, static_cast<int64_t>(ids.size()));
    part.narrow(1, 0, k).copy_(probs);
    part.select(1, k).copy_(batch.count("label") ? batch.at("label").to(torch::kFloat64)
                                                  : torch::full({static_cast<int64_t>(ids.size())}, -1.0, torch::kFloat64));
    if (progress) progress(ids.back() + 1 - mine.begin, mine.size());
  }
  auto all = comm.all_gather(out, "predictions");
  if (!world.is_main()) return n;
  std::string lines;
  for (int r = 0; r < world.world_size; ++r) {
    Slice s = eval_shard(n, r, world.world_size);
    auto t = all[static_cast<size_t>(r)].contiguous();
    const double* p = t.data_ptr<double>();
    for (int64_t i = 0; i < s.size(); ++i) {
      const double* row = p + i * (k + 1);
      int64_t best = std::max_element(row, row + k) - row;
      nlohmann::ordered_json probs = nlohmann::ordered_json::object();
      for (int64_t c = 0; c < k; ++c) probs[classes[static_cast<size_t>(c)]] = row[c];
      // In reading order: which input, what it was, what was predicted.
      nlohmann::ordered_json line = {{"index", s.begin + i}};
      for (const auto& [key, value] : task->input_fields(*data, s.begin + i)) line[key] = value;
      line["label"] = classes[static_cast<size_t>(best)];
      line["probability"] = row[best];
      line["probabilities"] = probs;
      if (row[k] >= 0) line["true_label"] = classes[static_cast<size_t>(row[k])];
      lines += line.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";  // bytes that are not UTF-8 become U+FFFD
    }
  }
  write_file_atomically(output, lines);
  return n;
}

}  // namespace cohort
