#include "cohort/data/hdf5_shard.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "cohort/core/error.hpp"

extern char** environ;

namespace cohort::hdf5 {

namespace fs = std::filesystem;

std::mutex& hdf5_mutex() {
  static std::mutex mu;
  return mu;
}

std::string hdf5_detail() {
  std::string out;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_UPWARD,
      [](unsigned n, const H5E_error2_t* err, void* data) -> herr_t {
        if (n == 0 && err->desc) *static_cast<std::string*>(data) = err->desc;
        return 0;
      },
      &out);
  return out.empty() ? "no detail from HDF5" : out;
}

std::string layout_names() { return detail::join(std::vector<std::string>(kKeyNames.begin(), kKeyNames.end()), ", "); }

std::string shape_str(const std::vector<hsize_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? "," : "") + std::to_string(dims[i]);
  return s + "]";
}

H5Id open_for_read(const std::string& path) {
  H5Id f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  COHORT_CHECK(f.ok(), DataError, path, ": not a readable HDF5 file (", hdf5_detail(),
               "); is it a whole BERT shard? Rewrite or remove it");
  return f;
}

std::vector<std::string> root_names(hid_t file) {
  std::vector<std::string> names;
  hsize_t idx = 0;
  H5Literate(
      file, H5_INDEX_NAME, H5_ITER_INC, &idx,
      [](hid_t, const char* name, const H5L_info_t*, void* data) -> herr_t {
        static_cast<std::vector<std::string>*>(data)->push_back(name);
        return 0;
      },
      &names);
  return names;
}

ShardShape inspect(const std::string& path) {
  H5Id f = open_for_read(path);
  std::error_code ec;
  const uint64_t file_bytes = fs::file_size(path, ec);  // where contiguous data may lie
  std::array<std::vector<hsize_t>, kNumKeys> dims;
  std::array<int64_t, kNumKeys> chunk_rows{};
  for (int k = 0; k < kNumKeys; ++k) {
    const char* key = kKeyNames[k];
    if (H5Lexists(f.get(), key, H5P_DEFAULT) <= 0) {
      auto has = root_names(f.get());
      throw DataError(detail::cat(path, ": dataset '", key, "' is missing; the file has: ",
                                  has.empty() ? std::string("nothing") : detail::join(has, ", "),
                                  "; expected NVIDIA's BERT layout: ", layout_names()));
    }
    H5Id d(H5Dopen2(f.get(), key, H5P_DEFAULT), H5Dclose);
    COHORT_CHECK(d.ok(), DataError, path, ": '", key, "' is not a readable dataset (", hdf5_detail(), ")");
    H5Id type(H5Dget_type(d.get()), H5Tclose);
    H5T_class_t cls = type.ok() ? H5Tget_class(type.get()) : H5T_NO_CLASS;
    if (cls != H5T_INTEGER) {
      const char* what = cls == H5T_FLOAT ? "float" : cls == H5T_STRING ? "string" : cls == H5T_ENUM ? "enum (bool?)"
                                                                                                      : "non-numeric";
      throw DataError(detail::cat(path, ": dataset '", key, "' has dtype ", what, " (",
                                  type.ok() ? H5Tget_size(type.get()) * 8 : 0, "-bit); expected an integer dtype"));
    }
    H5Id space(H5Dget_space(d.get()), H5Sclose);
    int rank = space.ok() ? H5Sget_simple_extent_ndims(space.get()) : -1;
    COHORT_CHECK(rank >= 0, DataError, path, ": cannot read the shape of dataset '", key, "' (", hdf5_detail(), ")");
    dims[k].assign(static_cast<size_t>(rank), 0);
    if (rank > 0) H5Sget_simple_extent_dims(space.get(), dims[k].data(), nullptr);
    COHORT_CHECK(rank == kRanks[k], DataError, path, ": dataset '", key, "' has rank ", rank, " (shape ",
                 shape_str(dims[k]), "); expected rank ", kRanks[k], " ", kShapes[k]);
    H5Id dcpl(H5Dget_create_plist(d.get()), H5Pclose);
    const H5D_layout_t layout = dcpl.ok() ? H5Pget_layout(dcpl.get()) : H5D_LAYOUT_ERROR;
    {
      // Where the data is must be inside the file: libhdf5 itself reads a
      // contiguous dataset from wherever its header points (found by fuzz/:
      // a flipped address made H5Dread copy from address 0).
      const size_t elem = type.ok() ? H5Tget_size(type.get()) : 0;
      COHORT_CHECK(elem >= 1 && elem <= 8, DataError, path, ": dataset '", key, "' has ", elem * 8,
                   "-bit integers; expected 8 to 64");
      uint64_t need = elem;
      for (hsize_t n : dims[k]) {
        COHORT_CHECK(!__builtin_mul_overflow(need, static_cast<uint64_t>(n), &need), DataError, path, ": dataset '",
                     key, "' has an impossible shape ", shape_str(dims[k]));
      }
      if (layout == H5D_CONTIGUOUS) {
        const haddr_t at = H5Dget_offset(d.get());
        COHORT_CHECK(need == 0 || (at != HADDR_UNDEF && !ec && at <= file_bytes && need <= file_bytes - at),
                     DataError, path, ": dataset '", key, "' claims ", need, " bytes at offset ",
                     at == HADDR_UNDEF ? std::string("(none)") : std::to_string(at), " of a ", file_bytes,
                     "-byte file (truncated or corrupt)");
      } else if (layout == H5D_COMPACT) {
        COHORT_CHECK(H5Dget_storage_size(d.get()) >= need, DataError, path, ": dataset '", key,
                     "' holds fewer bytes than its shape needs (corrupt)");
      } else if (layout != H5D_CHUNKED) {
        throw DataError(detail::cat(path, ": dataset '", key, "' has an unsupported storage layout (",
                                    static_cast<int>(layout), ")"));
      }
    }
    hsize_t chunk[2] = {0, 0};
    if (layout == H5D_CHUNKED && H5Pget_chunk(dcpl.get(), 2, chunk) == rank &&
        (rank == 1 || chunk[1] == dims[k][1]))
      chunk_rows[static_cast<size_t>(k)] = static_cast<int64_t>(chunk[0]);
  }
  // Rows agree across all six; L across the [N,L] three, P across the [N,P] two.
  for (int k = 1; k < kNumKeys; ++k) {
    COHORT_CHECK(dims[k][0] == dims[0][0], DataError, path, ": dataset '", kKeyNames[k], "' has ", dims[k][0],
                 " rows (shape ", shape_str(dims[k]), "); expected N=", dims[0][0], ", the rows of 'input_ids'");
  }
  for (int k : {kInputMask, kSegmentIds}) {
    COHORT_CHECK(dims[k][1] == dims[kInputIds][1], DataError, path, ": dataset '", kKeyNames[k], "' has ",
                 dims[k][1], " columns (shape ", shape_str(dims[k]), "); expected L=", dims[kInputIds][1],
                 ", the columns of 'input_ids'");
  }
  COHORT_CHECK(dims[kMaskedIds][1] == dims[kMaskedPositions][1], DataError, path, ": dataset 'masked_lm_ids' has ",
               dims[kMaskedIds][1], " columns (shape ", shape_str(dims[kMaskedIds]), "); expected P=",
               dims[kMaskedPositions][1], ", the columns of 'masked_lm_positions'");
  ShardShape s;
  s.n = static_cast<int64_t>(dims[kInputIds][0]);
  s.l = static_cast<int64_t>(dims[kInputIds][1]);
  s.p = static_cast<int64_t>(dims[kMaskedPositions][1]);
  s.chunk_rows = chunk_rows;
  COHORT_CHECK(s.l >= 1, DataError, path, ": dataset 'input_ids' has shape ", shape_str(dims[kInputIds]),
               "; expected L >= 1");
  COHORT_CHECK(s.p >= 1, DataError, path, ": dataset 'masked_lm_positions' has shape ",
               shape_str(dims[kMaskedPositions]), "; expected P >= 1");
  return s;
}

// --- the guard -----------------------------------------------------------------
//
// libhdf5 (1.10.8, Debian 12's) can crash on corrupt metadata: it copies
// into the unchecked result of a huge malloc (found by fuzz/). Every file is
// therefore inspected first in a separate process, which may die in this
// one's place; a crash becomes a DataError naming the file. One process per
// split, not per file. Errors HDF5 reports are left to the real open.
//
// That process is this program started afresh (/proc/self/exe, through
// posix_spawn), not a fork of this one: here Gloo, heartbeat and loader
// threads run, and a forked child of a threaded process may call only
// async-signal-safe functions until it execs; HDF5 and malloc are not. The
// new program does its work before main, in inspector_entry, when it finds
// kInspectEnv in its environment, and never reaches main.

namespace {

constexpr const char* kInspectEnv = "COHORT_INTERNAL_INSPECT_SHARDS";
constexpr int kProgressFd = 3;  // the child writes the index of each file it starts on

// The separate process, before main: inspects argv[1..] in turn and exits
// 0; a crash ends it on the file it announced last. glibc passes argc and
// argv to constructors.
__attribute__((constructor)) void inspector_entry(int argc, char** argv, char**) {
  if (std::getenv(kInspectEnv) == nullptr) return;
  rlimit no_core{0, 0};
  setrlimit(RLIMIT_CORE, &no_core);  // its crash is expected: no core file, no report
  for (uint64_t i = 0; i + 1 < static_cast<uint64_t>(argc); ++i) {
    if (write(kProgressFd, &i, sizeof i) != static_cast<ssize_t>(sizeof i)) _exit(0);
    try {
      Hdf5Lock lock;
      (void)inspect(argv[i + 1]);
    } catch (...) {
    }
  }
  _exit(0);
}

// Starts the inspector on `files`, its progress on `progress_fd`; -1 when it
// cannot be started (then the files go unguarded, as without a pipe).
pid_t spawn_inspector(const std::vector<std::string>& files, int progress_fd) {
  std::vector<char*> argv = {const_cast<char*>("cohort-inspect-shards")};
  for (const auto& f : files) argv.push_back(const_cast<char*>(f.c_str()));
  argv.push_back(nullptr);
  std::string flag = std::string(kInspectEnv) + "=1";
  std::vector<char*> env = {flag.data()};
  for (char** e = environ; *e != nullptr; ++e) env.push_back(*e);
  env.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  if (posix_spawn_file_actions_init(&actions) != 0) return -1;
  posix_spawn_file_actions_adddup2(&actions, progress_fd, kProgressFd);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv.data(), env.data());
  posix_spawn_file_actions_destroy(&actions);
  return rc == 0 ? pid : -1;
}

}  // namespace

void inspect_guarded(const std::vector<std::string>& files) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return;  // no pipe: go without the guard
  if (fds[1] == kProgressFd) {  // dup2 onto itself would keep close-on-exec
    int moved = fcntl(fds[1], F_DUPFD_CLOEXEC, kProgressFd + 1);
    close(fds[1]);
    fds[1] = moved;
  }
  pid_t pid = fds[1] < 0 ? -1 : spawn_inspector(files, fds[1]);
  if (fds[1] >= 0) close(fds[1]);
  if (pid < 0) {
    close(fds[0]);
    return;
  }
  uint64_t at = 0, last = files.size();
  for (;;) {  // a stop signal interrupts read(); the child must not lose its reader
    ssize_t got = read(fds[0], &at, sizeof at);
    if (got < 0 && errno == EINTR) continue;
    if (got != static_cast<ssize_t>(sizeof at)) break;
    last = at;
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  // Killed, or ended by a sanitizer's report (exit code 1) before its last file.
  bool died = (WIFSIGNALED(status) && WTERMSIG(status) != SIGPIPE) || (WIFEXITED(status) && WEXITSTATUS(status) != 0);
  if (died && last < files.size()) {
    throw DataError(detail::cat(files[last], ": libhdf5 crashed reading this file (",
                                WIFSIGNALED(status) ? strsignal(WTERMSIG(status)) : "exit code 1",
                                "): it is corrupt; restore or re-create it"));
  }
}

}  // namespace cohort::hdf5
