#include "cohort/train/model_init.hpp"

#include "cohort/ckpt/checkpoint.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/format.hpp"
#include "cohort/train/task.hpp"

namespace cohort {

std::vector<std::string> load_init_weights(Task& task, const std::string& init) {
  std::string file;
  try {
    file = model_weights_file(init);
  } catch (const DataError& e) {
    throw DataError(std::string("model.init ") + e.what());
  }
  if (!task.init_partially()) {
    load_model_weights(*task.module(), file);
    return {"model.init: every tensor from " + file};
  }
  WeightsLoad w = load_model_weights_partial(*task.module(), file);
  auto list = [](const std::vector<std::string>& names) {
    std::string out;
    for (size_t i = 0; i < names.size() && i < 8; ++i) out += (i ? ", " : "") + names[i];
    return names.size() > 8 ? out + strf(", ... (%zu in all)", names.size()) : out;
  };
  std::vector<std::string> notes;
  notes.push_back(strf("model.init: %lld tensors from %s", static_cast<long long>(w.loaded), file.c_str()));
  if (!w.initialised.empty()) notes.push_back("model.init: initialised (not in the file): " + list(w.initialised));
  if (!w.ignored.empty()) notes.push_back("model.init: left out (not in this model): " + list(w.ignored));
  return notes;
}

}  // namespace cohort
