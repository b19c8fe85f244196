#include "cohort/data/bert_shards.hpp"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <list>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <unordered_map>
#include <utility>

#include "cohort/core/error.hpp"
#include "cohort/core/files.hpp"
#include "cohort/data/manifest.hpp"

namespace cohort {

namespace {

namespace fs = std::filesystem;

// --- HDF5 plumbing -------------------------------------------------------------

// The serial HDF5 build keeps global state (the id tables, the error stack,
// the metadata caches) without locks, so every HDF5 call in the process, from
// any BertShards or writer, holds this one lock. It is the library's own
// global, mirrored; nothing of Cohort's lives here.
std::mutex& hdf5_mutex() {
  static std::mutex mu;
  return mu;
}

// Holds the HDF5 lock. Also turns off HDF5's automatic printing of its error
// stack to stderr: errors become DataErrors carrying hdf5_detail().
class Hdf5Lock {
 public:
  Hdf5Lock() : lock_(hdf5_mutex()) { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

 private:
  std::lock_guard<std::mutex> lock_;
};

// The innermost message on HDF5's error stack ("file signature not found",
// "truncated file: eof = ..."), for the one-line errors.
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

// An HDF5 id and the function that closes it. Created, used and destroyed
// only under the HDF5 lock.
class H5Id {
 public:
  H5Id() = default;
  H5Id(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~H5Id() { reset(); }
  H5Id(H5Id&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  H5Id& operator=(H5Id&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      close_ = o.close_;
      o.id_ = -1;
    }
    return *this;
  }
  H5Id(const H5Id&) = delete;
  H5Id& operator=(const H5Id&) = delete;

  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }
  hid_t release() { return std::exchange(id_, -1); }
  void reset() {
    if (id_ >= 0 && close_) close_(id_);
    id_ = -1;
  }

 private:
  hid_t id_ = -1;
  herr_t (*close_)(hid_t) = nullptr;
};

// The six datasets of NVIDIA's layout, in a fixed order.
enum Key { kInputIds, kInputMask, kSegmentIds, kMaskedPositions, kMaskedIds, kNextSentence, kNumKeys };
constexpr std::array<const char*, kNumKeys> kKeyNames = {
    "input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids", "next_sentence_labels"};
constexpr std::array<int, kNumKeys> kRanks = {2, 2, 2, 2, 2, 1};
constexpr std::array<const char*, kNumKeys> kShapes = {"[N,L]", "[N,L]", "[N,L]", "[N,P]", "[N,P]", "[N]"};
// Which width each key is held in memory: the [N,L] ids and the [N,P] arrays
// as int32, the 0/1 arrays as int8. HDF5 converts any stored integer width.
constexpr std::array<bool, kNumKeys> kWide = {true, false, false, true, true, false};

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

// Names of the links in the file's root group, for "the file has: ...".
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

// --- writing -------------------------------------------------------------------

void write_dataset(hid_t file, const std::string& path, Key key, const std::vector<hsize_t>& dims,
                   const void* data, const BertShardWriteOptions& opts) {
  const char* name = kKeyNames[key];
  hid_t file_type = kWide[key] ? H5T_STD_I32LE : H5T_STD_I8LE;
  hid_t mem_type = kWide[key] ? H5T_NATIVE_INT32 : H5T_NATIVE_INT8;
  auto fail = [&](const char* what) {
    return DataError(detail::cat(path, ": cannot ", what, " dataset '", name, "' (", hdf5_detail(), ")"));
  };

  H5Id space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
  H5Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  if (!space.ok() || !dcpl.ok()) throw fail("create");
  if (dims[0] > 0) {
    // Chunks of whole rows; at most 1 MiB so a chunk fits HDF5's default
    // per-dataset chunk cache.
    hsize_t row_bytes = (kWide[key] ? 4 : 1) * (dims.size() > 1 ? dims[1] : 1);
    hsize_t rows = std::min<hsize_t>({static_cast<hsize_t>(opts.chunk_rows), dims[0],
                                      std::max<hsize_t>(1, (hsize_t(1) << 20) / row_bytes)});
    std::vector<hsize_t> chunk = dims;
    chunk[0] = rows;
    bool ok = H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()) >= 0;
    if (ok && opts.gzip_level > 0) {
      ok = H5Pset_shuffle(dcpl.get()) >= 0 && H5Pset_deflate(dcpl.get(), static_cast<unsigned>(opts.gzip_level)) >= 0;
    }
    if (!ok) throw fail("set up compression for");
  }
  H5Id d(H5Dcreate2(file, name, file_type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT), H5Dclose);
  if (!d.ok()) throw fail("create");
  if (dims[0] > 0 && H5Dwrite(d.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0) throw fail("write");
}

}  // namespace

void write_bert_shard(const std::string& path, const BertRows& rows, const BertShardWriteOptions& opts) {
  const int64_t n = rows.rows(), l = rows.seq_len, p = rows.max_predictions;
  COHORT_CHECK(l >= 1 && p >= 1, DataError, path, ": cannot write a shard with seq_len ", l,
               " and max_predictions ", p, "; both must be >= 1");
  COHORT_CHECK(opts.chunk_rows >= 1, DataError, path, ": chunk_rows must be >= 1, got ", opts.chunk_rows);
  COHORT_CHECK(opts.gzip_level >= 0 && opts.gzip_level <= 9, DataError, path, ": gzip_level must be in [0, 9], got ",
               opts.gzip_level);
  auto check_size = [&](const char* field, size_t got, int64_t want, const char* shape) {
    COHORT_CHECK(static_cast<int64_t>(got) == want, DataError, path, ": ", field, " has ", got, " values; expected ",
                 want, " = ", shape, " for N=", n, " rows (next_sentence_labels), L=", l, ", P=", p);
  };
  check_size("input_ids", rows.input_ids.size(), n * l, "N*L");
  check_size("input_mask", rows.input_mask.size(), n * l, "N*L");
  check_size("segment_ids", rows.segment_ids.size(), n * l, "N*L");
  check_size("masked_lm_positions", rows.masked_lm_positions.size(), n * p, "N*P");
  check_size("masked_lm_ids", rows.masked_lm_ids.size(), n * p, "N*P");

  const std::string tmp = path + ".tmp";
  try {
    Hdf5Lock lock;
    // The HDF5 1.10 file format: its fixed-array chunk index finds a chunk in
    // O(1) and keeps an open file's metadata small, which random row access
    // needs (v1 B-trees cost 3x the memory and a tree walk per read).
    // Readers need HDF5 >= 1.10 (2016), as every current h5py has.
    H5Id fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
    COHORT_CHECK(fapl.ok() && H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V110, H5F_LIBVER_V110) >= 0, DataError,
                 tmp, ": cannot set up the HDF5 file format (", hdf5_detail(), ")");
    H5Id f(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose);
    COHORT_CHECK(f.ok(), DataError, tmp, ": cannot create (", hdf5_detail(), ")");
    const hsize_t N = static_cast<hsize_t>(n), L = static_cast<hsize_t>(l), P = static_cast<hsize_t>(p);
    write_dataset(f.get(), path, kInputIds, {N, L}, rows.input_ids.data(), opts);
    write_dataset(f.get(), path, kInputMask, {N, L}, rows.input_mask.data(), opts);
    write_dataset(f.get(), path, kSegmentIds, {N, L}, rows.segment_ids.data(), opts);
    write_dataset(f.get(), path, kMaskedPositions, {N, P}, rows.masked_lm_positions.data(), opts);
    write_dataset(f.get(), path, kMaskedIds, {N, P}, rows.masked_lm_ids.data(), opts);
    write_dataset(f.get(), path, kNextSentence, {N}, rows.next_sentence_labels.data(), opts);
    // Closing flushes: its failure (a full disk) is the write's failure.
    COHORT_CHECK(H5Fclose(f.release()) >= 0, DataError, tmp, ": cannot finish writing (", hdf5_detail(), ")");
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  commit_file(tmp, path);
}

// --- finding the shards ----------------------------------------------------------

namespace {

bool is_shard_name(const fs::path& p) { return p.extension() == ".hdf5" || p.extension() == ".h5"; }

std::vector<std::string> listing(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    names.push_back(e.path().filename().string() + (e.is_directory(ec) ? "/" : ""));
  }
  std::sort(names.begin(), names.end());
  constexpr size_t kShown = 12;
  if (names.size() > kShown) {
    size_t more = names.size() - kShown;
    names.resize(kShown);
    names.push_back(detail::cat("... ", more, " more"));
  }
  return names;
}

}  // namespace

std::vector<std::string> shard_files(const std::string& dir, const std::string& split) {
  std::error_code ec;
  COHORT_CHECK(fs::is_directory(dir, ec), DataError, dir, ": no such directory (looking for the '", split,
               "' shards). Is data.path right?");
  COHORT_CHECK(!split.empty(), DataError, dir, ": no split name given");
  const fs::path sub = fs::path(dir) / split;
  const bool nested = fs::is_directory(sub, ec);
  std::vector<std::string> names = {split};
  if (split == "train") names.push_back("training");

  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(nested ? sub : fs::path(dir), ec)) {
    if (!e.is_regular_file(ec) || !is_shard_name(e.path())) continue;
    const std::string name = e.path().filename().string();
    bool match = nested || std::any_of(names.begin(), names.end(), [&](const std::string& s) {
                   return name.find(s) != std::string::npos;
                 });
    if (match) out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  if (out.empty()) {
    const fs::path shown = nested ? sub : fs::path(dir);
    auto has = listing(shown);
    throw DataError(detail::cat("no '", split, "' shards under ", dir, ": expected ", (fs::path(dir) / split).string(),
                                "/*.hdf5 or ", dir, "/*", split, "*.hdf5; ", shown.string(), " has: ",
                                has.empty() ? std::string("nothing") : detail::join(has, ", ")));
  }
  return out;
}

// --- reading ---------------------------------------------------------------------

namespace {

// A least-recently-used map with a fixed capacity. Not thread-safe.
template <class K, class V>
class Lru {
 public:
  explicit Lru(size_t capacity) : capacity_(capacity) {}
  V* find(const K& key) {
    auto it = map_.find(key);
    if (it == map_.end()) return nullptr;
    order_.splice(order_.begin(), order_, it->second);
    return &it->second->second;
  }
  V& put(const K& key, V value) {
    if (V* v = find(key)) return *v = std::move(value);
    order_.emplace_front(key, std::move(value));
    map_[key] = order_.begin();
    while (order_.size() > capacity_) {
      map_.erase(order_.back().first);
      order_.pop_back();
    }
    return order_.front().second;
  }
  void clear() {
    map_.clear();
    order_.clear();
  }
  size_t size() const { return order_.size(); }

 private:
  size_t capacity_;
  std::list<std::pair<K, V>> order_;
  std::unordered_map<K, typename std::list<std::pair<K, V>>::iterator> map_;
};

// One shard file: where it is, which global rows it holds, how it is read.
struct ShardFile {
  std::string path;
  int64_t rows = 0;
  int64_t first = 0;       // global index of its row 0
  int64_t block_rows = 0;  // rows per cache block
  std::array<int64_t, kNumKeys> chunk_rows{};  // per dataset; 0: not chunked
};

// An open shard: the file and its six datasets.
struct OpenShard {
  H5Id file;
  std::array<H5Id, kNumKeys> sets;
};

// `rows` consecutive rows of one file, all six datasets, flat row-major.
struct Block {
  int64_t rows = 0;
  std::vector<int32_t> input_ids, masked_lm_positions, masked_lm_ids;
  std::vector<int8_t> input_mask, segment_ids, next_sentence_labels;
};

// The shape of one shard, read and checked at construction.
struct ShardShape {
  int64_t n = 0, l = 0, p = 0;
  // Rows per HDF5 chunk of each dataset; 0 where it is not chunked, or where
  // a chunk does not span whole rows.
  std::array<int64_t, kNumKeys> chunk_rows{};
};

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

// libhdf5 (1.10.8, Debian 12's) can crash on corrupt metadata: it copies
// into the unchecked result of a huge malloc (found by fuzz/). Every file is
// therefore opened and inspected first in a forked child, which may die in
// its place; a crash becomes a DataError naming the file. One fork per
// split, not per file. Errors HDF5 reports are left to the real open.
void inspect_in_a_child(const std::vector<std::string>& files) {
  int fds[2];
  if (pipe(fds) != 0) return;  // no pipe: go without the guard
  pid_t pid;
  {
    Hdf5Lock lock;  // no other thread is inside HDF5 while the child is made
    pid = fork();
    if (pid == 0) {
      close(fds[0]);
      rlimit no_core{0, 0};
      setrlimit(RLIMIT_CORE, &no_core);  // its crash is expected: no core file, no report
      int null_fd = open("/dev/null", O_WRONLY);
      if (null_fd >= 0) dup2(null_fd, 2);
      for (uint64_t i = 0; i < files.size(); ++i) {
        if (write(fds[1], &i, sizeof i) != static_cast<ssize_t>(sizeof i)) _exit(0);
        try {
          (void)inspect(files[i]);
        } catch (...) {
        }
      }
      _exit(0);
    }
  }
  close(fds[1]);
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

// The end of row `r`'s real content: one past its last real token or masked
// position, whichever is later. For NVIDIA's data, the sum of input_mask.
int64_t row_end(const Block& b, int64_t r, int64_t l, int64_t p) {
  int64_t end = 0;
  const int8_t* mask = b.input_mask.data() + r * l;
  for (int64_t j = l; j > 0; --j) {
    if (mask[j - 1] != 0) {
      end = j;
      break;
    }
  }
  const int32_t* pos = b.masked_lm_positions.data() + r * p;
  for (int64_t j = 0; j < p && pos[j] != 0; ++j) end = std::max<int64_t>(end, pos[j] + 1);
  return end;
}

int64_t mask_sum(const int8_t* mask, int64_t l) {
  int64_t s = 0;
  for (int64_t j = 0; j < l; ++j) s += mask[j] != 0;
  return s;
}

}  // namespace

struct BertShards::Impl {
  std::string dir, split;
  BertShardsOptions opts;
  BertShardInfo info;
  std::vector<ShardFile> files;
  std::vector<int64_t> starts;  // files[i].first, then the total

  // Under the HDF5 lock.
  Lru<int64_t, std::unique_ptr<OpenShard>> open{1};

  // Under `mu`. Blocks are keyed by the global index of their first row.
  mutable std::mutex mu;
  Lru<int64_t, std::shared_ptr<const Block>> blocks{1};
  // Real length of every row once length() is first asked (0xFFFF: unknown).
  // 2 bytes a row, allocated only when lengths are used (length bucketing).
  std::vector<uint16_t> lengths;
  static constexpr uint16_t kUnknown = 0xFFFF;

  // Where global row `index` lives.
  struct Where {
    int64_t file = 0;
    int64_t block = 0;     // block of that file
    int64_t key = 0;       // global index of the block's first row
    int64_t in_block = 0;  // row within the block
  };
  Where locate(int64_t index) const {
    COHORT_CHECK(index >= 0 && index < info.rows, Error, "BertShards: index ", index, " is out of range [0, ",
                 info.rows, ")");
    Where w;
    w.file = std::upper_bound(starts.begin(), starts.end(), index) - starts.begin() - 1;
    const ShardFile& f = files[static_cast<size_t>(w.file)];
    const int64_t r = index - f.first;
    w.block = r / f.block_rows;
    w.key = f.first + w.block * f.block_rows;
    w.in_block = r - w.block * f.block_rows;
    return w;
  }

  // The open shard `f`. Under the HDF5 lock.
  OpenShard& open_shard(int64_t f) {
    if (auto* s = open.find(f)) return **s;
    const std::string& path = files[static_cast<size_t>(f)].path;
    auto s = std::make_unique<OpenShard>();
    s->file = open_for_read(path);
    // A dataset whose chunks are exactly this file's blocks gets no HDF5
    // chunk cache: each block reads whole chunks once, straight into the
    // block, and the cache would only hold a second copy (up to 1 MiB per
    // dataset per open file). Other layouts keep HDF5's default cache, since
    // neighbouring blocks share their chunks.
    H5Id uncached(H5Pcreate(H5P_DATASET_ACCESS), H5Pclose);
    COHORT_CHECK(uncached.ok() && H5Pset_chunk_cache(uncached.get(), 0, 0, 1.0) >= 0, DataError, path,
                 ": cannot set up reading (", hdf5_detail(), ")");
    const ShardFile& file = files[static_cast<size_t>(f)];
    for (int k = 0; k < kNumKeys; ++k) {
      const bool aligned = file.chunk_rows[static_cast<size_t>(k)] == file.block_rows;
      s->sets[k] = H5Id(H5Dopen2(s->file.get(), kKeyNames[k], aligned ? uncached.get() : H5P_DEFAULT), H5Dclose);
      COHORT_CHECK(s->sets[k].ok(), DataError, path, ": cannot open dataset '", kKeyNames[k], "' (", hdf5_detail(),
                   "); did the file change since it was opened?");
    }
    return *open.put(f, std::move(s));
  }

  // Reads rows [r0, r0+n) of dataset `k` of shard `f` into `out`, converted to
  // int32 or int8. Under the HDF5 lock.
  template <class T>
  void read_rows(int64_t f, int k, int64_t r0, int64_t n, int64_t cols, std::vector<T>& out) {
    OpenShard& s = open_shard(f);
    const bool matrix = kRanks[k] == 2;
    out.resize(static_cast<size_t>(n * cols));
    hsize_t start[2] = {static_cast<hsize_t>(r0), 0};
    hsize_t count[2] = {static_cast<hsize_t>(n), static_cast<hsize_t>(cols)};
    H5Id fspace(H5Dget_space(s.sets[k].get()), H5Sclose);
    H5Id mspace(H5Screate_simple(matrix ? 2 : 1, count, nullptr), H5Sclose);
    bool ok = fspace.ok() && mspace.ok() &&
              H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, count, nullptr) >= 0 &&
              H5Dread(s.sets[k].get(), sizeof(T) == 4 ? H5T_NATIVE_INT32 : H5T_NATIVE_INT8, mspace.get(),
                      fspace.get(), H5P_DEFAULT, out.data()) >= 0;
    COHORT_CHECK(ok, DataError, files[static_cast<size_t>(f)].path, ": cannot read rows ", r0, "..", r0 + n - 1,
                 " of dataset '", kKeyNames[k], "' (", hdf5_detail(), "); is the file corrupt?");
  }

  // Block `b` of shard `f`, checked. Takes the HDF5 lock.
  std::shared_ptr<const Block> load_block(int64_t f, int64_t b) {
    const ShardFile& file = files[static_cast<size_t>(f)];
    const int64_t l = info.seq_len, p = info.max_predictions;
    const int64_t r0 = b * file.block_rows, n = std::min(file.block_rows, file.rows - r0);
    auto blk = std::make_shared<Block>();
    blk->rows = n;
    {
      Hdf5Lock lock;
      read_rows(f, kInputIds, r0, n, l, blk->input_ids);
      read_rows(f, kInputMask, r0, n, l, blk->input_mask);
      read_rows(f, kSegmentIds, r0, n, l, blk->segment_ids);
      read_rows(f, kMaskedPositions, r0, n, p, blk->masked_lm_positions);
      read_rows(f, kMaskedIds, r0, n, p, blk->masked_lm_ids);
      read_rows(f, kNextSentence, r0, n, 1, blk->next_sentence_labels);
    }
    // Bad values fail here, naming the file, rather than as an index error
    // deep inside the model.
    const int64_t vocab = info.vocab_size > 0 ? info.vocab_size : int64_t(1) << 31;
    auto bad = [&](int k, int64_t i, int64_t cols, int64_t value, const std::string& want) {
      return DataError(detail::cat(file.path, ": dataset '", kKeyNames[k], "' row ", r0 + i / cols, " column ",
                                   i % cols, " holds ", value, "; expected ", want));
    };
    for (int64_t i = 0; i < n * l; ++i) {
      int32_t v = blk->input_ids[static_cast<size_t>(i)];
      if (v < 0 || v >= vocab) throw bad(kInputIds, i, l, v, detail::cat("a token id in [0, ", vocab, ")"));
    }
    for (int64_t i = 0; i < n * l; ++i) {
      int8_t v = blk->segment_ids[static_cast<size_t>(i)];
      if (v != 0 && v != 1) throw bad(kSegmentIds, i, l, v, "0 (sentence A) or 1 (sentence B)");
    }
    for (int64_t r = 0; r < n; ++r) {
      int8_t v = blk->next_sentence_labels[static_cast<size_t>(r)];
      if (v != 0 && v != 1) throw bad(kNextSentence, r, 1, v, "0 or 1");
    }
    for (int64_t r = 0; r < n; ++r) {
      bool padding = false;  // ids past the first 0 position are ignored
      for (int64_t i = r * p; i < (r + 1) * p; ++i) {
        int32_t pos = blk->masked_lm_positions[static_cast<size_t>(i)];
        if (pos < 0 || pos >= l) throw bad(kMaskedPositions, i, p, pos, detail::cat("a position in [0, L=", l, ")"));
        padding = padding || pos == 0;
        int32_t id = blk->masked_lm_ids[static_cast<size_t>(i)];
        if (!padding && (id < 0 || id >= vocab))
          throw bad(kMaskedIds, i, p, id, detail::cat("a token id in [0, ", vocab, ")"));
      }
    }
    return blk;
  }

  std::shared_ptr<const Block> block(const Where& w) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (auto* hit = blocks.find(w.key)) return *hit;
    }
    // Read outside `mu`: other threads keep hitting the cache meanwhile. Two
    // threads may read the same block at once; the second put wins, harmlessly.
    auto blk = load_block(w.file, w.block);
    std::lock_guard<std::mutex> lock(mu);
    note_lengths(w.key, *blk);
    return blocks.put(w.key, std::move(blk));
  }

  // Under `mu`.
  void note_lengths(int64_t first, const Block& blk) {
    if (lengths.empty()) return;
    for (int64_t r = 0; r < blk.rows; ++r) {
      lengths[static_cast<size_t>(first + r)] =
          static_cast<uint16_t>(mask_sum(blk.input_mask.data() + r * info.seq_len, info.seq_len));
    }
  }

  Example gather(const std::vector<int64_t>& indices, bool trim) {
    const int64_t l = info.seq_len, p = info.max_predictions;
    const int64_t n = static_cast<int64_t>(indices.size());
    COHORT_CHECK(n > 0, Error, "BertShards: get_batch of no indices");
    // Each row's block, read once per batch; the batch holds its blocks even
    // if the cache evicts them meanwhile.
    std::vector<std::pair<const Block*, int64_t>> where(static_cast<size_t>(n));
    std::unordered_map<int64_t, std::shared_ptr<const Block>> held;
    for (int64_t i = 0; i < n; ++i) {
      const Where w = locate(indices[static_cast<size_t>(i)]);
      auto& blk = held[w.key];
      if (!blk) blk = block(w);
      where[static_cast<size_t>(i)] = {blk.get(), w.in_block};
    }
    int64_t width = l;
    if (trim) {
      width = 1;
      for (auto [blk, r] : where) width = std::max(width, row_end(*blk, r, l, p));
    }
    auto opt = torch::TensorOptions().dtype(torch::kInt64);
    torch::Tensor ids = torch::empty({n, width}, opt), mask = torch::empty({n, width}, opt),
                  seg = torch::empty({n, width}, opt), pos = torch::empty({n, p}, opt),
                  mlm = torch::empty({n, p}, opt), nsl = torch::empty({n}, opt);
    int64_t *ids_p = ids.data_ptr<int64_t>(), *mask_p = mask.data_ptr<int64_t>(), *seg_p = seg.data_ptr<int64_t>(),
            *pos_p = pos.data_ptr<int64_t>(), *mlm_p = mlm.data_ptr<int64_t>(), *nsl_p = nsl.data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i) {
      const auto [blk, r] = where[static_cast<size_t>(i)];
      std::copy_n(blk->input_ids.data() + r * l, width, ids_p + i * width);
      std::copy_n(blk->input_mask.data() + r * l, width, mask_p + i * width);
      std::copy_n(blk->segment_ids.data() + r * l, width, seg_p + i * width);
      const int32_t* bp = blk->masked_lm_positions.data() + r * p;
      const int32_t* bm = blk->masked_lm_ids.data() + r * p;
      // NVIDIA's convention: positions are 0-padded ([CLS] at 0 is never
      // masked), so the first 0 ends the real predictions.
      bool padding = false;
      for (int64_t j = 0; j < p; ++j) {
        padding = padding || bp[j] == 0;
        pos_p[i * p + j] = padding ? 0 : bp[j];  // past the trimmed width otherwise
        mlm_p[i * p + j] = padding ? -1 : bm[j];
      }
      nsl_p[i] = blk->next_sentence_labels[static_cast<size_t>(r)];
    }
    return {{"input_ids", ids},          {"input_mask", mask},    {"segment_ids", seg},
            {"masked_lm_positions", pos}, {"masked_lm_ids", mlm}, {"next_sentence_labels", nsl}};
  }

  int64_t length(int64_t index) {
    const Where w = locate(index);
    const ShardFile& file = files[static_cast<size_t>(w.file)];
    const bool cacheable = info.seq_len < kUnknown;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (cacheable && lengths.empty()) lengths.assign(static_cast<size_t>(info.rows), kUnknown);
      if (cacheable && lengths[static_cast<size_t>(index)] != kUnknown) return lengths[static_cast<size_t>(index)];
      if (auto* hit = blocks.find(w.key)) {
        note_lengths(w.key, **hit);
        return mask_sum((*hit)->input_mask.data() + w.in_block * info.seq_len, info.seq_len);
      }
    }
    // Only input_mask, and not through the block cache: a pass over every
    // row's length must not evict the blocks training is using.
    Block blk;
    const int64_t r0 = w.block * file.block_rows;
    blk.rows = std::min(file.block_rows, file.rows - r0);
    {
      Hdf5Lock lock;
      read_rows(w.file, kInputMask, r0, blk.rows, info.seq_len, blk.input_mask);
    }
    std::lock_guard<std::mutex> lock(mu);
    note_lengths(w.key, blk);
    return mask_sum(blk.input_mask.data() + w.in_block * info.seq_len, info.seq_len);
  }
};

BertShards::BertShards(const std::string& dir, const std::string& split, BertShardsOptions opts)
    : impl_(std::make_unique<Impl>()) {
  COHORT_CHECK(opts.block_rows >= 0, ConfigError, "BertShardsOptions.block_rows must be >= 0, got ", opts.block_rows);
  COHORT_CHECK(opts.cache_blocks >= 1, ConfigError, "BertShardsOptions.cache_blocks must be >= 1, got ",
               opts.cache_blocks);
  COHORT_CHECK(opts.open_files >= 1, ConfigError, "BertShardsOptions.open_files must be >= 1, got ",
               opts.open_files);
  Impl& m = *impl_;
  m.dir = dir;
  m.split = split;
  m.opts = opts;
  m.open = Lru<int64_t, std::unique_ptr<OpenShard>>(static_cast<size_t>(opts.open_files));
  m.blocks = Lru<int64_t, std::shared_ptr<const Block>>(static_cast<size_t>(opts.cache_blocks));

  std::string first_path;
  const std::vector<std::string> files = shard_files(dir, split);
  inspect_in_a_child(files);
  for (const std::string& path : files) {
    ShardShape s;
    {
      Hdf5Lock lock;
      s = inspect(path);
    }
    if (m.files.empty()) {
      m.info.seq_len = s.l;
      m.info.max_predictions = s.p;
      first_path = path;
    }
    COHORT_CHECK(s.l == m.info.seq_len, DataError, path, ": dataset 'input_ids' has L=", s.l, " columns; expected L=",
                 m.info.seq_len, " like the first shard ", first_path);
    COHORT_CHECK(s.p == m.info.max_predictions, DataError, path, ": dataset 'masked_lm_positions' has P=", s.p,
                 " columns; expected P=", m.info.max_predictions, " like the first shard ", first_path);
    // A block per chunk: reading one row decompresses its whole chunk anyway,
    // and a block that cut a chunk would decompress it twice.
    const int64_t chunk = s.chunk_rows[kInputIds];
    const int64_t block_rows = opts.block_rows > 0 ? opts.block_rows : chunk > 0 ? std::min<int64_t>(chunk, 4096) : 256;
    m.files.push_back({path, s.n, m.info.rows, block_rows, s.chunk_rows});
    m.starts.push_back(m.info.rows);
    m.info.rows += s.n;
  }
  m.starts.push_back(m.info.rows);
  m.info.files = static_cast<int64_t>(m.files.size());
  if (auto manifest = read_manifest(dir)) m.info.vocab_size = manifest->vocab_size;
}

BertShards::~BertShards() {
  // The open files are HDF5 ids: close them under the HDF5 lock.
  Hdf5Lock lock;
  impl_->open.clear();
}

int64_t BertShards::size() const { return impl_->info.rows; }

Example BertShards::get(int64_t index) const {
  Example ex = impl_->gather({index}, /*trim=*/false);
  for (auto& [name, t] : ex) t = t.squeeze(0);
  return ex;
}

Example BertShards::get_batch(const std::vector<int64_t>& indices) const {
  Example batch = impl_->gather(indices, true);
  return impl_->opts.pack ? pack_bert_rows(batch, impl_->info.seq_len, indices) : batch;
}

Example pack_bert_rows(const Example& batch, int64_t row_len, const std::vector<int64_t>& sample_ids) {
  const auto& ids = batch.at("input_ids");
  const int64_t n = ids.size(0), width = ids.size(1), p = batch.at("masked_lm_positions").size(1);
  for (const auto& [key, t] : batch) {
    COHORT_CHECK(t.is_cpu(), Error, "data.pack: packs batches on the CPU, before they move; '", key, "' is on ",
                 t.device());
  }
  COHORT_CHECK(width <= row_len, DataError, "data.pack: rows of ", width, " tokens do not fit rows of ", row_len);
  COHORT_CHECK(sample_ids.empty() || static_cast<int64_t>(sample_ids.size()) == n, Error, "data.pack: ",
               sample_ids.size(), " sample ids for a batch of ", n);
  // Errors name the dataset's sample where the caller gave it.
  auto which = [&](int64_t i) {
    return sample_ids.empty() ? detail::cat("row ", i, " of the batch")
                              : detail::cat("sample ", sample_ids[static_cast<size_t>(i)]);
  };
  auto contiguous = [&](const char* key) { return batch.at(key).to(torch::kInt64).contiguous(); };
  auto in_ids = contiguous("input_ids"), in_seg = contiguous("segment_ids"), in_mask = contiguous("input_mask"),
       in_pos = contiguous("masked_lm_positions"), in_mlm = contiguous("masked_lm_ids");
  const int64_t* mask = in_mask.data_ptr<int64_t>();
  std::vector<int64_t> length(static_cast<size_t>(n)), order(static_cast<size_t>(n));
  const int64_t* pos_in = in_pos.data_ptr<int64_t>();
  const int64_t* mlm_in = in_mlm.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    int64_t len = 0, real = 0;
    while (len < width && mask[i * width + len] != 0) ++len;
    for (int64_t t = 0; t < width; ++t) real += mask[i * width + t] != 0;
    // Packing moves an instance's real tokens only: they must be a prefix,
    // and every prediction must point at one of them.
    COHORT_CHECK(real == len, DataError, "data.pack: ", which(i), " has padding inside it (input_mask ",
                 "is not 1s then 0s); such rows can only be read unpacked");
    for (int64_t j = 0; j < p; ++j) {
      const int64_t at = pos_in[i * p + j];
      COHORT_CHECK(mlm_in[i * p + j] < 0 || (at >= 0 && at < std::max<int64_t>(len, 1)), DataError, "data.pack: ",
                   which(i), " predicts position ", at, ", outside its ", len,
                   " real tokens; such rows can only be read unpacked");
    }
    length[static_cast<size_t>(i)] = std::max<int64_t>(len, 1);  // an empty row still has its [CLS] slot
  }
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return length[a] > length[b]; });
  // First fit, longest first: each instance's row and offset.
  std::vector<int64_t> used, row_of(static_cast<size_t>(n)), offset_of(static_cast<size_t>(n));
  for (int64_t i : order) {
    size_t r = 0;
    while (r < used.size() && used[r] + length[i] > row_len) ++r;
    if (r == used.size()) used.push_back(0);
    row_of[i] = static_cast<int64_t>(r);
    offset_of[i] = used[r];
    used[r] += length[i];
  }
  const int64_t rows = static_cast<int64_t>(used.size());
  const int64_t w = used.empty() ? 1 : *std::max_element(used.begin(), used.end());
  auto opt = torch::TensorOptions().dtype(torch::kInt64);
  auto out_ids = torch::zeros({rows, w}, opt), out_seg = torch::zeros({rows, w}, opt),
       out_mask = torch::zeros({rows, w}, opt), out_posn = torch::zeros({rows, w}, opt),
       out_seq = torch::full({rows, w}, -1, opt), cls = torch::empty({n}, opt), flat_pos = torch::zeros({n, p}, opt);
  int64_t *oi = out_ids.data_ptr<int64_t>(), *os = out_seg.data_ptr<int64_t>(), *om = out_mask.data_ptr<int64_t>(),
          *op = out_posn.data_ptr<int64_t>(), *oq = out_seq.data_ptr<int64_t>(), *oc = cls.data_ptr<int64_t>(),
          *of = flat_pos.data_ptr<int64_t>();
  const int64_t *ii = in_ids.data_ptr<int64_t>(), *is = in_seg.data_ptr<int64_t>(), *ip = pos_in, *im = mlm_in;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t base = row_of[i] * w + offset_of[i], len = length[i];
    for (int64_t t = 0; t < len && t < width; ++t) {
      oi[base + t] = ii[i * width + t];
      os[base + t] = is[i * width + t];
      om[base + t] = mask[i * width + t];
      op[base + t] = t;
      oq[base + t] = i;
    }
    oc[i] = base;
    for (int64_t j = 0; j < p; ++j) of[i * p + j] = im[i * p + j] >= 0 ? base + ip[i * p + j] : 0;
  }
  Example out = batch;
  out["input_ids"] = out_ids;
  out["segment_ids"] = out_seg;
  out["input_mask"] = out_mask;
  out["position_ids"] = out_posn;
  out["seq_ids"] = out_seq;
  out["cls_index"] = cls;
  out["masked_lm_positions"] = flat_pos;
  return out;
}

std::string BertShards::describe() const {
  const BertShardInfo& i = impl_->info;
  return detail::cat("BERT shards: ", i.files, " files, ", i.rows, " rows, L=", i.seq_len, ", P=", i.max_predictions,
                     i.vocab_size > 0 ? detail::cat(", vocab ", i.vocab_size) : std::string(), " under ", impl_->dir,
                     " (split ", impl_->split, ")");
}

const BertShardInfo& BertShards::info() const { return impl_->info; }

int64_t BertShards::length(int64_t index) const { return impl_->length(index); }

}  // namespace cohort
