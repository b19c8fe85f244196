// defines: Error, UsageError, ConfigError, DataError, DistError, COHORT_CHECK, HeldPathName
//
// Every failure Cohort reports is one of these. `main` catches Error, prints
// `cohort: error: <what()>` on one line and exits with exit_code(): 2 for a
// usage or config mistake the user can fix by changing the command, 1 for a
// runtime failure (bad data, lost rank, I/O).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace cohort {

namespace detail {
// A file read through a descriptor held open (a checkpoint's files, read
// while another job's keep rotation may remove them) is opened as
// /proc/self/fd/N. While such a name is registered, an Error's message
// shows the file's own path instead (core/files.cpp).
std::string held_paths_named(const std::string& msg);
}  // namespace detail

// Registers `proc_path` (/proc/self/fd/N) as `real_path` in error messages
// for the object's lifetime.
class HeldPathName {
 public:
  HeldPathName(std::string proc_path, const std::string& real_path);
  ~HeldPathName();
  HeldPathName(const HeldPathName&) = delete;
  HeldPathName& operator=(const HeldPathName&) = delete;

 private:
  std::string proc_path_;
};

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg, int exit_code = 1)
      : std::runtime_error(detail::held_paths_named(msg)), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

// A bad command line, option value or config file. Exit code 2.
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& msg) : Error(msg, 2) {}
};

// A config key with a bad value. Exit code 2. The message names the key.
class ConfigError : public UsageError {
 public:
  using UsageError::UsageError;
};

// Input data that cannot be used: missing, truncated, wrong shape or dtype.
// The message names the file. Exit code 1.
class DataError : public Error {
 public:
  explicit DataError(const std::string& msg) : Error(msg, 1) {}
};

// A distributed failure: rendezvous, timeout, a dead or diverging rank.
class DistError : public Error {
 public:
  explicit DistError(const std::string& msg) : Error(msg, 1) {}
};

namespace detail {
template <class... Parts>
std::string cat(Parts&&... parts) {
  std::ostringstream os;
  (os << ... << std::forward<Parts>(parts));
  return os.str();
}

// The first line of a (possibly multi-line) library message, for one-line errors.
inline std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

// "a | b | c", for messages that list the accepted values.
inline std::string join(const std::vector<std::string>& items, const char* sep = " | ") {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : sep) + item;
  return out;
}
}  // namespace detail

}  // namespace cohort

// COHORT_CHECK(cond, ErrorType, parts...) throws ErrorType(parts...) when cond
// is false. Use it on input, never `assert` (NDEBUG removes asserts).
#define COHORT_CHECK(cond, ErrorType, ...) \
  do {                                     \
    if (!(cond)) {                         \
      throw ErrorType(::cohort::detail::cat(__VA_ARGS__)); \
    }                                      \
  } while (0)
