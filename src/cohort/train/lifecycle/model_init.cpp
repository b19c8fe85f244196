#include "cohort/train/lifecycle/model_init.hpp"

#include <filesystem>

#include <torch/serialize.h>

#include "cohort/ckpt/checkpoint.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/format.hpp"
#include "cohort/distributed/world.hpp"
#include "cohort/train/lifecycle/train_state.hpp"
#include "cohort/train/optimization/step_optimizer.hpp"
#include "cohort/train/task.hpp"

namespace cohort {

std::vector<std::string> load_init_weights(Task& task, const std::string& init) {
  std::string file;
  try {
    file = model_weights_file(init);
  } catch (const DataError& e) {
    throw DataError(std::string("model.init ") + e.what());
  }
  auto list = [](const std::vector<std::string>& names) {
    std::string out;
    for (size_t i = 0; i < names.size() && i < 8; ++i) out += (i ? ", " : "") + names[i];
    return names.size() > 8 ? out + strf(", ... (%zu in all)", names.size()) : out;
  };
  if (!task.init_partially()) {
    std::vector<std::string> skipped =
        load_model_weights(*task.module(), file, [&](const std::string& name) { return task.init_may_skip(name); });
    if (skipped.empty()) return {"model.init: every tensor from " + file};
    return {"model.init: every tensor from " + file + " but " + list(skipped) +
            " (initialised or left out: the heads of the other recipe, task.nsp)"};
  }
  WeightsLoad w = load_model_weights_partial(*task.module(), file);
  std::vector<std::string> notes;
  notes.push_back(strf("model.init: %lld tensors from %s", static_cast<long long>(w.loaded), file.c_str()));
  if (!w.initialised.empty()) notes.push_back("model.init: initialised (not in the file): " + list(w.initialised));
  if (!w.ignored.empty()) notes.push_back("model.init: left out (not in this model): " + list(w.ignored));
  return notes;
}

std::vector<std::string> restore_checkpoint(const ResolvedCheckpoint& from, Task& task, StepOptimizer& optimizer,
                                            const std::vector<StatePart*>& parts, TrainState& state,
                                            const World& world, const std::string& data_path, int64_t usable) {
  namespace fs = std::filesystem;
  load_model_weights(*task.module(), from.file("model.safetensors"));
  std::string reshard = optimizer.restore(from);
  std::vector<std::string> parts_said = state.restore(from, world, parts);
  // data.path may change on resume (the data moved); the data may not.
  COHORT_CHECK(from.state.train_samples < 0 || from.state.train_samples == task.train_set().size(), DataError,
               from.dir, " was trained on ", from.state.train_samples, " samples but ", data_path, " holds ",
               task.train_set().size(), ": is this the same dataset?");
  COHORT_CHECK(state.cursor.consumed < usable, DataError, from.dir, ": cursor ", state.cursor.consumed,
               " is outside the epoch's ", usable, " samples: is this the same dataset?");
  std::vector<std::string> notes = {
      strf("resumed from %s: step %lld, epoch %lld, %lld samples into the epoch (written by %d rank(s), now %d)",
           from.dir.c_str(), static_cast<long long>(state.step), static_cast<long long>(state.cursor.epoch),
           static_cast<long long>(state.cursor.consumed), from.state.world_size, world.world_size)};
  if (!reshard.empty()) notes.push_back(reshard);
  for (auto& note : parts_said) notes.push_back(std::move(note));
  return notes;
}

}  // namespace cohort
