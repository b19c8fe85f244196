// defines: NamedTensors, save_safetensors, load_safetensors
//
// The safetensors format: an 8-byte little-endian header length, a JSON
// header {name: {dtype, shape, data_offsets}, "__metadata__": {...}}, then
// the raw little-endian tensor bytes. Readable by the Hugging Face ecosystem.
#pragma once

#include <torch/types.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace cohort {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// Writes `tensors` (moved to CPU, made contiguous) in the given order.
// Throws Error naming the path and the reason on an I/O failure (the partial
// file is removed). Fsyncs the file.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

struct SafetensorsFile {
  std::map<std::string, torch::Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

// Reads and validates a whole file: header length, JSON, dtypes, shapes and
// offsets. Throws DataError naming the file (and the key) when malformed.
SafetensorsFile load_safetensors(const std::string& path);

}  // namespace cohort
