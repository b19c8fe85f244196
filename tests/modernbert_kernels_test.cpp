// ModernBERT's CPU passes compute what the ops they replace compute: the
// fused split and rotation of q and k (model/rotary.hpp) gives the unfused
// ops' bits forward and backward, in fp32 and bf16, with one row of angles
// or a row each (packed rows); sliding-window attention by blocks
// (model/sliding_window.hpp) gives masked attention over the whole row,
// forward and backward, for padded and packed rows and rows that do not fill
// their last block.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "cohort/model/rotary.hpp"
#include "cohort/model/sliding_window.hpp"

using namespace cohort;

namespace {

// cos and sin [rows, L, D] of the positions [rows, L], as ModernBERT makes them.
std::pair<torch::Tensor, torch::Tensor> angles(const torch::Tensor& positions, int64_t d, double theta) {
  auto inv = 1.0 / torch::pow(theta, torch::arange(0, d, 2, torch::kFloat32) / static_cast<double>(d));
  auto f = positions.unsqueeze(-1).to(torch::kFloat32) * inv;
  auto e = torch::cat({f, f}, -1);
  return {e.cos(), e.sin()};
}

struct Out {
  torch::Tensor q, k, v, grad;
};

Out rotate(bool fused, const torch::Tensor& qkv, int64_t heads, const std::pair<torch::Tensor, torch::Tensor>& cs,
           const std::vector<torch::Tensor>& upstream) {
  auto x = qkv.detach().clone().requires_grad_(true);
  Qkv r = fused ? rotary_qkv(x, heads, cs.first, cs.second) : rotary_qkv_unfused(x, heads, cs.first, cs.second);
  auto loss = (r.q.to(torch::kFloat64) * upstream[0]).sum() + (r.k.to(torch::kFloat64) * upstream[1]).sum() +
              (r.v.to(torch::kFloat64) * upstream[2]).sum();
  loss.backward();
  return {r.q, r.k, r.v, x.grad()};
}

void expect_same_bits(const torch::Tensor& a, const torch::Tensor& b, const char* what) {
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  ASSERT_EQ(a.scalar_type(), b.scalar_type()) << what;
  EXPECT_TRUE(torch::equal(a.contiguous(), b.contiguous())) << what << ": largest difference "
                                                            << (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

}  // namespace

TEST(ModernBertKernels, FusedRotationGivesTheUnfusedBits) {
  torch::manual_seed(3);
  const int64_t b = 3, l = 37, heads = 4, d = 16;
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    for (bool per_row : {false, true}) {
      auto qkv = torch::randn({b, l, 3 * heads * d}).to(dtype);
      auto positions = per_row ? torch::randint(0, 300, {b, l}, torch::kLong) : torch::arange(l).unsqueeze(0);
      auto cs = angles(positions, d, 160000.0);
      std::vector<torch::Tensor> up;
      for (int i = 0; i < 3; ++i) up.push_back(torch::randn({b, heads, l, d}, torch::kFloat64));
      Out fused = rotate(true, qkv, heads, cs, up), unfused = rotate(false, qkv, heads, cs, up);
      SCOPED_TRACE(std::string(dtype == torch::kFloat32 ? "fp32" : "bf16") + (per_row ? ", a row each" : ", one row"));
      // The fused pass made the result (else this compares the unfused ops with themselves).
      ASSERT_TRUE(fused.q.grad_fn() && fused.q.grad_fn()->name().find("RotaryQkv") != std::string::npos)
          << (fused.q.grad_fn() ? fused.q.grad_fn()->name() : "no grad_fn");
      expect_same_bits(fused.q, unfused.q, "q");
      expect_same_bits(fused.k, unfused.k, "k");
      expect_same_bits(fused.v, unfused.v, "v");
      expect_same_bits(fused.grad, unfused.grad, "qkv's gradient");
      // And the rotation is one: q is not v's copy, nor the input's.
      EXPECT_FALSE(torch::equal(fused.q, qkv.view({b, l, 3, heads, d}).select(2, 0).transpose(1, 2).contiguous()));
    }
  }
}

TEST(ModernBertKernels, BlockedSlidingWindowEqualsTheMaskedRow) {
  torch::manual_seed(5);
  const int64_t heads = 2, d = 8, w = 4;
  // Padded rows (the last block part empty: L = 22 is not a multiple of 4)
  // and packed rows whose positions restart at each sequence.
  const int64_t b = 3, l = 22;
  auto input_mask = torch::ones({b, l}, torch::kLong);
  input_mask.index_put_({1, torch::indexing::Slice(15, l)}, 0);
  input_mask.index_put_({2, torch::indexing::Slice(6, l)}, 0);
  auto padded_positions = torch::arange(l).unsqueeze(0);
  auto seq_ids = torch::zeros({b, l}, torch::kLong), packed_positions = torch::zeros({b, l}, torch::kLong);
  const std::vector<std::vector<int64_t>> lengths = {{9, 13}, {3, 7, 5, 7}, {22}};
  for (int64_t r = 0; r < b; ++r) {
    int64_t at = 0, id = 0;
    for (int64_t n : lengths[static_cast<size_t>(r)]) {
      for (int64_t i = 0; i < n; ++i, ++at) {
        seq_ids[r][at] = id;
        packed_positions[r][at] = i;
      }
      ++id;
    }
  }
  for (bool packed : {false, true}) {
    SCOPED_TRACE(packed ? "packed rows" : "padded rows");
    const auto& positions = packed ? packed_positions : padded_positions;
    const torch::Tensor ids = packed ? seq_ids : torch::Tensor();
    // The whole row's mask, as ModernBERT's sliding layers build it.
    torch::Tensor full;
    if (packed) {
      full = seq_ids.unsqueeze(2).eq(seq_ids.unsqueeze(1)).unsqueeze(1);
    } else {
      auto real = input_mask.ne(0);
      full = real.view({b, 1, 1, l}).logical_or(real.logical_not().view({b, 1, l, 1}));
    }
    full = full.logical_and((positions.unsqueeze(2) - positions.unsqueeze(1)).abs().le(w).unsqueeze(1));
    auto q = torch::randn({b, heads, l, d}, torch::kFloat64).requires_grad_(true);
    auto k = torch::randn({b, heads, l, d}, torch::kFloat64).requires_grad_(true);
    auto v = torch::randn({b, heads, l, d}, torch::kFloat64).requires_grad_(true);
    auto up = torch::randn({b, l, heads * d}, torch::kFloat64);
    // Only real queries' outputs are read (a padding query's never is).
    auto real = (packed ? torch::ones({b, l}, torch::kLong) : input_mask).to(torch::kFloat64).unsqueeze(-1);
    auto whole = at::scaled_dot_product_attention(q, k, v, full).transpose(1, 2).reshape({b, l, heads * d});
    auto blocked = banded_attention(q, k, v, band_keep(input_mask, positions, ids, w), w);
    ASSERT_EQ(blocked.sizes(), whole.sizes());
    EXPECT_LT((blocked * real - whole * real).abs().max().item<double>(), 1e-12);
    auto grads = [&](const torch::Tensor& out) {
      auto g = torch::autograd::grad({(out * real * up).sum()}, {q, k, v});
      return torch::cat({g[0].flatten(), g[1].flatten(), g[2].flatten()});
    };
    auto gw = grads(whole), gb = grads(blocked);
    EXPECT_LT((gw - gb).abs().max().item<double>(), 1e-12);
    EXPECT_GT(gw.abs().max().item<double>(), 1e-3);  // gradients that could differ
  }
}

// A query sees nothing beyond w places: a change to a key w + 1 places away
// (and to everything past it) leaves its output as it was, a change w places
// away does not.
TEST(ModernBertKernels, BlockedSlidingWindowReachesWPlaces) {
  torch::manual_seed(7);
  const int64_t l = 40, w = 5, i = 17;
  auto mask = torch::ones({1, l}, torch::kLong);
  auto positions = torch::arange(l).unsqueeze(0);
  auto keep = band_keep(mask, positions, {}, w);
  auto q = torch::randn({1, 1, l, 8}), k = torch::randn({1, 1, l, 8}), v = torch::randn({1, 1, l, 8});
  auto base = banded_attention(q, k, v, keep, w)[0][i];
  auto changed = [&](int64_t from) {
    auto k2 = k.clone(), v2 = v.clone();
    k2.narrow(2, from, l - from).normal_();
    v2.narrow(2, from, l - from).normal_();
    return banded_attention(q, k2, v2, keep, w)[0][i];
  };
  EXPECT_TRUE(torch::equal(changed(i + w + 1), base));
  EXPECT_FALSE(torch::equal(changed(i + w), base));
}
