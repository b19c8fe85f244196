#include <gtest/gtest.h>

#include <cmath>

#include "cohort/config/config.hpp"
#include "cohort/train/optim.hpp"

using namespace cohort;

namespace {
LrSchedule make(const std::string& kind, double warmup_ratio, int64_t total, double min_ratio = 0.0) {
  OptimOptions o;
  o.lr = 2.0;
  o.schedule = kind;
  o.warmup_ratio = warmup_ratio;
  o.min_lr_ratio = min_ratio;
  return LrSchedule::from(o, total);
}
}  // namespace

TEST(Schedule, WarmupRisesLinearlyToPeak) {
  LrSchedule s = make("linear", 0.1, 100);
  ASSERT_EQ(s.warmup, 10);
  for (int64_t k = 0; k < 10; ++k) EXPECT_DOUBLE_EQ(s.at(k), 2.0 * (k + 1) / 10.0);
  EXPECT_DOUBLE_EQ(s.at(10), 2.0);
}

TEST(Schedule, LinearDecaysToMinAtTotal) {
  LrSchedule s = make("linear", 0.0, 100, 0.25);
  EXPECT_DOUBLE_EQ(s.at(0), 2.0);
  EXPECT_DOUBLE_EQ(s.at(50), 2.0 * (0.25 + 0.75 * 0.5));
  EXPECT_DOUBLE_EQ(s.at(100), 0.5);
  EXPECT_DOUBLE_EQ(s.at(1000), 0.5);  // clamps past the end
}

TEST(Schedule, CosineHalfwayIsMidpoint) {
  LrSchedule s = make("cosine", 0.2, 110);
  ASSERT_EQ(s.warmup, 22);
  EXPECT_DOUBLE_EQ(s.at(22), 2.0);
  EXPECT_NEAR(s.at(22 + 44), 1.0, 1e-12);
  EXPECT_NEAR(s.at(110), 0.0, 1e-12);
  EXPECT_NEAR(s.at(22 + 22), 2.0 * 0.5 * (1 + std::cos(M_PI * 0.25)), 1e-12);
}

TEST(Schedule, ConstantAfterWarmup) {
  LrSchedule s = make("constant", 0.5, 10);
  EXPECT_DOUBLE_EQ(s.at(0), 0.4);
  for (int64_t k = 5; k < 20; ++k) EXPECT_DOUBLE_EQ(s.at(k), 2.0);
}

TEST(Optimizer, WeightDecaySkipsBiases) {
  torch::nn::Linear lin(3, 2);
  OptimOptions o;
  o.weight_decay = 0.5;
  auto opt = make_optimizer(o, *lin);
  ASSERT_EQ(opt->param_groups().size(), 2u);
  auto& decay = static_cast<torch::optim::AdamWOptions&>(opt->param_groups()[0].options());
  auto& none = static_cast<torch::optim::AdamWOptions&>(opt->param_groups()[1].options());
  EXPECT_DOUBLE_EQ(decay.weight_decay(), 0.5);
  EXPECT_DOUBLE_EQ(none.weight_decay(), 0.0);
  EXPECT_EQ(opt->param_groups()[0].params()[0].dim(), 2);
  EXPECT_EQ(opt->param_groups()[1].params()[0].dim(), 1);
  set_lr(*opt, 0.125);
  for (auto& g : opt->param_groups()) EXPECT_DOUBLE_EQ(g.options().get_lr(), 0.125);
}

// (float32 weights: compare to 1e-6.)
// One AdamW step from zero moments moves every weight by lr * sign(grad)
// (bias-corrected m/sqrt(v) = g/|g|), plus the decoupled decay lr*wd*w.
TEST(Optimizer, AdamWFirstStepClosedForm) {
  auto w = torch::tensor({1.0, -2.0, 3.0}, torch::requires_grad());
  OptimOptions o;
  o.lr = 0.1;
  o.weight_decay = 0.0;
  o.eps = 1e-12;
  torch::nn::Module m;
  m.register_parameter("w", w);
  auto opt = make_optimizer(o, m);
  (w * torch::tensor({2.0, -0.5, 1.0})).sum().backward();
  opt->step();
  EXPECT_NEAR(w[0].item<double>(), 1.0 - 0.1, 1e-6);
  EXPECT_NEAR(w[1].item<double>(), -2.0 + 0.1, 1e-6);
  EXPECT_NEAR(w[2].item<double>(), 3.0 - 0.1, 1e-6);
}
