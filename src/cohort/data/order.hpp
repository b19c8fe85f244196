// defines: Cursor, Slice, epoch_permutation, split_evenly, GlobalOrder
//
// The global sample order. Each epoch is one permutation of the whole dataset,
// a pure function of (seed, epoch), cut into consecutive global batches. A
// global batch is cut into micro-batches, dealt to ranks as contiguous runs
// of whole ones (data/balance.hpp, MicroBatches). Nothing here depends on the
// world size except the dealing, so the set of samples in optimizer step s is
// the same for any world size, and a Cursor saved at one world size resumes at
// another.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace cohort {

// How far into the global order the job has consumed.
struct Cursor {
  int64_t epoch = 0;
  int64_t consumed = 0;  // samples of this epoch already consumed
  bool operator==(const Cursor& o) const { return epoch == o.epoch && consumed == o.consumed; }
};

// A half-open range [begin, end).
struct Slice {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// A permutation of [0, n), the same on every platform for the same
// (seed, epoch): Fisher-Yates over mt19937_64 with unbiased bounded draws
// (std::shuffle's algorithm is implementation-defined).
std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch);

// Part `part` of `parts` near-equal contiguous pieces of [0, n): the first
// n % parts pieces get one extra element. Pieces may be empty when n < parts.
Slice split_evenly(int64_t n, int64_t part, int64_t parts);

// Length bucketing (data.bucket): the epoch's permutation is cut into windows
// of `window_batches` global batches; within a window samples are sorted by
// length, cut into global batches, and the batches are shuffled. Each batch
// then holds similar lengths, so dynamic padding wastes little, and the order
// is still a permutation that depends only on (seed, epoch, lengths): exactly
// once, and the same for every world size.
struct Bucketing {
  int64_t window_batches = 0;                // 0: off
  std::function<int64_t(int64_t)> length;    // sample index -> length
};

class GlobalOrder {
 public:
  GlobalOrder(int64_t dataset_size, int64_t global_batch, uint64_t seed, bool drop_last,
              Bucketing bucketing = {});

  int64_t dataset_size() const { return size_; }
  int64_t global_batch() const { return batch_; }
  // Samples per epoch actually consumed (all of them unless drop_last).
  int64_t usable() const { return usable_; }
  int64_t steps_per_epoch() const;

  // Size of the global batch that starts at `c` (short at the epoch's end).
  int64_t batch_size_at(const Cursor& c) const;
  // The cursor after the global batch that starts at `c`.
  Cursor advance(const Cursor& c) const;
  // The cursor `steps` global batches after `start`, in O(1).
  Cursor cursor_after(const Cursor& start, int64_t steps) const;

  // The permutation for `epoch`, cached; safe to call from several threads.
  std::shared_ptr<const std::vector<int64_t>> permutation(int64_t epoch) const;

 private:
  std::vector<int64_t> bucketed(std::vector<int64_t> perm, int64_t epoch) const;

  int64_t size_, batch_, usable_;
  uint64_t seed_;
  Bucketing bucketing_;
  mutable std::mutex mu_;
  mutable std::vector<std::pair<int64_t, std::shared_ptr<const std::vector<int64_t>>>> cache_;
};

}  // namespace cohort
