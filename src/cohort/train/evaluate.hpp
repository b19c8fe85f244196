// defines: evaluate
#pragma once

#include <cstdint>

#include "cohort/data/dataset.hpp"
#include "cohort/eval/tally.hpp"

namespace cohort {

class Task;
struct World;

struct EvalRun {
  int64_t batch = 512;        // samples per forward, per rank
  int64_t max_samples = 0;    // 0: all of `data`
};

// Runs `task` over this rank's shard of `data` (contiguous, no padding, no
// duplicates) in eval mode without gradients, and returns metric sums and
// counts. Summing the tallies of all ranks gives the same totals for every
// world size. Throws DataError when `data` is empty.
Tally evaluate(Task& task, const Dataset& data, const World& world, const EvalRun& run);

}  // namespace cohort
