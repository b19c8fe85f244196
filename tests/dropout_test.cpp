// Per-sample dropout masks (model/dropout.hpp): a sample's mask depends on
// (seed, step, sample id, site, coordinates) only, not on the batch it is
// in, its row, or the padding.
#include <gtest/gtest.h>

#include <torch/autograd.h>

#include <optional>

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
  // (700 columns: the CPU pass hashes a line in blocks of 512.)
  for (auto shape : {std::vector<int64_t>{3}, {3, 33}, {3, 7, 19}, {3, 2, 5, 9}, {3, 2, 700}}) {
    auto x = torch::ones(shape);
    for (double p : {0.1, 0.5}) {
      EXPECT_TRUE(torch::equal(sample_keep_mask(x, p, 9), sample_keep_mask_tensor_ops(x, p, 9))) << shape.size() << " " << p;
    }
  }
}

namespace {

// Two packed rows of 8: row 0 holds sample 1 (4 tokens) then sample 0 (3),
// row 1 holds sample 2 (5); the rest is padding.
struct PackedLayout {
  std::vector<int64_t> length{3, 4, 5};
  torch::Tensor seq = torch::tensor({1, 1, 1, 1, 0, 0, 0, -1, 2, 2, 2, 2, 2, -1, -1, -1}, torch::kInt64).view({2, 8});
  torch::Tensor pos = torch::tensor({0, 1, 2, 3, 0, 1, 2, 0, 0, 1, 2, 3, 4, 0, 0, 0}, torch::kInt64).view({2, 8});
  int64_t start(int64_t sample) const { return sample == 1 ? 0 : sample == 0 ? 4 : 8; }  // flat token index
};

}  // namespace

// data.pack: a sample packed into a row with others keeps the mask it has
// alone, for hidden states [R, L, H] and attention probabilities [R, A, L, L]
// (whose key coordinate is the key's position within the sample).
TEST(SampleDropout, PackedRowsKeepEachSamplesMask) {
  const PackedLayout layout;
  DropoutRows samples(3, 21, {40, 7, 13});
  auto alone_hidden = sample_keep_mask(torch::ones({3, 6, 10}), 0.4, 2);
  auto alone_probs = sample_keep_mask(torch::ones({3, 2, 6, 6}), 0.4, 1);
  DropoutRows packed(samples, layout.seq, layout.pos);
  auto hidden = sample_keep_mask(torch::ones({2, 8, 10}), 0.4, 2).view({16, 10});
  auto probs = sample_keep_mask(torch::ones({2, 2, 8, 8}), 0.4, 1);
  for (int64_t i = 0; i < 3; ++i) {
    const int64_t s = layout.start(i), n = layout.length[static_cast<size_t>(i)], r = s / 8, off = s % 8;
    EXPECT_TRUE(torch::equal(hidden.narrow(0, s, n), alone_hidden[i].narrow(0, 0, n))) << "sample " << i;
    EXPECT_TRUE(torch::equal(probs[r].narrow(1, off, n).narrow(2, off, n), alone_probs[i].narrow(1, 0, n).narrow(2, 0, n)))
        << "sample " << i;
  }
  // The device path gives the same bits, packed too.
  for (auto shape : {std::vector<int64_t>{2, 8, 10}, {2, 3, 8, 8}}) {
    auto x = torch::ones(shape);
    EXPECT_TRUE(torch::equal(sample_keep_mask(x, 0.3, 5), sample_keep_mask_tensor_ops(x, 0.3, 5))) << shape.size();
  }
  // Other shapes are not packed rows.
  EXPECT_THROW(sample_keep_mask(torch::ones({2, 7, 10}), 0.3, 5), std::exception);
  EXPECT_THROW(sample_keep_mask(torch::ones({2, 10}), 0.3, 5), std::exception);
  // Under the packed scope, a batch of samples is not its rows.
  EXPECT_THROW(sample_keep_mask(torch::ones({3, 6, 10}), 0.3, 5), std::exception);
}

// The CPU's one-pass dropout (hash and scale together, hashed again in
// backward) is x * mask / (1 - p) forward and g * mask / (1 - p) backward,
// in fp32, bf16 and fp16, packed or not.
TEST(SampleDropout, OnePassDropoutIsTheMaskTimesTheScale) {
  const PackedLayout layout;
  DropoutRows samples(8, 3, {4, 5, 6});
  std::optional<DropoutRows> packed;
  for (bool pack : {false, true}) {
    if (pack) packed.emplace(samples, layout.seq, layout.pos);
    for (auto shape : pack ? std::vector<std::vector<int64_t>>{{2, 8, 16}, {2, 4, 8, 8}}
                           : std::vector<std::vector<int64_t>>{{3}, {3, 16}, {3, 8, 16}, {3, 4, 8, 8}, {3, 2, 700}}) {
      for (auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kHalf}) {
        auto x = torch::randn(shape).to(dtype).requires_grad_(true);
        auto g = torch::randn(shape).to(dtype);
        auto y = sample_dropout(x, 0.3, 6, true);
        y.backward(g);
        auto mask = sample_keep_mask(x.detach(), 0.3, 6).to(dtype);
        EXPECT_TRUE(torch::equal(y, x.detach() * mask * (1.0 / 0.7))) << pack << " " << shape.size() << " " << dtype;
        EXPECT_TRUE(torch::equal(x.grad(), g * mask * (1.0 / 0.7))) << pack << " " << shape.size() << " " << dtype;
      }
    }
  }
  // A non-contiguous input and gradient: the mask follows the logical layout.
  packed.reset();
  auto base = torch::randn({16, 3}, torch::requires_grad());
  auto x = base.t();  // [3, 16], strided
  auto y = sample_dropout(x, 0.3, 6, true);
  auto g = torch::randn({16, 3}).t();
  y.backward(g);
  auto mask = sample_keep_mask(x.detach().contiguous(), 0.3, 6).to(torch::kFloat32);
  EXPECT_TRUE(torch::equal(y, x.detach() * mask * (1.0 / 0.7)));
  EXPECT_TRUE(torch::equal(base.grad().t(), g * mask * (1.0 / 0.7)));
  // And a double backward sees the mask again.
  auto z = torch::ones({3, 16}, torch::requires_grad());
  auto gz = torch::autograd::grad({sample_dropout(z, 0.3, 6, true).pow(2).sum()}, {z}, {}, true, true)[0];
  auto gg = torch::autograd::grad({gz.sum()}, {z})[0];
  auto m = sample_keep_mask(z.detach(), 0.3, 6).to(torch::kFloat32);
  EXPECT_TRUE(torch::allclose(gg, 2 * m * (1.0 / 0.7) * (1.0 / 0.7)));
}

// The one-pass bf16 kernel rounds in vector lanes: its bits must be
// c10::BFloat16's for every kind of value, kept or dropped (NaN stays NaN as
// 0x7FC0, a dropped negative is -0, a dropped inf is NaN, subnormals, ties
// and values that round up to inf).
TEST(SampleDropout, Bf16KernelRoundsAsC10ForSpecialValues) {
  const std::vector<uint16_t> bits = {0x0000, 0x8000, 0x0001, 0x8001, 0x007F, 0x0080, 0x3F80, 0xBF80, 0x7F7F,
                                      0xFF7F, 0x7F80, 0xFF80, 0x7FC0, 0xFFC1, 0x7F81, 0x4049, 0x3F81, 0x3F7F,
                                      0x7F00, 0x0040, 0xC2F7, 0x1234};
  const int64_t cols = 512 + 3;  // past one block, and a tail
  auto x = torch::empty({4, cols}, torch::kBFloat16);
  auto* xb = reinterpret_cast<uint16_t*>(x.data_ptr<c10::BFloat16>());
  for (int64_t i = 0; i < x.numel(); ++i) xb[i] = bits[static_cast<size_t>(i) % bits.size()];
  DropoutRows rows(11, 2, {0, 1, 2, 3});
  const double p = 0.3;
  auto y = sample_dropout(x, p, 4, true);
  auto keep = sample_keep_mask(x, p, 4);
  ASSERT_GT(keep.logical_not().sum().item<int64_t>(), 0);
  const auto scale = static_cast<float>(1.0 / (1.0 - p));
  const auto* yb = reinterpret_cast<const uint16_t*>(y.const_data_ptr<c10::BFloat16>());
  const bool* k = keep.const_data_ptr<bool>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    const c10::BFloat16 want(static_cast<float>(x.const_data_ptr<c10::BFloat16>()[i]) * (k[i] ? scale : 0.0f));
    ASSERT_EQ(yb[i], want.x) << "element " << i << ": input bits 0x" << std::hex << xb[i] << (k[i] ? " kept" : " dropped");
  }
}

// A packed layout whose positions do not continue their sample is refused.
TEST(SampleDropout, PackedRowsMustHoldContiguousSamples) {
  DropoutRows samples(3, 21, {40, 7});
  auto seq = torch::tensor({0, 0, 1, 1}, torch::kInt64).view({1, 4});
  EXPECT_NO_THROW(DropoutRows(samples, seq, torch::tensor({0, 1, 0, 1}, torch::kInt64).view({1, 4})));
  EXPECT_THROW(DropoutRows(samples, seq, torch::tensor({0, 1, 2, 3}, torch::kInt64).view({1, 4})), std::exception);
  EXPECT_THROW(DropoutRows(samples, seq, torch::tensor({1, 2, 0, 1}, torch::kInt64).view({1, 4})), std::exception);
  EXPECT_THROW(DropoutRows(samples, torch::tensor({0, 0, 2, 2}, torch::kInt64).view({1, 4}),
                           torch::tensor({0, 1, 0, 1}, torch::kInt64).view({1, 4})),
               std::exception);
  EXPECT_THROW(DropoutRows(samples, seq, torch::Tensor()), std::exception);
}
