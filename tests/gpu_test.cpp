// The CUDA paths. Each test needs a GPU and says SKIPPED without one; on a
// GPU machine scripts/gpu-check.sh runs them (ctest -R "^Gpu\\.").
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/cuda.h>

#include <c10/core/DeviceGuard.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <atomic>
#include <optional>
#include <thread>

#include "cohort/device/device_feed.hpp"
#include "cohort/device/host_read.hpp"
#include "cohort/distributed/comm.hpp"
#include "cohort/train/loop/trainer.hpp"
#include "cohort/train/optimization/precision.hpp"
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

// No step between log points makes the host wait for the GPU: CUDA's sync
// debug mode (torch.cuda.set_sync_debug_mode("error")) is on from the
// second step's start to each log point's iteration, so any synchronising
// call throws. This catches what the CPU test (host_reads_test.cpp) cannot:
// a sync that does not go through Cohort's counted reads. MLP and
// bert-pretrain (packed rows, LAMB, per-sample dropout) in fp32 and bf16;
// fp16, whose loss scaler reads one flag a step, is counted instead.
TEST_F(Gpu, StepsBetweenLogPointsNeverWaitForTheDevice) {
  TempDir bert_data;
  ASSERT_EQ(cohort::test::prepare_tiny_bert(bert_data).code, 0);
  auto bert = [&] {
    Config cfg = small_run();
    cfg.train.task = "bert-pretrain";
    cfg.model.name = "bert";
    cfg.model.hidden = 64;
    cfg.model.layers = 2;
    cfg.model.heads = 2;
    cfg.model.max_positions = 64;
    cfg.model.dropout = 0.1;
    cfg.data.path = bert_data / "data";
    cfg.data.pack = true;
    cfg.data.global_batch = 16;
    cfg.optim.name = OptimizerKind::kLamb;
    cfg.eval.split = "valid";
    return cfg;
  };
  struct Case {
    std::string name;
    Config cfg;
    Precision precision;
    bool check;  // sync debug mode; else count reads (one a step)
  };
  std::vector<Case> cases = {{"mlp fp32", small_run(), Precision::kFp32, true},
                             {"mlp bf16", small_run(), Precision::kBf16, true},
                             {"bert-pretrain bf16", bert(), Precision::kBf16, true},
                             {"bert-pretrain fp16", bert(), Precision::kFp16, false}};
  for (auto& c : cases) {
    TempDir tmp;
    Config cfg = c.cfg;
    cfg.train.precision = c.precision;
    cfg.train.device = DeviceKind::kCuda;
    cfg.optim.clip_norm = 1.0;
    cfg.eval.every_steps = 1000;
    RunOptions run;
    run.out_dir = tmp / "run";
    run.quiet = true;
    run.config_toml = "# test\n";
    std::optional<SyncCheck> check;
    int64_t checked = 0, mark = 0;
    std::vector<int64_t> reads;
    run.at = [&](StepPoint point, int64_t step) {
      if (point != StepPoint::kBegin) return;
      check.reset();
      if (step > 1 && (step - 1) % 10 != 0) reads.push_back(host_reads() - mark);  // step - 1's iteration
      mark = host_reads();
      if (step > 1 && step % 10 != 0) {
        if (c.check) check.emplace(SyncCheck::Mode::kError);
        ++checked;
      }
    };
    auto comm = Comm::single(DeviceKind::kCuda);
    RunSummary r = Trainer(cfg, *comm, run).run();
    check.reset();
    EXPECT_EQ(r.step_losses.size(), 20u) << c.name;
    EXPECT_EQ(checked, 17) << c.name;
    for (size_t i = 0; i < reads.size(); ++i) EXPECT_EQ(reads[i], c.check ? 0 : 1) << c.name << " iteration " << i;
  }
}

// The next batch is copied on a side stream from page-locked memory; the
// compute stream waits for it on an event, and what it reads is the batch.
TEST_F(Gpu, FeedCopiesOnASideStreamThatTheComputeStreamWaitsFor) {
  DeviceFeed feed(torch::Device(torch::kCUDA, 0));
  std::vector<DeviceFeed::Batch> batches(2);
  batches[0]["x"] = torch::arange(1 << 20, torch::kInt64);
  batches[1]["x"] = torch::arange(1 << 20, torch::kInt64).pin_memory();
  std::vector<DeviceFeed::Batch> staged;
  {
    SyncCheck check(SyncCheck::Mode::kError);  // staging never waits for the device
    staged = feed.stage(batches);
  }
  EXPECT_EQ(feed.staged(), 2);
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_TRUE(staged[i].at("x").is_cuda());
    EXPECT_TRUE(torch::equal(staged[i].at("x").cpu(), batches[i].at("x"))) << i;
  }
  ComputeClock clock(torch::Device(torch::kCUDA, 0));
  clock.start();
  auto a = torch::randn({2048, 2048}, torch::kCUDA);
  a = a.mm(a);
  clock.stop();
  const int64_t before = host_reads();
  EXPECT_GT(clock.take(), 0.0);
  EXPECT_EQ(host_reads(), before + 1) << "reading the clock is one counted wait";
}

namespace {

// An elastic world's link that the test drives: changed() once a member left.
class TestLink : public ElasticLink {
 public:
  bool changed() const override { return changed_; }
  std::string why() const override { return "rank 1 left"; }
  bool joiners_waiting() const override { return false; }
  void announce(const std::string&) override { changed_ = true; }
  void bury(c10::intrusive_ptr<c10::intrusive_ptr_target>) override {}
  std::atomic<bool> changed_{false};
};

}  // namespace

// Elastic worlds on NCCL: each generation has a NCCL communicator of its
// own. When a member leaves mid-collective, the survivor's wait ends with
// MembershipChanged and the communicator is aborted, so its stream (and a
// host read after it) is not left blocked inside NCCL.
TEST_F(Gpu, ElasticNcclGenerationIsAbortedWhenAMemberLeaves) {
  if (torch::cuda::device_count() < 2) GTEST_SKIP() << "SKIPPED: NCCL needs 2 GPUs (one rank per GPU)";
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto link = std::make_shared<TestLink>();
  std::atomic<bool> rank1_left{false};
  cohort::test::spawn(2, [&](int rank) {
    World w;
    w.rank = w.local_rank = rank;
    w.world_size = w.local_world_size = 2;
    w.device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(rank));
    RankSpec spec;
    spec.rank = spec.local_rank = rank;
    spec.world_size = spec.local_world_size = 2;
    CommOptions o;
    o.timeout = std::chrono::seconds(60);
    o.device = DeviceKind::kCuda;
    o.backend = BackendKind::kNccl;
    c10::DeviceGuard guard(w.device);
    auto comm = Comm::form(w, spec, o, store, link);
    auto t = torch::full({4}, static_cast<double>(rank + 1), torch::TensorOptions().device(w.device));
    comm->all_reduce_sum(t, "first sum");
    EXPECT_EQ(t.sum().item<double>(), 12.0);
    if (rank == 1) {
      rank1_left = true;
      link->announce("rank 1 left");  // as Membership would, seeing its heartbeat stop
      return;  // leaves without the second sum
    }
    while (!rank1_left) std::this_thread::yield();
    auto u = torch::ones({4}, torch::TensorOptions().device(w.device));
    EXPECT_THROW(comm->all_reduce_sum(u, "second sum"), MembershipChanged);
    EXPECT_EQ(torch::ones({2}, torch::TensorOptions().device(w.device)).sum().item<double>(), 2.0)
        << "the stream goes on after the abort";
  });
}
