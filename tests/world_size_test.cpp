// The promise that a step does not depend on the world size, checked where
// it was seen to fail: the Fashion-MNIST CNN (conv kernels whose per-sample
// results depend on the batch's shape), dropout on and off, worlds 1, 2 and
// 3, sharded optimizer state and sharded gradients, global batches that cut
// into micro-batches that divide evenly over the ranks and ones that do not.
// Every rank computes with one thread: a kernel's rounding follows its
// thread count, which the promise leaves to the user (README).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "helpers.hpp"

using cohort::test::run_cohort;
using cohort::test::TempDir;

namespace {

struct Case {
  int64_t batch;
  double dropout;
};

void PrintTo(const Case& c, std::ostream* os) { *os << "batch=" << c.batch << " dropout=" << c.dropout; }

class WorldSize : public ::testing::TestWithParam<Case> {};

}  // namespace

// 25 steps: the loss of every step agrees within 1e-6 (relative) with one
// rank's, on 2 and 3 ranks, sharded or not. (With the exact sum the steps are
// the same bits; the bound is the promise's.)
TEST_P(WorldSize, EveryStepsLossIsOneRanksLoss) {
  if (!cohort::test::have_fashion_mnist()) GTEST_SKIP() << "SKIPPED: dataset-fashion-mnist is not installed";
  const Case c = GetParam();
  TempDir tmp;
  const std::string common = " --model.name cnn --model.dropout " + std::to_string(c.dropout) +
                             " --data.global-batch " + std::to_string(c.batch) +
                             " --train.seed 7 --threads 1 --oversubscribe --optim.clip-norm 1 --train.max-steps 25"
                             " --log.every-steps 1 --eval.every-steps 1000 --eval.max-samples 100 --quiet";
  const std::vector<std::string> shapes = {
      "--nproc-per-node 1",
      "--nproc-per-node 2",
      "--nproc-per-node 2 --dist.shard optimizer",
      "--nproc-per-node 3",
      "--nproc-per-node 3 --dist.shard gradients",
  };
  std::vector<std::vector<double>> losses;
  for (const auto& shape : shapes) {
    const std::string dir = tmp / ("r" + std::to_string(losses.size()));
    auto r = run_cohort("train " + shape + common + " --out " + dir);
    ASSERT_EQ(r.code, 0) << shape << ": " << r.err;
    losses.push_back(cohort::test::train_losses(dir));
    ASSERT_EQ(losses.back().size(), 25u) << shape;
  }
  for (size_t k = 1; k < shapes.size(); ++k) {
    for (size_t i = 0; i < losses[0].size(); ++i) {
      EXPECT_NEAR(losses[k][i], losses[0][i], 1e-6 * std::abs(losses[0][i])) << shapes[k] << " step " << i + 1;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(CnnOnFashionMnist, WorldSize,
                         ::testing::Values(Case{64, 0.0}, Case{64, 0.1}, Case{96, 0.0}, Case{96, 0.1}, Case{192, 0.0},
                                           Case{192, 0.1}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return "batch" + std::to_string(info.param.batch) +
                                  (info.param.dropout > 0 ? "_dropout" : "_nodropout");
                         });
