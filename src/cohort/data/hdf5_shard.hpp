// defines: hdf5_mutex, Hdf5Lock, hdf5_detail, H5Id, Key, kKeyNames, layout_names,
//          shape_str, open_for_read, root_names, ShardShape, inspect, inspect_guarded
//
// Internal to data/: the HDF5 plumbing that the shard writer
// (bert_shard_writer.cpp) and reader (bert_shards.cpp) share, and the
// checks a shard passes before it is read.
#pragma once

#include <hdf5.h>

#include <array>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace cohort::hdf5 {

// The serial HDF5 build keeps global state (the id tables, the error stack,
// the metadata caches) without locks, so every HDF5 call in the process, from
// any BertShards or writer, holds this one lock. It is the library's own
// global, mirrored; nothing of Cohort's lives here.
std::mutex& hdf5_mutex();

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
std::string hdf5_detail();

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

// "input_ids, input_mask, ...": the layout's dataset names.
std::string layout_names();
// "[N,L]" with the numbers.
std::string shape_str(const std::vector<hsize_t>& dims);

// The file, opened read-only: DataError naming it otherwise. Under the lock.
H5Id open_for_read(const std::string& path);

// Names of the links in the file's root group, for "the file has: ...".
std::vector<std::string> root_names(hid_t file);

// The shape of one shard, read and checked at construction.
struct ShardShape {
  int64_t n = 0, l = 0, p = 0;
  // Rows per HDF5 chunk of each dataset; 0 where it is not chunked, or where
  // a chunk does not span whole rows.
  std::array<int64_t, kNumKeys> chunk_rows{};
};

// Opens `path` and checks its six datasets (names, ranks, integer types,
// agreeing row and column counts, data within the file): DataError naming
// the file and dataset otherwise. Under the HDF5 lock.
ShardShape inspect(const std::string& path);

// inspect() of every file in a separate process first, where a crash of
// libhdf5 on a corrupt file cannot take this one down: a DataError naming
// the file instead (hdf5_shard.cpp says how).
void inspect_guarded(const std::vector<std::string>& files);

}  // namespace cohort::hdf5
