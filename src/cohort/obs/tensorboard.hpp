// defines: TensorBoardWriter, tensorboard_scalars, crc32c, masked_crc32c
//
// TensorBoard event files, written without TensorFlow or protobuf: each
// record is a little-endian uint64 length, its masked CRC32C, the serialized
// Event, and the Event's masked CRC32C. Events carry scalar summaries
// (Event{wall_time=1, step=2, summary=5{value=1{tag=1, simple_value=2}}}).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace cohort {

// Every number of a metrics.jsonl line as a TensorBoard scalar, tagged
// "<prefix>/<key>" ("train/loss", "valid/mlm_accuracy"); nested objects nest
// ("train/phase_ms/comm"). The line's "step", "kind" and "split" are not
// scalars: they say where the others belong.
std::vector<std::pair<std::string, double>> tensorboard_scalars(const std::string& prefix,
                                                                 const nlohmann::json& line);

uint32_t crc32c(const void* data, size_t size);
uint32_t masked_crc32c(const void* data, size_t size);

class TensorBoardWriter {
 public:
  TensorBoardWriter() = default;  // disabled
  // Creates dir/events.out.tfevents.<unix time>.<host> and writes the
  // file-version event.
  explicit TensorBoardWriter(const std::string& dir);
  bool enabled() const { return out_.is_open(); }
  const std::string& path() const { return path_; }

  // One event at `step` holding these scalars ("train/loss", ...).
  void scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);

 private:
  void record(const std::string& event);
  std::ofstream out_;
  std::string path_;
};

}  // namespace cohort
