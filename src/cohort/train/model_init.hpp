// defines: load_init_weights
#pragma once

#include <string>
#include <vector>

namespace cohort {

class Task;

// model.init: `init` (a run directory, a checkpoint or a .safetensors file)
// into the task's model. A pretraining task takes every tensor; a
// fine-tuning task (Task::init_partially) starts from what the file shares
// with it. Returns the log's notes: what was loaded, initialised and left
// out. DataError naming model.init when `init` holds no weights.
std::vector<std::string> load_init_weights(Task& task, const std::string& init);

}  // namespace cohort
