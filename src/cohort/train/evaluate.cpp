#include "cohort/train/evaluate.hpp"

#include <torch/autograd.h>

#include "cohort/core/error.hpp"
#include "cohort/data/loader.hpp"
#include "cohort/dist/comm.hpp"
#include "cohort/train/task.hpp"

namespace cohort {

Tally evaluate(Task& task, const Dataset& data, Comm& comm, const EvalRun& run) {
  const World& world = comm.world();
  int64_t n = run.max_samples > 0 ? std::min(run.max_samples, data.size()) : data.size();
  COHORT_CHECK(n > 0, DataError, "evaluation set is empty (", data.describe(),
               "); set eval.split to a split with samples");
  Slice mine = eval_shard(n, world.rank, world.world_size);

  auto module = task.module();
  bool was_training = module->is_training();
  module->eval();
  torch::NoGradGuard no_grad;
  Tally tally = task.empty_tally();
  for (int64_t begin = mine.begin; begin < mine.end; begin += run.batch) {
    std::vector<int64_t> ids;
    for (int64_t i = begin; i < std::min(mine.end, begin + run.batch); ++i) ids.push_back(i);
    tally.merge(task.forward(to_device(gather(data, ids), world.device)).tally);
  }
  module->train(was_training);
  tally.unflatten(comm.all_reduce_sum(tally.flatten(), "evaluation metrics"));
  return tally;
}

}  // namespace cohort
