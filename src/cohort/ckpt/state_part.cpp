#include "cohort/ckpt/state_part.hpp"

#include <cctype>

#include "cohort/core/error.hpp"

namespace cohort {

std::string part_tensor_name(const std::string& part, const std::string& tensor) {
  return tensor.empty() ? part : part + "." + tensor;
}

namespace {

// `rest` is `part`'s tensor X as "NAME" or "NAME.X": X ("" for the first).
bool tensor_of(const std::string& rest, const std::string& part, std::string& tensor) {
  if (rest == part) {
    tensor.clear();
    return true;
  }
  if (rest.size() <= part.size() + 1 || rest.compare(0, part.size(), part) != 0 || rest[part.size()] != '.') {
    return false;
  }
  tensor = rest.substr(part.size() + 1);
  return true;
}

}  // namespace

SavedPart read_saved_part(const std::map<std::string, torch::Tensor>& tensors, const std::string& part,
                          int world_size, const std::string& file) {
  SavedPart saved;
  saved.by_rank.resize(static_cast<size_t>(world_size));
  const std::string rank_prefix = "rank.";
  for (const auto& [name, t] : tensors) {
    std::string tensor;
    if (tensor_of(name, part, tensor)) {
      saved.shared.emplace_back(tensor, t);
      continue;
    }
    if (name.rfind(rank_prefix, 0) != 0) continue;
    size_t digits = rank_prefix.size(), end = digits;
    while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
    if (end == digits || end >= name.size() || name[end] != '.') continue;
    if (!tensor_of(name.substr(end + 1), part, tensor)) continue;
    int r = end - digits > 9 ? world_size : std::stoi(name.substr(digits, end - digits));
    COHORT_CHECK(r >= 0 && r < world_size, DataError, file, ": ", name, " names a rank outside the checkpoint's ",
                 world_size);
    saved.by_rank[static_cast<size_t>(r)].emplace_back(tensor, t);
  }
  return saved;
}

}  // namespace cohort
