#include "cohort/train/trainer.hpp"


#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "cohort/ckpt/checkpoint.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/sha256.hpp"
#include "cohort/data/loader.hpp"
#include "cohort/dist/comm.hpp"
#include "cohort/dist/grad_sync.hpp"
#include "cohort/obs/metrics_log.hpp"
#include "cohort/obs/tensorboard.hpp"
#include "cohort/train/evaluate.hpp"
#include "cohort/train/optim.hpp"
#include "cohort/train/precision.hpp"
#include "cohort/train/runtime.hpp"
#include "cohort/train/stop.hpp"
#include "cohort/train/task.hpp"

namespace cohort {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A reported metric by name (0 when absent).
double metric(const std::vector<std::pair<std::string, double>>& metrics, const std::string& name) {
  for (const auto& [n, v] : metrics) {
    if (n == name) return v;
  }
  return 0.0;
}

std::string format_metric(const std::string& name, double value) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "  %s %.4f", name.c_str(), value);
  return buf;
}

// Zeroes gradients in place. (libtorch's Optimizer::zero_grad detaches them
// in place, which views into GradSync's buckets do not allow.)
void zero_gradients(torch::nn::Module& module) {
  torch::NoGradGuard no_grad;
  for (auto& p : module.parameters()) {
    if (p.grad().defined()) p.mutable_grad().zero_();
  }
}

// The config lines every rank must share: all but per-node settings (threads,
// device, loader, data location, timeouts, logging).
std::string shared_config(const std::string& toml) {
  static const char* const kPerNode[] = {"train.threads", "train.device", "data.workers", "data.prefetch",
                                         "data.path", "dist.timeout", "log."};
  std::string out;
  for (const auto& [key, value] : read_config_values(toml)) {
    bool local = false;
    for (const char* k : kPerNode) local = local || key.rfind(k, 0) == 0;
    if (!local) out += key + "=" + value + "\n";
  }
  return out;
}

// On resume, steps after the checkpoint are trained again: drop their old
// lines so metrics.jsonl holds each step once.
void drop_metrics_after(const std::string& path, int64_t step) {
  std::ifstream in(path);
  if (!in) return;
  std::string kept, line;
  while (std::getline(in, line)) {
    try {
      if (nlohmann::json::parse(line).value("step", int64_t{0}) > step) continue;
    } catch (const std::exception&) {
      continue;  // a torn last line from a crash
    }
    kept += line + "\n";
  }
  std::ofstream out(path + ".tmp");
  out << kept;
  out.flush();
  COHORT_CHECK(out.good(), Error, path, ".tmp: write failed (disk full?)");
  out.close();
  fs::rename(path + ".tmp", path);
}

void prepare_run_dir(const RunOptions& run) {
  COHORT_CHECK(!run.out_dir.empty(), UsageError, "--out RUN_DIR is required");
  fs::path dir(run.out_dir);
  COHORT_CHECK(run.overwrite || !run.resume_dir.empty() || !fs::exists(dir / "metrics.jsonl"), UsageError,
               run.out_dir, " already holds a run (metrics.jsonl); choose a new --out, continue it with --resume ",
               run.out_dir, ", or pass --overwrite");
  std::error_code ec;
  fs::create_directories(dir, ec);
  COHORT_CHECK(!ec, Error, run.out_dir, ": cannot create directory (", ec.message(), ")");
  if (run.overwrite && run.resume_dir.empty()) {
    fs::remove(dir / "metrics.jsonl", ec);
    fs::remove_all(dir / "checkpoints", ec);
    fs::remove_all(dir / "sample-ids", ec);
  }
  std::ofstream cfg(dir / "config.toml");
  cfg << run.config_toml;
  COHORT_CHECK(cfg.good(), Error, (dir / "config.toml").string(), ": write failed");
}

}  // namespace

struct Trainer::State {
  Config cfg;
  Comm* comm = nullptr;
  World world;
  RunOptions run;
  Runtime runtime;
  std::unique_ptr<Task> task;
  std::unique_ptr<GlobalOrder> order;
  std::unique_ptr<Loader> loader;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<GradSync> grad_sync;
  LrSchedule schedule;
  std::string precision;  // resolved: fp32 | bf16 | fp16
  LossScaler scaler{false};
  MetricsLog log;
  TensorBoardWriter tensorboard;
  std::shared_ptr<const Dataset> eval_data;
  std::unique_ptr<Checkpoints> checkpoints;
  std::ofstream sample_log;  // log.sample-ids: this rank's ids per step

  int64_t step = 0;
  int64_t start_step = 0;  // where this session began (after a resume)
  int64_t total_steps = 0;
  int64_t samples_seen = 0;
  Cursor cursor;
  Tally interval;  // training metrics since the last log line
  // Seconds per phase since the last log line, on this rank: data wait,
  // forward, backward, exposed communication, optimizer; and whole steps.
  std::array<double, 6> phases{};
  int64_t interval_steps = 0;
  int64_t interval_units = 0;
  Clock::time_point interval_start = Clock::now();
  Clock::time_point start = Clock::now();
  RunSummary summary;

  void say(const char* fmt, ...) const __attribute__((format(printf, 2, 3)));
  // On a terminal, rank 0 redraws one status line after every step (at most
  // ten times a second); plain log lines scroll above it.
  bool tty = false;
  mutable bool bar_shown = false;
  Clock::time_point last_bar = Clock::now();
  double last_loss = 0, last_rate = 0;
  void progress(int64_t epoch);
  void announce_plan() const;
  double train_step(const StepBatch& batch);
  void log_train(int64_t epoch);
  void run_eval();
  void resume(const std::string& dir);
  void save_checkpoint();
  void begin();
  RunSummary end();
  StepBatch next_batch();
  void finish_step(const StepBatch& batch);
  bool eval_due(const StepBatch& batch) const;
  bool stop_agreed();
  Clock::time_point step_start = Clock::now();
  int64_t last_eval_step = -1;
  std::string last_eval_text;  // "; test accuracy 0.8873 loss 0.3089"
  bool due(int64_t every) const { return every > 0 && step % every == 0; }
};

void Trainer::State::say(const char* fmt, ...) const {
  if (run.quiet || !world.is_main()) return;
  if (bar_shown) {
    std::fputs("\r\033[K", stdout);  // clear the status line first
    bar_shown = false;
  }
  va_list args;
  va_start(args, fmt);
  std::vprintf(fmt, args);
  va_end(args);
  std::fflush(stdout);
}

Trainer::Trainer(Config cfg, Comm& comm, RunOptions run) : s_(std::make_unique<State>()) {
  State& s = *s_;
  s.cfg = std::move(cfg);
  s.comm = &comm;
  s.world = comm.world();
  s.run = std::move(run);
  validate(s.cfg);
  s.runtime = setup_runtime(s.cfg.train, s.world);
  s.precision = resolve_precision(s.cfg.train.precision, s.world.device);
  // "auto" follows each machine's CPU; mixed machines would train in mixed
  // precisions, so bf16 only where every rank has it.
  // (Every multi-rank CPU job runs this collective, whatever its setting, so
  // ranks started with different configs still meet the start-up check.)
  if (s.world.world_size > 1 && !s.world.device.is_cuda()) {
    double with_bf16 = comm.all_reduce_sum(std::vector<double>{s.precision == "bf16" ? 1.0 : 0.0},
                                           "precision check")[0];
    if (s.cfg.train.precision == "auto" && with_bf16 < s.world.world_size) s.precision = "fp32";
  }
  s.scaler = LossScaler(s.precision == "fp16");

  s.task = make_task(s.cfg, s.world);
  // model.init: rank 0 reads the weights and the broadcast gives them to all.
  if (!s.cfg.model.init.empty() && s.run.resume_dir.empty() && s.world.is_main()) {
    load_model_weights(*s.task->module(), model_weights_file(s.cfg.model.init));
  }
  broadcast_module(comm, *s.task->module());
  GradSyncOptions gs;
  gs.bucket_cap_bytes = static_cast<int64_t>(s.cfg.dist.bucket_cap_mb * (1 << 20));
  gs.compression = s.cfg.dist.grad_compression;
  s.grad_sync = std::make_unique<GradSync>(comm, *s.task->module(), gs);
  s.eval_data = s.task->eval_set(s.cfg.eval.split);
  const Dataset& train = s.task->train_set();
  Bucketing bucketing;
  if (s.cfg.data.bucket > 0) {
    COHORT_CHECK(train.size() == 0 || train.length(0) >= 0, ConfigError,
                 "data.bucket needs samples with lengths; train.task ", s.cfg.train.task, " has none");
    bucketing = {s.cfg.data.bucket, [&train](int64_t i) { return train.length(i); }};
  }
  s.order = std::make_unique<GlobalOrder>(train.size(), s.cfg.data.global_batch, s.cfg.train.seed,
                                          s.cfg.data.drop_last, std::move(bucketing));
  s.total_steps = s.cfg.train.max_steps > 0 ? s.cfg.train.max_steps
                                             : s.cfg.train.epochs * s.order->steps_per_epoch();
  s.optimizer = make_optimizer(s.cfg.optim, *s.task->module());
  s.schedule = LrSchedule::from(s.cfg.optim, s.total_steps);
  s.interval = s.task->empty_tally();
  if (!s.run.resume_dir.empty()) s.resume(s.run.resume_dir);

  if (s.run.eval_only) {
    if (s.world.is_main()) s.log = MetricsLog((fs::path(s.run.out_dir) / "metrics.jsonl").string());
    return;
  }
  LoaderOptions lo;
  lo.rank = s.world.rank;
  lo.world_size = s.world.world_size;
  lo.accum_steps = s.cfg.optim.accum_steps;
  lo.workers = s.cfg.data.workers;
  lo.prefetch = s.cfg.data.prefetch;
  s.loader = std::make_unique<Loader>(train, *s.order, lo, s.cursor);
  s.checkpoints = std::make_unique<Checkpoints>(s.run.out_dir, s.cfg.ckpt.keep);
  // Ranks started with different configs or data would drift or hang later:
  // check now, naming the rank and what differs.
  auto hash = std::stoull(sha256_hex(shared_config(s.run.config_toml)).substr(0, 15), nullptr, 16);
  comm.agree({static_cast<int64_t>(hash), train.size(), s.total_steps, s.step},
             {"config hash", "training samples", "total steps", "start step"}, "start-up");
  // Only now, with config, model and data all accepted, touch the run dir.
  if (s.world.is_main()) prepare_run_dir(s.run);
  comm.barrier("run directory set-up");
  if (s.world.is_main() && !s.run.resume_dir.empty()) {
    drop_metrics_after((fs::path(s.run.out_dir) / "metrics.jsonl").string(), s.step);
  }
  if (s.world.is_main()) s.log = MetricsLog((fs::path(s.run.out_dir) / "metrics.jsonl").string());
  if (s.world.is_main() && s.cfg.log.tensorboard) {
    s.tensorboard = TensorBoardWriter((fs::path(s.run.out_dir) / "tensorboard").string());
  }
  if (s.cfg.log.sample_ids) {
    fs::create_directories(fs::path(s.run.out_dir) / "sample-ids");
    s.sample_log.open(fs::path(s.run.out_dir) / "sample-ids" / ("rank-" + std::to_string(s.world.rank) + ".jsonl"),
                      std::ios::app);
  }
}

// Loads a verified checkpoint: weights, optimizer, step and cursor; this
// rank's RNG state when the world size is unchanged (at another world size
// ranks keep their seed-derived streams: dropout masks are drawn per rank).
void Trainer::State::resume(const std::string& dir) {
  CheckpointState st = Checkpoints::verify(dir);
  load_model_weights(*task->module(), (fs::path(dir) / "model.safetensors").string());
  step = st.step;
  cursor = st.cursor;
  samples_seen = st.samples_seen;
  if (run.eval_only) return;  // weights only: the run's checkpoints stay as they are
  torch::load(*optimizer, (fs::path(dir) / "optimizer.pt").string());
  auto rng = load_safetensors((fs::path(dir) / "rng.safetensors").string());
  if (auto ls = rng.tensors.find("loss_scaler"); ls != rng.tensors.end()) scaler.restore(ls->second);
  if (st.world_size == world.world_size) {
    auto it = rng.tensors.find("rank." + std::to_string(world.rank));
    COHORT_CHECK(it != rng.tensors.end(), DataError, dir, "/rng.safetensors lacks rank.", world.rank);
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(it->second.to(torch::kUInt8));
  }
  // Checkpoints newer than the one resumed belong to an abandoned future:
  // move them aside (never delete) so `latest` and pruning see this line.
  if (world.is_main()) {
    fs::path root = fs::path(run.out_dir) / "checkpoints";
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(root, ec)) {
      std::string n = e.path().filename().string();
      if (Checkpoints::step_of(n) <= step) continue;
      fs::path target = root / ("abandoned-" + n);
      for (int k = 2; fs::exists(target); ++k) target = root / ("abandoned-" + n + "-" + std::to_string(k));
      fs::rename(e.path(), target, ec);
      COHORT_CHECK(!ec, Error, "cannot move aside newer checkpoint ", e.path().string(), ": ", ec.message());
      run.notes.push_back("moved aside newer checkpoint " + n + " (now " + target.filename().string() + ")");
    }
  }
  COHORT_CHECK(cursor.consumed < order->usable(), DataError, dir, ": cursor ", cursor.consumed,
               " is outside the epoch's ", order->usable(), " samples: is this the same dataset?");
  char buf[256];
  std::snprintf(buf, sizeof buf, "resumed from %s: step %lld, epoch %lld, %lld samples into the epoch (written by %d "
                "rank(s), now %d)", dir.c_str(), static_cast<long long>(step), static_cast<long long>(cursor.epoch),
                static_cast<long long>(cursor.consumed), st.world_size, world.world_size);
  run.notes.push_back(buf);
}

void Trainer::State::save_checkpoint() {
  auto t0 = Clock::now();
  auto& module = *task->module();
  NamedTensors model;
  for (auto& item : module.named_parameters()) model.emplace_back(item.key(), item.value());
  for (auto& item : module.named_buffers()) model.emplace_back(item.key(), item.value());
  torch::Tensor state;
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    state = gen.get_state().to(torch::kInt64);
  }
  auto states = comm->all_gather(state, "checkpoint RNG gather");
  if (world.is_main()) {
    NamedTensors rng;
    for (size_t r = 0; r < states.size(); ++r) rng.emplace_back("rank." + std::to_string(r), states[r].to(torch::kUInt8));
    if (scaler.enabled()) rng.emplace_back("loss_scaler", scaler.state());
    CheckpointState st;
    st.step = step;
    st.cursor = cursor;
    st.samples_seen = samples_seen;
    st.world_size = world.world_size;
    std::string dir = checkpoints->write(st, model, *optimizer, rng, run.config_toml);
    say("ckpt  step %lld  %s  (%s)\n", static_cast<long long>(step), dir.c_str(),
        format_duration(seconds_since(t0)).c_str());
  }
  comm->barrier("checkpoint write");
}

Trainer::~Trainer() = default;

void Trainer::State::progress(int64_t epoch) {
  if (!tty || run.quiet || !world.is_main() || step == total_steps) return;
  if (Clock::now() - last_bar < std::chrono::milliseconds(100)) {
    if (!summary.step_losses.empty()) last_loss = 0.9 * last_loss + 0.1 * summary.step_losses.back();
    return;
  }
  last_bar = Clock::now();
  const int width = 24;
  int filled = static_cast<int>(width * step / std::max<int64_t>(1, total_steps));
  double eta = seconds_since(start) / static_cast<double>(std::max<int64_t>(1, step - start_step)) *
               static_cast<double>(total_steps - step);
  // Between log lines: this rank's smoothed loss and the interval's rate.
  double loss = summary.step_losses.empty() ? last_loss : summary.step_losses.back();
  last_loss = last_loss == 0 ? loss : 0.9 * last_loss + 0.1 * loss;
  double rate = interval_units / std::max(seconds_since(interval_start), 1e-9);
  if (interval_units > 0) last_rate = rate;
  std::string bar(static_cast<size_t>(filled), '#');
  bar.append(static_cast<size_t>(width - filled), '.');
  std::printf("\r\033[K[%s] %lld/%lld  epoch %lld  loss %.4f  lr %.2e  %.0f %s/s  eta %s", bar.c_str(),
              static_cast<long long>(step), static_cast<long long>(total_steps), static_cast<long long>(epoch),
              last_loss, schedule.at(step - 1), last_rate, task->unit_name().c_str(), format_duration(eta).c_str());
  std::fflush(stdout);
  bar_shown = true;
}

void Trainer::State::announce_plan() const {
  const Dataset& train = task->train_set();
  int64_t params = 0;
  for (const auto& p : task->module()->parameters()) params += p.numel();
  say("cohort: %s, %lld parameters, %s on %s, %d thread(s) of %d core(s)\n", cfg.model.name.c_str(),
      static_cast<long long>(params), precision.c_str(), world.device.str().c_str(),
      runtime.threads, runtime.cores);
  say("cohort: train %s\ncohort: eval  %s\n", train.describe().c_str(), eval_data->describe().c_str());
  say("cohort: global batch %lld = %d rank(s) x %lld accumulation step(s); %lld steps/epoch, "
      "%lld steps total; %s schedule, peak lr %g, %lld warmup steps\n",
      static_cast<long long>(cfg.data.global_batch), world.world_size,
      static_cast<long long>(cfg.optim.accum_steps), static_cast<long long>(order->steps_per_epoch()),
      static_cast<long long>(total_steps), schedule.kind.c_str(), schedule.peak,
      static_cast<long long>(schedule.warmup));
}

// One optimizer step: forward and backward over this rank's micro-batches,
// each loss divided by the global unit count, then clip and step.
double Trainer::State::train_step(const StepBatch& batch) {
  auto& module = *task->module();
  module.train();
  zero_gradients(module);
  // Global unit counts per loss term (and for throughput), known before any
  // backward: from the batch plan, or one small all-reduce.
  std::vector<double> global_units = {static_cast<double>(batch.global_samples),
                                      static_cast<double>(batch.global_samples)};
  if (!task->units_are_samples()) {
    std::vector<double> local(task->loss_terms() + 1, 0.0);
    for (const auto& micro : batch.micro) {
      if (micro.empty()) continue;
      Units u = task->count_units(micro);
      for (size_t i = 0; i < u.per_term.size(); ++i) local[i] += static_cast<double>(u.per_term[i]);
      local.back() += static_cast<double>(u.throughput);
    }
    global_units = comm->all_reduce_sum(local, "unit count");
  }
  for (size_t i = 0; i + 1 < global_units.size(); ++i) {
    COHORT_CHECK(global_units[i] > 0, Error, "step ", step, ": the global batch has no units for loss term ", i);
  }
  Tally step_tally = task->empty_tally();
  for (size_t m = 0; m < batch.micro.size(); ++m) {
    // Only the last micro-batch's backward communicates.
    grad_sync->prepare(/*sync=*/m + 1 == batch.micro.size());
    const Example& micro = batch.micro[m];
    if (micro.empty()) continue;
    TaskOutput out;
    auto t0 = Clock::now();
    {
      AutocastScope autocast(precision, world.device);
      out = task->forward(to_device(micro, world.device));
    }
    if (run.debug_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(run.debug_delay_ms));
    auto t1 = Clock::now();
    torch::Tensor loss = out.loss_sums.at(0) / global_units[0];
    for (size_t i = 1; i < out.loss_sums.size(); ++i) loss = loss + out.loss_sums[i] / global_units[i];
    scaler.scale(loss).backward();
    phases[1] += std::chrono::duration<double>(t1 - t0).count();
    phases[2] += seconds_since(t1);
    step_tally.merge(out.tally);
  }
  auto t_comm = Clock::now();
  grad_sync->finalize();
  phases[3] += seconds_since(t_comm);
  auto t_optim = Clock::now();
  interval_units += static_cast<int64_t>(global_units.back());
  // This rank's share of the step's metrics; ranks sum their interval
  // tallies at the next log line, not every step.
  double loss = metric(task->report(step_tally), "loss");
  // The gradients are all-reduced, so every rank sees the same ones and takes
  // the same decision. fp16: an overflow skips the step and lowers the loss
  // scale. Otherwise a non-finite gradient is fatal: training has diverged.
  if (scaler.unscale_and_update(module)) {
    // Gradients are already all-reduced, so this norm is the global one.
    double norm = clip_gradients(module, cfg.optim.clip_norm);
    COHORT_CHECK(std::isfinite(norm), Error, "step ", step, ": non-finite gradients (this rank's loss ", loss,
                 "); lower optim.lr or enable optim.clip-norm");
    set_lr(*optimizer, schedule.at(step));
    optimizer->step();
  }
  phases[4] += seconds_since(t_optim);
  interval.merge(step_tally);
  samples_seen += batch.global_samples;
  return loss;
}

void Trainer::State::log_train(int64_t epoch) {
  comm->agree({step, cursor.epoch, cursor.consumed}, {"step", "epoch", "cursor"}, "the step check");
  double secs = seconds_since(interval_start);
  double units_per_s = interval_units / std::max(secs, 1e-9);
  double eta = seconds_since(start) / static_cast<double>(std::max<int64_t>(1, step - start_step)) *
               static_cast<double>(total_steps - step);
  double lr = schedule.at(step - 1);
  interval.unflatten(comm->all_reduce_sum(interval.flatten(), "training metrics"));
  nlohmann::json line = {{"kind", "train"}, {"step", step},       {"epoch", epoch},
                         {"lr", lr},        {"samples", samples_seen}, {"tokens_per_s", units_per_s}};
  std::string text;
  auto metrics = task->report(interval);
  for (const auto& [name, value] : metrics) {
    line[name] = value;
    text += format_metric(name, value);
  }
  // Step-time breakdown: every rank's per-step phase times, the max over
  // ranks per phase, and the rank whose steps took longest.
  auto mine = torch::tensor(std::vector<double>(phases.begin(), phases.end()), torch::kFloat64) /
              static_cast<double>(std::max<int64_t>(1, interval_steps));
  auto all = torch::stack(comm->all_gather(mine, "step-time report"));  // [ranks, 6]
  auto worst = std::get<0>(all.max(0));
  // The straggler is the rank with the most work (forward + backward +
  // optimizer): the others spend the difference waiting in communication.
  auto work = all.select(1, 1) + all.select(1, 2) + all.select(1, 4);
  int slowest = static_cast<int>(work.argmax().item<int64_t>());
  static const char* const kPhase[] = {"data", "forward", "backward", "comm", "optim", "step"};
  nlohmann::json phase_ms;
  for (int i = 0; i < 6; ++i) phase_ms[kPhase[i]] = worst[i].item<double>() * 1e3;
  line["phase_ms"] = phase_ms;
  line["slowest_rank"] = slowest;
  log.write(line);
  tensorboard.scalars(step, tensorboard_scalars("train", line));
  phases.fill(0.0);
  interval_steps = 0;
  say("step %6lld/%lld  epoch %lld %s  lr %.2e  %.0f %s/s  eta %s\n", static_cast<long long>(step),
      static_cast<long long>(total_steps), static_cast<long long>(epoch), text.c_str(), lr, units_per_s,
      task->unit_name().c_str(), format_duration(eta).c_str());
  interval = task->empty_tally();
  interval_units = 0;
  interval_start = Clock::now();
}

void Trainer::State::run_eval() {
  if (last_eval_step == step) return;
  last_eval_step = step;
  auto t0 = Clock::now();
  Tally tally = cohort::evaluate(*task, *eval_data, *comm, {cfg.eval.batch, cfg.eval.max_samples});
  nlohmann::json line = {{"kind", "eval"}, {"step", step}, {"split", cfg.eval.split},
                         {"count", static_cast<int64_t>(tally.count(task->count_metric()))}};
  std::string text;
  auto metrics = task->report(tally);
  for (const auto& [name, value] : metrics) {
    line[name] = value;
    text += format_metric(name, value);
  }
  log.write(line);
  tensorboard.scalars(step, tensorboard_scalars(cfg.eval.split, line));
  say("eval  step %lld  %s:%s  (%lld %s, %s)\n", static_cast<long long>(step), cfg.eval.split.c_str(),
      text.c_str(), static_cast<long long>(tally.count(task->count_metric())), "samples",
      format_duration(seconds_since(t0)).c_str());
  interval_start += Clock::now() - t0;  // evaluation time is not training throughput
  last_eval_text = "; " + cfg.eval.split + ":" + text;
  summary.final_eval_loss = metric(metrics, "loss");
  summary.final_eval_accuracy = tally.has("accuracy") ? metric(metrics, "accuracy") : 0.0;
}

StepBatch Trainer::State::next_batch() {
  step_start = Clock::now();
  StepBatch batch = loader->next();
  phases[0] += seconds_since(step_start);
  return batch;
}

void Trainer::State::finish_step(const StepBatch& batch) {
  phases[5] += seconds_since(step_start);
  ++interval_steps;
  ++step;
  cursor = batch.next;
  if (sample_log.is_open()) {
    sample_log << nlohmann::json({{"step", step}, {"epoch", batch.cursor.epoch}, {"ids", batch.indices}}).dump()
               << '\n' << std::flush;
  }
  progress(batch.cursor.epoch);
}

bool Trainer::State::eval_due(const StepBatch& batch) const {
  bool epoch_end = batch.next.epoch != batch.cursor.epoch;
  return due(cfg.eval.every_steps) || (cfg.eval.every_steps == 0 && epoch_end) || step == total_steps;
}

// Ranks agree on stopping: a signal may reach them at different steps.
bool Trainer::State::stop_agreed() {
  bool stop = comm->all_reduce_sum(std::vector<double>{stop_requested() ? 1.0 : 0.0}, "stop check")[0] > 0;
  if (stop) {
    say("cohort: stopped by a signal at step %lld; continue with --resume %s\n", static_cast<long long>(step),
        run.out_dir.c_str());
  }
  return stop;
}

RunSummary Trainer::run() {
  State& s = *s_;
  s.begin();
  while (s.step < s.total_steps) {
    StepBatch batch = s.next_batch();
    s.summary.step_losses.push_back(s.train_step(batch));  // forward, backward, all-reduce, optimizer
    s.finish_step(batch);
    bool last = s.step == s.total_steps;
    if (s.due(s.cfg.log.every_steps) || last) s.log_train(batch.cursor.epoch);
    if (s.eval_due(batch)) s.run_eval();
    bool stop = s.stop_agreed();
    if (s.due(s.cfg.ckpt.every_steps) || last || stop) s.save_checkpoint();
    if (stop) break;
  }
  return s.end();
}

RunSummary Trainer::evaluate() {
  State& s = *s_;
  for (const auto& note : s.run.notes) s.say("cohort: %s\n", note.c_str());
  s.start = Clock::now();
  s.start_step = s.step;
  s.run_eval();
  s.summary.steps = s.step;
  s.summary.seconds = seconds_since(s.start);
  return s.summary;
}

void Trainer::State::begin() {
  for (const auto& note : run.notes) say("cohort: %s\n", note.c_str());
  announce_plan();
  start = interval_start = Clock::now();
  start_step = step;
  tty = isatty(fileno(stdout)) != 0;
  if (step >= total_steps) {
    say("cohort: nothing to do: already at step %lld of %lld (raise train.max-steps or train.epochs)\n",
        static_cast<long long>(step), static_cast<long long>(total_steps));
  }
}

RunSummary Trainer::State::end() {
  summary.steps = step;
  summary.seconds = seconds_since(start);
  say("cohort: done: %lld steps in %s%s\n", static_cast<long long>(step - start_step),
      format_duration(summary.seconds).c_str(), last_eval_text.c_str());
  return summary;
}

}  // namespace cohort
