#include <gtest/gtest.h>

#include <limits>
#include <set>

#include "cohort/data/balance.hpp"
#include "cohort/data/loader.hpp"
#include "cohort/data/order.hpp"
#include "iota_dataset.hpp"

using namespace cohort;
using cohort::test::IotaDataset;
using cohort::test::ids_of;

TEST(Order, PermutationIsAPermutation) {
  for (int64_t n : {1, 2, 7, 1000}) {
    auto p = epoch_permutation(n, 42, 0);
    std::vector<int64_t> sorted = p;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(sorted[i], i);
  }
}

TEST(Order, ReshuffledEachEpochAndReproducible) {
  auto e0 = epoch_permutation(1000, 42, 0);
  auto e1 = epoch_permutation(1000, 42, 1);
  EXPECT_NE(e0, e1);
  EXPECT_EQ(e0, epoch_permutation(1000, 42, 0));
  EXPECT_NE(e0, epoch_permutation(1000, 43, 0));
  // Not the identity, and not merely rotated: many fixed points would be odd.
  int fixed = 0;
  for (int64_t i = 0; i < 1000; ++i) fixed += e0[i] == i;
  EXPECT_LT(fixed, 10);
}

TEST(Order, SplitEvenlyCoversExactly) {
  for (int64_t n : {0, 1, 5, 96, 97}) {
    for (int64_t parts : {1, 2, 3, 7}) {
      int64_t expect_begin = 0;
      for (int64_t p = 0; p < parts; ++p) {
        Slice s = split_evenly(n, p, parts);
        EXPECT_EQ(s.begin, expect_begin);
        EXPECT_LE(s.size(), n / parts + 1);
        EXPECT_GE(s.size(), n / parts);
        expect_begin = s.end;
      }
      EXPECT_EQ(expect_begin, n);
    }
  }
}

TEST(Order, CursorAfterMatchesStepping) {
  for (bool drop_last : {false, true}) {
    GlobalOrder order(103, 10, 1, drop_last);
    EXPECT_EQ(order.steps_per_epoch(), drop_last ? 10 : 11);
    for (Cursor start : {Cursor{0, 0}, Cursor{2, 30}, Cursor{1, 95}}) {
      if (start.consumed >= order.usable()) continue;
      Cursor c = start;
      for (int64_t k = 0; k < 40; ++k) {
        ASSERT_EQ(order.cursor_after(start, k), c) << "k=" << k;
        c = order.advance(c);
      }
    }
  }
}

struct Shape {
  int64_t n;
  int64_t global_batch;
  int world;
  int64_t micro;  // data.micro-batch
};

void PrintTo(const Shape& s, std::ostream* os) {
  *os << "n=" << s.n << " batch=" << s.global_batch << " world=" << s.world << " micro=" << s.micro;
}

class Dealing : public ::testing::TestWithParam<Shape> {};

// Several ranks' loaders in one process: each global batch is split into
// disjoint pieces that together are exactly that batch of the permutation, and
// an epoch covers every sample exactly once. The micro-batches, in rank
// order, are the batch's cut (MicroBatches) whatever the world size: each
// rank computes whole ones, and a rank dealt none runs one empty one.
TEST_P(Dealing, ExactlyOncePerEpochAtAnyWorldSize) {
  Shape s = GetParam();
  IotaDataset data(s.n);
  GlobalOrder order(s.n, s.global_batch, 5, false);
  std::vector<std::unique_ptr<Loader>> loaders;
  for (int r = 0; r < s.world; ++r) {
    LoaderOptions o;
    o.rank = r;
    o.world_size = s.world;
    o.micro_batch = s.micro;
    o.workers = r % 2;  // both the inline and the threaded path
    loaders.push_back(std::make_unique<Loader>(data, order, o, Cursor{}));
  }
  auto perm = epoch_permutation(s.n, 5, 0);
  std::multiset<int64_t> seen;
  int64_t consumed = 0;
  for (int64_t step = 0; step < order.steps_per_epoch(); ++step) {
    std::vector<int64_t> global;
    std::vector<std::vector<int64_t>> micro_batches;
    int64_t expect = std::min(s.global_batch, s.n - consumed);
    const MicroBatches cut{s.micro};
    for (int r = 0; r < s.world; ++r) {
      StepBatch b = loaders[static_cast<size_t>(r)]->next();
      ASSERT_EQ(b.cursor.consumed, consumed);
      const Slice mine = split_evenly(cut.count(expect), r, s.world);
      ASSERT_EQ(static_cast<int64_t>(b.micro.size()), std::max<int64_t>(mine.size(), 1)) << "rank " << r;
      for (const auto& m : b.micro) {
        auto ids = ids_of(m);
        global.insert(global.end(), ids.begin(), ids.end());
        if (!ids.empty()) micro_batches.push_back(ids);
      }
    }
    ASSERT_EQ(static_cast<int64_t>(micro_batches.size()), cut.count(expect));
    for (int64_t i = 0; i < cut.count(expect); ++i) {
      const Slice at = cut.at(expect, i);
      ASSERT_LE(at.size(), s.micro);
      ASSERT_EQ(micro_batches[static_cast<size_t>(i)],
                std::vector<int64_t>(perm.begin() + consumed + at.begin, perm.begin() + consumed + at.end))
          << "micro-batch " << i;
    }
    ASSERT_EQ(static_cast<int64_t>(global.size()), expect);
    ASSERT_EQ(global, std::vector<int64_t>(perm.begin() + consumed, perm.begin() + consumed + expect));
    seen.insert(global.begin(), global.end());
    consumed += expect;
  }
  EXPECT_EQ(consumed, s.n);
  EXPECT_EQ(static_cast<int64_t>(seen.size()), s.n);
  for (int64_t i = 0; i < s.n; ++i) EXPECT_EQ(seen.count(i), 1u) << i;
  // The next step starts epoch 1 with a different order.
  StepBatch next = loaders[0]->next();
  EXPECT_EQ(next.cursor, (Cursor{1, 0}));
}

INSTANTIATE_TEST_SUITE_P(Shapes, Dealing,
                         ::testing::Values(Shape{96, 96, 1, 32}, Shape{100, 96, 2, 32}, Shape{101, 10, 3, 4},
                                           Shape{97, 12, 3, 5}, Shape{5, 4, 3, 1}, Shape{1, 1, 1, 1},
                                           Shape{50, 8, 2, 3}, Shape{64, 64, 3, 32}),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           const Shape& s = info.param;
                           return "n" + std::to_string(s.n) + "_batch" + std::to_string(s.global_batch) + "_world" +
                                  std::to_string(s.world) + "_micro" + std::to_string(s.micro);
                         });

TEST(Order, DropLastSkipsOnlyTheShortBatch) {
  GlobalOrder order(25, 10, 3, /*drop_last=*/true);
  EXPECT_EQ(order.usable(), 20);
  EXPECT_EQ(order.advance({0, 10}), (Cursor{1, 0}));
}

TEST(Order, WorkerExceptionsReachTheConsumer) {
  class Broken : public IotaDataset {
   public:
    using IotaDataset::IotaDataset;
    Example get(int64_t i) const override {
      if (i == 3) throw std::runtime_error("bad sample 3");
      return IotaDataset::get(i);
    }
  };
  Broken data(8);
  GlobalOrder order(8, 8, 1, false);
  LoaderOptions o;
  o.workers = 2;
  Loader loader(data, order, o, Cursor{});
  EXPECT_THROW(loader.next(), std::runtime_error);
}

TEST(Order, EvalShardsCoverWithoutDuplicates) {
  for (int world : {1, 2, 3, 5}) {
    int64_t covered = 0;
    for (int r = 0; r < world; ++r) {
      Slice s = eval_shard(11, r, world);
      EXPECT_EQ(s.begin, covered);
      covered = s.end;
    }
    EXPECT_EQ(covered, 11);
  }
}

// Hardening: a global batch near INT64_MAX is one short batch per epoch,
// not an overflow (it was SIGFPE).
TEST(Order, HugeGlobalBatchDoesNotOverflow) {
  const int64_t huge = std::numeric_limits<int64_t>::max();
  GlobalOrder order(10, huge, 1, false);
  EXPECT_EQ(order.steps_per_epoch(), 1);
  EXPECT_EQ(order.batch_size_at({0, 0}), 10);
  EXPECT_EQ(order.advance({0, 0}), (Cursor{1, 0}));
  EXPECT_EQ(order.cursor_after({0, 0}, 5), (Cursor{5, 0}));
  GlobalOrder near(huge, huge - 1, 1, false);
  EXPECT_EQ(near.steps_per_epoch(), 2);
  EXPECT_EQ(near.cursor_after({0, 0}, 3), (Cursor{1, huge - 1}));
}
