// The CPU allocator that keeps large blocks (device/cpu_block_cache.hpp):
// a freed large block serves the next request of its size class, kept
// blocks never take the large bytes past their peak in use, small blocks
// are not kept, and every block is aligned and writable to its end.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "cohort/device/cpu_block_cache.hpp"

using cohort::CpuBlockCache;

namespace {

constexpr size_t kCacheLarge = 1 << 20;

bool block_aligned(const c10::DataPtr& p) { return reinterpret_cast<uintptr_t>(p.get()) % 64 == 0; }

}  // namespace

TEST(CpuBlockCache, ReusesAFreedLargeBlockOfItsClass) {
  CpuBlockCache cache(kCacheLarge);
  void* first = nullptr;
  {
    auto a = cache.allocate(3 * kCacheLarge + 5);
    ASSERT_TRUE(block_aligned(a));
    std::memset(a.get(), 1, 3 * kCacheLarge + 5);
    first = a.get();
  }
  auto s = cache.stats();
  EXPECT_EQ(s.live, 0u);
  EXPECT_EQ(s.kept, CpuBlockCache::size_class(3 * kCacheLarge + 5));
  // Another request of the same class (3 MiB + 5 and + 1000 both round up
  // to 3.25 MiB) gets the same block back.
  ASSERT_EQ(CpuBlockCache::size_class(3 * kCacheLarge + 1000), CpuBlockCache::size_class(3 * kCacheLarge + 5));
  auto b = cache.allocate(3 * kCacheLarge + 1000);
  EXPECT_EQ(b.get(), first);
  s = cache.stats();
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.kept, 0u);
}

TEST(CpuBlockCache, KeptBlocksStayWithinThePeakInUse) {
  CpuBlockCache cache(kCacheLarge);
  {
    // Peak: two blocks of 4 MiB in use.
    auto a = cache.allocate(4 * kCacheLarge), b = cache.allocate(4 * kCacheLarge);
  }
  EXPECT_EQ(cache.stats().peak_live, 8 * kCacheLarge);
  EXPECT_EQ(cache.stats().kept, 8 * kCacheLarge);
  // A block of another class: the kept ones make room for it.
  auto c = cache.allocate(6 * kCacheLarge);
  auto s = cache.stats();
  EXPECT_EQ(s.live, 6 * kCacheLarge);
  EXPECT_LE(s.live + s.kept, s.peak_live);
  EXPECT_EQ(s.kept, 0u);  // 6 + 4 > 8: both went
  // Never past the peak, whatever the order of requests and frees.
  std::vector<c10::DataPtr> held;
  for (size_t i = 1; i <= 20; ++i) {
    held.push_back(cache.allocate((i % 5 + 1) * kCacheLarge + i));
    if (i % 3 == 0) held.erase(held.begin());
    s = cache.stats();
    EXPECT_LE(s.live + s.kept, s.peak_live) << "request " << i;
  }
}

TEST(CpuBlockCache, SmallBlocksAreNotKeptAndEmptyOnesAreNull) {
  CpuBlockCache cache(kCacheLarge);
  {
    auto a = cache.allocate(1000);
    ASSERT_TRUE(block_aligned(a));
    std::memset(a.get(), 7, 1000);
    auto z = cache.allocate(0);
    EXPECT_EQ(z.get(), nullptr);
  }
  auto s = cache.stats();
  EXPECT_EQ(s.kept + s.live + s.hits + s.misses, 0u);
}

TEST(CpuBlockCache, SizeClassesRoundUpByAnEighthAtMost) {
  for (size_t n : {size_t{1} << 20, (size_t{1} << 20) + 1, size_t{3} << 24, (size_t{5} << 25) + 12345}) {
    const size_t c = CpuBlockCache::size_class(n);
    EXPECT_GE(c, n);
    EXPECT_LE(c - n, n / 8) << n;
    EXPECT_EQ(CpuBlockCache::size_class(c), c) << n;
  }
}
