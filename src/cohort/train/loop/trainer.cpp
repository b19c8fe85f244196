#include "cohort/train/loop/trainer.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <utility>

#include "cohort/core/error.hpp"
#include "cohort/core/files.hpp"
#include "cohort/core/format.hpp"
#include "cohort/distributed/comm.hpp"
#include "cohort/sync/grad_sync.hpp"
#include "cohort/train/lifecycle/launch_shape.hpp"
#include "cohort/train/lifecycle/model_init.hpp"
#include "cohort/train/lifecycle/runtime.hpp"
#include "cohort/train/lifecycle/startup.hpp"
#include "cohort/train/lifecycle/stop.hpp"
#include "cohort/train/loop/data_plan.hpp"
#include "cohort/train/loop/evaluate.hpp"
#include "cohort/train/loop/reporting.hpp"
#include "cohort/train/loop/trainer_parts.hpp"
#include "cohort/train/optimization/precision.hpp"

namespace cohort {

namespace fs = std::filesystem;

Trainer::Parts::Parts(Config config, Comm& c, RunOptions options)
    : cfg(std::move(config)), comm(c), world(c.world()), run(std::move(options)) {
  validate(cfg);
  if (!comm.elastic()) validate_world(cfg, comm.size());  // an elastic world's size changes: its launcher checks
  precision = agree_startup(comm, run.config_toml, cfg.train.precision);
  seed_rngs(cfg.train.seed, world.rank);
  state.scaler = LossScaler(precision == Precision::kFp16);
  task = make_task(cfg, world);
  // model.init: rank 0 reads the weights and the broadcast gives them to all.
  if (!cfg.model.init.empty() && !run.checkpoint()) {
    on_main_then_agree(comm, "model.init load", [&] {
      for (auto& note : load_init_weights(*task, cfg.model.init)) run.notes.push_back(note);
    });
  }
  broadcast_module(comm, *task->module());
  eval_data = task->eval_set(cfg.eval.split);
  DataPlan plan = plan_data(cfg, task->train_set());
  order = std::move(plan.order);
  total_steps = plan.total_steps;
  for (auto& note : plan.notes) run.notes.push_back(note);
  groups = form_replica_groups(comm, cfg);
  optimizer = make_step_optimizer(*groups->step, cfg, *task->module());
  schedule = LrSchedule::from(cfg.optim, total_steps);
  replicas = make_replica_sync(comm, *groups, *task->module(), *optimizer, cfg);
  if (const ResolvedCheckpoint* from = run.checkpoint()) {
    for (auto& note : restore_checkpoint(*from, *task, *optimizer, state_parts(), state, world, cfg.data.path,
                                         order->usable())) {
      run.notes.push_back(note);
    }
  } else if (comm.elastic() &&
             adopt_handover(comm, held(), *task->module(), *optimizer, state_parts(), state, run.notes)) {
    COHORT_CHECK(state.cursor.consumed < order->usable(), Error, "state handover: cursor ", state.cursor.consumed,
                 " is outside the epoch's ", order->usable(), " samples");
    if (held()) step_cursor = held()->step_cursor;
  }
  keeper = std::make_unique<Keeper>(comm, *task, *optimizer, *replicas, std::as_const(*this).state_parts(), state,
                                    run.out_dir, cfg.ckpt.keep, run.config_toml,
                                    BestMetric(cfg.ckpt.best_metric, cfg.train.early_stop_patience,
                                               task->report(task->empty_tally()), cfg.train.task));
  balancer = std::make_unique<Balancer>(balancer_options(cfg, world.world_size, state.balance_shares));
  state.balance_shares = balancer->shares();
  loader = std::make_unique<Loader>(task->train_set(), *order, loader_options(cfg, world, state.balance_shares),
                                    state.cursor);
  log = std::make_unique<TrainLog>(*task, schedule, *balancer, total_steps, world.device);
  feed = std::make_unique<DeviceFeed>(world.device);
  compute_clock = std::make_unique<ComputeClock>(world.device);
  agree_start_point(comm, {run.out_dir, run.config_toml, state.step, task->train_set().size(), total_steps,
                           balancer->shares()});
  open_outputs();
}

// Only now, with config, model and data accepted on every rank, is the run
// dir touched.
void Trainer::Parts::open_outputs() {
  RunDir dir(run.out_dir);
  // An elastic world's shape is its membership's, not a launch's.
  std::optional<LaunchShape> shape;
  if (!comm.elastic()) shape = LaunchShape::gather(comm);
  on_main_then_agree(comm, "run directory set-up", [&] {
    run_lock = dir.lock(run.job_id, cfg.dist.timeout, run.mode(), run.notes);
    for (auto& note : dir.prepare(run.mode(), run.config_toml, state.step)) run.notes.push_back(note);
    if (shape) {
      if (const ResolvedCheckpoint* from = run.checkpoint()) {
        std::string note = shape_change_note(LaunchShape::read(Checkpoints::run_dir_of(from->dir)), *shape);
        if (!note.empty()) run.notes.push_back(note);
      }
      shape->write(run.out_dir);
    }
    dir.write_run_files(task->run_files(), run.mode());
    if (cfg.log.sample_ids && held()) {
      std::string note = complete_sample_ids(run.out_dir, *held(), state.step, *order, world.rank);
      if (!note.empty()) run.notes.push_back(note);
    }
    if (run.mode() == RunMode::kResume) keeper->note_best_so_far(dir, cfg.eval.split);
  });
  keeper->agree_best_so_far();
  reporter = rank_reporter(run, world, cfg.log);
  if (world.is_main() && held()) {
    std::string note = write_held_train_line(*held(), dir, *reporter);
    if (!note.empty()) run.notes.push_back(note);
    // The open interval goes on: the next line covers its steps too.
    if (!held()->train_line) log->interval().tally = held()->interval;
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
  if (std::string sync = replicas->describe(); !sync.empty()) reporter->message(sync);
  if (std::string ranges = optimizer->describe(); !ranges.empty()) reporter->message(ranges);
  log->interval().start = Clock::now();
  world_start_step = state.step;
  if (held()) log->begin(held()->first_step, held()->started);  // the summary and ETA count every world of this process
  else log->begin(state.step, log->interval().start);
  rng_mark = cpu_rng_state();
  if (replicas->local() && !replicas->window_open()) {
    if (!held() && state.step > 0) step_cursor.consumed = -1;  // a checkpoint does not say where its step began
    mark_sync();
  }
  speed_balance = std::make_unique<SpeedBalance>(*balancer, *loader, world.rank, world.world_size,
                                                 cfg.data.balance_every, world_start_step);
}

StepParts Trainer::Parts::step_parts() const {
  StepParts p(*task, comm, replicas->reduction(), *optimizer, schedule);
  p.precision = precision;
  p.device = world.device;
  p.clip_norm = cfg.optim.clip_norm;
  p.dropout_rng = cfg.model.dropout_rng;
  p.seed = cfg.train.seed;
  if (cfg.data.balance == Balance::kAuto && world.world_size > 1) p.clock = compute_clock.get();
  p.at = run.at;
  return p;
}

StepBatch Trainer::Parts::next_batch() {
  if (run.at) run.at(StepPoint::kBegin, state.step + 1);
  step_start = Clock::now();
  StepBatch batch = loader->next();
  for (auto& micro : batch.micro) {
    if (!micro.empty()) task->add_host_inputs(micro);
  }
  // On a GPU the copies overlap the previous step's kernels, still running:
  // the host is ahead of the device, since no step waits for it.
  batch.staged = feed->stage(batch.micro);
  log->interval().phases.lap(Phase::kData, step_start);
  return batch;
}

void Trainer::Parts::finish_step(const StepBatch& batch, const StepResult& result) {
  log->count(state.step + 1, result);
  state.samples_seen += batch.global_samples;
  ++state.step;
  const Clock::time_point outer = Clock::now();
  bool synced = replicas->after_step(state.step, result.samples, state.step == total_steps);
  log->interval().phases.lap(Phase::kComm, outer);  // the outer sync is the step's too
  log->interval().phases.lap(Phase::kStep, step_start);
  state.cursor = batch.next;
  step_cursor = batch.cursor;
  rng_mark = cpu_rng_state();
  if (synced) mark_sync();
  if (run.at) run.at(StepPoint::kApplied, state.step);
  report_world_change(run.membership, *reporter);
  if (sample_log.is_open()) {
    sample_log << nlohmann::json({{"step", state.step}, {"epoch", batch.cursor.epoch}, {"ids", batch.indices}}).dump()
               << '\n' << std::flush;
    COHORT_CHECK(sample_log.good(), Error, RunDir(run.out_dir).sample_ids_file(world.rank), ": write failed (disk full?)");
  }
  log->progress(state, batch.cursor.epoch, *reporter);
}

// data.balance = auto: every balance-every steps the ranks pool their
// measured speeds and re-deal the coming steps (data/balance.hpp).
void Trainer::Parts::rebalance(const StepResult& result) {
  auto sum = [this](const std::vector<double>& v) { return comm.all_reduce_sum(v, "balance measurement"); };
  std::string change = speed_balance->after_step(state.step, total_steps, result.samples, *compute_clock, sum);
  if (change.empty()) return;
  state.balance_shares = balancer->shares();
  reporter->message(change);
}

// The line is known to every rank before its collectives: a world that
// fails in them hands it to the next (open_outputs writes it).
void Trainer::Parts::log_train(int64_t epoch) {
  TrainReport r = log->line(state, epoch);
  last_line = r;
  if (sync_mark && sync_mark->step == state.step) sync_mark->line = r;  // the sync's step has its line
  comm.agree({state.step, state.cursor.epoch, state.cursor.consumed}, {"step", "epoch", "cursor"}, "the step check");
  report_phases(comm, log->interval().phases, r);
  if (run.at) run.at(StepPoint::kLine, state.step);
  reporter->train(r);
  log->next_interval();
}

// The steps since the last line are read first: a diverged run stops here,
// before its checkpoint (and before an evaluation: run_eval).
void Trainer::Parts::save() {
  log->settle();
  keeper->save(*reporter);
}

void Trainer::Parts::run_eval() {
  if (last_eval_step == state.step) return;
  log->settle();  // a diverged model is named here, never evaluated (nor kept as the best)
  last_eval_step = state.step;
  auto t0 = Clock::now();
  EvalReport r;
  replicas->with_newest_synced([&] { r = evaluate_report(*task, *eval_data, comm, cfg.eval, state.step); });
  reporter->eval(r);
  log->interval().start += Clock::now() - t0;  // evaluation time is not training throughput
  last_eval_text = "; " + r.split + ":" + format_metrics(r.metrics);
  summary.final_eval_loss = metric_value(r.metrics, "loss");
  summary.final_eval_accuracy = metric_value(r.metrics, "accuracy");
  keeper->after_eval(r, *reporter);
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
    // The resume keeps the recorded launch shape: the same command goes on bit-identically.
    const bool nodes = world.local_world_size < world.world_size;
    reporter->message(strf("cohort: stopped by a signal at step %lld; continue with --resume %s%s",
                           static_cast<long long>(state.step), run.out_dir.c_str(),
                           nodes ? " on every node (with the job's --nnodes and --init-method, and its --node-rank)" : ""));
  }
  return stop;
}

// train.early-stop-patience: the same decision on every rank, without a collective.
bool Trainer::Parts::early_stop() {
  summary.stopped_by = keeper->early_stop(total_steps, *reporter);
  return !summary.stopped_by.empty();
}

RunSummary Trainer::Parts::end() {
  log->settle();
  summary.step_losses = log->step_losses();
  if (run_lock) run_lock->release();
  summary.steps = state.step;
  summary.seconds = seconds_since(log->start());
  reporter->message(strf("cohort: done: %lld steps in %s%s%s", static_cast<long long>(state.step - log->start_step()),
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
    StepResult result = train_step(p.step_parts(), p.state, batch, p.log->interval().phases);
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
    if (p.due(p.cfg.ckpt.every_steps) || last || stop) p.save();
    if (stop) break;
    p.admit_joiners();
  }
  return p.end();
}

std::shared_ptr<const Handover> Trainer::handover() const { return p_->handover(); }

}  // namespace cohort
