#include "cohort/device/cpu_block_cache.hpp"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <algorithm>
#include <cstring>

namespace cohort {

// Before each block: who owns it (null: a small block) and its size class.
// 64 bytes, so the data keeps c10's 64-byte alignment.
struct alignas(64) CpuBlockCache::Header {
  CpuBlockCache* owner;
  size_t bytes;
};

CpuBlockCache::CpuBlockCache(size_t large) : large_(std::max<size_t>(large, 1)) {}

CpuBlockCache::~CpuBlockCache() {
  for (auto& [bytes, blocks] : kept_)
    for (void* base : blocks) c10::free_cpu(base);
}

size_t CpuBlockCache::size_class(size_t n) {
  size_t top = 1;
  while (top <= n / 2) top *= 2;
  const size_t step = std::max<size_t>(top / 8, 64);
  return (n + step - 1) / step * step;
}

c10::DataPtr CpuBlockCache::allocate(size_t n) {
  static_assert(sizeof(Header) == 64);
  if (n == 0) return {nullptr, nullptr, &release, c10::Device(c10::DeviceType::CPU)};
  const bool large = n >= large_;
  const size_t bytes = large ? size_class(n) : n;
  void* base = large ? take(bytes) : c10::alloc_cpu(bytes + sizeof(Header));
  auto* h = static_cast<Header*>(base);
  h->owner = large ? this : nullptr;
  h->bytes = bytes;
  void* data = h + 1;
  return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
}

c10::DeleterFnPtr CpuBlockCache::raw_deleter() const { return &release; }

void CpuBlockCache::copy_data(void* dest, const void* src, std::size_t count) const {
  if (count > 0) std::memcpy(dest, src, count);
}

void CpuBlockCache::release(void* data) {
  if (data == nullptr) return;
  auto* h = static_cast<Header*>(data) - 1;
  if (h->owner == nullptr) {
    c10::free_cpu(h);
    return;
  }
  h->owner->give(h, h->bytes);
}

void* CpuBlockCache::take(size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.live += bytes;
    stats_.peak_live = std::max(stats_.peak_live, stats_.live);
    auto it = kept_.find(bytes);
    if (it != kept_.end() && !it->second.empty()) {
      void* base = it->second.back();
      it->second.pop_back();
      stats_.kept -= bytes;
      ++stats_.hits;
      return base;
    }
    ++stats_.misses;
    // Room for the new block within the peak: drop kept blocks of other sizes.
    evict_locked(stats_.peak_live);
  }
  try {
    return c10::alloc_cpu(bytes + sizeof(Header));
  } catch (const c10::Error&) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      evict_locked(stats_.live);  // all of them, and try once more
    }
    try {
      return c10::alloc_cpu(bytes + sizeof(Header));
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      stats_.live -= bytes;
      throw;
    }
  }
}

void CpuBlockCache::give(void* base, size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.live -= bytes;
  // live + kept <= peak held before, so the block always fits.
  kept_[bytes].push_back(base);
  stats_.kept += bytes;
}

// Frees kept blocks, largest first, until live + kept <= until.
void CpuBlockCache::evict_locked(size_t until) {
  while (stats_.kept > 0 && stats_.live + stats_.kept > until) {
    auto it = std::prev(kept_.end());
    while (it->second.empty()) it = std::prev(kept_.erase(it));
    c10::free_cpu(it->second.back());
    it->second.pop_back();
    stats_.kept -= it->first;
    if (it->second.empty()) kept_.erase(it);
  }
}

CpuBlockCache::Stats CpuBlockCache::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CpuBlockCache::install(size_t large) {
  static CpuBlockCache* cache = [&] {
    auto* c = new CpuBlockCache(large);
    c10::SetCPUAllocator(c, /*priority=*/1);
    return c;
  }();
  (void)cache;
}

}  // namespace cohort
