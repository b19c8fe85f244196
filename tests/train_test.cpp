#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cohort/core/error.hpp"
#include "cohort/distributed/comm.hpp"
#include "cohort/train/loop/trainer.hpp"
#include "helpers.hpp"

using namespace cohort;
using cohort::test::TempDir;

namespace {

Config small_run() { return cohort::test::small_mlp_run(); }

RunSummary train(const Config& cfg, const std::string& dir) {
  RunOptions run;
  run.out_dir = dir;
  run.quiet = true;
  run.config_toml = "# test\n";
  auto comm = Comm::single();
  return Trainer(cfg, *comm, run).run();
}

double mean(const std::vector<double>& v, size_t begin, size_t end) {
  double s = 0;
  for (size_t i = begin; i < end; ++i) s += v[i];
  return s / static_cast<double>(end - begin);
}

}  // namespace

class TrainFashion : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cohort::test::have_fashion_mnist()) GTEST_SKIP() << "SKIPPED: dataset-fashion-mnist is not installed";
  }
};

TEST_F(TrainFashion, LossFallsAndFilesAreWritten) {
  TempDir tmp;
  RunSummary r = train(small_run(), tmp / "run");
  ASSERT_EQ(r.steps, 60);
  ASSERT_EQ(r.step_losses.size(), 60u);
  EXPECT_LT(mean(r.step_losses, 50, 60), 0.6 * mean(r.step_losses, 0, 5));
  EXPECT_GT(r.final_eval_accuracy, 0.5);  // 10 classes: chance is 0.1

  auto lines = cohort::test::lines_of(cohort::test::read_file(tmp / "run/metrics.jsonl"));
  ASSERT_EQ(lines.size(), 4u);  // 3 train lines (every 20 steps) + final eval
  for (size_t i = 0; i < 3; ++i) {
    auto j = nlohmann::json::parse(lines[i]);
    EXPECT_EQ(j.at("kind"), "train");
    EXPECT_EQ(j.at("step"), 20 * (i + 1));
    EXPECT_EQ(j.at("samples"), 32 * 20 * (i + 1));
    for (const char* key : {"epoch", "loss", "lr", "tokens_per_s", "accuracy"}) EXPECT_TRUE(j.contains(key)) << key;
  }
  auto eval = nlohmann::json::parse(lines[3]);
  EXPECT_EQ(eval.at("kind"), "eval");
  EXPECT_EQ(eval.at("split"), "test");
  EXPECT_EQ(eval.at("count"), 1000);
  EXPECT_DOUBLE_EQ(eval.at("accuracy").get<double>(), r.final_eval_accuracy);
  EXPECT_EQ(cohort::test::read_file(tmp / "run/config.toml"), "# test\n");
}

TEST_F(TrainFashion, SameSeedSameLossesWhateverTheLoaderThreads) {
  TempDir tmp;
  Config a = small_run();
  a.train.max_steps = 15;
  a.data.workers = 0;
  Config b = a;
  b.data.workers = 3;
  EXPECT_EQ(train(a, tmp / "a").step_losses, train(b, tmp / "b").step_losses);
  Config c = a;
  c.train.seed = 2;
  EXPECT_NE(train(a, tmp / "a2").step_losses, train(c, tmp / "c").step_losses);
}

// The global batch, not the micro-batch, defines a step: computing it in
// micro-batches of a quarter (and of an uneven cut) gives the same losses as
// one full batch (no dropout, fp32), up to the order of the gradient sums.
TEST_F(TrainFashion, MicroBatchesMatchTheFullBatch) {
  TempDir tmp;
  Config a = small_run();
  a.train.max_steps = 20;
  a.model.dropout = 0.0;
  a.data.micro_batch = a.data.global_batch;
  auto la = train(a, tmp / "a").step_losses;
  for (int64_t micro : {a.data.global_batch / 4, a.data.global_batch / 3 + 1}) {
    Config b = a;
    b.data.micro_batch = micro;
    auto lb = train(b, tmp / ("b" + std::to_string(micro))).step_losses;
    ASSERT_EQ(la.size(), lb.size());
    for (size_t i = 0; i < la.size(); ++i) {
      EXPECT_NEAR(la[i], lb[i], 1e-5 * std::abs(la[i])) << "micro-batch " << micro << " step " << i;
    }
  }
}

TEST_F(TrainFashion, RefusesToOverwriteARun) {
  TempDir tmp;
  Config cfg = small_run();
  cfg.train.max_steps = 1;
  train(cfg, tmp / "run");
  EXPECT_THROW(train(cfg, tmp / "run"), UsageError);
}
