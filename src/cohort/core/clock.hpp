// defines: Clock, seconds_since
//
// The one clock Cohort measures durations with (monotonic: a wall-clock
// change does not bend a step time or a timeout).
#pragma once

#include <chrono>

namespace cohort {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace cohort
