// defines: DeviceTally
//
// A Tally (eval/tally.hpp) whose sums may still be tensors on the device: a
// task adds its loss and its correct predictions as they are, the trainer
// sums them over micro-batches, steps and ranks without reading them, and
// read() turns the whole into a host Tally with one counted host read, at a
// log point or at evaluation's end. Values the host knows (counts) stay on
// the host. Tensors are never changed in place, so copies share them.
//
// Many metrics at once (a confusion matrix's cells) are one block: a tensor
// of sums and one of counts over names that are adjacent in sorted order.
#pragma once

#include <c10/core/Device.h>
#include <torch/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cohort/eval/tally.hpp"

namespace cohort {

class DeviceTally {
 public:
  // Host values, e.g. a count the host knows.
  void add(const std::string& name, double sum, double count);
  // `sum` (one value, any dtype) stays where it is until read().
  void add(const std::string& name, const torch::Tensor& sum, double count);
  // A count the host does not know either (positives in a batch).
  void add(const std::string& name, const torch::Tensor& sum, const torch::Tensor& count);
  // names[i] gets sums[i] and counts[i] (tensors of names.size() values);
  // the names must be sorted and no other metric may sort between them.
  void add(std::shared_ptr<const std::vector<std::string>> names, const torch::Tensor& sums,
           const torch::Tensor& counts);
  void merge(const DeviceTally& other);

  // True when some value is a tensor (read() then reads the device).
  bool on_device() const;
  // [sum0, count0, sum1, count1, ...] over every name of `layout`, in
  // Tally::flatten's order (0 for a name never added), as float64 on
  // `device`, for an all-reduce; reads nothing. Error for a name `layout`
  // lacks.
  torch::Tensor flatten(const Tally& layout, const c10::Device& device) const;
  // The inverse: every name of `layout`, its values views of `flat`.
  static DeviceTally unflatten(const Tally& layout, const torch::Tensor& flat);
  // The host tally over `layout`'s names: one counted host read when
  // on_device(), none otherwise.
  Tally read(const Tally& layout) const;

 private:
  struct Entry {
    double sum = 0, count = 0;               // host parts
    torch::Tensor device_sum, device_count;  // float64 scalars, or undefined
  };
  struct Block {
    std::shared_ptr<const std::vector<std::string>> names;
    torch::Tensor sums, counts;  // float64 [names->size()]
  };
  std::map<std::string, Entry> entries_;
  std::vector<Block> blocks_;
};

}  // namespace cohort
