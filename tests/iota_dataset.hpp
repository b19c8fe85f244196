// A dataset whose sample i is a scalar tensor holding i, so batches show
// which ids they hold: for the order, loader and balance tests.
#pragma once

#include <string>
#include <vector>

#include "cohort/data/dataset.hpp"

namespace cohort::test {

class IotaDataset : public Dataset {
 public:
  explicit IotaDataset(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  Example get(int64_t i) const override { return {{"id", torch::tensor(i)}}; }
  std::string describe() const override { return "iota"; }

 private:
  int64_t n_;
};

// The ids a batch of IotaDataset holds, in order.
inline std::vector<int64_t> ids_of(const Example& batch) {
  if (batch.empty()) return {};
  auto t = batch.at("id").contiguous();
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

}  // namespace cohort::test
