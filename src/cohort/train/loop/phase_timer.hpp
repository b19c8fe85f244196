// defines: Phase, phase_name, PhaseTimer
//
// Where a rank's step time goes, summed between log lines: waiting for
// data, forward, backward, exposed communication (what backward did not
// hide), the optimizer, and whole steps.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <vector>

#include "cohort/core/clock.hpp"

namespace cohort {

enum class Phase { kData, kForward, kBackward, kComm, kOptim, kStep };
constexpr int kPhaseCount = 6;

// "data", "forward", "backward", "comm", "optim", "step": metrics.jsonl's phase_ms keys.
const char* phase_name(Phase phase);

class PhaseTimer {
 public:
  void add(Phase phase, double seconds) { total_[static_cast<size_t>(phase)] += seconds; }
  // Adds the time since `start` to `phase`, and returns now.
  Clock::time_point lap(Phase phase, Clock::time_point start) {
    auto now = Clock::now();
    add(phase, std::chrono::duration<double>(now - start).count());
    return now;
  }
  void end_step() { ++steps_; }
  // Mean seconds per step in each phase, in Phase order, since the last reset.
  std::vector<double> per_step() const;
  void reset() {
    total_.fill(0.0);
    steps_ = 0;
  }

 private:
  std::array<double, kPhaseCount> total_{};
  int64_t steps_ = 0;
};

}  // namespace cohort
