#include "cohort/core/gz_file.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "cohort/core/error.hpp"

namespace cohort {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

GzFile open_gz_input(const std::string& path, GzSuffix suffix) {
  struct stat st;
  COHORT_CHECK(::stat(path.c_str(), &st) == 0, DataError, path, ": cannot open (", std::strerror(errno), ")");
  COHORT_CHECK(!S_ISDIR(st.st_mode), DataError, path, ": is a directory, expected a file");
  GzFile f(gzopen(path.c_str(), "rb"));
  COHORT_CHECK(f != nullptr, DataError, path, ": cannot open (", std::strerror(errno), ")");
  gzbuffer(f.get(), 1 << 20);
  if (suffix == GzSuffix::kMeansCompressed && (ends_with(path, ".gz") || ends_with(path, ".dz"))) {
    char first = 0;
    int got = gzread(f.get(), &first, 1);
    COHORT_CHECK(got <= 0 || !gzdirect(f.get()), DataError, path,
                 ": not gzip-compressed, though its name ends in ", path.substr(path.size() - 3),
                 " (a wrong or damaged file?)");
    gzrewind(f.get());
  }
  return f;
}

size_t gz_read_some(gzFile f, const std::string& path, void* dst, size_t n) {
  int r = gzread(f, dst, static_cast<unsigned>(std::min<size_t>(n, 1u << 30)));
  if (r < 0) {
    int errnum = 0;
    const char* msg = gzerror(f, &errnum);
    throw DataError(detail::cat(path, ": corrupt or unreadable (", errnum == Z_ERRNO ? std::strerror(errno) : msg,
                                ")"));
  }
  if (r == 0) {
    int errnum = Z_OK;
    const char* msg = gzerror(f, &errnum);
    COHORT_CHECK(errnum == Z_OK, DataError, path, ": truncated or corrupt compressed data (", msg,
                 "); nothing of it is used. Is the file complete?");
  }
  return static_cast<size_t>(r);
}

size_t gz_read_full(gzFile f, const std::string& path, void* dst, size_t n) {
  auto* p = static_cast<char*>(dst);
  size_t got = 0;
  while (got < n) {
    size_t r = gz_read_some(f, path, p + got, n - got);
    if (r == 0) break;
    got += r;
  }
  return got;
}

bool gz_cut_short(gzFile f) {
  int errnum = Z_OK;
  gzerror(f, &errnum);
  return errnum == Z_BUF_ERROR;
}

}  // namespace cohort
