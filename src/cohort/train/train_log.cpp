#include "cohort/train/train_log.hpp"

#include <algorithm>

#include "cohort/data/balance.hpp"
#include "cohort/train/optim.hpp"
#include "cohort/train/task.hpp"
#include "cohort/train/train_state.hpp"
#include "cohort/train/train_step.hpp"

namespace cohort {

TrainLog::TrainLog(const Task& task, const LrSchedule& schedule, const Balancer& balancer, int64_t total_steps)
    : task_(task), schedule_(schedule), balancer_(balancer), total_steps_(total_steps) {
  interval_.tally = task_.empty_tally();
}

void TrainLog::begin(int64_t start_step, Clock::time_point start) {
  start_step_ = start_step;
  start_ = start;
}

void TrainLog::count(const StepResult& result) {
  interval_.phases.end_step();
  interval_.tally.merge(result.tally);
  interval_.units += result.units;
}

void TrainLog::progress(const StepResult& result, const TrainState& state, int64_t epoch, Reporter& reporter) const {
  double secs = seconds_since(interval_.start);
  reporter.progress({state.step, total_steps_, epoch, result.loss, schedule_.at(state.step - 1),
                     interval_.units / std::max(secs, 1e-9), task_.unit_name(), eta(state.step)});
}

TrainReport TrainLog::line(const TrainState& state, int64_t epoch) const {
  TrainReport r;
  r.step = state.step;
  r.total_steps = total_steps_;
  r.epoch = epoch;
  r.lr = schedule_.at(state.step - 1);
  r.samples = state.samples_seen;
  r.units_per_s = interval_.units / std::max(seconds_since(interval_.start), 1e-9);
  r.unit = task_.unit_name();
  r.eta_s = eta(state.step);
  r.metrics = task_.report(interval_.tally);
  if (balancer_.mode() != Balance::kEqual) r.balance = balancer_.shares();
  return r;
}

void TrainLog::next_interval() {
  interval_ = Interval();
  interval_.tally = task_.empty_tally();
}

double TrainLog::eta(int64_t step) const {
  return eta_seconds(seconds_since(start_), step - start_step_, total_steps_ - step);
}

}  // namespace cohort
