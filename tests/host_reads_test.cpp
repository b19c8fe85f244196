// A steady-state step reads nothing back from the device: every deliberate
// host read goes through device/host_read.hpp, which counts them, and a run
// of 20 steps that logs every 10 must make none in the iterations between
// its log points, for every task, both optimizers, clipping, data.balance =
// auto, bf16 and fp16 (whose loss scaler reads one flag per step, as
// torch.amp.GradScaler does). On a GPU,
// Gpu.StepsBetweenLogPointsNeverWaitForTheDevice (gpu_test.cpp) proves the
// rest under CUDA's sync debug mode.
#include <CLI/CLI.hpp>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "cohort/config/config.hpp"
#include "cohort/device/device_feed.hpp"
#include "cohort/device/device_tally.hpp"
#include "cohort/device/host_read.hpp"
#include "cohort/distributed/comm.hpp"
#include "cohort/train/loop/trainer.hpp"
#include "helpers.hpp"
#include "thread_world.hpp"

using namespace cohort;
using cohort::test::TempDir;

namespace {

Config parse_args(std::vector<std::string> args) {
  CLI::App app;
  Config cfg;
  ConfigBinding binding(app, cfg);
  std::reverse(args.begin(), args.end());  // CLI11 takes them reversed
  app.parse(args);
  return cfg;
}

// Host reads per iteration of the training loop: step N's count runs from
// its kBegin to step N+1's (the step, its logging, checks and saves). The
// last step's iteration runs into the end of the run and is left out.
struct Reads {
  std::map<int64_t, int64_t> per_step;
  RunSummary summary;
};

Reads count_reads(const Config& cfg, Comm& comm, const std::string& dir) {
  RunOptions run;
  run.out_dir = dir;
  run.quiet = true;
  run.config_toml = "# test\n";
  Reads reads;
  int64_t step = 0, mark = 0;
  run.at = [&](StepPoint point, int64_t n) {
    if (point != StepPoint::kBegin) return;
    if (step > 0) reads.per_step[step] = host_reads() - mark;
    step = n;
    mark = host_reads();
  };
  reads.summary = Trainer(cfg, comm, run).run();
  return reads;
}

// Steps 1-19 of a 20-step run logged every 10: none reads but step 10,
// which reads (the counter works); fp16 reads its overflow flag once a step.
void expect_no_reads_between_log_points(const Reads& reads, int64_t per_step, const std::string& what) {
  ASSERT_EQ(reads.per_step.size(), 19u) << what;
  ASSERT_EQ(reads.summary.step_losses.size(), 20u) << what << ": every step's loss is read at the log points";
  for (const auto& [step, n] : reads.per_step) {
    if (step == 10) {
      EXPECT_GT(n, per_step) << what << ": the log point at step 10 read nothing";
    } else {
      EXPECT_EQ(n, per_step) << what << ": step " << step << " made " << n << " host reads";
    }
  }
  for (double loss : reads.summary.step_losses) EXPECT_TRUE(std::isfinite(loss)) << what;
}

const std::vector<std::string> kRun = {"--train.max-steps", "20", "--log.every-steps", "10", "--eval.every-steps",
                                       "1000", "--ckpt.every-steps", "1000", "--optim.clip-norm", "1.0"};

std::vector<std::string> with(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

void single_rank(const std::vector<std::string>& args, int64_t per_step, const std::string& what) {
  TempDir tmp;
  auto comm = Comm::single(DeviceKind::kCpu);
  expect_no_reads_between_log_points(count_reads(parse_args(with(kRun, args)), *comm, tmp / "run"), per_step, what);
}

std::vector<std::string> image(const std::string& optimizer, const std::string& precision) {
  return {"--model.name", "mlp", "--model.hidden", "32", "--data.global-batch", "32", "--eval.max-samples", "64",
          "--optim.name", optimizer, "--train.precision", precision};
}

class HostReads : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    bert_dir_ = new TempDir;
    auto prep = cohort::test::prepare_tiny_bert(*bert_dir_);
    ASSERT_EQ(prep.code, 0) << prep.err;
  }
  static void TearDownTestSuite() {
    delete bert_dir_;
    bert_dir_ = nullptr;
  }
  static std::vector<std::string> bert(const std::string& optimizer, const std::string& precision) {
    return {"--train.task", "bert-pretrain", "--model.name", "bert", "--model.hidden", "32", "--model.layers", "2",
            "--model.heads", "2", "--model.max-positions", "64", "--data.path", *bert_dir_ / "data",
            "--data.global-batch", "16", "--eval.split", "valid", "--eval.max-samples", "32", "--optim.name", optimizer,
            "--train.precision", precision};
  }
  static TempDir* bert_dir_;
};
TempDir* HostReads::bert_dir_ = nullptr;

}  // namespace

TEST_F(HostReads, ImageClassifyStepsReadNothingWithEitherOptimizer) {
  if (!cohort::test::have_fashion_mnist()) GTEST_SKIP() << "SKIPPED: dataset-fashion-mnist is not installed";
  single_rank(image("adamw", "fp32"), 0, "image, adamw, fp32");
  single_rank(image("lamb", "bf16"), 0, "image, lamb, bf16");
}

TEST_F(HostReads, BertPretrainStepsReadNothingPackedOrNotWithDynamicMasks) {
  single_rank(bert("adamw", "bf16"), 0, "bert-pretrain, adamw, bf16");
  single_rank(with(bert("lamb", "fp32"), {"--data.pack=true", "--task.masking", "dynamic"}), 0,
              "bert-pretrain, lamb, packed, dynamic masks");
}

TEST_F(HostReads, BertClassifyStepsReadNothingAndKeepTheConfusionOnTheDevice) {
  TempDir tmp;
  std::filesystem::create_directories(tmp / "tsv");
  std::string tsv = "text\tlabel\n";
  const char* words[] = {"the", "cat", "sat", "on", "a", "mat", "dog", "ran"};
  for (int i = 0; i < 96; ++i) tsv += std::string(words[i % 8]) + " " + words[(i * 3) % 8] + "\t" + (i % 3 ? "a" : "b") + "\n";
  for (const char* split : {"train", "valid"}) cohort::test::write_file(tmp / ("tsv/" + std::string(split) + ".tsv"), tsv);
  auto args = bert("adamw", "bf16");
  args = with(std::vector<std::string>(args.begin() + 2, args.end()), {"--train.task", "bert-classify"});
  // The pretraining data's vocabulary, for the classifier's tokenizer.
  auto& path = *std::find(args.begin(), args.end(), *bert_dir_ / "data");
  path = tmp / "tsv";
  args = with(args, {"--data.vocab", *bert_dir_ / "data/vocab.txt", "--data.max-seq-length", "16"});
  single_rank(args, 0, "bert-classify, adamw, bf16");
}

TEST_F(HostReads, Fp16ReadsOnlyItsOverflowFlagOncePerStep) {
  single_rank(bert("adamw", "fp16"), 1, "bert-pretrain, adamw, fp16 with loss scaling");
}

// Two ranks measuring their speed (data.balance = auto, every 10 steps: at
// the log points) with sharded LAMB, whose trust ratios are summed over
// the ranks on the device.
TEST_F(HostReads, BalancedShardedRanksReadNothingBetweenLogPoints) {
  TempDir tmp;
  auto args = with(bert("lamb", "bf16"), {"--data.balance", "auto", "--data.balance-every", "10", "--dist.shard",
                                          "gradients"});
  std::vector<Reads> reads(2);
  cohort::test::spawn_world(2, [&](Comm& comm) {
    reads[static_cast<size_t>(comm.rank())] = count_reads(parse_args(with(kRun, args)), comm, tmp / "run");
  });
  for (int r = 0; r < 2; ++r) expect_no_reads_between_log_points(reads[static_cast<size_t>(r)], 0, "rank " + std::to_string(r));
  EXPECT_EQ(reads[0].summary.step_losses, reads[1].summary.step_losses);
}

// The pieces on their own: a tally stays on the device until read, and the
// read is one, whatever was merged; a CPU feed hands the batch through.
TEST(DeviceTally, SumsStayUnreadUntilOneReadAndKeepTallysLayout) {
  Tally layout;
  for (const char* name : {"accuracy", "c/0", "c/1", "c/2", "loss"}) layout.add(name, 0, 0);
  auto cells = std::make_shared<const std::vector<std::string>>(std::vector<std::string>{"c/0", "c/1", "c/2"});
  const int64_t before = host_reads();
  DeviceTally a, b;
  a.add("loss", torch::tensor(1.5), 2);
  a.add("accuracy", torch::tensor(1, torch::kInt64), 2);
  a.add(cells, torch::tensor({1, 0, 2}), torch::tensor({1, 0, 2}));
  b.add("loss", 0.5, 1);
  b.add("accuracy", torch::tensor(0.5), torch::tensor(1.0));
  b.add(cells, torch::tensor({0.0, 3.0, 0.0}), torch::tensor({0.0, 3.0, 0.0}));
  a.merge(b);
  torch::Tensor flat = a.flatten(layout, torch::kCPU);
  flat.mul_(2);  // as an all-reduce of two equal ranks would
  DeviceTally reduced = DeviceTally::unflatten(layout, flat);
  EXPECT_EQ(host_reads(), before) << "nothing is read before read()";
  Tally t = reduced.read(layout);
  EXPECT_EQ(host_reads(), before + 1);
  EXPECT_EQ(t.sum("loss"), 4.0);
  EXPECT_EQ(t.count("loss"), 6.0);
  EXPECT_EQ(t.sum("accuracy"), 3.0);
  EXPECT_EQ(t.count("accuracy"), 6.0);
  EXPECT_EQ(t.sum("c/1"), 6.0);
  EXPECT_EQ(t.count("c/2"), 4.0);
  // Host values alone read nothing; a name outside the layout is an error.
  DeviceTally host;
  host.add("loss", 1.0, 1);
  EXPECT_EQ(host.read(layout).sum("loss"), 1.0);
  EXPECT_EQ(host_reads(), before + 1);
  host.add("nope", 1.0, 1);
  EXPECT_THROW(host.read(layout), Error);
  // So is a block of metrics the task does not have: nothing is dropped.
  DeviceTally other;
  other.add(std::make_shared<const std::vector<std::string>>(std::vector<std::string>{"d/0", "d/1"}),
            torch::ones({2}), torch::ones({2}));
  EXPECT_THROW(other.flatten(layout, torch::kCPU), Error);
}

TEST(DeviceFeed, OnACpuTheBatchPassesThroughAndTheClockIsTheWallClock) {
  DeviceFeed feed(torch::kCPU);
  std::vector<DeviceFeed::Batch> batches(2);
  batches[0]["x"] = torch::arange(6);
  auto staged = feed.stage(batches);
  ASSERT_EQ(staged.size(), 2u);
  EXPECT_TRUE(staged[0].at("x").is_same(batches[0].at("x")));
  EXPECT_TRUE(staged[1].empty());
  EXPECT_EQ(feed.staged(), 0);
  ComputeClock clock(torch::kCPU);
  const int64_t before = host_reads();
  clock.start();
  clock.stop();
  clock.discard();
  EXPECT_EQ(clock.take(), 0.0);
  clock.start();
  auto t = torch::randn({64, 64});
  t = t.mm(t);
  clock.stop();
  EXPECT_GT(clock.take(), 0.0);
  EXPECT_EQ(host_reads(), before) << "a CPU clock reads nothing";
}
