// Ranks of different speeds: the split of a global batch (data/balance.hpp)
// and its dealing by the loader when the split changes mid-epoch.
#include <gtest/gtest.h>

#include <numeric>
#include <set>

#include "cohort/core/error.hpp"
#include "cohort/data/balance.hpp"
#include "cohort/data/loader.hpp"
#include "iota_dataset.hpp"

using namespace cohort;
using cohort::test::IotaDataset;
using cohort::test::ids_of;

namespace {

int64_t sum(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

}  // namespace

TEST(Balance, SplitByWeightsSumsAndMatchesTheEvenSplit) {
  for (int64_t n : {0, 1, 7, 64, 97, 1000}) {
    for (int ranks : {1, 2, 3, 5}) {
      auto equal = split_by_weights(n, std::vector<int64_t>(static_cast<size_t>(ranks), 1));
      ASSERT_EQ(sum(equal), n);
      for (int r = 0; r < ranks; ++r) {
        Slice even = split_evenly(n, r, ranks), mine = weighted_slice(n, std::vector<int64_t>(ranks, 1), r);
        EXPECT_EQ(mine.begin, even.begin) << n << " " << ranks << " " << r;
        EXPECT_EQ(mine.end, even.end) << n << " " << ranks << " " << r;
      }
    }
  }
  // Weights that sum to n are the shares; a short batch scales them.
  EXPECT_EQ(split_by_weights(64, {41, 23}), (std::vector<int64_t>{41, 23}));
  EXPECT_EQ(split_by_weights(10, {41, 23}), (std::vector<int64_t>{6, 4}));
  EXPECT_EQ(sum(split_by_weights(9223372036854775807, {3, 5, 7})), 9223372036854775807);
}

TEST(Balance, SharesFollowSpeedsDeterministically) {
  auto a = shares_for_speeds(64, {812.0, 405.0}, 1);
  EXPECT_EQ(sum(a), 64);
  EXPECT_EQ(a, (std::vector<int64_t>{42, 22}));
  EXPECT_EQ(shares_for_speeds(64, {812.0, 405.0}, 1), a);  // a pure function
  EXPECT_EQ(shares_for_speeds(64, {1.0, 1.0, 1.0}, 0), (std::vector<int64_t>{22, 21, 21}));
  // Every rank keeps its floor, so a very slow rank is still measured.
  auto floored = shares_for_speeds(16, {1000.0, 1.0}, 1);
  EXPECT_EQ(floored, (std::vector<int64_t>{15, 1}));
  EXPECT_THROW(shares_for_speeds(16, {1.0, 0.0}, 1), Error);
}

TEST(Balance, AutoConvergesAndHysteresisStopsOscillation) {
  Balancer b({Balance::kAuto, 60, 2, {}, {}});
  EXPECT_EQ(b.shares(), (std::vector<int64_t>{30, 30}));
  // Rank 1 is twice as slow: 30 samples take it 2 s, rank 0 1 s.
  ASSERT_TRUE(b.update({30, 30}, {1.0, 2.0}));
  EXPECT_EQ(b.shares(), (std::vector<int64_t>{40, 20}));
  // Measured again at the new split, with 3% noise: no change.
  EXPECT_FALSE(b.update({40, 20}, {1.33, 1.37}));
  EXPECT_FALSE(b.update({40, 20}, {1.37, 1.33}));
  EXPECT_EQ(b.shares(), (std::vector<int64_t>{40, 20}));
  // Rank 0 slows down to rank 1's speed: the split follows.
  ASSERT_TRUE(b.update({40, 20}, {4.0, 2.0}));
  EXPECT_EQ(b.shares(), (std::vector<int64_t>{30, 30}));
  // A rank that computed nothing keeps its last speed.
  EXPECT_FALSE(b.update({30, 0}, {3.0, 0.0}));
}

TEST(Balance, ModesAndResume) {
  EXPECT_EQ(Balancer({Balance::kWeights, 64, 2, {2.0, 1.0}, {}}).shares(), (std::vector<int64_t>{43, 21}));
  EXPECT_FALSE(Balancer({Balance::kWeights, 64, 2, {2.0, 1.0}, {}}).update({1, 1}, {1, 9}));
  EXPECT_FALSE(Balancer({Balance::kEqual, 64, 2, {}, {}}).update({1, 1}, {1, 9}));
  std::string err;
  try {
    Balancer({Balance::kWeights, 64, 3, {2.0, 1.0}, {}});
  } catch (const ConfigError& e) {
    err = e.what();
  }
  EXPECT_NE(err.find("data.balance-weights has 2 weight(s) but the world has 3"), std::string::npos) << err;
  // auto resumes its shares at the same world size and batch; else equal.
  EXPECT_EQ(Balancer({Balance::kAuto, 64, 2, {}, {41, 23}}).shares(), (std::vector<int64_t>{41, 23}));
  EXPECT_EQ(Balancer({Balance::kAuto, 64, 3, {}, {41, 23}}).shares(), (std::vector<int64_t>{22, 21, 21}));
  EXPECT_EQ(Balancer({Balance::kAuto, 96, 2, {}, {41, 23}}).shares(), (std::vector<int64_t>{48, 48}));
}

// The split changes twice mid-epoch, while the loaders have steps built
// ahead: every global batch is still exactly its slice of the permutation,
// dealt by the shares in effect as whole micro-batches of the batch's cut,
// and the epoch covers every sample once.
TEST(Balance, ExactlyOnceWhenTheSplitChangesMidEpoch) {
  const int64_t n = 203, global = 20;
  const MicroBatches cut{3};  // 7 micro-batches of a full batch: 3,3,3,3,3,3,2
  IotaDataset data(n);
  GlobalOrder order(n, global, 9, false);
  std::vector<std::unique_ptr<Loader>> loaders;
  for (int r = 0; r < 2; ++r) {
    LoaderOptions o;
    o.rank = r;
    o.world_size = 2;
    o.micro_batch = cut.most;
    o.workers = 2 - r;  // threaded with 2 and 1 workers
    o.prefetch = 3;
    loaders.push_back(std::make_unique<Loader>(data, order, o, Cursor{}));
  }
  auto perm = epoch_permutation(n, 9, 0);
  std::vector<int64_t> shares = {4, 3};
  std::multiset<int64_t> seen;
  int64_t consumed = 0;
  for (int64_t step = 0; step < order.steps_per_epoch(); ++step) {
    if (step == 3) shares = {5, 2};
    if (step == 7) shares = {1, 6};
    if (step == 3 || step == 7) {
      for (auto& l : loaders) l->reshare(shares);
    }
    int64_t expect = std::min(global, n - consumed);
    std::vector<int64_t> batch;
    for (int r = 0; r < 2; ++r) {
      StepBatch b = loaders[static_cast<size_t>(r)]->next();
      ASSERT_EQ(b.cursor.consumed, consumed);
      const Slice mine = weighted_slice(cut.count(expect), shares, r);
      ASSERT_EQ(static_cast<int64_t>(b.micro.size()), std::max<int64_t>(1, mine.size()))
          << "step " << step << " rank " << r;
      for (size_t m = 0; m < b.micro.size(); ++m) {
        auto ids = ids_of(b.micro[m]);
        const Slice want = mine.size() == 0 ? Slice{} : cut.at(expect, mine.begin + static_cast<int64_t>(m));
        ASSERT_EQ(ids, std::vector<int64_t>(perm.begin() + consumed + want.begin, perm.begin() + consumed + want.end))
            << "step " << step << " rank " << r << " micro-batch " << m;
        const Slice rows = b.micro_rows[m];
        ASSERT_EQ(std::vector<int64_t>(b.indices.begin() + rows.begin, b.indices.begin() + rows.end), ids);
        batch.insert(batch.end(), ids.begin(), ids.end());
      }
    }
    ASSERT_EQ(batch, std::vector<int64_t>(perm.begin() + consumed, perm.begin() + consumed + expect)) << step;
    seen.insert(batch.begin(), batch.end());
    consumed += expect;
  }
  EXPECT_EQ(consumed, n);
  EXPECT_EQ(seen.size(), static_cast<size_t>(n));
  EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), static_cast<size_t>(n));
}
