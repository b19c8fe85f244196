// dist.shard: optimizer state and gradients split over the ranks in uneven
// ranges (ZeRO stages 1 and 2). The split itself; the same loss per step as
// an unsharded run; checkpoints that re-shard at any world size and mode;
// bad settings refused before anything is written.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>

#include "cohort/ckpt/safetensors.hpp"
#include "cohort/sync/shard_layout.hpp"
#include "helpers.hpp"

using namespace cohort;
using cohort::test::run_cohort;
using cohort::test::TempDir;

namespace {

std::map<std::string, torch::Tensor> shard_model(const std::string& ckpt) {
  auto f = load_safetensors(ckpt + "/model.safetensors");
  return {f.tensors.begin(), f.tensors.end()};
}

double max_difference(const std::string& a, const std::string& b) {
  auto x = shard_model(a), y = shard_model(b);
  double worst = 0;
  for (const auto& [name, t] : y) worst = std::max(worst, (x.at(name) - t).abs().max().item<double>());
  return worst;
}

// 240 images, 12 a step: 20 steps an epoch; clipping on, dropout off.
std::string shard_args(const TempDir& tmp, const std::string& extra, int micro_batch = 2) {
  return " train --model.name mlp --model.hidden 32 --model.dropout 0 --data.global-batch 12 --train.epochs 3 "
         "--optim.clip-norm 0.05 --log.every-steps 1 --eval.every-steps 0 --eval.max-samples 12 --quiet "
         "--oversubscribe --ckpt.every-steps 10 --ckpt.keep 10 --data.micro-batch " + std::to_string(micro_batch) +
         " --data.path " + tmp.path() + " " + extra;
}

// `sharded`'s run against `ref`'s: the same 60 losses within 1e-6
// relative, and the same model at the end.
void expect_same_run(const TempDir& tmp, const std::string& ref, const std::string& sharded) {
  auto a = cohort::test::train_losses(tmp / ref), b = cohort::test::train_losses(tmp / sharded);
  ASSERT_EQ(a.size(), 60u);
  ASSERT_EQ(b.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-6 * std::abs(a[i])) << sharded << " step " << i + 1;
  EXPECT_LT(max_difference(tmp / (sharded + "/checkpoints/step-60"), tmp / (ref + "/checkpoints/step-60")), 1e-5);
}

}  // namespace

TEST(ShardLayout, RangesFollowTheWeights) {
  auto l = ShardLayout::make({10, 20, 30, 40}, {2, 1}, 1);
  EXPECT_EQ(l.groups(), 2);
  EXPECT_EQ(l.bounds, (std::vector<int64_t>{0, 67, 100}));
  EXPECT_TRUE(l.primary(1));
  // The parameters start at 0, 10, 30 and 60: [25, 67) ends the second,
  // holds the third and begins the fourth.
  auto s = l.segments(25, 67);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].param, 1u);
  EXPECT_EQ(s[0].offset, 15);
  EXPECT_EQ(s[0].length, 5);
  EXPECT_EQ(s[1].param, 2u);
  EXPECT_EQ(s[1].offset, 0);
  EXPECT_EQ(s[1].at, 5);
  EXPECT_EQ(s[2].length, 7);
  EXPECT_EQ(s[2].at, 35);
  EXPECT_EQ(l.segments(67, 100).front().offset, 7);
}

// Ranks r and r + G hold the same range (different nodes when every node
// runs as many ranks); a group's range follows its smallest member.
TEST(ShardLayout, ReplicasPairRanksAcrossNodes) {
  auto l = ShardLayout::make({100}, {4, 1, 4, 4}, 2);
  ASSERT_EQ(l.groups(), 2);
  EXPECT_EQ(l.members(0), (std::vector<int>{0, 2}));
  EXPECT_EQ(l.members(1), (std::vector<int>{1, 3}));
  EXPECT_EQ(l.bounds, (std::vector<int64_t>{0, 80, 100}));
  EXPECT_FALSE(l.primary(2));
  auto odd = ShardLayout::make({100}, {1, 1, 1}, 2);  // three ranks, pairs: one group of all three
  EXPECT_EQ(odd.groups(), 1);
  EXPECT_EQ(odd.members(0), (std::vector<int>{0, 1, 2}));
  auto many = ShardLayout::make({1}, {1, 1, 1}, 1);  // more ranges than elements: some empty
  EXPECT_EQ(many.total(), 1);
  EXPECT_EQ(many.bounds.back(), 1);
}

// The same loss at every step as the unsharded run at the same world size
// (AdamW and LAMB, clipping on, fp32, 60 steps), with uneven weights, each
// rank computing several micro-batches of 2.
class ShardMath : public ::testing::TestWithParam<std::string> {};

TEST_P(ShardMath, SameLossPerStepAsUnsharded) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 240);
  const std::string optim = " --optim.name " + GetParam();
  struct Case {
    std::string name, args;
  };
  const std::vector<Case> cases = {
      {"none2", "--nproc-per-node 2"},
      {"opt2", "--nproc-per-node 2 --dist.shard optimizer --dist.shard-weights 2,1"},
      {"grad2", "--nproc-per-node 2 --dist.shard gradients --dist.shard-weights 1,3"},
      {"none3", "--nproc-per-node 3"},
      // 6 micro-batches of 2, shares 2, 3 and 1: 2, 3 and 1 rounds of sums (padded to 3 everywhere).
      {"grad3", "--nproc-per-node 3 --dist.shard gradients --data.balance weights --data.balance-weights 1,2,1"},
  };
  for (const auto& c : cases) {
    auto r = run_cohort(shard_args(tmp, c.args + optim + " --out " + (tmp / c.name)));
    ASSERT_EQ(r.code, 0) << c.name << ": " << r.err;
  }
  for (const auto& [ref, sharded] : std::vector<std::pair<std::string, std::string>>{
           {"none2", "opt2"}, {"none2", "grad2"}, {"none3", "grad3"}}) {
    expect_same_run(tmp, ref, sharded);
  }
  // The world size changes nothing either (per-sample averaging).
  auto two = cohort::test::train_losses(tmp / "grad2"), three = cohort::test::train_losses(tmp / "grad3");
  for (size_t i = 0; i < two.size(); ++i) EXPECT_NEAR(three[i], two[i], 1e-5 * std::abs(two[i])) << "step " << i + 1;
}

INSTANTIATE_TEST_SUITE_P(Optimizers, ShardMath, ::testing::Values("adamw", "lamb"));

// A checkpoint records its ranges and each range's rank writes its file; a
// resume re-shards at another world size, mode or weights, and an unsharded
// run reads it whole (and the other way round): the weights at the end are
// those of the uninterrupted run.
TEST(Shard, CheckpointsReshardAtAnyWorldSizeAndMode) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 240);
  auto r = run_cohort(shard_args(tmp, "--nproc-per-node 2 --dist.shard gradients --dist.shard-weights 2,1 --out " +
                                          (tmp / "sharded")));
  ASSERT_EQ(r.code, 0) << r.err;
  r = run_cohort(shard_args(tmp, "--nproc-per-node 2 --out " + (tmp / "whole")));
  ASSERT_EQ(r.code, 0) << r.err;

  const std::string ckpt = tmp / "sharded/checkpoints/step-20";
  auto state = nlohmann::json::parse(cohort::test::read_file(ckpt + "/state.json"));
  ASSERT_TRUE(state.contains("shard")) << state.dump();
  EXPECT_EQ(state["format_version"], 3);  // a cohort that cannot read ranges refuses it
  EXPECT_EQ(state["shard"]["mode"], "gradients");
  auto bounds = state["shard"]["bounds"].get<std::vector<int64_t>>();
  ASSERT_EQ(bounds.size(), 3u);
  EXPECT_NEAR(static_cast<double>(bounds[1]) / static_cast<double>(bounds[2]), 2.0 / 3.0, 1e-3);
  for (int g = 0; g < 2; ++g) {
    auto f = load_safetensors(ckpt + "/optimizer.shard-" + std::to_string(g) + ".safetensors");
    EXPECT_EQ(f.tensors.at("exp_avg").numel(), bounds[g + 1] - bounds[g]);
  }

  struct Resume {
    std::string name, from, args, note;
  };
  const std::vector<Resume> resumes = {
      {"to3", "sharded", "--nproc-per-node 3 --dist.shard optimizer --dist.shard-weights auto",
       "re-sharded the optimizer state from 2 range(s) to 3"},
      {"to1", "sharded", "--nproc-per-node 1 --dist.shard none", "joined the checkpoint's 2 optimizer range(s)"},
      {"whole_to3", "whole", "--nproc-per-node 3 --dist.shard gradients --dist.shard-weights 1,2,3",
       "the checkpoint's optimizer state was whole"},
  };
  for (const auto& c : resumes) {
    auto res = run_cohort(" train --oversubscribe " + c.args + " --resume " + (tmp / (c.from + "/checkpoints/step-20")) +
                          " --out " + (tmp / c.name));
    ASSERT_EQ(res.code, 0) << c.name << ": " << res.err;
    EXPECT_NE(res.out.find(c.note), std::string::npos) << c.name << ": " << res.out;
    EXPECT_LT(max_difference(tmp / (c.name + "/checkpoints/step-60"), tmp / "whole/checkpoints/step-60"), 1e-5) << c.name;
  }
  // A damaged range file is caught by the checksums: the run falls back.
  std::string shard0 = ckpt + "/optimizer.shard-0.safetensors";
  std::string bytes = cohort::test::read_file(shard0);
  bytes[bytes.size() - 1] ^= 1;
  cohort::test::write_file(shard0, bytes);
  auto bad = run_cohort(" train --oversubscribe --nproc-per-node 2 --resume " + ckpt + " --out " + (tmp / "bad"));
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("optimizer.shard-0.safetensors: checksum mismatch"), std::string::npos) << bad.err;
}

// Sharding composes with the gradient wire: PowerSGD's compressed sums feed
// a sharded optimizer (the same losses as PowerSGD unsharded), and sharded
// gradients travel in bf16 (the same as bf16 unsharded where each rank
// computes one micro-batch, so both send one sum of the same values). Each
// resumes bit-identically at its world size and goes on at another.
TEST(Shard, ComposesWithPowerSgdAndHalfWires) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 240);
  const std::string psgd = " --dist.grad-compression powersgd --dist.powersgd-rank 2",
                    bf16 = " --dist.grad-compression bf16";
  struct Case {
    std::string name, args;
    int micro_batch;
  };
  const std::vector<Case> cases = {
      {"psgd", "--nproc-per-node 2" + psgd, 2},
      {"psgd_opt", "--nproc-per-node 2 --dist.shard optimizer --dist.shard-weights 2,1" + psgd, 2},
      {"bf16", "--nproc-per-node 2" + bf16, 6},
      {"bf16_grad", "--nproc-per-node 2 --dist.shard gradients --dist.shard-weights 1,3" + bf16, 6},
      {"bf16_grad_micro", "--nproc-per-node 2 --dist.shard gradients" + bf16, 2},  // three bf16 sums a step
  };
  for (const auto& c : cases) {
    auto r = run_cohort(shard_args(tmp, c.args + " --out " + (tmp / c.name), c.micro_batch));
    ASSERT_EQ(r.code, 0) << c.name << ": " << r.err;
  }
  for (const auto& [ref, sharded] : std::vector<std::pair<std::string, std::string>>{{"psgd", "psgd_opt"},
                                                                                     {"bf16", "bf16_grad"}}) {
    expect_same_run(tmp, ref, sharded);
  }
  // bf16 rounding of each micro-batch's sum differs from one sum of the
  // step, but not by much: it trains as the exact run does.
  auto exact = cohort::test::train_losses(tmp / "bf16"), micro = cohort::test::train_losses(tmp / "bf16_grad_micro");
  ASSERT_EQ(micro.size(), exact.size());
  EXPECT_NEAR(micro.back(), exact.back(), 0.02 * exact.back());

  struct Resume {
    std::string name, from, args;
    bool same_bits;
    std::string note;
  };
  const std::vector<Resume> resumes = {
      {"psgd_opt_again", "psgd_opt", "--nproc-per-node 2", true, ""},
      {"bf16_grad_again", "bf16_grad", "--nproc-per-node 2", true, ""},
      {"psgd_opt_to3", "psgd_opt", "--nproc-per-node 3 --dist.shard-weights auto", false,
       "powersgd: the error-feedback remainders of the checkpoint's 2 rank(s) are dropped at 3 rank(s)"},
      {"bf16_grad_to3", "bf16_grad", "--nproc-per-node 3 --dist.shard-weights auto", false,
       "re-sharded the optimizer state from 2 range(s) to 3"},
  };
  for (const auto& c : resumes) {
    auto res = run_cohort(" train --oversubscribe " + c.args + " --resume " + (tmp / (c.from + "/checkpoints/step-20")) +
                          " --out " + (tmp / c.name));
    ASSERT_EQ(res.code, 0) << c.name << ": " << res.err;
    EXPECT_NE(res.out.find(c.note), std::string::npos) << c.name << ": " << res.out;
    auto losses = cohort::test::train_losses(tmp / c.name);
    ASSERT_FALSE(losses.empty()) << c.name;
    const double moved = max_difference(tmp / (c.name + "/checkpoints/step-60"), tmp / (c.from + "/checkpoints/step-60"));
    if (c.same_bits) {
      EXPECT_EQ(moved, 0.0) << c.name;
    }
  }
}

TEST(Shard, BadSettingsAreConfigErrors) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 240);
  struct Bad {
    std::string args, says;
  };
  const std::vector<Bad> bad = {
      {"--dist.shard optimizer --dist.shard-weights 2,x", "dist.shard-weights: '2,x' must be auto or positive numbers"},
      {"--dist.shard optimizer --dist.shard-weights 2,1,1", "gives 3 weight(s) ('2,1,1') but the world has 2 rank(s)"},
      {"--dist.shard optimizer --dist.shard-weights 0,1", "must be auto or positive numbers"},
      {"--dist.shard gradients --optim.name sgd", "optim.name = sgd has none worth sharding"},
      {"--dist.shard optimizer --dist.shard-replicas 3", "dist.shard-replicas"},
      {"--dist.shard optimizer --dist.sync local", "gives islands of one rank, each stepping alone: set dist.islands"},
      {"--dist.shard optimizer --dist.sync local --dist.islands 1", "gives islands of one rank, each stepping alone"},
      {"--dist.shard gradients --dist.grad-compression powersgd", "use dist.shard = optimizer with powersgd"},
      {"--dist.shard sideways", "sideways"},
  };
  for (const auto& b : bad) {
    auto r = run_cohort(shard_args(tmp, "--nproc-per-node 2 " + b.args + " --out " + (tmp / "run")));
    EXPECT_EQ(r.code, 2) << b.args << ": " << r.err;
    EXPECT_NE(r.err.find(b.says), std::string::npos) << b.args << ": " << r.err;
    EXPECT_FALSE(std::filesystem::exists(tmp / "run/checkpoints")) << b.args;
  }
}
