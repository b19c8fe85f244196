// The CUDA paths. Each test needs a GPU and says SKIPPED without one; on a
// GPU machine scripts/gpu-check.sh runs them (ctest -R "^Gpu\\.").
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/cuda.h>

#include "cohort/distributed/comm.hpp"
#include "cohort/train/precision.hpp"
#include "cohort/train/trainer.hpp"
#include "helpers.hpp"

using namespace cohort;
using cohort::test::TempDir;

namespace {

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "SKIPPED: no CUDA device (this libtorch sees none)";
    if (!cohort::test::have_fashion_mnist()) GTEST_SKIP() << "SKIPPED: dataset-fashion-mnist is not installed";
  }
};

Config small_run() {
  Config cfg = cohort::test::small_mlp_run();
  cfg.model.dropout = 0.0;
  cfg.train.max_steps = 20;
  cfg.log.every_steps = 10;
  return cfg;
}

RunSummary train_on(Config cfg, DeviceKind device, const std::string& dir) {
  cfg.train.device = device;
  RunOptions run;
  run.out_dir = dir;
  run.quiet = true;
  run.config_toml = "# test\n";
  auto comm = Comm::single(device);
  return Trainer(cfg, *comm, run).run();
}

}  // namespace

TEST_F(Gpu, OneRankOnCudaFollowsTheCpuRun) {
  TempDir tmp;
  auto cpu = train_on(small_run(), DeviceKind::kCpu, tmp / "cpu");
  auto gpu = train_on(small_run(), DeviceKind::kCuda, tmp / "gpu");
  ASSERT_EQ(cpu.step_losses.size(), gpu.step_losses.size());
  for (size_t i = 0; i < cpu.step_losses.size(); ++i) {
    EXPECT_NEAR(gpu.step_losses[i], cpu.step_losses[i], 1e-3 * std::abs(cpu.step_losses[i]) + 1e-4) << "step " << i;
  }
  EXPECT_NEAR(gpu.final_eval_accuracy, cpu.final_eval_accuracy, 0.02);
}

TEST_F(Gpu, MixedPrecisionTrainsWithFp32MasterWeights) {
  TempDir tmp;
  for (Precision p : {Precision::kBf16, Precision::kFp16}) {
    Config cfg = small_run();
    cfg.train.precision = p;
    cfg.train.max_steps = 60;
    auto r = train_on(cfg, DeviceKind::kCuda, tmp / name_of(p));
    double first = (r.step_losses[0] + r.step_losses[1] + r.step_losses[2]) / 3;
    double last = (r.step_losses[57] + r.step_losses[58] + r.step_losses[59]) / 3;
    EXPECT_LT(last, 0.7 * first) << name_of(p);
  }
  torch::Tensor a = torch::randn({8, 8}, torch::kCUDA);
  AutocastScope autocast(Precision::kBf16, a.device());
  EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kBFloat16);
}

// Two ranks share the one GPU through Gloo on CUDA tensors (NCCL refuses two
// ranks on one device): the loss curve is the one rank's.
TEST_F(Gpu, TwoRanksOnOneGpuMatchOneRank) {
  TempDir tmp;
  std::string common = " --model.name mlp --model.hidden 64 --model.dropout 0 --train.max-steps 20 "
                       "--data.global-batch 32 --log.every-steps 10 --eval.max-samples 500 --train.device cuda "
                       "--dist.backend gloo --quiet --out ";
  auto one = cohort::test::run_cohort("train --nproc-per-node 1" + common + (tmp / "one"));
  ASSERT_EQ(one.code, 0) << one.err;
  auto two = cohort::test::run_cohort("train --nproc-per-node 2" + common + (tmp / "two"));
  ASSERT_EQ(two.code, 0) << two.err;
  auto a = cohort::test::train_losses(tmp / "one"), b = cohort::test::train_losses(tmp / "two");
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-3 * a[i]) << "log line " << i;
}

// With NCCL, every GPU a rank: a node's GPU count is the default rank count.
TEST_F(Gpu, NcclRanksOnEveryVisibleGpu) {
  if (torch::cuda::device_count() < 2) GTEST_SKIP() << "SKIPPED: NCCL needs 2 GPUs (one rank per GPU)";
  TempDir tmp;
  auto r = cohort::test::run_cohort("train --model.name mlp --train.max-steps 10 --data.global-batch 32 "
                                    "--train.device cuda --quiet --out " + (tmp / "run"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE((r.out + r.err).find("of " + std::to_string(torch::cuda::device_count()) + ","), std::string::npos) << r.out << r.err;
}
