#include "cohort/train/loop/phase_timer.hpp"

#include <algorithm>

namespace cohort {

const char* phase_name(Phase phase) {
  static const char* const kNames[kPhaseCount] = {"data", "forward", "backward", "comm", "optim", "step"};
  return kNames[static_cast<int>(phase)];
}

std::vector<double> PhaseTimer::per_step() const {
  std::vector<double> out(total_.begin(), total_.end());
  for (double& v : out) v /= static_cast<double>(std::max<int64_t>(1, steps_));
  return out;
}

}  // namespace cohort
