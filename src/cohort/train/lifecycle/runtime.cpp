#include "cohort/train/lifecycle/runtime.hpp"

#include <sched.h>
#include <torch/utils.h>

#include <algorithm>

namespace cohort {

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return 1;
}

void seed_rngs(uint64_t seed, int rank) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(rank) * 0xBF58476D1CE4E5B9ull;
  torch::manual_seed((x ^ (x >> 31)) & ((uint64_t(1) << 63) - 1));
}

}  // namespace cohort
