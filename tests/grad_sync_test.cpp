// GradSync against the flat all-reduce it must equal, with every rank a
// thread of this process.
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>

#include "cohort/core/error.hpp"
#include "cohort/distributed/comm.hpp"
#include "cohort/sync/grad_sync.hpp"
#include "helpers.hpp"
#include "thread_world.hpp"

using namespace cohort;
using cohort::test::spawn_world;

namespace {

// Parameters of assorted sizes: 7 tensors, 4 bytes per element.
struct Params : torch::nn::Module {
  Params() {
    for (int64_t k = 0; k < 7; ++k) {
      ps.push_back(register_parameter("p" + std::to_string(k), torch::zeros({3 + 5 * k, 2})));
    }
  }
  std::vector<torch::Tensor> ps;
};

// A loss whose gradient for parameter k is an integer tensor depending on
// rank, micro-batch and k: sums are exact in any order, so bucketing and
// reduction order cannot hide a wrong mapping.
torch::Tensor integer_loss(Params& m, int rank, int micro, const std::vector<bool>& used) {
  torch::Tensor loss = torch::zeros({});
  for (size_t k = 0; k < m.ps.size(); ++k) {
    if (!used[k]) continue;
    auto c = torch::arange(m.ps[k].numel()).reshape(m.ps[k].sizes()).to(torch::kFloat32) * float(rank + 1) +
             float(10 * micro + k);
    loss = loss + (m.ps[k] * c).sum();
  }
  return loss;
}

std::vector<torch::Tensor> grads_of(Params& m) {
  std::vector<torch::Tensor> out;
  for (auto& p : m.ps) out.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
  return out;
}

void zero_grads(Params& m) {
  for (auto& p : m.ps)
    if (p.grad().defined()) p.grad().zero_();
}

struct Case {
  int world;
  int64_t cap;    // bytes
  int64_t first;  // bytes
  int accum;
  size_t expect_buckets;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << "world=" << c.world << " cap=" << c.cap << " first=" << c.first << " accum=" << c.accum;
}

class GradSyncMatchesFlat : public ::testing::TestWithParam<Case> {};

}  // namespace

TEST_P(GradSyncMatchesFlat, BitIdentical) {
  Case c = GetParam();
  spawn_world(c.world, [&](Comm& comm) {
    int rank = comm.rank();
    Params m;
    GradSyncOptions o;
    o.bucket_cap_bytes = c.cap;
    o.first_bucket_bytes = c.first;
    GradSync sync(comm, m, o);
    EXPECT_EQ(sync.buckets().size(), c.expect_buckets);
    std::vector<bool> all(7, true);

    for (int micro = 0; micro < c.accum; ++micro) {
      sync.prepare(micro + 1 == c.accum);
      integer_loss(m, rank, micro, all).backward();
      if (micro + 1 < c.accum) {
        EXPECT_EQ(sync.collectives_issued(), 0) << "a collective on a non-final micro-batch";
      }
    }
    EXPECT_EQ(sync.launched(), sync.buckets().size()) << "hooks should launch every bucket during backward";
    sync.finalize();
    EXPECT_EQ(sync.collectives_issued(), static_cast<int64_t>(sync.buckets().size()));
    auto bucketed = grads_of(m);

    // The reference: autograd's own accumulation (no prepare(): the hooks
    // stay idle after finalize()), one flat all-reduce. The losses are
    // integers, so every order of the sums is exact.
    zero_grads(m);
    for (int micro = 0; micro < c.accum; ++micro) integer_loss(m, rank, micro, all).backward();
    all_reduce_gradients(comm, m);
    auto flat = grads_of(m);
    for (size_t k = 0; k < flat.size(); ++k) EXPECT_TRUE(torch::equal(bucketed[k], flat[k])) << "parameter " << k;
  });
}

INSTANTIATE_TEST_SUITE_P(
    Buckets, GradSyncMatchesFlat,
    ::testing::Values(Case{2, 1 << 30, 1 << 30, 1, 1},  // everything in one bucket
                      Case{3, 1, 1, 1, 7},              // one bucket per parameter
                      Case{2, 400, 100, 1, 4},          // several buckets (layout checked below)
                      Case{3, 400, 400, 3, 4},          // several buckets, 3 micro-batches
                      Case{4, 1 << 30, 1 << 30, 2, 1}),
    [](const ::testing::TestParamInfo<Case>& info) { return "case" + std::to_string(info.index); });

// The exact sum: 12 micro-batches whose gradients are fp32 values of mixed
// signs and magnitudes (their fp32 sum depends on its order), computed by 1,
// 2, 3 or 4 ranks, each taking a contiguous run of them as the loader deals
// them. The summed gradients are the same bits every time. The fp32 sum
// (Compression::kFp32) is the control: the same split gives other bits, so
// the check can fail.
TEST(GradSync, ExactSumIsTheSameWhicheverRankComputedEachMicroBatch) {
  constexpr int kMicro = 12;
  auto contribution = [](int64_t numel, int micro, size_t k) {
    auto g = torch::Generator(at::detail::createCPUGenerator(1000 * micro + static_cast<int64_t>(k)));
    return torch::randn({numel}, g) * std::pow(10.0, (micro % 5) - 2);
  };
  auto run = [&](int world, Compression compression) {
    std::vector<torch::Tensor> result;
    std::mutex mu;
    spawn_world(world, [&](Comm& comm) {
      Params m;
      GradSyncOptions o;
      o.compression = compression;
      o.bucket_cap_bytes = 400;
      o.first_bucket_bytes = 100;
      GradSync sync(comm, m, o);
      const int begin = kMicro * comm.rank() / world, end = kMicro * (comm.rank() + 1) / world;
      for (int micro = begin; micro < end; ++micro) {
        sync.prepare(micro + 1 == end);
        torch::Tensor loss = torch::zeros({});
        for (size_t k = 0; k < m.ps.size(); ++k) {
          loss = loss + (m.ps[k].reshape({-1}) * contribution(m.ps[k].numel(), micro, k)).sum();
        }
        loss.backward();
      }
      sync.finalize();
      if (comm.rank() == 0) {
        std::lock_guard<std::mutex> lock(mu);
        result = grads_of(m);
      }
    });
    return result;
  };
  const auto one = run(1, Compression::kNone);
  for (int world : {2, 3, 4}) {
    const auto many = run(world, Compression::kNone);
    for (size_t k = 0; k < one.size(); ++k) {
      EXPECT_TRUE(torch::equal(many[k], one[k])) << "world " << world << " parameter " << k << ": "
                                                 << (many[k] - one[k]).abs().max().item<double>();
    }
  }
  const auto fp32_one = run(1, Compression::kFp32), fp32_three = run(3, Compression::kFp32);
  bool differs = false;
  for (size_t k = 0; k < one.size(); ++k) differs = differs || !torch::equal(fp32_one[k], fp32_three[k]);
  EXPECT_TRUE(differs) << "the fp32 sums should depend on the split: the exact check above proves nothing";
}

// Expected bucket counts for the "several" cases, from the sizes: parameter k
// holds (3 + 5k) * 2 floats = 24 + 40k bytes, packed in reverse order.
TEST(GradSync, BucketLayout) {
  auto comm = Comm::single();
  Params m;
  GradSyncOptions o;
  o.bucket_cap_bytes = 400;
  o.first_bucket_bytes = 100;
  GradSync sync(*comm, m, o);
  // Bytes: p0..p6 = 24, 64, 104, 144, 184, 224, 264. Reverse order: p6 fills
  // the first bucket (cap 100, but a bucket always takes one parameter);
  // p5 (224) + p4 (184) = 408 > 400, so p5 is alone; p4 + p3 = 328 fits,
  // + p2 = 432 does not; p2 + p1 + p0 = 192.
  std::vector<std::vector<size_t>> expect = {{6}, {5}, {4, 3}, {2, 1, 0}};
  EXPECT_EQ(sync.buckets(), expect);
}

TEST(GradSync, UnusedParameterDoesNotHang) {
  spawn_world(3, [&](Comm& comm) {
    int rank = comm.rank();
    Params m;
    GradSync sync(comm, m, {});
    std::vector<bool> used(7, true);
    used[2] = rank != 1;  // rank 1 never touches p2
    used[5] = false;      // nobody touches p5
    sync.prepare(true);
    integer_loss(m, rank, 0, used).backward();
    sync.finalize();
    auto g = grads_of(m);
    EXPECT_TRUE(g[5].eq(0).all().item<bool>());
    // p2 = sum over ranks 0 and 2 of (arange * (rank+1) + 2).
    auto ar = torch::arange(m.ps[2].numel()).reshape(m.ps[2].sizes()).to(torch::kFloat32);
    EXPECT_TRUE(torch::equal(g[2], ar * 1 + 2 + ar * 3 + 2));
  });
}

// Gloo in libtorch 2.x sums fp16 and bf16 alike: both wire dtypes give the
// fp32 sum within their precision.
class GradSyncCompression : public ::testing::TestWithParam<const char*> {};

TEST_P(GradSyncCompression, IsCloseToTheExactSum) {
  spawn_world(2, [&](Comm& comm) {
    int rank = comm.rank();
    Params m;
    GradSyncOptions o;
    o.compression = parse_choice<Compression>("dist.grad-compression", GetParam());
    GradSync sync(comm, m, o);
    std::vector<bool> all(7, true);
    sync.prepare(true);
    integer_loss(m, rank, 0, all).backward();
    sync.finalize();
    auto compressed = grads_of(m);
    zero_grads(m);
    sync.prepare(false);
    integer_loss(m, rank, 0, all).backward();
    all_reduce_gradients(comm, m);
    auto exact = grads_of(m);
    for (size_t k = 0; k < exact.size(); ++k) {
      EXPECT_EQ(compressed[k].scalar_type(), torch::kFloat32) << k;
      EXPECT_TRUE(torch::allclose(compressed[k], exact[k], /*rtol=*/1e-2, /*atol=*/1e-2)) << k;
    }
    // Random floats are not exact in 16 bits: the sum really went over the
    // wire in the narrow dtype. (Ranks are threads here, so the weights come
    // from a generator of their own, not the global one they would race on.)
    torch::nn::Linear net(16, 8);
    {
      torch::NoGradGuard no_grad;
      auto gen = at::detail::createCPUGenerator(3);
      net->weight.copy_(torch::randn({8, 16}, gen));
      net->bias.copy_(torch::randn({8}, gen));
    }
    GradSync wire(comm, *net, o);
    auto x = torch::randn({4, 16}, torch::Generator(at::detail::createCPUGenerator(7 + rank)));
    wire.prepare(true);
    net->forward(x).pow(2).sum().backward();
    wire.finalize();
    auto narrow = net->weight.grad().clone();
    net->weight.mutable_grad().zero_();
    net->bias.mutable_grad().zero_();
    wire.prepare(false);
    net->forward(x).pow(2).sum().backward();
    auto mine = net->weight.grad().clone();
    all_reduce_gradients(comm, *net);
    auto summed = net->weight.grad().clone();
    // Rounding each rank's gradient and then the sum to a unit roundoff u
    // errs by at most about 2u times the sum of the magnitudes, however much
    // the ranks' gradients cancel.
    net->weight.mutable_grad().copy_(mine.abs());
    net->bias.mutable_grad().zero_();
    all_reduce_gradients(comm, *net);
    const bool bf16 = std::string(GetParam()) == "bf16";
    const double u = bf16 ? 1.0 / 256 : 1.0 / 2048;
    auto bound = net->weight.grad() * (2.5 * u) + 1e-6;
    auto err = (narrow - summed).abs();
    EXPECT_TRUE(err.le(bound).all().item<bool>())
        << "rank " << rank << ": error " << err.max().item<double>() << " where the bound is "
        << bound.flatten().index({(err - bound).argmax()}).item<double>();
    // bf16 errs where fp16 would not: the wire held bf16, not fp16.
    if (bf16) {
      EXPECT_TRUE(err.gt(net->weight.grad() * (2.5 / 2048) + 1e-6).any().item<bool>()) << "as exact as fp16";
    }
    EXPECT_FALSE(torch::equal(narrow, summed)) << "no rounding: was the gradient compressed?";
  });
}

INSTANTIATE_TEST_SUITE_P(WireDtypes, GradSyncCompression, ::testing::Values("fp16", "bf16"));

// A real network, random floats: with 2 ranks the sum is order-free, so the
// result must be bit-identical too.
TEST(GradSync, MlpGradientsMatchFlat) {
  spawn_world(2, [&](Comm& comm) {
    int rank = comm.rank();
    torch::manual_seed(0);
    torch::nn::Sequential net(torch::nn::Linear(16, 64), torch::nn::ReLU(), torch::nn::Linear(64, 64),
                              torch::nn::ReLU(), torch::nn::Linear(64, 3));
    GradSyncOptions o;
    o.bucket_cap_bytes = 8 << 10;
    o.first_bucket_bytes = 1 << 10;
    GradSync sync(comm, *net, o);
    EXPECT_GT(sync.buckets().size(), 2u);
    auto x = torch::randn({8, 16}, torch::Generator(at::detail::createCPUGenerator(100 + rank)));
    sync.prepare(true);
    net->forward(x).pow(2).sum().backward();
    sync.finalize();
    std::vector<torch::Tensor> bucketed;
    for (auto& p : net->parameters()) bucketed.push_back(p.grad().clone());
    for (auto& p : net->parameters()) p.grad().zero_();
    sync.prepare(false);
    net->forward(x).pow(2).sum().backward();
    all_reduce_gradients(comm, *net);
    size_t k = 0;
    for (auto& p : net->parameters()) EXPECT_TRUE(torch::equal(bucketed[k++], p.grad()));
  });
}

// dist.shard = gradients: no gradient stays on the parameters; the sink
// gets every bucket's sum, once per micro-batch (accumulated there), with
// zeros for a parameter that got no gradient, and many small buckets pass
// the one-bucket-in-flight limit without a hang.
struct SumSink : GradShardSink {
  explicit SumSink(const std::vector<int64_t>& numels) {
    for (auto n : numels) sums.push_back(torch::zeros({n}));
  }
  void add_reduced(const std::vector<size_t>& params, const torch::Tensor& flat) override {
    int64_t offset = 0;
    for (size_t k : params) {
      sums[k].add_(flat.narrow(0, offset, sums[k].numel()));
      offset += sums[k].numel();
    }
  }
  std::vector<torch::Tensor> sums;
};

TEST(GradSync, SinkGetsEverySumAndNoGradientStays) {
  spawn_world(3, [&](Comm& comm) {
    int rank = comm.rank();
    torch::manual_seed(0);
    torch::nn::Sequential net(torch::nn::Linear(16, 64), torch::nn::ReLU(), torch::nn::Linear(64, 64),
                              torch::nn::ReLU(), torch::nn::Linear(64, 3));
    net->register_parameter("unused", torch::ones({5}));
    std::vector<int64_t> numels;
    for (auto& p : net->parameters()) numels.push_back(p.numel());
    SumSink sink(numels);
    GradSyncOptions o;
    o.bucket_cap_bytes = 2 << 10;
    o.first_bucket_bytes = 1 << 10;
    o.sink = &sink;
    GradSync sync(comm, *net, o);
    EXPECT_GT(sync.buckets().size(), 4u);
    auto gen = torch::Generator(at::detail::createCPUGenerator(100 + rank));
    auto x1 = torch::randn({8, 16}, gen), x2 = torch::randn({4, 16}, gen);
    for (const auto& x : {x1, x2}) {  // two micro-batches: each reduced, summed in the sink
      sync.prepare(/*sync=*/false);
      net->forward(x).pow(2).sum().backward();
      for (auto& p : net->parameters()) EXPECT_FALSE(p.grad().defined());
    }
    sync.finalize();
    // The reference: both micro-batches accumulated, one flat all-reduce.
    torch::nn::Sequential ref(torch::nn::Linear(16, 64), torch::nn::ReLU(), torch::nn::Linear(64, 64),
                              torch::nn::ReLU(), torch::nn::Linear(64, 3));
    ref->register_parameter("unused", torch::ones({5}));
    {
      torch::NoGradGuard no_grad;
      auto a = net->parameters(), b = ref->parameters();
      for (size_t k = 0; k < a.size(); ++k) b[k].copy_(a[k]);
    }
    for (const auto& x : {x1, x2}) ref->forward(x).pow(2).sum().backward();
    all_reduce_gradients(comm, *ref);
    auto b = ref->parameters();
    for (size_t k = 0; k < b.size(); ++k) {
      EXPECT_TRUE(torch::allclose(sink.sums[k], b[k].grad().reshape({-1}), 1e-5, 1e-6)) << "parameter " << k;
    }
    size_t unused_at = 0;  // a module's own parameters come before its children's
    for (const auto& item : net->named_parameters()) {
      if (item.key() == "unused") break;
      ++unused_at;
    }
    EXPECT_TRUE(torch::equal(sink.sums.at(unused_at), torch::zeros({5})));
  });
}
