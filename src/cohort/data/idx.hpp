// defines: IdxArray, read_idx, ImageDataset
//
// The IDX format (MNIST, Fashion-MNIST): two zero bytes, a dtype byte, a
// dimension count, big-endian uint32 dimensions, then the data. Files may be
// gzip'd; zlib reads both forms.
#pragma once

#include <torch/types.h>

#include <string>
#include <vector>

#include "cohort/data/dataset.hpp"

namespace cohort {

struct IdxArray {
  std::vector<int64_t> dims;
  torch::Tensor data;  // uint8, shape `dims`
};

// Reads a whole IDX file of unsigned bytes. Throws DataError naming the file
// for a missing, truncated, oversized or corrupt file, or another dtype.
IdxArray read_idx(const std::string& path);

// `dir/stem.gz` if it exists, else `dir/stem`. Throws DataError if neither.
std::string find_idx(const std::string& dir, const std::string& stem);

// An image classification split in IDX form: `train` or `test` (t10k) images
// and labels. get(i) returns {"image": float [1,H,W] normalised,
// "label": int64 scalar}.
class ImageDataset : public Dataset {
 public:
  static ImageDataset load(const std::string& dir, const std::string& split);
  ImageDataset(IdxArray images, IdxArray labels, std::string origin);

  int64_t size() const override { return images_.size(0); }
  Example get(int64_t index) const override;
  Example get_batch(const std::vector<int64_t>& indices) const override;
  std::string describe() const override;

  int64_t num_classes() const { return num_classes_; }
  int64_t height() const { return images_.size(1); }
  int64_t width() const { return images_.size(2); }

 private:
  torch::Tensor images_;  // uint8 [N,H,W]
  torch::Tensor labels_;  // int64 [N]
  int64_t num_classes_ = 0;
  std::string origin_;
};

}  // namespace cohort
