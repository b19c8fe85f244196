// defines: CpuBlockCache
//
// libtorch's CPU allocator with large blocks kept for reuse. A training step
// allocates and frees the same large tensors every time (a layer's GeGLU
// input, the masked-LM logits); glibc serves each one above its mmap
// threshold with a fresh mmap, whose pages fault in, zeroed by the kernel, on
// first touch. That costs about 13% of a ModernBERT step in bf16 here. The
// cache keeps a freed large block, by size class, for the next request of
// that class. It never holds more than the peak of live large bytes so far:
// large blocks in use plus kept ones stay at or under that peak, so the
// process's memory at its peak is what it would be without the cache (up to
// the size classes' rounding, at most an eighth).
#pragma once

#include <c10/core/Allocator.h>

#include <cstddef>
#include <map>
#include <mutex>
#include <vector>

namespace cohort {

class CpuBlockCache final : public c10::Allocator {
 public:
  // Blocks of at least `large` bytes are cached; smaller ones go straight to
  // and from c10's aligned allocation.
  explicit CpuBlockCache(size_t large);
  ~CpuBlockCache() override;

  c10::DataPtr allocate(size_t n) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  struct Stats {
    size_t live = 0, kept = 0, peak_live = 0;  // large bytes, by size class
    size_t hits = 0, misses = 0;               // large requests
  };
  Stats stats() const;
  // The size class of a large request: n rounded up to an eighth of its
  // highest power of two.
  static size_t size_class(size_t n);

  // Makes a process-wide cache for blocks of at least `large` bytes
  // libtorch's CPU allocator; later calls do nothing. It is never destroyed,
  // since tensors may outlive main.
  static void install(size_t large);

 private:
  struct Header;
  static void release(void* data);
  void* take(size_t bytes);
  void give(void* base, size_t bytes);
  void evict_locked(size_t until);

  const size_t large_;
  mutable std::mutex mutex_;
  std::map<size_t, std::vector<void*>> kept_;  // size class -> blocks (their bases)
  Stats stats_;
};

}  // namespace cohort
