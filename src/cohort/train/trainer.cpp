#include "cohort/train/trainer.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>

#include "cohort/core/error.hpp"
#include "cohort/core/files.hpp"
#include "cohort/core/format.hpp"
#include "cohort/data/balance.hpp"
#include "cohort/data/loader.hpp"
#include "cohort/distributed/comm.hpp"
#include "cohort/distributed/grad_sync.hpp"
#include "cohort/obs/reporter.hpp"
#include "cohort/train/best.hpp"
#include "cohort/train/data_plan.hpp"
#include "cohort/train/elastic.hpp"
#include "cohort/train/evaluate.hpp"
#include "cohort/train/model_init.hpp"
#include "cohort/train/optim.hpp"
#include "cohort/train/phase_timer.hpp"
#include "cohort/train/precision.hpp"
#include "cohort/train/reporting.hpp"
#include "cohort/train/run_dir.hpp"
#include "cohort/train/runtime.hpp"
#include "cohort/train/startup.hpp"
#include "cohort/train/stop.hpp"
#include "cohort/train/task.hpp"
#include "cohort/train/train_state.hpp"
#include "cohort/train/train_step.hpp"

namespace cohort {

namespace fs = std::filesystem;

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
  std::unique_ptr<SpeedBalance> speed_balance;  // data.balance = auto; made in begin()
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
  BestMetric best;  // ckpt.best-metric and early stopping
  std::string last_eval_text;  // "; test:  accuracy 0.8873  loss 0.3089"
  RunSummary summary;
  torch::Tensor rng_mark;       // this rank's generator at the last step boundary (elastic handover)
  Cursor step_cursor;           // where the last step's global batch started (elastic handover)
  std::optional<TrainReport> last_line;  // the last train line built, written or not (elastic handover)
  bool joiners_agreed = false;  // elastic: the last stop check found newcomers waiting

  void resume(const ResolvedCheckpoint& from);
  std::shared_ptr<const Handover> handover() const;
  void admit_joiners() const;
  void report_membership();
  void open_outputs();
  void begin();
  StepParts step_parts() const;
  StepBatch next_batch();
  void finish_step(const StepBatch& batch, const StepResult& result);
  void rebalance(const StepResult& result);
  TrainReport train_line(int64_t epoch) const;
  void log_train(int64_t epoch);
  bool line_due() const { return due(cfg.log.every_steps) || state.step == total_steps; }
  void run_eval();
  void keep_best(const EvalReport& r);
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
  precision = agree_startup(comm, run.config_toml, cfg.train.precision);
  seed_rngs(cfg.train.seed, world.rank);
  state.scaler = LossScaler(precision == Precision::kFp16);
  task = make_task(cfg, world);
  // model.init: rank 0 reads the weights and the broadcast gives them to all.
  if (!cfg.model.init.empty() && !run.resume) {
    on_main_then_agree(comm, "model.init load", [&] {
      for (auto& note : load_init_weights(*task, cfg.model.init)) run.notes.push_back(note);
    });
  }
  broadcast_module(comm, *task->module());
  GradSyncOptions gs;
  gs.bucket_cap_bytes = static_cast<int64_t>(cfg.dist.bucket_cap_mb * (1 << 20));
  gs.compression = cfg.dist.grad_compression;
  grad_sync = std::make_unique<GradSync>(comm, *task->module(), gs);
  eval_data = task->eval_set(cfg.eval.split);
  DataPlan plan = plan_data(cfg, task->train_set());
  order = std::move(plan.order);
  total_steps = plan.total_steps;
  for (auto& note : plan.notes) run.notes.push_back(note);
  optimizer = make_optimizer(cfg.optim, *task->module());
  schedule = LrSchedule::from(cfg.optim, total_steps);
  interval.tally = task->empty_tally();
  if (run.resume) {
    resume(*run.resume);
  } else if (comm.elastic() &&
             adopt_handover(comm, run.from_peers ? run.handover.get() : nullptr, *task->module(), *optimizer, state)) {
    COHORT_CHECK(state.cursor.consumed < order->usable(), Error, "state handover: cursor ", state.cursor.consumed,
                 " is outside the epoch's ", order->usable(), " samples");
  }
  best = BestMetric(cfg.ckpt.best_metric, cfg.train.early_stop_patience, task->report(task->empty_tally()),
                    cfg.train.task);
  balancer = std::make_unique<Balancer>(balancer_options(cfg, world.world_size, state.balance_shares));
  state.balance_shares = balancer->shares();
  loader = std::make_unique<Loader>(task->train_set(), *order, loader_options(cfg, world, state.balance_shares),
                                    state.cursor);
  checkpoints = std::make_unique<Checkpoints>(run.out_dir, cfg.ckpt.keep);
  StartPoint start_point;
  start_point.out_dir = run.out_dir;
  start_point.config_toml = run.config_toml;
  start_point.step = state.step;
  start_point.train_samples = task->train_set().size();
  start_point.total_steps = total_steps;
  start_point.shares = balancer->shares();
  agree_start_point(comm, start_point);
  open_outputs();
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

// Elastic: this process's state at the last completed step, and the step's records.
std::shared_ptr<const Handover> Trainer::Parts::handover() const {
  auto h = capture_handover(*task->module(), *optimizer, state, world.world_size, task->train_set().size());
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
  std::vector<double> so_far = {0.0, 0.0, 0.0, 0.0};
  on_main_then_agree(comm, "run directory set-up", [&] {
    run_lock = dir.lock(run.job_id, cfg.dist.timeout, run.mode(), run.notes);
    for (auto& note : dir.prepare(run.mode(), run.config_toml, state.step)) run.notes.push_back(note);
    dir.write_run_files(task->run_files(), run.mode());
    if (cfg.log.sample_ids && run.from_peers && run.handover && run.handover->state.step == state.step) {
      size_t n = complete_sample_ids(run.out_dir, *run.handover, *order, world.rank);
      if (n > 0) {
        run.notes.push_back(strf("elastic: logged %zu sample id(s) of step %lld for the member(s) lost after it", n,
                                 static_cast<long long>(state.step)));
      }
    }
    auto b = Checkpoints::best(run.out_dir);
    if ((run.resume || run.from_peers) && b.step >= 0 && b.metric == cfg.ckpt.best_metric) {
      so_far = {1.0, b.value, static_cast<double>(b.step), static_cast<double>(dir.eval_steps_after(cfg.eval.split, b.step))};
    }
  });
  // Every rank needs the best so far: keep_best's decision is collective.
  so_far = comm.all_reduce_sum(so_far, "best checkpoint so far");
  if (so_far[0] > 0) best.restore(so_far[1], static_cast<int64_t>(so_far[2]), static_cast<int64_t>(so_far[3]));
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

void Trainer::Parts::begin() {
  for (const auto& note : run.notes) reporter->message("cohort: " + note);
  for (const auto& line : start_lines(cfg, *task, *eval_data, precision, world, *order, schedule, *balancer,
                                      state.step, total_steps)) {
    reporter->message(line);
  }
  start = interval.start = Clock::now();
  start_step = world_start_step = state.step;
  if (run.from_peers && run.handover) {  // the summary and ETA count every world of this process
    start = run.handover->started;
    start_step = run.handover->first_step;
  }
  rng_mark = cpu_rng_state();
  speed_balance = std::make_unique<SpeedBalance>(*balancer, *loader, world.rank, world.world_size,
                                                 cfg.data.balance_every, world_start_step);
}

StepParts Trainer::Parts::step_parts() const {
  StepParts p(*task, comm, *grad_sync, *optimizer, schedule);
  p.precision = precision;
  p.device = world.device;
  p.clip_norm = cfg.optim.clip_norm;
  p.dropout_rng = cfg.model.dropout_rng;
  p.seed = cfg.train.seed;
  p.time_on_device = cfg.data.balance == Balance::kAuto;
  p.at = run.at;
  return p;
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
// measured speeds and re-deal the coming steps (data/balance.hpp).
void Trainer::Parts::rebalance(const StepResult& result) {
  auto sum = [this](const std::vector<double>& v) { return comm.all_reduce_sum(v, "balance measurement"); };
  std::string change = speed_balance->after_step(state.step, total_steps, result.samples, result.compute_s, sum);
  if (change.empty()) return;
  state.balance_shares = balancer->shares();
  reporter->message(change);
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

// ckpt.best-metric: every rank takes the same decision from the same
// reduced metrics; the checkpoint is written (collectively) on a new best.
void Trainer::Parts::keep_best(const EvalReport& r) {
  if (!best.improved(r, state.step)) return;
  save_checkpoint();
  if (world.is_main()) {
    checkpoints->mark_best(state.step, best.metric(), best.value());
    reporter->message(strf("best  step %lld  %s %.4f", static_cast<long long>(state.step), best.metric().c_str(),
                           best.value()));
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

// train.early-stop-patience: the same decision on every rank, without a collective.
bool Trainer::Parts::early_stop() {
  std::string why = best.patience_ran_out();
  if (why.empty() || state.step == total_steps) return false;
  summary.stopped_by = why;
  reporter->message(strf("cohort: %s at step %lld; the best checkpoint is kept (checkpoints/best.json)",
                         why.c_str(), static_cast<long long>(state.step)));
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
