#include "cohort/train/trainer.hpp"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "cohort/core/error.hpp"
#include "cohort/core/files.hpp"
#include "cohort/core/sha256.hpp"
#include "cohort/data/balance.hpp"
#include "cohort/data/loader.hpp"
#include "cohort/distributed/comm.hpp"
#include "cohort/distributed/grad_sync.hpp"
#include "cohort/obs/mlflow.hpp"
#include "cohort/obs/reporter.hpp"
#include "cohort/train/evaluate.hpp"
#include "cohort/train/optim.hpp"
#include "cohort/train/phase_timer.hpp"
#include "cohort/train/precision.hpp"
#include "cohort/train/run_dir.hpp"
#include "cohort/train/runtime.hpp"
#include "cohort/train/stop.hpp"
#include "cohort/train/task.hpp"
#include "cohort/train/train_state.hpp"
#include "cohort/train/train_step.hpp"

namespace cohort {

namespace fs = std::filesystem;

namespace {

std::string strf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string strf(const char* fmt, ...) {
  va_list args, again;
  va_start(args, fmt);
  va_copy(again, args);
  std::string out(static_cast<size_t>(std::max(0, std::vsnprintf(nullptr, 0, fmt, args))), '\0');
  std::vsnprintf(out.data(), out.size() + 1, fmt, again);
  va_end(again);
  va_end(args);
  return out;
}

// train.precision for this run. auto follows each machine's CPU; mixed
// machines would train in mixed precisions, so bf16 only where every rank
// has it. (Every multi-rank CPU job runs this collective, whatever its
// setting, so ranks started with different configs still meet the start-up
// check.)
Precision agree_precision(Precision requested, Comm& comm) {
  const World& world = comm.world();
  Precision p = resolve_precision(requested, world.device);
  if (world.world_size > 1 && !world.device.is_cuda()) {
    double with_bf16 = comm.all_reduce_sum(std::vector<double>{p == Precision::kBf16 ? 1.0 : 0.0},
                                           "precision check")[0];
    if (requested == Precision::kAuto && with_bf16 < world.world_size) p = Precision::kFp32;
  }
  return p;
}

// Ranks started with different configs would build different models and
// fail inside a collective (Gloo aborts on a size mismatch). Every shared key
// is compared first, before any collective whose shape depends on the
// config, and a difference names the key, the ranks and this rank's value.
// Collective.
void agree_config(Comm& comm, const std::string& config_toml) {
  if (comm.size() == 1) return;
  std::vector<std::string> keys, values;
  std::istringstream in(shared_config(config_toml));
  for (std::string line; std::getline(in, line);) {
    auto eq = line.find('=');
    keys.push_back(line.substr(0, eq));
    values.push_back(line.substr(eq + 1));
  }
  std::vector<int64_t> hashes;
  for (const auto& v : values) hashes.push_back(static_cast<int64_t>(std::stoull(sha256_hex(v).substr(0, 15), nullptr, 16)));
  auto all = comm.all_gather(torch::tensor(hashes, torch::kInt64), "start-up config check");
  for (int r = 1; r < comm.size(); ++r) {
    COHORT_CHECK(all[static_cast<size_t>(r)].numel() == static_cast<int64_t>(hashes.size()), ConfigError, "rank ", r,
                 " has ", all[static_cast<size_t>(r)].numel(), " shared config keys but rank 0 has ", all[0].numel(),
                 ": are all nodes running the same cohort build?");
  }
  std::string diff;
  for (size_t i = 0; i < keys.size(); ++i) {
    std::string ranks;
    for (int r = 1; r < comm.size(); ++r) {
      if (all[static_cast<size_t>(r)][static_cast<int64_t>(i)].item<int64_t>() != all[0][static_cast<int64_t>(i)].item<int64_t>())
        ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    }
    if (!ranks.empty()) {
      diff += detail::cat(diff.empty() ? "" : "; ", keys[i], " differs between rank 0 and rank(s) ", ranks,
                          " (rank ", comm.rank(), " has ", values[i], ")");
    }
  }
  COHORT_CHECK(diff.empty(), ConfigError, "ranks were started with different configs: ", diff,
               ". Every node must give the same values, except per-node keys (README: Scopes)");
}

// Work only rank 0 does ahead of a collective: if it fails there, every
// rank fails now (rank 0 with its own error) instead of waiting out
// dist.timeout in the next collective. Collective.
template <class Fn>
void on_main_then_agree(Comm& comm, const char* what, Fn fn) {
  std::exception_ptr error;
  int code = 0;  // rank 0's exit code: every rank exits with it
  if (comm.world().is_main()) {
    try {
      fn();
    } catch (const Error& e) {
      error = std::current_exception();
      code = e.exit_code();
    } catch (...) {
      error = std::current_exception();
      code = 1;
    }
  }
  double failed = comm.all_reduce_sum(std::vector<double>{static_cast<double>(code)}, what)[0];
  if (error) std::rethrow_exception(error);
  if (failed != 0) throw Error(detail::cat("rank 0 failed in the ", what, "; its error says why"), static_cast<int>(failed));
}

NamedTensors module_tensors(torch::nn::Module& module) {
  NamedTensors out;
  for (auto& item : module.named_parameters()) out.emplace_back(item.key(), item.value());
  for (auto& item : module.named_buffers()) out.emplace_back(item.key(), item.value());
  return out;
}

// The interval's per-phase step times: the slowest rank's per phase, and
// the rank with the most compute (forward + backward + optimizer: the
// others spend the difference waiting in communication). Collective.
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

}  // namespace

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

// "rank 0 41 samples, rank 1 23"
std::string describe_split(const std::vector<int64_t>& shares) {
  std::string out;
  for (size_t r = 0; r < shares.size(); ++r) {
    out += strf("%srank %zu %lld%s", r ? ", " : "", r, static_cast<long long>(shares[r]), r ? "" : " samples");
  }
  return out;
}

// Training metrics since the last log line.
struct Interval {
  Tally tally;
  int64_t units = 0;
  Clock::time_point start = Clock::now();
  PhaseTimer phases;
};

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
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<GradSync> grad_sync;
  LrSchedule schedule;
  std::unique_ptr<Balancer> balancer;
  std::unique_ptr<Loader> loader;
  double window_samples = 0, window_compute_s = 0;  // this rank's, since the last rebalance
  std::unique_ptr<Checkpoints> checkpoints;
  std::unique_ptr<RunDirLock> run_lock;  // rank 0's: RUN_DIR/.lock, released when the run ends cleanly
  std::shared_ptr<Reporter> reporter;  // rank 0's; a silent one elsewhere
  std::ofstream sample_log;            // log.sample-ids: this rank's ids per step
  TrainState state;
  Interval interval;
  Clock::time_point start = Clock::now();
  Clock::time_point step_start = Clock::now();
  int64_t start_step = 0;  // where this session began (after a resume; elastic: this process's first world)
  int64_t world_start_step = 0;  // where this world began (data.balance measures each world afresh)
  int64_t last_eval_step = -1;
  int64_t last_ckpt_step = -1;
  std::optional<double> best_value;  // ckpt.best-metric's best so far
  int64_t best_step = -1;            // where it was reached
  int64_t evals_since_best = 0;      // train.early-stop-patience counts these
  std::string last_eval_text;  // "; test:  accuracy 0.8873  loss 0.3089"
  RunSummary summary;
  torch::Tensor rng_mark;       // this rank's generator at the last step boundary (elastic handover)
  Cursor step_cursor;           // where the last step's global batch started (elastic handover)
  std::optional<TrainReport> last_line;  // the last train line built, written or not (elastic handover)
  bool joiners_agreed = false;  // elastic: the last stop check found newcomers waiting

  void build_data();
  void init_weights();
  void resume(const ResolvedCheckpoint& from);
  void adopt_handover();
  std::shared_ptr<const Handover> handover() const;
  void admit_joiners() const;
  void report_membership();
  void open_outputs();
  void complete_records(const Handover& held);
  void begin();
  StepParts step_parts() {
    return {*task, comm, *grad_sync, *optimizer, schedule, precision, world.device, cfg.optim.clip_norm,
            cfg.model.dropout_rng, cfg.train.seed, /*time_on_device=*/cfg.data.balance == Balance::kAuto,
            run.debug_delay_ms, run.debug_slowdown};
  }
  StepBatch next_batch();
  void finish_step(const StepBatch& batch, const StepResult& result);
  void rebalance(const StepResult& result);
  TrainReport train_line(int64_t epoch) const;
  void log_train(int64_t epoch);
  bool line_due() const { return due(cfg.log.every_steps) || state.step == total_steps; }
  void run_eval();
  void keep_best(const EvalReport& r);
  void check_best_metric() const;
  bool eval_due(const StepBatch& batch) const;
  bool stop_agreed();
  bool early_stop();
  void save_checkpoint();
  RunSummary end();
  bool due(int64_t every) const { return every > 0 && state.step % every == 0; }
  double eta() const { return eta_seconds(seconds_since(start), state.step - start_step, total_steps - state.step); }
};

Trainer::Parts::Parts(Config config, Comm& c, RunOptions options)
    : cfg(std::move(config)), comm(c), world(c.world()), run(std::move(options)) {
  validate(cfg);
  agree_config(comm, run.config_toml);
  seed_rngs(cfg.train.seed, world.rank);
  precision = agree_precision(cfg.train.precision, comm);
  state.scaler = LossScaler(precision == Precision::kFp16);
  task = make_task(cfg, world);
  // model.init: rank 0 reads the weights and the broadcast gives them to all.
  if (!cfg.model.init.empty() && !run.resume) on_main_then_agree(comm, "model.init load", [&] { init_weights(); });
  broadcast_module(comm, *task->module());
  GradSyncOptions gs;
  gs.bucket_cap_bytes = static_cast<int64_t>(cfg.dist.bucket_cap_mb * (1 << 20));
  gs.compression = cfg.dist.grad_compression;
  grad_sync = std::make_unique<GradSync>(comm, *task->module(), gs);
  build_data();
  optimizer = make_optimizer(cfg.optim, *task->module());
  schedule = LrSchedule::from(cfg.optim, total_steps);
  interval.tally = task->empty_tally();
  if (run.resume) resume(*run.resume);
  else if (comm.elastic()) adopt_handover();
  if (!cfg.ckpt.best_metric.empty()) check_best_metric();
  balancer = std::make_unique<Balancer>(cfg.data.balance, cfg.data.global_batch, world.world_size,
                                        cfg.data.balance_weights, state.balance_shares);
  state.balance_shares = balancer->shares();
  LoaderOptions lo;
  lo.rank = world.rank;
  lo.world_size = world.world_size;
  lo.accum_steps = cfg.optim.accum_steps;
  lo.max_micro_batch = cfg.data.max_micro_batch;
  lo.shares = balancer->shares();
  lo.workers = cfg.data.workers;
  lo.prefetch = cfg.data.prefetch;
  lo.pin_memory = world.device.is_cuda();
  loader = std::make_unique<Loader>(task->train_set(), *order, lo, state.cursor);
  checkpoints = std::make_unique<Checkpoints>(run.out_dir, cfg.ckpt.keep);
  // Ranks started with different configs or data would drift or hang later:
  // check now, naming the rank and what differs.
  auto hash = std::stoull(sha256_hex(shared_config(run.config_toml)).substr(0, 15), nullptr, 16);
  uint64_t split_hash = 0;  // each rank's own read of the checkpoint's split
  for (int64_t s : balancer->shares()) split_hash = split_hash * 1000003 + static_cast<uint64_t>(s);
  // Each rank resumes from what it finds in --out: on several nodes that
  // must be one shared directory.
  comm.agree({state.step}, {"start step"}, "start-up",
             "Every rank continues from the newest checkpoint it finds in --out " + run.out_dir +
                 ", so on several nodes --out must be one directory on a filesystem every node shares "
                 "(or give each node the same copy with --resume)");
  comm.agree({static_cast<int64_t>(hash), task->train_set().size(), total_steps, state.step,
              static_cast<int64_t>(split_hash >> 1)},
             {"config hash", "training samples", "total steps", "start step", "batch split"}, "start-up");
  open_outputs();
}

// model.init. A fine-tuning task starts from what the file shares with it,
// and the log names what it initialised and what it left out.
void Trainer::Parts::init_weights() {
  std::string file;
  try {
    file = model_weights_file(cfg.model.init);
  } catch (const DataError& e) {
    throw DataError(std::string("model.init ") + e.what());
  }
  if (!task->init_partially()) {
    load_model_weights(*task->module(), file);
    run.notes.push_back("model.init: every tensor from " + file);
    return;
  }
  WeightsLoad w = load_model_weights_partial(*task->module(), file);
  auto list = [](const std::vector<std::string>& names) {
    std::string out;
    for (size_t i = 0; i < names.size() && i < 8; ++i) out += (i ? ", " : "") + names[i];
    return names.size() > 8 ? out + strf(", ... (%zu in all)", names.size()) : out;
  };
  run.notes.push_back(strf("model.init: %lld tensors from %s", static_cast<long long>(w.loaded), file.c_str()));
  if (!w.initialised.empty()) run.notes.push_back("model.init: initialised (not in the file): " + list(w.initialised));
  if (!w.ignored.empty()) run.notes.push_back("model.init: left out (not in this model): " + list(w.ignored));
}

void Trainer::Parts::build_data() {
  eval_data = task->eval_set(cfg.eval.split);
  const Dataset& train = task->train_set();
  Bucketing bucketing;
  if (cfg.data.bucket > 0) {
    COHORT_CHECK(train.size() == 0 || train.length(0) >= 0, ConfigError,
                 "data.bucket needs samples with lengths; train.task ", cfg.train.task, " has none");
    bucketing = {cfg.data.bucket, [&train](int64_t i) { return train.length(i); }};
  }
  order = std::make_unique<GlobalOrder>(train.size(), cfg.data.global_batch, cfg.train.seed, cfg.data.drop_last,
                                        std::move(bucketing));
  if (cfg.data.global_batch > train.size()) {
    run.notes.push_back(strf("warning: data.global-batch %lld is larger than the training split (%lld samples): "
                             "each step takes the whole split",
                             static_cast<long long>(cfg.data.global_batch), static_cast<long long>(train.size())));
  }
  if (cfg.train.max_steps > 0) {
    total_steps = cfg.train.max_steps;
  } else {
    COHORT_CHECK(!__builtin_mul_overflow(cfg.train.epochs, order->steps_per_epoch(), &total_steps), ConfigError,
                 "train.epochs ", cfg.train.epochs, " x ", order->steps_per_epoch(), " steps per epoch overflows");
  }
}

// Weights, optimizer and train state from a verified checkpoint.
void Trainer::Parts::resume(const ResolvedCheckpoint& from) {
  load_model_weights(*task->module(), (fs::path(from.dir) / "model.safetensors").string());
  torch::load(*optimizer, (fs::path(from.dir) / "optimizer.pt").string());
  state.restore(from, world);
  // data.path may change on resume (the data moved); the data may not.
  COHORT_CHECK(from.state.train_samples < 0 || from.state.train_samples == task->train_set().size(), DataError,
               from.dir, " was trained on ", from.state.train_samples, " samples but ", cfg.data.path, " holds ",
               task->train_set().size(), ": is this the same dataset?");
  COHORT_CHECK(state.cursor.consumed < order->usable(), DataError, from.dir, ": cursor ", state.cursor.consumed,
               " is outside the epoch's ", order->usable(), " samples: is this the same dataset?");
  run.notes.push_back(strf("resumed from %s: step %lld, epoch %lld, %lld samples into the epoch (written by %d "
                           "rank(s), now %d)", from.dir.c_str(), static_cast<long long>(state.step),
                           static_cast<long long>(state.cursor.epoch), static_cast<long long>(state.cursor.consumed),
                           from.state.world_size, world.world_size));
}

// Elastic: the new world goes on from the state rank 0 held in memory (the
// least advanced survivor's: the step every survivor completed) when it
// held one. Parameters, optimizer, step, cursor, samples and loss scale
// come by broadcast; every survivor keeps its
// own RNG stream, newcomers their seed-derived ones; data.balance = auto
// measures the new world afresh. Collective.
void Trainer::Parts::adopt_handover() {
  const Handover* mine = run.from_peers ? run.handover.get() : nullptr;
  const bool main_holds = world.is_main() && mine;
  if (comm.all_reduce_sum(std::vector<double>{main_holds ? 1.0 : 0.0}, "state handover")[0] == 0) return;
  torch::NoGradGuard no_grad;
  std::string blob;
  if (main_holds) {
    std::map<std::string, torch::Tensor> by_name(mine->model.begin(), mine->model.end());
    for (auto& [name, t] : module_tensors(*task->module())) {
      auto it = by_name.find(name);
      COHORT_CHECK(it != by_name.end() && it->second.sizes() == t.sizes(), Error,
                   "state handover: the previous world's model lacks ", name);
      t.copy_(it->second);
    }
    torch::serialize::OutputArchive a;
    const CheckpointState& s = mine->state;
    a.write("state", torch::tensor({s.step, s.cursor.epoch, s.cursor.consumed, s.samples_seen,
                                    static_cast<int64_t>(s.world_size)}, torch::kInt64));
    a.write("optimizer", torch::from_blob(const_cast<char*>(mine->optimizer.data()),
                                          {static_cast<int64_t>(mine->optimizer.size())}, torch::kUInt8));
    if (mine->scaler.defined()) a.write("scaler", mine->scaler);
    std::ostringstream os;
    a.save_to(os);
    blob = os.str();
  }
  broadcast_module(comm, *task->module());
  comm.broadcast_bytes(blob, 0, "state handover");
  torch::serialize::InputArchive a;
  a.load_from(blob.data(), blob.size());
  torch::Tensor fields, opt, scaler;
  a.read("state", fields);
  a.read("optimizer", opt);
  std::istringstream opt_in(std::string(static_cast<const char*>(opt.data_ptr()), static_cast<size_t>(opt.numel())));
  torch::load(*optimizer, opt_in);
  if (a.try_read("scaler", scaler)) state.scaler.restore(scaler);
  auto f = fields.data_ptr<int64_t>();
  state.step = f[0];
  state.cursor = {f[1], f[2]};
  state.samples_seen = f[3];
  // The old split was per rank of the old world: ranks are renumbered, so
  // data.balance = auto measures the new world afresh.
  state.balance_shares.clear();
  // A survivor goes on with its own stream, as it stood after that step.
  if (mine && mine->state.step == state.step && mine->rng.defined()) set_cpu_rng_state(mine->rng);
  COHORT_CHECK(state.cursor.consumed < order->usable(), Error, "state handover: cursor ", state.cursor.consumed,
               " is outside the epoch's ", order->usable(), " samples");
}

std::shared_ptr<const Handover> Trainer::Parts::handover() const {
  auto h = std::make_shared<Handover>();
  h->state.step = state.step;
  h->state.cursor = state.cursor;
  h->state.samples_seen = state.samples_seen;
  h->state.world_size = world.world_size;
  h->state.train_samples = task->train_set().size();
  h->state.balance_shares = state.balance_shares;
  torch::NoGradGuard no_grad;
  for (auto& [name, t] : module_tensors(*task->module())) h->model.emplace_back(name, t.detach().clone());
  std::ostringstream os;
  torch::save(*optimizer, os);
  h->optimizer = os.str();
  if (state.scaler.enabled()) h->scaler = state.scaler.state().clone();
  h->rng = rng_mark.defined() ? rng_mark.clone() : cpu_rng_state();
  h->step_cursor = step_cursor;
  // The step's line: built already (its collectives may have failed, or
  // rank 0 may have died before writing it), or due and not built yet (a
  // collective before it failed: data.balance's measurement, say).
  if (last_line && last_line->step == state.step) h->train_line = last_line;
  else if (state.step > world_start_step && line_due()) h->train_line = train_line(step_cursor.epoch);
  h->interval = interval.tally;
  h->first_step = start_step;
  h->started = start;
  return h;
}

// Elastic: newcomers that the last stop check found waiting are admitted
// now, at the step boundary: this world ends and the next one includes them.
void Trainer::Parts::admit_joiners() const {
  if (!joiners_agreed || state.step >= total_steps) return;
  throw MembershipChanged(strf("step %lld: node(s) asked to join", static_cast<long long>(state.step)));
}

// Elastic: the change that formed this world, after its first step.
void Trainer::Parts::report_membership() {
  if (!run.membership) return;
  MembershipReport r = *run.membership;
  run.membership.reset();
  r.recovery_s = seconds_since(r.noticed);
  r.unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                  std::chrono::system_clock::now().time_since_epoch()).count();
  reporter->membership(r);
}

// Only now, with config, model and data accepted on every rank, is the run
// dir touched.
void Trainer::Parts::open_outputs() {
  RunDir dir(run.out_dir);
  // Rank 0's: has one, its value, its step, the evaluations since (summed: 0 elsewhere).
  std::vector<double> best = {0.0, 0.0, 0.0, 0.0};
  on_main_then_agree(comm, "run directory set-up", [&] {
    run_lock = dir.lock(run.job_id, cfg.dist.timeout, run.mode(), run.notes);
    for (auto& note : dir.prepare(run.mode(), run.config_toml, state.step)) run.notes.push_back(note);
    for (const auto& [name, text] : task->run_files()) {
      const fs::path file = fs::path(run.out_dir) / name;
      // The tokenizer the run started with stays, whatever a resume's data.path says now.
      if (run.mode() == RunMode::kResume && name.rfind("tokenizer/", 0) == 0 && fs::exists(file)) continue;
      fs::create_directories(file.parent_path());
      write_file_atomically(file.string(), text);
    }
    if (run.from_peers && run.handover) complete_records(*run.handover);
    auto b = Checkpoints::best(run.out_dir);
    if ((run.resume || run.from_peers) && b.step >= 0 && b.metric == cfg.ckpt.best_metric) {
      best = {1.0, b.value, static_cast<double>(b.step), static_cast<double>(dir.eval_steps_after(cfg.eval.split, b.step))};
    }
  });
  // Every rank needs the best so far: keep_best's decision is collective.
  best = comm.all_reduce_sum(best, "best checkpoint so far");
  if (best[0] > 0) {
    best_value = best[1], best_step = static_cast<int64_t>(best[2]);
    evals_since_best = static_cast<int64_t>(best[3]);  // early stopping counts on
  }
  reporter = rank_reporter(run, world, cfg.log);
  if (world.is_main() && run.from_peers && run.handover) {
    const Handover& held = *run.handover;
    if (held.train_line && !dir.has_train_line(held.state.step)) {
      reporter->train(*held.train_line);
      run.notes.push_back(strf("elastic: logged step %lld's train line for the world that took it",
                               static_cast<long long>(held.state.step)));
    }
    // The open interval goes on: the next line covers its steps too.
    if (!held.train_line) interval.tally = held.interval;
  }
  if (cfg.log.sample_ids) {
    fs::create_directories(fs::path(dir.sample_ids_file(world.rank)).parent_path());
    sample_log.open(dir.sample_ids_file(world.rank), std::ios::app);
  }
}

// Elastic, on rank 0 of a world that goes on from memory: the step held
// was applied by every member of the last world, but a member lost right
// after it may not have logged its share of the step's sample ids.
// (Its train line follows in open_outputs, once the reporter is open.)
void Trainer::Parts::complete_records(const Handover& held) {
  if (!cfg.log.sample_ids || held.state.step == 0 || held.state.step != state.step) return;
  const Cursor c = held.step_cursor;
  auto perm = order->permutation(c.epoch);
  std::vector<int64_t> ids(perm->begin() + c.consumed, perm->begin() + c.consumed + order->batch_size_at(c));
  size_t n = RunDir(run.out_dir).complete_sample_ids(state.step, c.epoch, ids, world.rank);
  if (n > 0) {
    run.notes.push_back(strf("elastic: logged %zu sample id(s) of step %lld for the member(s) lost after it", n,
                             static_cast<long long>(state.step)));
  }
}

void Trainer::Parts::begin() {
  for (const auto& note : run.notes) reporter->message("cohort: " + note);
  int64_t params = 0;
  for (const auto& p : task->module()->parameters()) params += p.numel();
  reporter->message(strf("cohort: %s, %lld parameters, %s on %s, %d thread(s) of %d core(s)",
                         cfg.model.name.c_str(), static_cast<long long>(params), name_of(precision),
                         world.device.str().c_str(), torch::get_num_threads(), available_cores()));
  reporter->message("cohort: train " + task->train_set().describe());
  reporter->message("cohort: eval  " + eval_data->describe());
  reporter->message(strf("cohort: global batch %lld = %d rank(s) x %lld accumulation step(s); %lld steps/epoch, "
                         "%lld steps total; %s schedule, peak lr %g, %lld warmup steps",
                         static_cast<long long>(cfg.data.global_batch), world.world_size,
                         static_cast<long long>(cfg.optim.accum_steps),
                         static_cast<long long>(order->steps_per_epoch()), static_cast<long long>(total_steps),
                         name_of(schedule.kind), schedule.peak, static_cast<long long>(schedule.warmup)));
  if (balancer->mode() != Balance::kEqual) {
    reporter->message(strf("cohort: balance %s: %s", name_of(balancer->mode()), describe_split(balancer->shares()).c_str()));
  }
  if (state.step >= total_steps) {
    reporter->message(strf("cohort: nothing to do: already at step %lld of %lld (raise train.max-steps or "
                           "train.epochs)", static_cast<long long>(state.step), static_cast<long long>(total_steps)));
  }
  start = interval.start = Clock::now();
  start_step = world_start_step = state.step;
  if (run.from_peers && run.handover) {  // the summary and ETA count every world of this process
    start = run.handover->started;
    start_step = run.handover->first_step;
  }
  rng_mark = cpu_rng_state();
}

StepBatch Trainer::Parts::next_batch() {
  if (run.at) run.at(StepPoint::kBegin, state.step + 1);
  step_start = Clock::now();
  StepBatch batch = loader->next();
  interval.phases.lap(Phase::kData, step_start);
  return batch;
}

void Trainer::Parts::finish_step(const StepBatch& batch, const StepResult& result) {
  interval.phases.lap(Phase::kStep, step_start);
  interval.phases.end_step();
  interval.tally.merge(result.tally);
  interval.units += result.units;
  summary.step_losses.push_back(result.loss);
  state.samples_seen += batch.global_samples;
  ++state.step;
  state.cursor = batch.next;
  step_cursor = batch.cursor;
  rng_mark = cpu_rng_state();
  if (run.at) run.at(StepPoint::kApplied, state.step);
  report_membership();
  if (sample_log.is_open()) {
    sample_log << nlohmann::json({{"step", state.step}, {"epoch", batch.cursor.epoch}, {"ids", batch.indices}}).dump()
               << '\n' << std::flush;
    COHORT_CHECK(sample_log.good(), Error, RunDir(run.out_dir).sample_ids_file(world.rank), ": write failed (disk full?)");
  }
  double secs = seconds_since(interval.start);
  reporter->progress({state.step, total_steps, batch.cursor.epoch, result.loss, schedule.at(state.step - 1),
                      interval.units / std::max(secs, 1e-9), task->unit_name(), eta()});
}

// data.balance = auto: every balance-every steps the ranks pool their
// measured speeds and re-deal the coming steps. Every rank takes the same
// decision from the same figures, at the same step. The session's first
// step (warm-up) is not measured.
void Trainer::Parts::rebalance(const StepResult& result) {
  if (balancer->mode() != Balance::kAuto || world.world_size < 2) return;
  if (state.step > world_start_step + 1) {
    window_samples += static_cast<double>(result.samples);
    window_compute_s += result.compute_s;
  }
  if ((state.step - world_start_step) % cfg.data.balance_every != 0 || state.step == total_steps) return;
  std::vector<double> mine(2 * static_cast<size_t>(world.world_size), 0.0);
  mine[static_cast<size_t>(world.rank)] = window_samples;
  mine[static_cast<size_t>(world.world_size + world.rank)] = window_compute_s;
  auto all = comm.all_reduce_sum(mine, "balance measurement");
  window_samples = window_compute_s = 0;
  std::vector<double> samples(all.begin(), all.begin() + world.world_size), seconds(all.begin() + world.world_size, all.end());
  if (!balancer->update(samples, seconds)) return;
  loader->reshare(balancer->shares());
  state.balance_shares = balancer->shares();
  std::string speeds;
  for (double s : balancer->speeds()) speeds += strf("%s%.0f", speeds.empty() ? "" : ", ", s);
  reporter->message(strf("balance: step %lld: %s (measured %s samples/s)", static_cast<long long>(state.step),
                         describe_split(balancer->shares()).c_str(), speeds.c_str()));
}

// The interval's metrics were summed over the ranks step by step
// (train_step), so the line is known to every rank before its collectives:
// a world that fails in them hands it to the next (open_outputs writes it).
void Trainer::Parts::log_train(int64_t epoch) {
  TrainReport r = train_line(epoch);
  last_line = r;
  comm.agree({state.step, state.cursor.epoch, state.cursor.consumed}, {"step", "epoch", "cursor"}, "the step check");
  report_phases(comm, interval.phases, r);
  if (run.at) run.at(StepPoint::kLine, state.step);
  reporter->train(r);
  interval = Interval();
  interval.tally = task->empty_tally();
}

// The train line of the interval that ends at this step, but for the
// per-phase times (a collective).
TrainReport Trainer::Parts::train_line(int64_t epoch) const {
  TrainReport r;
  r.step = state.step;
  r.total_steps = total_steps;
  r.epoch = epoch;
  r.lr = schedule.at(state.step - 1);
  r.samples = state.samples_seen;
  r.units_per_s = interval.units / std::max(seconds_since(interval.start), 1e-9);
  r.unit = task->unit_name();
  r.eta_s = eta();
  r.metrics = task->report(interval.tally);
  if (balancer->mode() != Balance::kEqual) r.balance = balancer->shares();
  return r;
}

void Trainer::Parts::run_eval() {
  if (last_eval_step == state.step) return;
  last_eval_step = state.step;
  auto t0 = Clock::now();
  EvalReport r = evaluate_report(*task, *eval_data, comm, cfg.eval, state.step);
  reporter->eval(r);
  interval.start += Clock::now() - t0;  // evaluation time is not training throughput
  last_eval_text = "; " + r.split + ":" + format_metrics(r.metrics);
  summary.final_eval_loss = metric_value(r.metrics, "loss");
  summary.final_eval_accuracy = metric_value(r.metrics, "accuracy");
  keep_best(r);
}

// ckpt.best-metric must be one of the task's eval metrics: said at start-up,
// not at the first evaluation.
void Trainer::Parts::check_best_metric() const {
  std::string have;
  for (const auto& m : task->report(task->empty_tally())) {
    if (m.first == cfg.ckpt.best_metric) return;
    if (m.first.find('/') == std::string::npos) have += (have.empty() ? "" : ", ") + m.first;
  }
  throw ConfigError(detail::cat("ckpt.best-metric '", cfg.ckpt.best_metric, "' is not an eval metric of ",
                                cfg.train.task, " (it reports: ", have, ")"));
}

// ckpt.best-metric: every rank sees the same reduced metrics, so all take
// the same decision; the checkpoint is written (collectively) when the
// metric improved. Lower is better for a loss.
void Trainer::Parts::keep_best(const EvalReport& r) {
  const std::string& name = cfg.ckpt.best_metric;
  if (name.empty()) return;
  auto it = std::find_if(r.metrics.begin(), r.metrics.end(), [&](const auto& m) { return m.first == name; });
  if (it == r.metrics.end()) return;  // checked at start-up
  const bool lower = name.find("loss") != std::string::npos;
  const double v = it->second;
  if (best_value && (lower ? v >= *best_value : v <= *best_value)) {
    ++evals_since_best;
    return;
  }
  best_value = v;
  best_step = state.step;
  evals_since_best = 0;
  save_checkpoint();
  if (world.is_main()) {
    checkpoints->mark_best(state.step, name, v);
    reporter->message(strf("best  step %lld  %s %.4f", static_cast<long long>(state.step), name.c_str(), v));
  }
}

bool Trainer::Parts::eval_due(const StepBatch& batch) const {
  bool epoch_end = batch.next.epoch != batch.cursor.epoch;
  return due(cfg.eval.every_steps) || (cfg.eval.every_steps == 0 && epoch_end) || state.step == total_steps;
}

// Ranks agree on stopping: a signal may reach them at different steps.
// Elastic: newcomers waiting to join are agreed on here too.
bool Trainer::Parts::stop_agreed() {
  std::vector<double> flags = {stop_requested() ? 1.0 : 0.0};
  if (comm.elastic()) flags.push_back(comm.joiners_waiting() ? 1.0 : 0.0);
  flags = comm.all_reduce_sum(flags, "stop check");
  bool stop = flags[0] > 0;
  joiners_agreed = comm.elastic() && flags[1] > 0;
  if (stop) {
    reporter->message(strf("cohort: stopped by a signal at step %lld; continue with --resume %s",
                           static_cast<long long>(state.step), run.out_dir.c_str()));
  }
  return stop;
}

// train.early-stop-patience: every rank saw the same reduced metrics, so
// every rank takes the same decision, without a collective.
bool Trainer::Parts::early_stop() {
  const int64_t patience = cfg.train.early_stop_patience;
  if (patience == 0 || evals_since_best < patience || state.step == total_steps) return false;
  summary.stopped_by = strf("early stop: %s did not improve for %lld evaluations (best %.4f at step %lld)",
                            cfg.ckpt.best_metric.c_str(), static_cast<long long>(patience), best_value.value_or(0.0),
                            static_cast<long long>(best_step));
  reporter->message(strf("cohort: %s at step %lld; the best checkpoint is kept (checkpoints/best.json)",
                         summary.stopped_by.c_str(), static_cast<long long>(state.step)));
  return true;
}

void Trainer::Parts::save_checkpoint() {
  if (last_ckpt_step == state.step) return;  // already written this step (ckpt.best-metric)
  last_ckpt_step = state.step;
  auto t0 = Clock::now();
  TrainState::Snapshot snapshot = state.capture(comm, task->train_set().size());
  // Every rank fails with rank 0's write error (a full disk: exit 1, the
  // file named), instead of waiting in a barrier for a rank that is gone.
  on_main_then_agree(comm, "checkpoint write", [&] {
    std::string dir = checkpoints->write(snapshot.state, module_tensors(*task->module()), *optimizer, snapshot.rng,
                                         run.config_toml);
    reporter->message(strf("ckpt  step %lld  %s  (%s)", static_cast<long long>(state.step), dir.c_str(),
                           format_duration(seconds_since(t0)).c_str()));
  });
}

RunSummary Trainer::Parts::end() {
  if (run_lock) run_lock->release();
  summary.steps = state.step;
  summary.seconds = seconds_since(start);
  reporter->message(strf("cohort: done: %lld steps in %s%s%s", static_cast<long long>(state.step - start_step),
                         format_duration(summary.seconds).c_str(), last_eval_text.c_str(),
                         summary.stopped_by.empty() ? "" : ("; " + summary.stopped_by).c_str()));
  reporter->finish(state.step >= total_steps || !summary.stopped_by.empty());
  return summary;
}

Trainer::Trainer(Config cfg, Comm& comm, RunOptions run)
    : p_(std::make_unique<Parts>(std::move(cfg), comm, std::move(run))) {}

Trainer::~Trainer() = default;

RunSummary Trainer::run() {
  Parts& p = *p_;
  p.begin();
  while (p.state.step < p.total_steps) {
    StepBatch batch = p.next_batch();
    StepResult result = train_step(p.step_parts(), p.state, batch, p.interval.phases);
    p.finish_step(batch, result);
    p.rebalance(result);
    bool last = p.state.step == p.total_steps;
    if (p.line_due()) p.log_train(batch.cursor.epoch);
    if (p.eval_due(batch)) p.run_eval();
    bool stop = p.stop_agreed();
    if (p.early_stop()) {
      if (!p.line_due()) p.log_train(batch.cursor.epoch);  // the run's last step has its line
      stop = true;
    }
    if (p.due(p.cfg.ckpt.every_steps) || last || stop) p.save_checkpoint();
    if (stop) break;
    p.admit_joiners();
  }
  return p.end();
}

std::shared_ptr<const Handover> Trainer::handover() const { return p_->handover(); }

}  // namespace cohort
