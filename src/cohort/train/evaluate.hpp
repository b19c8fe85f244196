// defines: evaluate
#pragma once

#include <cstdint>

#include "cohort/data/dataset.hpp"
#include "cohort/eval/tally.hpp"

namespace cohort {

class Comm;
class Task;

struct EvalRun {
  int64_t batch = 512;        // samples per forward, per rank
  int64_t max_samples = 0;    // 0: all of `data`
};

// Runs `task` over this rank's shard of `data` (contiguous, no padding, no
// duplicates) in eval mode without gradients, then sums the metric tallies of
// all ranks: the result is the same for every world size. Collective: every
// rank calls it. Throws DataError when `data` is empty.
Tally evaluate(Task& task, const Dataset& data, Comm& comm, const EvalRun& run);

}  // namespace cohort
