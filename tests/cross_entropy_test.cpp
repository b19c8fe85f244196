// The masked-LM loss's fused pass (model/cross_entropy.hpp) against the
// unfused ops: the summed loss to 1e-6 relative, the hits exactly (argmax's
// first-largest rule on ties), the gradient to bf16's rounding, for rows
// whose vocabulary is not a multiple of the kernel's lanes and rows whose
// logits span more than exp's range; evaluation gives the training pass's
// loss; fp32 logits take the unfused ops themselves; a label outside the
// vocabulary is refused.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "cohort/core/error.hpp"
#include "cohort/model/cross_entropy.hpp"
#include "tensor_helpers.hpp"

using namespace cohort;

namespace {

struct Pass {
  double loss;
  int64_t hits;
  torch::Tensor grad;  // of loss * scale, in the logits' dtype
};

Pass run(bool fused, const torch::Tensor& logits, const torch::Tensor& labels, double scale) {
  auto x = logits.detach().clone().requires_grad_(true);
  CrossEntropySum r = fused ? cross_entropy_sum(x, labels) : cross_entropy_sum_unfused(x, labels);
  EXPECT_EQ(r.loss.scalar_type(), torch::kFloat);
  if (fused && logits.scalar_type() == torch::kBFloat16) {  // the fused node, not the unfused ops
    EXPECT_NE(r.loss.grad_fn()->name().find("CrossEntropyFunction"), std::string::npos) << r.loss.grad_fn()->name();
  }
  (r.loss * scale).backward();
  return {r.loss.item<double>(), r.hits.item<int64_t>(), x.grad()};
}

// Logits [n, v] in bf16 with rows of several scales, some with ties for
// the largest at and before their label.
std::pair<torch::Tensor, torch::Tensor> batch(int64_t n, int64_t v) {
  torch::manual_seed(5);
  auto logits = torch::randn({n, v}) * torch::linspace(0.5, 12.0, n).unsqueeze(1);
  auto labels = torch::randint(0, v, {n}, torch::kInt64);
  auto l = labels.accessor<int64_t, 1>();
  auto x = logits.accessor<float, 2>();
  for (int64_t i = 0; i < n; i += 4) x[i][l[i]] = 100.0f;  // the largest: a hit
  for (int64_t i = 1; i < n; i += 8) {                      // a tie before the label: argmax is the first
    x[i][l[i]] = 100.0f;
    x[i][0] = 100.0f;
    if (l[i] == 0) l[i] = 1;
  }
  for (int64_t i = 2; i < n; i += 8) {  // tied with one after the label: still the first
    l[i] = 3;
    x[i][3] = 100.0f;
    x[i][v - 1] = 100.0f;
  }
  x[5][7] = 300.0f;  // a row beyond exp's range: most of its terms underflow
  x[5][l[5]] = -300.0f;
  return {logits.to(torch::kBFloat16), labels};
}

}  // namespace

TEST(CrossEntropy, FusedPassGivesTheUnfusedLossHitsAndGradient) {
  for (int64_t v : {1000, 1003, 8192}) {
    auto [logits, labels] = batch(37, v);
    Pass f = run(true, logits, labels, 0.37), u = run(false, logits, labels, 0.37);
    EXPECT_NEAR(f.loss, u.loss, 1e-6 * std::abs(u.loss)) << "v " << v;
    EXPECT_EQ(f.hits, u.hits) << "v " << v;
    EXPECT_GT(u.hits, 5) << "the batch has its hits";
    ASSERT_EQ(f.grad.scalar_type(), torch::kBFloat16);
    auto a = f.grad.to(torch::kFloat64), b = u.grad.to(torch::kFloat64);
    // Within one bf16 rounding of the unfused gradient everywhere, and the
    // same bits nearly everywhere.
    auto off = (a - b).abs() - b.abs() * std::ldexp(1.0, -7);
    EXPECT_LE(off.max().item<double>(), 1e-30) << "v " << v;
    const double same = a.eq(b).to(torch::kFloat64).mean().item<double>();
    EXPECT_GT(same, 0.99) << "v " << v;
    // The gradient of a label's term: 0.37 (p - 1), summing to 0 over a row.
    EXPECT_LT(cohort::test::max_abs(a.sum(1)), 1e-2) << "v " << v;
  }
}

TEST(CrossEntropy, EvaluationGivesTheTrainingPassLoss) {
  auto [logits, labels] = batch(19, 1003);
  CrossEntropySum eval;
  {
    torch::NoGradGuard off;
    eval = cross_entropy_sum(logits, labels);
  }
  Pass train = run(true, logits, labels, 1.0);
  EXPECT_EQ(eval.loss.item<double>(), train.loss);
  EXPECT_EQ(eval.hits.item<int64_t>(), train.hits);
}

TEST(CrossEntropy, Fp32LogitsTakeTheUnfusedOps) {
  auto [logits, labels] = batch(19, 1003);
  Pass f = run(true, logits.to(torch::kFloat), labels, 0.5), u = run(false, logits.to(torch::kFloat), labels, 0.5);
  EXPECT_EQ(f.loss, u.loss);
  EXPECT_EQ(f.hits, u.hits);
  EXPECT_TRUE(torch::equal(f.grad, u.grad));
}

TEST(CrossEntropy, ALabelOutsideTheVocabularyIsRefused) {
  auto [logits, labels] = batch(8, 100);
  labels[3] = 100;
  EXPECT_THROW(cross_entropy_sum(logits, labels), cohort::Error);
  labels[3] = -100;
  EXPECT_THROW(cross_entropy_sum(logits, labels), cohort::Error);
}
