#include "cohort/train/loop/train_log.hpp"

#include <algorithm>
#include <cmath>

#include "cohort/core/error.hpp"
#include "cohort/data/balance.hpp"
#include "cohort/device/host_read.hpp"
#include "cohort/obs/reporter.hpp"
#include "cohort/train/lifecycle/train_state.hpp"
#include "cohort/train/loop/train_step.hpp"
#include "cohort/train/optimization/optim.hpp"
#include "cohort/train/task.hpp"

namespace cohort {

TrainLog::TrainLog(const Task& task, const LrSchedule& schedule, const Balancer& balancer, int64_t total_steps,
                   const c10::Device& device)
    : task_(task), schedule_(schedule), balancer_(balancer), total_steps_(total_steps), device_(device) {}

void TrainLog::begin(int64_t start_step, Clock::time_point start) {
  start_step_ = start_step;
  start_ = start;
}

void TrainLog::count(int64_t step, const StepResult& result) {
  interval_.phases.end_step();
  interval_.tally.merge(result.tally);
  interval_.units += result.units;
  pending_.push_back({step, result.tally, result.grad_norm});
}

// One read for everything, gathered on the rank's device: per pending step
// its metrics and gradient norm (0 when fp16's scaler skipped the step),
// then the interval's metrics.
void TrainLog::settle() {
  if (pending_.empty() && !interval_.tally.on_device()) return;
  const Tally layout = task_.empty_tally();
  const size_t width = 2 * layout.names().size() + 1;
  auto opts = torch::TensorOptions().dtype(torch::kFloat64).device(device_);
  std::vector<torch::Tensor> parts;
  for (const auto& p : pending_) {
    parts.push_back(p.tally.flatten(layout, device_));
    parts.push_back(p.grad_norm.defined() ? p.grad_norm.to(opts).reshape({1}) : torch::zeros({1}, opts));
  }
  parts.push_back(interval_.tally.flatten(layout, device_));
  std::vector<double> values = host_values(torch::cat(parts));
  size_t at = 0;
  for (const auto& p : pending_) {
    Tally t = layout;
    t.unflatten(std::vector<double>(values.begin() + static_cast<long>(at),
                                    values.begin() + static_cast<long>(at + width - 1)));
    double loss = metric_value(task_.report(t), "loss");
    COHORT_CHECK(std::isfinite(values[at + width - 1]), Error, "step ", p.step, ": non-finite gradients (loss ", loss,
                 "); lower optim.lr or enable optim.clip-norm");
    step_losses_.push_back(loss);
    at += width;
  }
  pending_.clear();
  Tally interval = layout;
  interval.unflatten(std::vector<double>(values.begin() + static_cast<long>(at), values.end()));
  last_loss_ = metric_value(task_.report(interval), "loss");
  interval_.tally = DeviceTally();
  for (const auto& name : interval.names()) interval_.tally.add(name, interval.sum(name), interval.count(name));
}

void TrainLog::progress(const TrainState& state, int64_t epoch, Reporter& reporter) const {
  double secs = seconds_since(interval_.start);
  reporter.progress({state.step, total_steps_, epoch, last_loss_, schedule_.at(state.step - 1),
                     interval_.units / std::max(secs, 1e-9), task_.unit_name(), eta(state.step)});
}

TrainReport TrainLog::line(const TrainState& state, int64_t epoch) {
  settle();
  TrainReport r;
  r.step = state.step;
  r.total_steps = total_steps_;
  r.epoch = epoch;
  r.lr = schedule_.at(state.step - 1);
  r.samples = state.samples_seen;
  r.units_per_s = interval_.units / std::max(seconds_since(interval_.start), 1e-9);
  r.unit = task_.unit_name();
  r.eta_s = eta(state.step);
  r.metrics = task_.report(interval_.tally.read(task_.empty_tally()));
  if (balancer_.mode() != Balance::kEqual) r.balance = balancer_.shares();
  return r;
}

void TrainLog::next_interval() { interval_ = Interval(); }

double TrainLog::eta(int64_t step) const {
  return eta_seconds(seconds_since(start_), step - start_step_, total_steps_ - step);
}

}  // namespace cohort
