// defines: Interval, TrainLog
//
// What training tells as it goes: progress after every step, and the train
// line (the metrics of the interval since the last line, throughput, ETA)
// when one is due. The interval's metrics were summed over the ranks step by
// step (train_step), so every rank knows the line before its collectives.
// They stay on the device until settle() reads them, once per line (and
// before a checkpoint): a step never waits for the device, and the progress
// shown between lines carries the last line's loss.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "cohort/device/device_tally.hpp"
#include "cohort/eval/tally.hpp"
#include "cohort/obs/reporter.hpp"
#include "cohort/train/loop/phase_timer.hpp"

namespace cohort {

class Balancer;
struct LrSchedule;
class Task;
struct StepResult;
struct TrainState;

// Training metrics since the last train line.
struct Interval {
  DeviceTally tally;
  int64_t units = 0;
  Clock::time_point start = Clock::now();
  PhaseTimer phases;
};

class TrainLog {
 public:
  // `device`: where the steps leave their records (the rank's device).
  TrainLog(const Task& task, const LrSchedule& schedule, const Balancer& balancer, int64_t total_steps,
           const c10::Device& device);

  // Where this process's training began, which the ETA and the summary count
  // from: this world's first step, or an elastic process's first world's.
  void begin(int64_t start_step, Clock::time_point start);
  int64_t start_step() const { return start_step_; }
  Clock::time_point start() const { return start_; }

  Interval& interval() { return interval_; }
  const Interval& interval() const { return interval_; }
  // Step `step`, just applied, counts into the interval; its values stay
  // on the device.
  void count(int64_t step, const StepResult& result);
  // Reads what the steps counted since the last settle() left on the device
  // (one counted host read; none when nothing is left): each step's loss and
  // the interval's metrics. Error naming the first step whose gradients were
  // non-finite (training diverged).
  void settle();
  // Every settled step's mean loss over the ranks, in order.
  const std::vector<double>& step_losses() const { return step_losses_; }
  // Progress after step state.step, to `reporter`, with the last settled loss.
  void progress(const TrainState& state, int64_t epoch, Reporter& reporter) const;
  // The line of the interval that ends at state.step, but for the per-phase
  // times (report_phases: a collective). Settles first.
  TrainReport line(const TrainState& state, int64_t epoch);
  // A new interval, after a line.
  void next_interval();

 private:
  double eta(int64_t step) const;

  struct Pending {
    int64_t step;
    DeviceTally tally;        // the step's metrics, over the ranks
    torch::Tensor grad_norm;  // undefined: the step was skipped (fp16 overflow)
  };

  const Task& task_;
  const LrSchedule& schedule_;
  const Balancer& balancer_;
  int64_t total_steps_;
  c10::Device device_;
  Interval interval_;
  std::vector<Pending> pending_;  // steps counted since the last settle()
  std::vector<double> step_losses_;
  double last_loss_ = std::numeric_limits<double>::quiet_NaN();  // the last line's, for progress
  Clock::time_point start_ = Clock::now();
  int64_t start_step_ = 0;
};

}  // namespace cohort
