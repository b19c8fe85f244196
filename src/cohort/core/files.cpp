#include "cohort/core/files.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cohort/core/error.hpp"

namespace cohort {

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

void write_file_atomically(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << bytes;
    out.flush();
    if (!out.good()) {
      std::remove(tmp.c_str());
      throw Error(detail::cat(tmp, ": write failed (disk full?)"));
    }
  }
  commit_file(tmp, path);
}

}  // namespace cohort
