// Per-sample dropout masks (model/dropout.hpp): a sample's mask depends on
// (seed, step, sample id, site, coordinates) only, not on the batch it is
// in, its row, or the padding.
#include <gtest/gtest.h>

#include "cohort/model/dropout.hpp"

using namespace cohort;

TEST(SampleDropout, MaskFollowsTheSampleNotTheBatch) {
  torch::Tensor ones = torch::ones({3, 5, 7});
  torch::Tensor alone, in_batch, padded;
  {
    DropoutRows rows(7, 12, {42});
    alone = sample_keep_mask(ones.slice(0, 0, 1), 0.3, 4);
  }
  {
    DropoutRows rows(7, 12, {9, 3, 42});  // sample 42 is now the third row
    in_batch = sample_keep_mask(ones, 0.3, 4);
  }
  {
    DropoutRows rows(7, 12, {42, 1});  // and here padded from 5 to 9 positions, 7 to 11 columns
    padded = sample_keep_mask(torch::ones({2, 9, 11}), 0.3, 4);
  }
  EXPECT_TRUE(torch::equal(in_batch[2], alone[0]));
  EXPECT_TRUE(torch::equal(padded[0].slice(0, 0, 5).slice(1, 0, 7), alone[0]));
  // Another step, site or seed gives another mask.
  DropoutRows other_step(7, 13, {42});
  EXPECT_FALSE(torch::equal(sample_keep_mask(ones.slice(0, 0, 1), 0.3, 4), alone));
  EXPECT_FALSE(torch::equal(sample_keep_mask(ones.slice(0, 0, 1), 0.3, 5), alone));
}

TEST(SampleDropout, DropsAboutPAndScalesTheRest) {
  DropoutRows rows(1, 0, {0, 1, 2, 3});
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    auto x = torch::ones({4, 64, 256}, dtype);
    auto y = sample_dropout(x, 0.25, 0, /*training=*/true).to(torch::kFloat32);
    double dropped = y.eq(0).to(torch::kFloat64).mean().item<double>();
    EXPECT_NEAR(dropped, 0.25, 0.01);
    EXPECT_NEAR(y.sum().item<double>() / static_cast<double>(x.numel()), 1.0, 0.02);
    EXPECT_TRUE(y.ne(0).logical_and(y.sub(1.0 / 0.75).abs().gt(1e-2)).sum().item<int64_t>() == 0);
  }
  // Gradients flow through the kept elements only, scaled.
  auto x = torch::ones({4, 8}, torch::requires_grad());
  sample_dropout(x, 0.5, 3, true).sum().backward();
  auto mask = sample_keep_mask(x.detach(), 0.5, 3).to(torch::kFloat32) * 2.0;
  EXPECT_TRUE(torch::equal(x.grad(), mask));
  // Off while evaluating; the wrong number of rows is an error.
  EXPECT_TRUE(torch::equal(sample_dropout(x, 0.5, 3, false), x));
  EXPECT_THROW(sample_dropout(torch::ones({3, 8}), 0.5, 3, true), std::exception);
}

TEST(SampleDropout, WithoutRowsItIsTorchsDropout) {
  torch::manual_seed(3);
  auto a = sample_dropout(torch::ones({64, 64}), 0.5, 0, true);
  torch::manual_seed(3);
  auto b = torch::dropout(torch::ones({64, 64}), 0.5, true);
  EXPECT_TRUE(torch::equal(a, b));
}

// Off the CPU the mask comes from tensor ops on the device: the same bits.
TEST(SampleDropout, TensorOpsGiveTheCpuKernelsBits) {
  DropoutRows rows(5, 77, {3, 1000000007, 12});
  for (auto shape : {std::vector<int64_t>{3}, {3, 33}, {3, 7, 19}, {3, 2, 5, 9}}) {
    auto x = torch::ones(shape);
    for (double p : {0.1, 0.5}) {
      EXPECT_TRUE(torch::equal(sample_keep_mask(x, p, 9), sample_keep_mask_tensor_ops(x, p, 9))) << shape.size() << " " << p;
    }
  }
}
