#include "cohort/data/dataset.hpp"

#include "cohort/core/error.hpp"

namespace cohort {

Example collate(const std::vector<Example>& examples) {
  COHORT_CHECK(!examples.empty(), Error, "collate: no examples");
  Example out;
  for (const auto& [name, first] : examples.front()) {
    std::vector<torch::Tensor> parts;
    parts.reserve(examples.size());
    for (const auto& ex : examples) {
      auto it = ex.find(name);
      COHORT_CHECK(it != ex.end(), DataError, "collate: an example lacks field '", name, "'");
      parts.push_back(it->second);
    }
    out[name] = torch::stack(parts);
  }
  return out;
}

Example Dataset::get_batch(const std::vector<int64_t>& indices) const {
  std::vector<Example> examples;
  examples.reserve(indices.size());
  for (int64_t i : indices) examples.push_back(get(i));
  return collate(examples);
}

Example gather(const Dataset& ds, const std::vector<int64_t>& indices) { return ds.get_batch(indices); }

}  // namespace cohort
