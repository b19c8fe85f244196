#include <gtest/gtest.h>

#include <cmath>

#include "cohort/config/config.hpp"
#include "cohort/train/optimization/optim.hpp"

using namespace cohort;

namespace {
LrSchedule make(const std::string& kind, double warmup_ratio, int64_t total, double min_ratio = 0.0) {
  OptimOptions o;
  o.lr = 2.0;
  o.schedule = parse_choice<Schedule>("optim.schedule", kind);
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

// FusedAdamW (what make_optimizer gives for adamw) against libtorch's AdamW:
// the same weights within float rounding and the same step counts after 10
// steps, with weight decay, a parameter without a gradient (skipped), and a
// transposed parameter (not contiguous: the whole step takes AdamW's path).
TEST(Optimizer, FusedAdamWMatchesLibtorchAdamW) {
  for (bool strided : {false, true}) {
    torch::manual_seed(3);
    auto make_params = [&] {
      std::vector<torch::Tensor> ps = {torch::randn({7, 5}), torch::randn({5}), torch::randn({3})};
      if (strided) ps[0] = torch::randn({5, 7}).t();
      for (auto& p : ps) p.set_requires_grad(true);
      return ps;
    };
    auto a = make_params();
    std::vector<torch::Tensor> b;
    for (auto& p : a) b.push_back(p.detach().clone().set_requires_grad(true));
    if (strided) b[0] = a[0].detach().t().clone().t().set_requires_grad(true);
    auto opts = torch::optim::AdamWOptions(1e-2).weight_decay(0.1).eps(1e-8);
    FusedAdamW fused({a[0], a[1], a[2]}, opts);
    torch::optim::AdamW plain({b[0], b[1], b[2]}, opts);
    for (int s = 0; s < 10; ++s) {
      for (size_t k = 0; k < 2; ++k) {  // the third never gets a gradient
        auto g = torch::randn(a[k].sizes());
        a[k].mutable_grad() = strided && k == 0 ? g.t().contiguous().t() : g.clone();
        b[k].mutable_grad() = g.clone();
      }
      fused.step();
      plain.step();
    }
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_TRUE(torch::allclose(a[k], b[k], 1e-5, 1e-6)) << "strided " << strided << " param " << k;
    }
    EXPECT_TRUE(torch::equal(a[2], b[2]));
    for (size_t k = 0; k < 2; ++k) {
      auto& sa = static_cast<torch::optim::AdamWParamState&>(*fused.state().at(a[k].unsafeGetTensorImpl()));
      auto& sb = static_cast<torch::optim::AdamWParamState&>(*plain.state().at(b[k].unsafeGetTensorImpl()));
      EXPECT_EQ(sa.step(), 10);
      EXPECT_EQ(sb.step(), 10);
      EXPECT_TRUE(torch::allclose(sa.exp_avg_sq(), sb.exp_avg_sq(), 1e-5, 1e-9));
    }
    EXPECT_EQ(fused.state().count(a[2].unsafeGetTensorImpl()), 0u);
  }
}
