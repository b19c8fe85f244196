// defines: Interval, TrainLog
//
// What training tells as it goes: progress after every step, and the train
// line (the metrics of the interval since the last line, throughput, ETA)
// when one is due. The interval's metrics were summed over the ranks step by
// step (train_step), so every rank knows the line before its collectives.
#pragma once

#include <cstdint>

#include "cohort/eval/tally.hpp"
#include "cohort/obs/reporter.hpp"
#include "cohort/train/phase_timer.hpp"

namespace cohort {

class Balancer;
struct LrSchedule;
class Task;
struct StepResult;
struct TrainState;

// Training metrics since the last train line.
struct Interval {
  Tally tally;
  int64_t units = 0;
  Clock::time_point start = Clock::now();
  PhaseTimer phases;
};

class TrainLog {
 public:
  TrainLog(const Task& task, const LrSchedule& schedule, const Balancer& balancer, int64_t total_steps);

  // Where this process's training began, which the ETA and the summary count
  // from: this world's first step, or an elastic process's first world's.
  void begin(int64_t start_step, Clock::time_point start);
  int64_t start_step() const { return start_step_; }
  Clock::time_point start() const { return start_; }

  Interval& interval() { return interval_; }
  const Interval& interval() const { return interval_; }
  // The step just applied counts into the interval.
  void count(const StepResult& result);
  // Progress after step state.step, to `reporter`.
  void progress(const StepResult& result, const TrainState& state, int64_t epoch, Reporter& reporter) const;
  // The line of the interval that ends at state.step, but for the per-phase
  // times (report_phases: a collective).
  TrainReport line(const TrainState& state, int64_t epoch) const;
  // A new interval, after a line.
  void next_interval();

 private:
  double eta(int64_t step) const;

  const Task& task_;
  const LrSchedule& schedule_;
  const Balancer& balancer_;
  int64_t total_steps_;
  Interval interval_;
  Clock::time_point start_ = Clock::now();
  int64_t start_step_ = 0;
};

}  // namespace cohort
