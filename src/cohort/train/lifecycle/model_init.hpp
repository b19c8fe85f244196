// defines: load_init_weights, restore_checkpoint
//
// Where a run's model starts: model.init's weights, or a checkpoint's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cohort {

class StatePart;
class StepOptimizer;
class Task;
struct ResolvedCheckpoint;
struct TrainState;
struct World;

// model.init: `init` (a run directory, a checkpoint or a .safetensors file)
// into the task's model. A pretraining task takes every tensor; a
// fine-tuning task (Task::init_partially) starts from what the file shares
// with it. Returns the log's notes: what was loaded, initialised and left
// out. DataError naming model.init when `init` holds no weights.
std::vector<std::string> load_init_weights(Task& task, const std::string& init);

// A verified checkpoint's weights into the task's model, its optimizer state
// into `optimizer`, its train state into `state` and every state part's
// tensors into its part (the loss scaler, the outer stage's PowerSGD or
// local sync state). DataError when the data are not the checkpoint's:
// another sample count in `data_path`, or a cursor beyond the epoch's
// `usable` samples. Returns the log's notes.
std::vector<std::string> restore_checkpoint(const ResolvedCheckpoint& from, Task& task, StepOptimizer& optimizer,
                                            const std::vector<StatePart*>& parts, TrainState& state,
                                            const World& world, const std::string& data_path, int64_t usable);

}  // namespace cohort
