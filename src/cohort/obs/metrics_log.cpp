#include "cohort/obs/metrics_log.hpp"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "cohort/core/error.hpp"

namespace cohort {

MetricsLog::MetricsLog(const std::string& path) : out_(path, std::ios::app), path_(path) {
  COHORT_CHECK(out_.is_open(), Error, path, ": cannot open for writing (", std::strerror(errno), ")");
}

void MetricsLog::write(const nlohmann::json& line) {
  if (!out_.is_open()) return;
  errno = 0;
  out_ << line.dump() << '\n';
  out_.flush();
  // A full disk: one error naming the file (a torn last line is dropped on
  // resume), and no more writes after it.
  if (!out_.good()) {
    int err = errno;
    out_.close();
    throw Error(detail::cat(path_, ": write failed (", err ? std::strerror(err) : "disk full?", ")"));
  }
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  long s = std::lround(seconds);
  char buf[32];
  if (s < 60) std::snprintf(buf, sizeof buf, "%lds", s);
  else if (s < 3600) std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, (s % 3600) / 60);
  return buf;
}

}  // namespace cohort
