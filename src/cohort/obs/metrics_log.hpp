// defines: MetricsLog, format_duration
//
// RUN_DIR/metrics.jsonl: one JSON object per line, flushed as written, so a
// crash loses nothing already reported. Only rank 0 writes; other ranks hold
// a disabled log.
#pragma once

#include <nlohmann/json.hpp>

#include <fstream>
#include <string>

namespace cohort {

class MetricsLog {
 public:
  MetricsLog() = default;  // disabled
  explicit MetricsLog(const std::string& path);
  void write(const nlohmann::json& line);
  bool enabled() const { return out_.is_open(); }

 private:
  std::ofstream out_;
  std::string path_;
};

// 75.3 -> "1m15s", 3725 -> "1h02m".
std::string format_duration(double seconds);

}  // namespace cohort
