#include "cohort/data/hdf5_shard.hpp"

#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>  // environ

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "cohort/core/error.hpp"

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
// kInspectEnv in its environment, and never reaches main. It reads the file
// names from its stdin (an in-memory file: no limit on their number), tells
// which file it is on through fd 3, and has the stop signals blocked: a
// Ctrl-C meant for the job is not a crash. Where Cohort is not part of the
// program itself (a library loaded into another program), re-running the
// program would not reach inspector_entry: the files go unguarded there.

namespace {

constexpr const char* kInspectEnv = "COHORT_INTERNAL_INSPECT_SHARDS";
constexpr int kProgressFd = 3;  // the child writes the index of each file it starts on

std::string read_all(int fd) {
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t got = read(fd, buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return out;
    out.append(buf, static_cast<size_t>(got));
  }
}

// The separate process, before main: inspects the files named on stdin (each
// ended by a NUL) in turn and exits 0; a crash ends it on the file it
// announced last.
__attribute__((constructor)) void inspector_entry() {
  if (std::getenv(kInspectEnv) == nullptr) return;
  rlimit no_core{0, 0};
  setrlimit(RLIMIT_CORE, &no_core);  // its crash is expected: no core file, no report
  const std::string names = read_all(0);
  uint64_t i = 0;
  for (size_t at = 0, end; (end = names.find('\0', at)) != std::string::npos; at = end + 1, ++i) {
    if (write(kProgressFd, &i, sizeof i) != static_cast<ssize_t>(sizeof i)) _exit(0);
    try {
      Hdf5Lock lock;
      (void)inspect(names.substr(at, end - at));
    } catch (...) {
    }
  }
  _exit(0);
}

// Whether inspector_entry is part of the program itself rather than of a
// library it loaded (dl_iterate_phdr visits the program first).
bool in_the_program() {
  struct Probe {
    uintptr_t addr;
    bool inside = false;
  } probe{reinterpret_cast<uintptr_t>(&inspector_entry)};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* p = static_cast<Probe*>(data);
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
          if (ph.p_type == PT_LOAD && p->addr >= lo && p->addr < lo + ph.p_memsz) p->inside = true;
        }
        return 1;  // the program only
      },
      &probe);
  return probe.inside;
}

// The file names, each ended by a NUL, in an in-memory file read from its
// start; -1 when there is none.
int name_list(const std::vector<std::string>& files) {
  int fd = memfd_create("cohort-shards", MFD_CLOEXEC);
  if (fd < 0) return -1;
  std::string names;
  for (const auto& f : files) names += f + '\0';
  for (size_t done = 0; done < names.size();) {
    ssize_t put = write(fd, names.data() + done, names.size() - done);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) {
      close(fd);
      return -1;
    }
    done += static_cast<size_t>(put);
  }
  if (lseek(fd, 0, SEEK_SET) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Starts the inspector on the names in `list_fd`, its progress on
// `progress_fd`; -1 when it cannot be started (the files then go unguarded).
pid_t spawn_inspector(int list_fd, int progress_fd) {
  char* argv[] = {const_cast<char*>("cohort-inspect-shards"), nullptr};
  std::string flag = std::string(kInspectEnv) + "=1";
  std::vector<char*> env = {flag.data()};
  for (char** e = environ; *e != nullptr; ++e) env.push_back(*e);
  env.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  if (posix_spawn_file_actions_init(&actions) != 0) return -1;
  if (posix_spawnattr_init(&attr) != 0) {
    posix_spawn_file_actions_destroy(&actions);
    return -1;
  }
  posix_spawn_file_actions_adddup2(&actions, list_fd, 0);
  posix_spawn_file_actions_adddup2(&actions, progress_fd, kProgressFd);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  sigset_t stops;
  sigemptyset(&stops);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaddset(&stops, sig);
  posix_spawnattr_setsigmask(&attr, &stops);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, "/proc/self/exe", &actions, &attr, argv, env.data());
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&actions);
  return rc == 0 ? pid : -1;
}

// `fd`, moved above the child's fds 0 to 3 (dup2 onto itself would keep
// close-on-exec); -1 when it cannot be.
int above_stdio(int fd) {
  if (fd < 0 || fd > kProgressFd) return fd;
  int moved = fcntl(fd, F_DUPFD_CLOEXEC, kProgressFd + 1);
  close(fd);
  return moved;
}

// The child died before its last file: a crash, or a sanitizer's report
// (exit code 1). Not a stop signal: those are blocked in it.
bool crashed(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status) != 0;
  return WIFSIGNALED(status) && WTERMSIG(status) != SIGPIPE;
}

}  // namespace

void inspect_guarded(const std::vector<std::string>& files) {
  if (files.empty() || !in_the_program()) return;
  const int list = above_stdio(name_list(files));
  if (list < 0) return;  // no in-memory file: go without the guard
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    close(list);
    return;
  }
  fds[1] = above_stdio(fds[1]);
  pid_t pid = fds[1] < 0 ? -1 : spawn_inspector(list, fds[1]);
  close(list);
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
  if (crashed(status) && last < files.size()) {
    throw DataError(detail::cat(files[last], ": libhdf5 crashed reading this file (",
                                WIFSIGNALED(status) ? strsignal(WTERMSIG(status)) : "exit code 1",
                                "): it is corrupt; restore or re-create it"));
  }
}

}  // namespace cohort::hdf5
