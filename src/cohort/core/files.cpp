#include "cohort/core/files.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "cohort/core/error.hpp"

namespace cohort {

namespace {

std::mutex& held_names_mu() {
  static std::mutex mu;
  return mu;
}

std::map<std::string, std::string>& held_names() {
  static std::map<std::string, std::string> names;  // /proc/self/fd/N -> the file's path
  return names;
}

}  // namespace

HeldPathName::HeldPathName(std::string proc_path, const std::string& real_path) : proc_path_(std::move(proc_path)) {
  std::lock_guard<std::mutex> lock(held_names_mu());
  held_names()[proc_path_] = real_path;
}

HeldPathName::~HeldPathName() {
  std::lock_guard<std::mutex> lock(held_names_mu());
  held_names().erase(proc_path_);
}

std::string detail::held_paths_named(const std::string& msg) {
  static const std::string kPrefix = "/proc/self/fd/";
  if (msg.find(kPrefix) == std::string::npos) return msg;
  std::lock_guard<std::mutex> lock(held_names_mu());
  std::string out;
  size_t at = 0;
  for (size_t hit; (hit = msg.find(kPrefix, at)) != std::string::npos;) {
    size_t end = hit + kPrefix.size();
    while (end < msg.size() && msg[end] >= '0' && msg[end] <= '9') ++end;
    auto it = held_names().find(msg.substr(hit, end - hit));
    out += msg.substr(at, hit - at) + (it == held_names().end() ? msg.substr(hit, end - hit) : it->second);
    at = end;
  }
  return out + msg.substr(at);
}

namespace fs = std::filesystem;

namespace {

std::string parent_of(const std::string& path) {
  fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

}  // namespace

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  COHORT_CHECK(in.good(), DataError, path, ": missing or unreadable");
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

void sync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  COHORT_CHECK(fd >= 0, Error, path, ": cannot open to sync (", std::strerror(errno), ")");
  int rc = ::fsync(fd);
  ::close(fd);
  COHORT_CHECK(rc == 0, Error, path, ": fsync failed (", std::strerror(errno), ")");
}

void commit_file(const std::string& tmp, const std::string& path) {
  try {
    sync_path(tmp, false);
    COHORT_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, Error, path, ": cannot rename ", tmp, " into place (",
                 std::strerror(errno), ")");
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  sync_path(parent_of(path), true);
}

void write_file_durably(const std::string& path, const std::vector<std::string_view>& parts) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  COHORT_CHECK(fd >= 0, Error, path, ": cannot open for writing (", std::strerror(errno), ")");
  auto fail = [&](const char* what, int err) {
    ::close(fd);
    ::unlink(path.c_str());  // a partial file would only fill the disk further
    throw Error(detail::cat(path, ": ", what, " (", std::strerror(err), ")"));
  };
  for (std::string_view part : parts) {
    while (!part.empty()) {
      ssize_t n = ::write(fd, part.data(), part.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail("write failed", n < 0 ? errno : ENOSPC);
      part.remove_prefix(static_cast<size_t>(n));
    }
  }
  if (::fsync(fd) != 0) fail("fsync failed", errno);
  if (::close(fd) != 0) {  // NFS reports some write errors only here
    int err = errno;
    ::unlink(path.c_str());
    throw Error(detail::cat(path, ": write failed on close (", std::strerror(err), ")"));
  }
}

void write_file_atomically(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  write_file_durably(tmp, {bytes});
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    std::remove(tmp.c_str());
    throw Error(detail::cat(path, ": cannot rename ", tmp, " into place (", std::strerror(err), ")"));
  }
  sync_path(parent_of(path), true);
}

}  // namespace cohort
