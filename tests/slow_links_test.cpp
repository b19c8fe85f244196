// Training across slow links: PowerSGD's compressed gradient sums and local
// steps with outer syncs (dist.sync = local), against the exact sums they
// replace; their state across a resume.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>

#include "cohort/distributed/comm.hpp"
#include "cohort/sync/grad_sync.hpp"
#include "cohort/sync/local_sync.hpp"
#include "cohort/sync/powersgd.hpp"
#include "helpers.hpp"
#include "thread_world.hpp"

using namespace cohort;
using cohort::test::run_cohort;
using cohort::test::spawn_world;
using cohort::test::TempDir;

namespace {

// Rank r's gradients: a 48 x 40 matrix, a 6 x 4 one (too small to
// compress) and a bias; `rank1` makes the matrix rank one (an outer product,
// as one sample's gradient of a linear layer).
std::vector<torch::Tensor> rank_gradients(int rank, int call, bool rank1) {
  torch::manual_seed(1000 * call + rank);
  auto big = rank1 ? torch::outer(torch::randn({48}), torch::randn({40})) : torch::randn({48, 40});
  return {big, torch::randn({6, 4}), torch::randn({40})};
}

const std::vector<std::string> kNames = {"big", "small", "bias"};

std::vector<torch::Tensor> copies(const std::vector<torch::Tensor>& ts) {
  std::vector<torch::Tensor> out;
  for (const auto& t : ts) out.push_back(t.clone());
  return out;
}

torch::Tensor remainder_of(const PowerSgdBucket& b) { return b.own_state().at(0).second.reshape({48, 40}); }

// The tensor bytes of a checkpoint's model (after the safetensors header).
std::string model_bytes(const std::string& ckpt_dir) {
  std::string b = cohort::test::read_file(ckpt_dir + "/model.safetensors");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(static_cast<unsigned char>(b[i])) << (8 * i);
  return b.substr(8 + n);
}

const std::string kSlowTiny = " --model.name mlp --model.hidden 16 --optim.schedule constant "
                          "--log.every-steps 1 --eval.every-steps 1000000 --eval.max-samples 8 ";

}  // namespace

TEST(PowerSgd, CompressesOnlyMatricesItShrinks) {
  EXPECT_TRUE(powersgd_compresses({48, 40}, 4));       // (48 + 40) * 4 * 2 = 704 < 1920
  EXPECT_TRUE(powersgd_compresses({16, 3, 4, 4}, 2));  // a conv kernel: 16 x 48
  EXPECT_FALSE(powersgd_compresses({6, 4}, 4));        // 80 >= 24: sent exactly
  EXPECT_FALSE(powersgd_compresses({40}, 1));          // one-dimensional
  EXPECT_FALSE(powersgd_compresses({48, 40}, 16));     // rank too high to gain
}

// Error feedback: what was sent plus what every rank kept is exactly the
// sum of what the ranks put in (their gradients plus what they kept before).
TEST(PowerSgd, SentPlusKeptIsTheGradient) {
  const int n = 3;
  std::vector<std::vector<torch::Tensor>> put_in(n), sent(n), kept(n);
  std::vector<std::unique_ptr<PowerSgdBucket>> buckets(n);  // each rank's, kept from call to call
  for (int call = 0; call < 3; ++call) {
    spawn_world(n, [&](Comm& comm) {
      int r = comm.rank();
      auto& bucket = buckets[r];
      auto g = rank_gradients(r, call, /*rank1=*/false);
      if (call == 0) bucket = std::make_unique<PowerSgdBucket>(g, kNames, 2, 7);
      auto before = remainder_of(*bucket);
      put_in[r] = copies(g);
      put_in[r][0] += before;
      bucket->reduce(comm, g);
      sent[r] = copies(g);
      kept[r] = {remainder_of(*bucket)};
    });
    torch::Tensor total = torch::zeros({48, 40}), remainders = torch::zeros({48, 40});
    for (int r = 0; r < n; ++r) {
      total += put_in[r][0];
      remainders += kept[r][0];
    }
    EXPECT_TRUE(torch::allclose(sent[0][0] + remainders, total, 1e-5, 1e-5)) << "call " << call;
    EXPECT_GT((sent[0][0] - total).abs().max().item<double>(), 1e-2) << "rank 2 cannot hold a random 48 x 40 sum";
    for (int r = 1; r < n; ++r) {
      for (size_t k = 0; k < 3; ++k) EXPECT_TRUE(torch::equal(sent[r][k], sent[0][k])) << "rank " << r << " tensor " << k;
    }
    // The small matrix and the bias are summed exactly.
    for (size_t k = 1; k < 3; ++k) {
      torch::Tensor exact = put_in[0][k] + put_in[1][k] + put_in[2][k];
      EXPECT_TRUE(torch::allclose(sent[0][k], exact, 1e-6, 1e-6)) << "tensor " << k;
    }
  }
}

// When the rank covers the summed gradient's rank, the sum is exact and
// nothing is kept back.
TEST(PowerSgd, RankAtLeastTheGradientsRankGivesTheExactSum) {
  std::vector<torch::Tensor> sent(2), exact(2), kept(2);
  spawn_world(2, [&](Comm& comm) {
    auto g = rank_gradients(comm.rank(), 0, /*rank1=*/true);
    PowerSgdBucket bucket(g, kNames, 2, 11);  // the sum of two rank-one matrices has rank 2
    exact[comm.rank()] = g[0].clone();
    bucket.reduce(comm, g);
    sent[comm.rank()] = g[0];
    kept[comm.rank()] = remainder_of(bucket);
  });
  auto sum = exact[0] + exact[1];
  EXPECT_TRUE(torch::allclose(sent[0], sum, 1e-4, 1e-5)) << (sent[0] - sum).abs().max().item<double>();
  EXPECT_LT((kept[0] + kept[1]).abs().max().item<double>(), 1e-4);
}

// Inside GradSync, overlapped with backward: every rank ends with the same
// gradients, and a Q and remainders a checkpoint can carry.
TEST(PowerSgd, GradSyncGivesEveryRankTheSameGradients) {
  std::vector<std::vector<torch::Tensor>> grads(2);
  std::vector<size_t> state_sizes(2);
  spawn_world(2, [&](Comm& comm) {
    torch::manual_seed(3);  // the same model on both ranks
    torch::nn::Sequential net(torch::nn::Linear(32, 64), torch::nn::ReLU(), torch::nn::Linear(64, 48));
    GradSyncOptions o;
    o.compression = Compression::kPowerSgd;
    o.powersgd_rank = 2;
    o.first_bucket_bytes = 1024;
    GradSync sync(comm, *net, o);
    EXPECT_EQ(sync.compressed_tensors(), 2u);
    EXPECT_LT(sync.wire_floats(), sync.exact_floats() / 4);
    torch::manual_seed(100 + comm.rank());
    for (int step = 0; step < 3; ++step) {
      for (auto& p : net->parameters()) p.mutable_grad().zero_();
      sync.prepare(true);
      net->forward(torch::randn({8, 32})).pow(2).sum().backward();
      sync.finalize();
    }
    for (auto& p : net->parameters()) grads[comm.rank()].push_back(p.grad().clone());
    state_sizes[comm.rank()] = sync.shared_state().size() + sync.own_state().size();
  });
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (size_t k = 0; k < grads[0].size(); ++k) EXPECT_TRUE(torch::equal(grads[0][k], grads[1][k])) << "tensor " << k;
  EXPECT_EQ(state_sizes[0], 4u);  // a Q and a remainder per compressed matrix
}

// Local steps of one with plain SGD, outer lr 1 and no momentum average the
// ranks' one-step parameters: exactly one step on the averaged gradient.
TEST(LocalSync, OneStepWindowsWithPlainSgdAreExactTraining) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 40);
  std::string common = "train" + kSlowTiny + "--model.dropout 0 --optim.name sgd --optim.momentum 0 --optim.lr 0.05 "
                       "--data.global-batch 6 --nproc-per-node 2 --train.max-steps 12 --data.path " + tmp.path();
  auto exact = run_cohort(common + " --out " + (tmp / "exact"));
  ASSERT_EQ(exact.code, 0) << exact.err;
  auto local = run_cohort(common + " --dist.sync local --dist.local-steps 1 --optim.outer-lr 1 "
                          "--optim.outer-momentum 0 --out " + (tmp / "local"));
  ASSERT_EQ(local.code, 0) << local.err;
  auto a = cohort::test::train_losses(tmp / "exact"), b = cohort::test::train_losses(tmp / "local");
  ASSERT_EQ(a.size(), 12u);
  ASSERT_EQ(b.size(), 12u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-5 * std::abs(a[i])) << "step " << i + 1;
  // With 4 steps per window the ranks drift apart in between: not the same run.
  auto apart = run_cohort(common + " --dist.sync local --dist.local-steps 4 --optim.outer-lr 1 "
                          "--optim.outer-momentum 0 --out " + (tmp / "apart"));
  ASSERT_EQ(apart.code, 0) << apart.err;
  auto c = cohort::test::train_losses(tmp / "apart");
  ASSERT_EQ(c.size(), 12u);
  EXPECT_NE(c[5], a[5]);
  EXPECT_NE(local.out.find("sync local: an outer Nesterov step (lr 1, momentum 0) every 1 step(s)"),
            std::string::npos) << local.out;
}

// Resuming from a checkpoint taken in the middle of a window, or with
// PowerSGD's remainders and Qs, continues bit for bit.
class SlowLinkResume : public ::testing::TestWithParam<const char*> {};

TEST_P(SlowLinkResume, MidWindowIsBitIdentical) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 40);
  std::string run = tmp / "run";
  std::string common = "train" + kSlowTiny + "--model.dropout 0.1 --data.global-batch 6 --nproc-per-node 2 --ckpt.every-steps 9 "
                       "--ckpt.keep 5 --train.max-steps 20 " + GetParam();
  auto full = run_cohort(common + " --data.path " + tmp.path() + " --out " + run);
  ASSERT_EQ(full.code, 0) << full.err;
  std::string uninterrupted = model_bytes(run + "/checkpoints/step-20");
  auto again = run_cohort("train --resume " + run + "/checkpoints/step-9 --quiet");  // the recorded 2 ranks
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_EQ(model_bytes(run + "/checkpoints/step-20"), uninterrupted);
  // At another world size the open window is merged, and the run goes on.
  auto other = run_cohort("train --resume " + run + "/checkpoints/step-9 --nproc-per-node 1 --train.max-steps 12");
  ASSERT_EQ(other.code, 0) << other.err;
  bool local = std::string(GetParam()).find("local") != std::string::npos;
  EXPECT_NE(other.out.find(local ? "had 6 samples in an open window; merged by one outer step"
                                 : "error-feedback remainders of the checkpoint's 2 rank(s) are dropped"),
            std::string::npos) << other.out;
}

INSTANTIATE_TEST_SUITE_P(Modes, SlowLinkResume,
                         ::testing::Values("--dist.sync local --dist.local-steps 4 --optim.outer-momentum 0.5",
                                           "--dist.grad-compression powersgd --dist.powersgd-rank 1"),
                         [](const auto& info) { return info.index == 0 ? "LocalSteps" : "PowerSgd"; });

// Islands: 4 ranks as 2 islands of 2. With one-step windows, plain SGD,
// outer lr 1 and no momentum they are exact training, as flat local steps
// are; and an island of 2 ranks summing its gradients exactly trains what
// one rank with both ranks' samples does, so 2 islands of 2 are 2 flat
// ranks with local steps, window for window.
TEST(Islands, TrainAsOneRankEachAndOneStepWindowsAreExactTraining) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 40);
  std::string common = "train" + kSlowTiny + "--model.dropout 0 --optim.name sgd --optim.momentum 0 --optim.lr 0.05 "
                       "--data.global-batch 8 --train.max-steps 12 --oversubscribe --data.path " + tmp.path();
  const std::string outer = " --dist.sync local --optim.outer-lr 1 --optim.outer-momentum 0";
  auto exact = run_cohort(common + " --nproc-per-node 4 --out " + (tmp / "exact"));
  ASSERT_EQ(exact.code, 0) << exact.err;
  auto one = run_cohort(common + outer + " --nproc-per-node 4 --dist.islands 2 --dist.local-steps 1 --out " +
                        (tmp / "one"));
  ASSERT_EQ(one.code, 0) << one.err;
  EXPECT_NE(one.out.find("2 island(s) of 2 rank(s), gradients summed exactly inside each, and each island rank sums "
                         "its 1/2 of the change"), std::string::npos) << one.out;
  auto a = cohort::test::train_losses(tmp / "exact"), b = cohort::test::train_losses(tmp / "one");
  ASSERT_EQ(a.size(), 12u);
  ASSERT_EQ(b.size(), 12u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-5 * std::abs(a[i])) << "step " << i + 1;
  // Islands dealt unequal shares (here 6 and 2 samples of 8): each island's
  // change counts by the samples it trained, so one-step windows are still
  // one step on the whole batch's mean gradient.
  auto uneven = run_cohort(common + outer + " --nproc-per-node 4 --dist.islands 2 --dist.local-steps 1 "
                           "--data.balance weights --data.balance-weights 3,1,1,1 --out " + (tmp / "uneven"));
  ASSERT_EQ(uneven.code, 0) << uneven.err;
  EXPECT_NE(uneven.out.find("rank 0 4 micro-batch(es), rank 1 2, rank 2 1, rank 3 1"), std::string::npos)
      << uneven.out;
  auto u = cohort::test::train_losses(tmp / "uneven");
  ASSERT_EQ(u.size(), 12u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(u[i], a[i], 1e-5 * std::abs(a[i])) << "uneven step " << i + 1;

  auto islands = run_cohort(common + outer + " --nproc-per-node 4 --dist.islands 2,2 --dist.local-steps 4 --out " +
                            (tmp / "islands"));
  ASSERT_EQ(islands.code, 0) << islands.err;
  // The change in int8 (a scale per 4096 values) trains about as fp32 does.
  auto int8 = run_cohort(common + outer + " --nproc-per-node 4 --dist.islands 2,2 --dist.local-steps 4 "
                         "--dist.grad-compression int8 --out " + (tmp / "int8"));
  ASSERT_EQ(int8.code, 0) << int8.err;
  EXPECT_NE(int8.out.find("MiB in int8 per sync"), std::string::npos) << int8.out;
  auto flat = run_cohort(common + outer + " --nproc-per-node 2 --dist.local-steps 4 --out " + (tmp / "flat"));
  ASSERT_EQ(flat.code, 0) << flat.err;
  auto c = cohort::test::train_losses(tmp / "islands"), d = cohort::test::train_losses(tmp / "flat");
  ASSERT_EQ(c.size(), 12u);
  ASSERT_EQ(d.size(), 12u);
  for (size_t i = 0; i < c.size(); ++i) EXPECT_NEAR(c[i], d[i], 1e-5 * std::abs(d[i])) << "step " << i + 1;
  auto q = cohort::test::train_losses(tmp / "int8");
  ASSERT_EQ(q.size(), 12u);
  for (size_t i = 0; i < q.size(); ++i) EXPECT_NEAR(q[i], c[i], 2e-2 * std::abs(c[i])) << "step " << i + 1;
  EXPECT_NE(q[11], c[11]) << "int8 rounds the change";
  // int4 (a scale per 128 values) with error feedback: coarser, and close.
  auto int4 = run_cohort(common + outer + " --nproc-per-node 4 --dist.islands 2,2 --dist.local-steps 4 "
                         "--dist.grad-compression int4 --dist.outer-error-feedback --out " + (tmp / "int4"));
  ASSERT_EQ(int4.code, 0) << int4.err;
  EXPECT_NE(int4.out.find("MiB in int4 per sync with error feedback"), std::string::npos) << int4.out;
  auto h = cohort::test::train_losses(tmp / "int4");
  ASSERT_EQ(h.size(), 12u);
  for (size_t i = 0; i < h.size(); ++i) EXPECT_NEAR(h[i], c[i], 2e-2 * std::abs(c[i])) << "int4 step " << i + 1;
  EXPECT_NE(h[11], q[11]) << "int4 rounds otherwise than int8";
  EXPECT_GT(std::abs(c[5] - a[5]), 1e-6) << "4-step windows drift apart between syncs: not exact training";
}

// Islands of unequal sizes (a box of 2 beside a box of 1, or an island that
// lost a rank): the change is cut into as many slices as the smallest island
// has ranks, and the island of 2 trains what one rank with both ranks'
// samples does, so islands of 2 and 1 on 3 ranks are 2 flat ranks dealt 8
// and 4 samples of 12, window for window, the change on any wire.
TEST(Islands, OfUnequalSizesTrainAsFlatRanksWithTheirSamples) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 48);
  std::string common = "train" + kSlowTiny + "--model.dropout 0 --optim.name sgd --optim.momentum 0 --optim.lr 0.05 "
                       "--data.global-batch 12 --train.max-steps 12 --oversubscribe --data.path " + tmp.path() +
                       " --dist.sync local --dist.local-steps 4 --optim.outer-momentum 0.5";
  auto flat = run_cohort(common + " --nproc-per-node 2 --data.balance weights --data.balance-weights 2,1 --out " +
                         (tmp / "flat"));
  ASSERT_EQ(flat.code, 0) << flat.err;
  const auto a = cohort::test::train_losses(tmp / "flat");
  ASSERT_EQ(a.size(), 12u);
  for (const char* wire : {"none", "int8"}) {
    const std::string out = tmp / wire;
    auto r = run_cohort(common + " --nproc-per-node 3 --dist.islands 2,1 --dist.grad-compression " + wire +
                        " --out " + out);
    ASSERT_EQ(r.code, 0) << wire << "\n" << r.err;
    EXPECT_NE(r.out.find("2 island(s) of 2,1 rank(s), gradients summed exactly inside each, and each of the first 1 "
                         "rank(s) of an island sums its 1/1 of the change"), std::string::npos) << r.out;
    const auto b = cohort::test::train_losses(out);
    ASSERT_EQ(b.size(), 12u);
    const double tol = std::string(wire) == "none" ? 1e-5 : 2e-2;
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], tol * std::abs(a[i])) << wire << " step " << i + 1;
  }
}

// Error feedback: what the wire's rounding leaves out of a change goes with
// the next sync, so the synced model misses at most one rounding of the
// change however many syncs ran; without it the same rounding is lost at
// every sync. Two flat ranks move every value by the same step each window,
// which bf16 rounds the same way every time; the reference is the same run
// with the change in fp32.
TEST(LocalSync, ErrorFeedbackLosesNoPartOfTheChangeForGood) {
  constexpr int kSyncs = 200;
  constexpr double kStep = 1e-3 / 3;
  std::vector<torch::Tensor> last(3);  // fp32, bf16, bf16 with error feedback
  for (int run = 0; run < 3; ++run) {
    spawn_world(2, [&](Comm& comm) {
      auto island = comm.split({comm.rank()}, "island/" + std::to_string(comm.rank()));
      torch::nn::Linear net(16, 16);
      torch::NoGradGuard no_grad;
      for (auto& p : net->parameters()) p.fill_(1.0);
      LocalSyncOptions o;
      o.every = 1;
      o.outer_lr = 1;
      o.outer_momentum = 0;
      o.wire = run == 0 ? Compression::kNone : Compression::kBf16;
      o.error_feedback = run == 2;
      LocalSync sync(*island, comm, *net, o);
      for (int step = 1; step <= kSyncs; ++step) {
        for (auto& p : net->parameters()) p.sub_(kStep);
        EXPECT_TRUE(sync.after_step(step, 1, false));
      }
      if (comm.rank() == 0) last[static_cast<size_t>(run)] = net->weight.clone();
    });
  }
  const double with = (last[2] - last[0]).abs().max().item<double>();
  const double without = (last[1] - last[0]).abs().max().item<double>();
  EXPECT_LT(with, 2e-6) << "with error feedback: one bf16 rounding of a step, at most";
  EXPECT_GT(without, 20 * with) << "without: the rounding of every sync adds up";
}

// Integer wires: each block of values goes as integers of its largest
// magnitude / levels (int8: 127 per 4096 values; int4: 7 per 128), so one
// sync misses at most half a level per value, and with error feedback the
// synced model misses at most one rounding of the change however many
// syncs ran; without it, a change the wire rounds the same way every window
// loses the same part at every sync. The ranks move each value by its own
// step every window (values of many sizes in a block); the reference is
// the same run in fp32. The bytes each sync sends are the blocks' scales
// and the packed values.
TEST(LocalSync, IntegerWiresRoundEachBlockAndFeedBackWhatTheyLeaveOut) {
  constexpr int kSyncs = 100;
  struct Wire {
    Compression wire;
    double levels;
    int64_t bytes;  // 272 values: one int8 block, three int4 blocks of 128
  };
  for (const Wire w : {Wire{Compression::kInt8, 127, 4 + 272}, Wire{Compression::kInt4, 7, 3 * 4 + 136}}) {
    std::vector<torch::Tensor> last(3), first(3);  // fp32, the wire, the wire with error feedback
    torch::manual_seed(7);
    const torch::Tensor steps = torch::rand({272}).mul_(1e-3);
    for (int run = 0; run < 3; ++run) {
      spawn_world(2, [&](Comm& comm) {
        auto island = comm.split({comm.rank()}, "island/" + std::to_string(comm.rank()));
        torch::nn::Linear net(16, 16);
        torch::NoGradGuard no_grad;
        for (auto& p : net->parameters()) p.fill_(1.0);
        LocalSyncOptions o;
        o.every = 1;
        o.wire = run == 0 ? Compression::kNone : w.wire;
        o.error_feedback = run == 2;
        LocalSync sync(*island, comm, *net, o);
        if (run > 0) EXPECT_EQ(sync.wire_bytes(), w.bytes) << name_of(w.wire);
        for (int step = 1; step <= kSyncs; ++step) {
          int64_t at = 0;
          for (auto& p : net->parameters()) {
            p.sub_(steps.narrow(0, at, p.numel()).view_as(p));
            at += p.numel();
          }
          EXPECT_TRUE(sync.after_step(step, 1, false));
          if (step == 1 && comm.rank() == 0) first[static_cast<size_t>(run)] = net->weight.clone();
        }
        if (comm.rank() == 0) last[static_cast<size_t>(run)] = net->weight.clone();
      });
    }
    // The weight's 256 values lie in its blocks with the bias's 16; their
    // largest step is at most 1e-3, so a level is at most 1e-3 / levels.
    const double level = 1e-3 / w.levels;
    EXPECT_LE((first[1] - first[0]).abs().max().item<double>(), 0.5 * level + 2e-7) << name_of(w.wire);
    EXPECT_GT((first[1] - first[0]).abs().max().item<double>(), 0) << name_of(w.wire) << " rounds";
    const double with = (last[2] - last[0]).abs().max().item<double>();
    const double without = (last[1] - last[0]).abs().max().item<double>();
    // (A block's scale then counts the remainder too: a little over a level.)
    EXPECT_LE(with, 0.6 * level + 2e-6) << name_of(w.wire) << " with error feedback: one rounding, at most";
    EXPECT_GT(without, 10 * with) << name_of(w.wire) << " without: the rounding of every sync adds up";
  }
}

// Each island's inner step keeps everything the exact step has: sharding
// its AdamW state over the island's ranks (optimizer, or gradients too)
// trains as the unsharded islands do (the same elementwise update),
// dist.shard-weights gives each island its members' weights, and the sum
// inside an island takes another wire dtype.
TEST(Islands, ShardedInsideTrainAsUnsharded) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 40);
  std::string common = "train" + kSlowTiny + "--model.dropout 0 --optim.name adamw --optim.lr 0.01 "
                       "--data.global-batch 8 --train.max-steps 12 --oversubscribe --nproc-per-node 4 --data.path " +
                       tmp.path() + " --dist.sync local --dist.islands 2 --dist.local-steps 4";
  auto whole = run_cohort(common + " --out " + (tmp / "whole"));
  ASSERT_EQ(whole.code, 0) << whole.err;
  const auto a = cohort::test::train_losses(tmp / "whole");
  ASSERT_EQ(a.size(), 12u);
  for (const char* mode : {"optimizer", "gradients"}) {
    const std::string out = tmp / mode;
    auto r = run_cohort(common + " --dist.shard " + mode + " --dist.shard-weights 1,3,1,3 --out " + out);
    ASSERT_EQ(r.code, 0) << mode << "\n" << r.err;
    EXPECT_NE(r.out.find(std::string("dist.shard: ") + mode + ", 2 range(s) x 1 replica(s)"), std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("25.0%; rank 1 ["), std::string::npos) << "island 1's weights are ranks 2 and 3's\n" << r.out;
    EXPECT_NE(r.out.find("in each island, over its ranks"), std::string::npos) << r.out;
    const auto b = cohort::test::train_losses(out);
    ASSERT_EQ(b.size(), 12u);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-6 * std::abs(a[i])) << mode << " step " << i + 1;
  }
  // Any wire inside an island: bf16 rounds the island's gradient sum, so
  // the run is close to the exact one and not the same.
  auto bf16 = run_cohort(common + " --dist.island-compression bf16 --dist.shard optimizer --out " + (tmp / "bf16"));
  ASSERT_EQ(bf16.code, 0) << bf16.err;
  EXPECT_NE(bf16.out.find("gradients summed in bf16 inside each"), std::string::npos) << bf16.out;
  const auto h = cohort::test::train_losses(tmp / "bf16");
  ASSERT_EQ(h.size(), 12u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(h[i], a[i], 2e-2 * std::abs(a[i])) << "bf16 step " << i + 1;
  EXPECT_NE(h[11], a[11]) << "bf16 rounds the sum inside the island";
  // Islands of one rank have nobody to share the state with, and no sum
  // inside to compress: one line each, at the launch, nothing written.
  auto flat = run_cohort("train" + kSlowTiny + "--oversubscribe --nproc-per-node 4 --data.path " + tmp.path() +
                         " --dist.sync local --dist.islands rank --dist.shard optimizer --out " + (tmp / "flat"));
  EXPECT_EQ(flat.code, 2) << flat.err;
  EXPECT_NE(flat.err.find("gives islands of one rank, each stepping alone"), std::string::npos) << flat.err;
  EXPECT_EQ(cohort::test::lines_of(flat.err).size(), 1u) << flat.err;
  EXPECT_FALSE(std::filesystem::exists(tmp / "flat"));
  for (const char* islands : {"rank", "auto"}) {
    auto none = run_cohort("train" + kSlowTiny + "--oversubscribe --nproc-per-node 2 --data.path " + tmp.path() +
                           " --dist.sync local --dist.island-compression fp32 --dist.islands " + islands +
                           " --out " + (tmp / "flat"));
    EXPECT_EQ(none.code, 2) << none.err;
    EXPECT_NE(none.err.find("dist.island-compression"), std::string::npos) << none.err;
    EXPECT_EQ(cohort::test::lines_of(none.err).size(), 1u) << none.err;
    EXPECT_FALSE(std::filesystem::exists(tmp / "flat"));
  }
}

// A checkpoint in the middle of a window resumes bit for bit with the same
// islands, streamed with a fragment's sum in flight too (fragments of 4
// steps' windows close after steps 2 and 4 mod 4; the one closed at step 10
// lands after step 11, so the checkpoint at 10 holds it); regrouped (flat
// local steps on the same 4 ranks), the open windows are merged and the run
// goes on.
class IslandsResume : public ::testing::TestWithParam<const char*> {};

TEST_P(IslandsResume, MidWindowIsBitIdentical) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 40);
  std::string run = tmp / "run";
  auto full = run_cohort("train" + kSlowTiny + "--model.dropout 0.1 --data.global-batch 8 --nproc-per-node 4 "
                         "--oversubscribe --ckpt.every-steps 5 --ckpt.keep 5 --train.max-steps 20 --dist.sync local "
                         "--dist.local-steps 4 --optim.outer-momentum 0.5 --dist.islands 2 --data.path " + tmp.path() +
                         " --out " + run + " " + GetParam());
  ASSERT_EQ(full.code, 0) << full.err;
  std::string uninterrupted = model_bytes(run + "/checkpoints/step-20");
  const bool streamed = std::string(GetParam()).find("delay") != std::string::npos;
  EXPECT_EQ(cohort::test::read_file(run + "/checkpoints/step-10/rng.safetensors").find("sync.local.in-flight") !=
                std::string::npos, streamed) << "a fragment's sum is in flight at step 10 when streamed, only then";
  auto again = run_cohort("train --resume " + run + "/checkpoints/step-10 --quiet");
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_TRUE(model_bytes(run + "/checkpoints/step-20") == uninterrupted) << "the resumed run's model differs";
  auto regrouped = run_cohort("train --resume " + run + "/checkpoints/step-10 --dist.islands rank --train.max-steps 12");
  ASSERT_EQ(regrouped.code, 0) << regrouped.err;
  EXPECT_NE(regrouped.out.find("in an open window; merged by one outer step before going on with 4 rank(s) in 4 "
                               "island(s)"), std::string::npos) << regrouped.out;
}

// Evaluation of a streamed run sees the newest model the islands agree
// on: a fragment still travelling is waited for and its outer step applied
// to the synced model then, and it lands in each rank's parameters at its
// step as before, so training is the same with or without evaluations.
// Windows of 4 steps in 2 fragments close after steps 2 and 0 mod 4, each
// landing a step later: fragment 0 travels after step 10 and nothing
// closes at step 11, so the evaluation after step 10 sees the model the one
// after step 11 does (before: fragment 0 as of step 6). The checkpoint at
// step 10, written after that evaluation, holds that model with the
// landing still due, and resumes bit for bit, or regrouped.
TEST(Islands, EvaluationSeesTheFragmentInFlightSynced) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 40);
  const std::string common = "train --model.name mlp --model.hidden 16 --optim.schedule constant --log.every-steps 1 "
                             "--eval.max-samples 8 --model.dropout 0.1 --data.global-batch 8 --nproc-per-node 4 "
                             "--oversubscribe --train.max-steps 20 --dist.sync local --dist.local-steps 4 "
                             "--optim.outer-momentum 0.5 --dist.islands 2 --dist.outer-fragments 2 "
                             "--dist.outer-delay 1 --dist.grad-compression int4 --dist.outer-error-feedback "
                             "--data.path " + tmp.path();
  const std::string run = tmp / "run";
  auto evaluated = run_cohort(common + " --eval.every-steps 1 --ckpt.every-steps 5 --ckpt.keep 5 --out " + run);
  ASSERT_EQ(evaluated.code, 0) << evaluated.err;
  auto plain = run_cohort(common + " --eval.every-steps 1000000 --out " + (tmp / "plain"));
  ASSERT_EQ(plain.code, 0) << plain.err;
  const auto a = cohort::test::train_losses(run), b = cohort::test::train_losses(tmp / "plain");
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(b.size(), 20u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "evaluations changed training at step " << i + 1;
  std::map<int64_t, double> eval;
  for (const auto& line : cohort::test::lines_of(cohort::test::read_file(run + "/metrics.jsonl"))) {
    const auto j = nlohmann::json::parse(line);
    if (j["kind"] == "eval") eval[j["step"].get<int64_t>()] = j["loss"].get<double>();
  }
  ASSERT_EQ(eval.size(), 20u);
  EXPECT_EQ(eval[10], eval[11]) << "the evaluation after step 10 sees fragment 0 as synced at step 10";
  EXPECT_NE(eval[9], eval[10]) << "fragment 0 as of step 6, then as of step 10";
  const std::string state = cohort::test::read_file(run + "/checkpoints/step-10/rng.safetensors");
  EXPECT_NE(state.find("sync.local.in-flight"), std::string::npos) << "fragment 0 lands after step 11";
  EXPECT_EQ(state.find("local.in-flight.sent"), std::string::npos) << "applied: nothing to send again";
  const std::string uninterrupted = model_bytes(run + "/checkpoints/step-20");
  auto again = run_cohort("train --resume " + run + "/checkpoints/step-10 --quiet");
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_TRUE(model_bytes(run + "/checkpoints/step-20") == uninterrupted) << "the resumed run's model differs";
  auto regrouped = run_cohort("train --resume " + run + "/checkpoints/step-10 --dist.islands rank --train.max-steps 12");
  ASSERT_EQ(regrouped.code, 0) << regrouped.err;
  EXPECT_NE(regrouped.out.find("merged by one outer step before going on with 4 rank(s) in 4 island(s)"),
            std::string::npos) << regrouped.out;
}

std::string resume_case_name(size_t index) {
  const std::vector<std::string> names = {"Blocking", "Streamed", "StreamedInt8", "StreamedInt8Feedback",
                                          "StreamedInt4Feedback"};
  return names.at(index);
}

INSTANTIATE_TEST_SUITE_P(Syncs, IslandsResume,
                         ::testing::Values("", "--dist.outer-fragments 2 --dist.outer-delay 1 --optim.outer-mix 0.5",
                                           "--dist.outer-fragments 2 --dist.outer-delay 1 --dist.grad-compression int8",
                                           "--dist.outer-fragments 2 --dist.outer-delay 1 --dist.grad-compression int8 "
                                           "--dist.outer-error-feedback",
                                           "--dist.outer-fragments 2 --dist.outer-delay 1 --dist.grad-compression int4 "
                                           "--dist.outer-error-feedback"),
                         [](const auto& info) { return resume_case_name(info.index); });

TEST(Islands, LayoutsTheWorldCannotHoldAreConfigErrors) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 16);
  std::string common = "train" + kSlowTiny + "--data.global-batch 4 --train.max-steps 1 --oversubscribe --data.path " +
                       tmp.path() + " --dist.sync local";
  struct Case {
    std::string args, error;
  };
  for (const Case& c : std::vector<Case>{
           {" --nproc-per-node 3 --dist.islands 2", "dist.islands '2' does not divide the world's 3 rank(s)"},
           {" --nproc-per-node 3 --dist.islands 2,2", "dist.islands '2,2' does not divide the world's 3 rank(s)"},
           {" --nproc-per-node 2 --dist.islands 2", "makes one island of the whole world"},
           {" --nproc-per-node 2 --dist.islands two", "dist.islands: 'two' must be auto, node, rank, or island sizes"},
           {" --nproc-per-node 2 --dist.local-steps 4 --dist.outer-fragments 3", "dist.outer-fragments must be >= 1 "
            "and divide dist.local-steps (4)"},
           {" --nproc-per-node 2 --dist.local-steps 4 --dist.outer-fragments 2 --dist.outer-delay 2",
            "dist.outer-delay must be >= 0 and below dist.local-steps / dist.outer-fragments (2)"},
           {" --nproc-per-node 2 --optim.outer-mix 0.3", "optim.outer-mix"}}) {
    auto r = run_cohort(common + c.args + " --out " + (tmp / "run"));
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.error), std::string::npos) << c.args << "\n" << r.err;
    EXPECT_FALSE(std::filesystem::exists(tmp / "run")) << c.args;
  }
  auto step = run_cohort("train --model.name mlp --dist.islands node --out /nonexistent");
  EXPECT_EQ(step.code, 2) << step.err;
  EXPECT_NE(step.err.find("dist.islands"), std::string::npos) << step.err;
  for (const std::string wire : {"int8", "int4"}) {
    auto r = run_cohort("train --model.name mlp --dist.grad-compression " + wire + " --out /nonexistent");
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_NE(r.err.find("a gradient sum in " + wire + " would wrap"), std::string::npos) << r.err;
    EXPECT_EQ(cohort::test::lines_of(r.err).size(), 1u) << r.err;
  }
  auto inside = run_cohort("train --model.name mlp --dist.sync local --dist.islands 2 --dist.island-compression int4 "
                           "--nproc-per-node 4 --oversubscribe --out /nonexistent");
  EXPECT_EQ(inside.code, 2) << inside.err;
  EXPECT_NE(inside.err.find("dist.island-compression"), std::string::npos) << inside.err;
}

TEST(LocalSync, PowerSgdWithLocalStepsIsAConfigError) {
  auto r = run_cohort("train --model.name mlp --dist.sync local --dist.grad-compression powersgd --out /nonexistent");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("dist.grad-compression"), std::string::npos) << r.err;
}

// PowerSGD approximates the summed gradient, and the remainders' sum is
// what every next step adds: all of it is linear in the sum, so from two
// ranks on the loss per step does not depend on how many ranks share the
// batch (up to rounding). One rank has nothing to compress.
TEST(PowerSgd, LossDoesNotDependOnTheWorldSizeFromTwoRanks) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 60);
  std::string common = "train" + kSlowTiny + "--model.dropout 0 --data.global-batch 12 --train.max-steps 15 "
                       "--dist.grad-compression powersgd --dist.powersgd-rank 1 --oversubscribe --data.path " +
                       tmp.path();
  auto two = run_cohort(common + " --nproc-per-node 2 --out " + (tmp / "two"));
  ASSERT_EQ(two.code, 0) << two.err;
  auto three = run_cohort(common + " --nproc-per-node 3 --out " + (tmp / "three"));
  ASSERT_EQ(three.code, 0) << three.err;
  auto exact = run_cohort("train" + kSlowTiny + "--model.dropout 0 --data.global-batch 12 --train.max-steps 15 "
                          "--nproc-per-node 2 --data.path " + tmp.path() + " --out " + (tmp / "exact"));
  ASSERT_EQ(exact.code, 0) << exact.err;
  auto a = cohort::test::train_losses(tmp / "two"), b = cohort::test::train_losses(tmp / "three"), e = cohort::test::train_losses(tmp / "exact");
  ASSERT_EQ(a.size(), 15u);
  ASSERT_EQ(b.size(), 15u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-5 * std::abs(a[i])) << "step " << i + 1;
  EXPECT_GT(std::abs(a[14] - e[14]), 1e-6) << "rank 1 of a 16 x 64 gradient is not the exact sum";
}

// PowerSGD between islands (dist.islands with dist.grad-compression
// powersgd): each island sums its gradients exactly, and island rank i
// compresses every width-th bucket with the other islands and broadcasts it
// inside. PowerSGD's products are linear in the summed gradient, so the run
// is the flat one's at any grouping, islands of unequal sizes too; the
// traffic between islands is one compressed gradient per island. A
// checkpoint mid-run (the Qs, the same on every rank, and each compressing
// rank's remainders) resumes bit for bit.
TEST(PowerSgd, BetweenIslandsTrainsAsFlatPowerSgd) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 60);
  std::string common = "train" + kSlowTiny + "--model.dropout 0 --data.global-batch 12 --train.max-steps 12 "
                       "--dist.grad-compression powersgd --dist.powersgd-rank 1 --oversubscribe --data.path " +
                       tmp.path();
  auto flat = run_cohort(common + " --nproc-per-node 2 --out " + (tmp / "flat"));
  ASSERT_EQ(flat.code, 0) << flat.err;
  const auto a = cohort::test::train_losses(tmp / "flat");
  ASSERT_EQ(a.size(), 12u);
  struct Case {
    const char* name;
    std::string args, says;
  };
  for (const Case& c : std::vector<Case>{
           {"two", " --nproc-per-node 4 --dist.islands 2 --ckpt.every-steps 5",
            "from each island; 2 island(s) of 2 rank(s), gradients summed exactly inside each, compressed between them "
            "(island rank i compresses buckets i, i + 2, ...)"},
           {"uneven", " --nproc-per-node 3 --dist.islands 2,1", "2 island(s) of 2,1 rank(s), gradients summed exactly "
            "inside each, compressed between them (an island's first rank compresses every bucket)"}}) {
    const std::string out = tmp / c.name;
    auto r = run_cohort(common + c.args + " --out " + out);
    ASSERT_EQ(r.code, 0) << c.name << "\n" << r.err;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << r.out;
    const auto b = cohort::test::train_losses(out);
    ASSERT_EQ(b.size(), 12u);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-5 * std::abs(a[i])) << c.name << " step " << i + 1;
  }
  const std::string run = tmp / "two";
  const std::string uninterrupted = model_bytes(run + "/checkpoints/step-12");
  auto again = run_cohort("train --resume " + run + "/checkpoints/step-5 --quiet");
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_TRUE(model_bytes(run + "/checkpoints/step-12") == uninterrupted) << "the resumed run's model differs";
  // Islands of one node on one node: nothing between islands to compress.
  auto one = run_cohort(common + " --nproc-per-node 2 --dist.islands node --out " + (tmp / "one"));
  EXPECT_EQ(one.code, 2) << one.err;
  EXPECT_NE(one.err.find("makes one island of the whole world, which has nobody to meet: drop dist.islands"),
            std::string::npos) << one.err;
}
