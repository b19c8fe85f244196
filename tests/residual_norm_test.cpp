// The fused dropout + residual + LayerNorm (model/residual_norm.hpp) computes
// what the unfused ops compute, forward and backward, in fp32 and under
// autocast's bf16, with per-sample masks unpacked and packed.
#include <gtest/gtest.h>

#include <torch/autograd.h>

#include <optional>

#include "cohort/model/dropout.hpp"
#include "cohort/model/residual_norm.hpp"

using namespace cohort;

namespace {

// The result's autograd node is the fused pass's (behind the view to x's shape).
bool made_by_fused_pass(const torch::Tensor& y) {
  auto node = y.grad_fn();
  for (int depth = 0; node && depth < 2; ++depth) {
    if (node->name().find("DropoutAddNorm") != std::string::npos) return true;
    node = node->next_edges().empty() ? nullptr : node->next_edges()[0].function;
  }
  return false;
}

struct Grads {
  torch::Tensor full, low, dx, dr, dw, db;
};

// Runs one path on copies of the inputs, with upstream gradients gy for the
// fp32 result and gl for the bf16 copy a product reads (the unfused path's
// result cast to bf16, as autocast casts it).
Grads run(bool fused, const torch::Tensor& x, const torch::Tensor& r, const torch::Tensor& w, const torch::Tensor& b,
          const torch::Tensor& gy, const torch::Tensor& gl, double p, bool training, bool read_low = true) {
  auto xi = x.detach().clone().requires_grad_(true), ri = r.detach().clone().requires_grad_(true);
  auto wi = w.detach().clone().requires_grad_(true), bi = b.detach().clone().requires_grad_(true);
  Hidden h = fused ? dropout_add_layer_norm(xi, ri, wi, bi, 1e-12, p, 7, training)
                   : dropout_add_layer_norm_unfused(xi, ri, wi, bi, 1e-12, p, 7, training);
  if (fused) {
    EXPECT_TRUE(made_by_fused_pass(h.full));  // not the fallback
  }
  torch::Tensor low = h.low.defined() ? h.low : h.full.to(x.scalar_type());
  // bf16 products read `low`: its gradient arrives in bf16, as a GEMM's would.
  auto loss = (h.full * gy).sum();
  if (x.scalar_type() != r.scalar_type() && read_low) {
    torch::autograd::backward({loss, (low * gl).sum()});
  } else {
    loss.backward();
  }
  return {h.full.detach(), low.detach(), xi.grad(), ri.grad(), wi.grad(), bi.grad()};
}

void expect_close(const torch::Tensor& a, const torch::Tensor& b, double rtol, double atol, const char* what) {
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  auto diff = (a.to(torch::kFloat) - b.to(torch::kFloat)).abs();
  auto bound = atol + rtol * b.to(torch::kFloat).abs();
  EXPECT_EQ(diff.gt(bound).sum().item<int64_t>(), 0)
      << what << ": max |diff| " << diff.max().item<double>() << " (" << a.scalar_type() << ")";
}

struct Case {
  torch::Tensor x, r, w, b, gy, gl;
};

Case make_case(int64_t rows, int64_t len, int64_t h, torch::ScalarType x_type) {
  torch::manual_seed(11);
  Case c;
  c.x = torch::randn({rows, len, h}).to(x_type);
  c.r = torch::randn({rows, len, h}) * 2.0 + 0.5;
  c.w = torch::randn({h}) * 0.2 + 1.0;
  c.b = torch::randn({h}) * 0.1;
  c.gy = torch::randn({rows, len, h});
  c.gl = torch::randn({rows, len, h}).to(x_type);
  return c;
}

void compare(const Case& c, double p, bool training, bool read_low = true) {
  const bool bf16 = c.x.scalar_type() == torch::kBFloat16;
  Grads f = run(true, c.x, c.r, c.w, c.b, c.gy, c.gl, p, training, read_low);
  Grads u = run(false, c.x, c.r, c.w, c.b, c.gy, c.gl, p, training, read_low);
  expect_close(f.full, u.full, 1e-5, 1e-5, "y");
  if (bf16) {
    ASSERT_TRUE(f.low.defined());
    EXPECT_TRUE(torch::equal(f.low, f.full.to(torch::kBFloat16))) << "the bf16 copy is y rounded";
    expect_close(f.low, u.low, 1e-2, 1e-5, "y in bf16");
  }
  expect_close(f.dr, u.dr, 1e-4, 1e-5, "d residual");
  // In bf16 the gradient of x is rounded twice, as the unfused ops round it:
  // ds differing in its last fp32 bits may round to the next bf16.
  expect_close(f.dx, u.dx, bf16 ? 1e-2 : 1e-4, 1e-5, "d x");
  expect_close(f.dw, u.dw, 1e-4, 1e-3, "d weight");
  expect_close(f.db, u.db, 1e-4, 1e-3, "d bias");
  EXPECT_EQ(f.dx.scalar_type(), c.x.scalar_type());
}

}  // namespace

TEST(ResidualNorm, FusedIsTheUnfusedOpsWithPerSampleDropout) {
  for (auto type : {torch::kFloat, torch::kBFloat16}) {
    SCOPED_TRACE(type == torch::kFloat ? "fp32" : "bf16");
    Case c = make_case(3, 9, 70, type);  // 70: lanes and a tail
    DropoutRows rows(5, 2, {4, 8, 15});
    compare(c, 0.25, /*training=*/true);
    compare(c, 0.25, true, /*read_low=*/false);  // the last layer: only the fp32 result is read
    // Strided inputs: the same as their contiguous copies.
    Case t = c;
    t.x = c.x.transpose(1, 2).contiguous().transpose(1, 2);
    t.r = c.r.transpose(0, 1).contiguous().transpose(0, 1);
    ASSERT_FALSE(t.x.is_contiguous());
    compare(t, 0.25, true);
    // The dropped elements are the per-sample mask's.
    Grads f = run(true, c.x, torch::zeros_like(c.r), torch::ones_like(c.w), torch::zeros_like(c.b), c.gy, c.gl, 0.25,
                  true);
    auto keep = sample_keep_mask(c.x, 0.25, 7);
    EXPECT_TRUE(f.dx.masked_select(keep.logical_not()).eq(0).all().item<bool>());
    EXPECT_GT(f.dx.masked_select(keep).ne(0).to(torch::kFloat).mean().item<double>(), 0.99);
  }
}

TEST(ResidualNorm, FusedIsTheUnfusedOpsWithoutDropout) {
  for (auto type : {torch::kFloat, torch::kBFloat16}) {
    SCOPED_TRACE(type == torch::kFloat ? "fp32" : "bf16");
    Case c = make_case(2, 5, 256, type);
    compare(c, 0.1, /*training=*/false);  // evaluating: no dropout, no rows needed
    compare(c, 0.0, /*training=*/true);
  }
}

TEST(ResidualNorm, PackedRowsKeepEachSamplesMask) {
  // Two rows of 6 tokens: samples 0 (4 tokens) + 1 (2), and 2 (5) + padding.
  auto seq = torch::tensor({0, 0, 0, 0, 1, 1, 2, 2, 2, 2, 2, -1}, torch::kLong).view({2, 6});
  auto pos = torch::tensor({0, 1, 2, 3, 0, 1, 0, 1, 2, 3, 4, 0}, torch::kLong).view({2, 6});
  for (auto type : {torch::kFloat, torch::kBFloat16}) {
    SCOPED_TRACE(type == torch::kFloat ? "fp32" : "bf16");
    Case c = make_case(2, 6, 48, type);
    DropoutRows samples(3, 1, {20, 21, 22});
    DropoutRows packed(samples, seq, pos);
    compare(c, 0.5, true);
  }
}

TEST(ResidualNorm, WeightGradientsDoNotDependOnTheThreadCount) {
  Case c = make_case(4, 50, 64, torch::kBFloat16);  // 200 rows: several blocks
  DropoutRows rows(1, 1, {1, 2, 3, 4});
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  Grads one = run(true, c.x, c.r, c.w, c.b, c.gy, c.gl, 0.1, true);
  at::set_num_threads(2);
  Grads two = run(true, c.x, c.r, c.w, c.b, c.gy, c.gl, 0.1, true);
  at::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(one.dw, two.dw));
  EXPECT_TRUE(torch::equal(one.db, two.db));
  EXPECT_TRUE(torch::equal(one.dx, two.dx));
}

TEST(ResidualNorm, OtherCasesTakeTheUnfusedOps) {
  // torch's generator's masks (no DropoutRows): the unfused ops, same draws.
  Case c = make_case(2, 3, 16, torch::kFloat);
  torch::manual_seed(4);
  auto a = dropout_add_layer_norm(c.x, c.r, c.w, c.b, 1e-12, 0.5, 0, true);
  torch::manual_seed(4);
  auto b = dropout_add_layer_norm_unfused(c.x, c.r, c.w, c.b, 1e-12, 0.5, 0, true);
  EXPECT_TRUE(torch::equal(a.full, b.full));
  EXPECT_FALSE(a.low.defined());
  // A double residual: unfused, in its dtype.
  auto d = dropout_add_layer_norm(c.x.to(torch::kDouble), c.r.to(torch::kDouble), c.w.to(torch::kDouble),
                                  c.b.to(torch::kDouble), 1e-12, 0.0, 0, false);
  EXPECT_EQ(d.full.scalar_type(), torch::kDouble);
}

TEST(ResidualNorm, EvaluatingKeepsNothingAndGivesTheSameResult) {
  Case c = make_case(2, 7, 96, torch::kBFloat16);
  torch::NoGradGuard no_grad;
  Hidden f = dropout_add_layer_norm(c.x, c.r, c.w, c.b, 1e-12, 0.1, 7, /*training=*/false);
  Hidden u = dropout_add_layer_norm_unfused(c.x, c.r, c.w, c.b, 1e-12, 0.1, 7, false);
  EXPECT_FALSE(f.full.requires_grad());
  expect_close(f.full, u.full, 1e-5, 1e-5, "y");
  EXPECT_TRUE(torch::equal(f.low, f.full.to(torch::kBFloat16)));
}

TEST(ResidualNorm, PackedAttentionShapesGoUnfused) {
  // [R, A, L, L] under packed rows hashes with shifts: the fused pass is for
  // hidden states only, so a 4-D input takes the unfused ops.
  auto seq = torch::tensor({0, 0, 1, 1}, torch::kLong).view({1, 4});
  auto pos = torch::tensor({0, 1, 0, 1}, torch::kLong).view({1, 4});
  DropoutRows samples(3, 1, {5, 6});
  DropoutRows packed(samples, seq, pos);
  auto x = torch::randn({1, 2, 4, 4}, torch::requires_grad());
  auto r = torch::randn({1, 2, 4, 4});
  auto w = torch::ones({4}), b = torch::zeros({4});
  Hidden f = dropout_add_layer_norm(x, r, w, b, 1e-12, 0.5, 7, true);
  Hidden u = dropout_add_layer_norm_unfused(x, r, w, b, 1e-12, 0.5, 7, true);
  EXPECT_FALSE(made_by_fused_pass(f.full));
  EXPECT_TRUE(torch::equal(f.full, u.full));
}
