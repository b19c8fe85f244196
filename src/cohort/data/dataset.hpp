// defines: Example, Dataset, collate
//
// A dataset is random access: size() and get(i). Samplers, batchers and the
// prefetching loader are views over it, composed in loader.hpp.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace cohort {

// One sample, or one batch once collated: named tensors ("image", "label",
// "input_ids", ...). A task reads the names it needs.
using Example = std::map<std::string, torch::Tensor>;

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // Thread-safe: loader workers call get() concurrently.
  virtual Example get(int64_t index) const = 0;
  // The collated batch of `indices`. The default collates get(i); datasets
  // that can gather many rows at once (in-memory tensors) override it.
  virtual Example get_batch(const std::vector<int64_t>& indices) const;
  // The batch as training deals it in `epoch`: datasets that draw something
  // afresh each epoch (dynamic masking) draw it from (seed, epoch, sample
  // id), so a sample's draw does not depend on who fetches it. The default
  // is get_batch, which evaluation uses.
  virtual Example draw_batch(const std::vector<int64_t>& indices, int64_t epoch) const {
    (void)epoch;
    return get_batch(indices);
  }
  // Sequence datasets: sample i's real length, for length bucketing
  // (data.bucket). The default, -1, means samples have no length.
  virtual int64_t length(int64_t index) const {
    (void)index;
    return -1;
  }
  // One line for logs: what this is and where it came from.
  virtual std::string describe() const = 0;
};

// Stacks each named tensor along a new leading dimension. All examples must
// have the same names and shapes.
Example collate(const std::vector<Example>& examples);

// Fetches `indices` from `ds` as one collated batch (ds.get_batch).
Example gather(const Dataset& ds, const std::vector<int64_t>& indices);

}  // namespace cohort
