// The communicator, with every rank as a thread of this process.
#include <gtest/gtest.h>

#include <chrono>

#include "cohort/core/error.hpp"
#include "cohort/distributed/comm.hpp"
#include "cohort/distributed/rendezvous.hpp"
#include "helpers.hpp"

using namespace cohort;
using cohort::test::spawn;
using cohort::test::error_of;
using cohort::test::TempDir;

namespace {

enum class Via { kTcp, kFile, kEnv };

CommOptions quick(int timeout_s = 30) {
  CommOptions o;
  o.timeout = std::chrono::seconds(timeout_s);
  o.heartbeat = std::chrono::milliseconds(200);
  o.device = DeviceKind::kCpu;
  return o;
}

RankSpec spec_via(Via via, int rank, int n, int port, const std::string& file) {
  if (via == Via::kEnv) {
    Env env = {{"RANK", std::to_string(rank)},  {"WORLD_SIZE", std::to_string(n)},
               {"LOCAL_RANK", std::to_string(rank)}, {"LOCAL_WORLD_SIZE", std::to_string(n)},
               {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)}};
    return *detect_rank_spec(env, "");
  }
  RankSpec s;
  s.rank = s.local_rank = rank;
  s.world_size = s.local_world_size = n;
  s.init = parse_init_method(via == Via::kTcp ? "tcp://127.0.0.1:" + std::to_string(port) : "file://" + file);
  s.host_store = rank == 0;
  return s;
}

}  // namespace

std::string world_name(const ::testing::TestParamInfo<std::tuple<Via, int>>& info) {
  static const char* const kVia[] = {"tcp", "file", "env"};
  return std::string(kVia[static_cast<int>(std::get<0>(info.param))]) + "_world" +
         std::to_string(std::get<1>(info.param));
}

class FormWorld : public ::testing::TestWithParam<std::tuple<Via, int>> {};

TEST_P(FormWorld, CollectivesGiveClosedForms) {
  auto [via, n] = GetParam();
  TempDir tmp;
  int port = cohort::test::free_port();
  spawn(n, [&, via = via, n = n](int rank) {
    auto comm = Comm::connect(spec_via(via, rank, n, port, tmp / "store"), quick());
    ASSERT_EQ(comm->rank(), rank);
    ASSERT_EQ(comm->size(), n);

    auto t = torch::tensor({double(rank), 1.0});
    comm->all_reduce_sum(t);
    EXPECT_EQ(t[0].item<double>(), n * (n - 1) / 2.0);
    EXPECT_EQ(t[1].item<double>(), n);

    auto b = torch::full({3}, rank == n - 1 ? 42.0 : -1.0);
    comm->broadcast(b, n - 1);
    EXPECT_TRUE(b.eq(42.0).all().item<bool>());

    // Rank r contributes r rows of value r (rank 0 contributes none).
    auto parts = comm->all_gather(torch::full({rank, 2}, int64_t(rank)));
    ASSERT_EQ(static_cast<int>(parts.size()), n);
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(parts[r].size(0), r);
      EXPECT_TRUE(parts[r].eq(r).all().item<bool>());
    }
    comm->agree({7, 8}, {"step", "cursor"}, "a test");
    comm->barrier();
  });
}

INSTANTIATE_TEST_SUITE_P(Methods, FormWorld,
                         ::testing::Combine(::testing::Values(Via::kTcp, Via::kFile, Via::kEnv),
                                            ::testing::Values(1, 2, 3, 4)),
                         world_name);

TEST(Comm, DivergingRankIsNamedOnEveryRank) {
  int port = cohort::test::free_port();
  std::vector<std::string> errors(3);
  spawn(3, [&](int rank) {
    auto comm = Comm::connect(spec_via(Via::kTcp, rank, 3, port, ""), quick());
    errors[rank] = error_of([&] { comm->agree({rank == 2 ? 41 : 42, 5}, {"step", "cursor"}, "the step check"); });
  });
  for (const auto& e : errors) EXPECT_NE(e.find("rank 2 has step 41 but rank 0 has 42"), std::string::npos) << e;
}

TEST(Comm, WrongSecretIsRefused) {
  int port = cohort::test::free_port();
  std::vector<std::string> errors(2);
  spawn(2, [&](int rank) {
    CommOptions o = quick(4);
    o.secret = rank == 0 ? "right" : "wrong";
    errors[rank] = error_of([&] { Comm::connect(spec_via(Via::kTcp, rank, 2, port, ""), o); });
  });
  EXPECT_NE(errors[1].find("secret differs"), std::string::npos) << errors[1];
  EXPECT_NE(errors[0], "(no error)");  // rank 0 never gets its peer: a timeout, not a hang
}

TEST(Comm, PortInUseIsAClearError) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  listen(fd, 1);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int port = ntohs(addr.sin_port);
  auto t0 = std::chrono::steady_clock::now();
  std::string e = error_of([&] { Comm::connect(spec_via(Via::kTcp, 0, 2, port, ""), quick(5)); });
  close(fd);
  EXPECT_NE(e.find("cannot host the rendezvous store"), std::string::npos) << e;
  EXPECT_NE(e.find(std::to_string(port)), std::string::npos) << e;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
}

TEST(Comm, UnreachableMasterFailsWithinTheTimeout) {
  int port = cohort::test::free_port();  // nobody listens here
  auto t0 = std::chrono::steady_clock::now();
  std::string e = error_of([&] { Comm::connect(spec_via(Via::kTcp, 1, 2, port, ""), quick(3)); });
  EXPECT_NE(e.find("cannot reach the rendezvous store"), std::string::npos) << e;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(15));
}

TEST(Rendezvous, ParsesInitMethods) {
  auto tcp = parse_init_method("tcp://10.0.0.5:1234");
  EXPECT_EQ(tcp.kind, InitMethod::Kind::kTcp);
  EXPECT_EQ(tcp.host, "10.0.0.5");
  EXPECT_EQ(tcp.port, 1234);
  EXPECT_EQ(parse_init_method("file:///shared/x").path, "/shared/x");
  EXPECT_EQ(parse_init_method("env://").kind, InitMethod::Kind::kEnv);
  EXPECT_EQ(parse_init_method("").kind, InitMethod::Kind::kNone);
  EXPECT_THROW(parse_init_method("tcp://host"), UsageError);
  EXPECT_THROW(parse_init_method("tcp://host:99999"), UsageError);
  EXPECT_THROW(parse_init_method("file://relative"), UsageError);
  EXPECT_THROW(parse_init_method("udp://x:1"), UsageError);
}

TEST(Rendezvous, SlurmVariables) {
  EXPECT_EQ(slurm_first_host("gpu[03-05,9],cpu1"), "gpu03");
  EXPECT_EQ(slurm_first_host("node7,node8"), "node7");
  EXPECT_EQ(slurm_first_host("a[1-2]"), "a1");
  Env env = {{"SLURM_PROCID", "5"},        {"SLURM_NTASKS", "7"},         {"SLURM_LOCALID", "1"},
             {"SLURM_NODEID", "2"},        {"SLURM_TASKS_PER_NODE", "2(x2),3"},
             {"SLURM_JOB_NODELIST", "gpu[03-05]"}};
  auto s = detect_rank_spec(env, "");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->source, "SLURM");
  EXPECT_EQ(s->rank, 5);
  EXPECT_EQ(s->world_size, 7);
  EXPECT_EQ(s->local_rank, 1);
  EXPECT_EQ(s->local_world_size, 3);  // node 2 is the third node: 3 tasks
  EXPECT_EQ(s->node_rank, 2);
  EXPECT_EQ(s->init.host, "gpu03");
  EXPECT_EQ(s->init.port, 29500);
  EXPECT_FALSE(s->host_store);
  // Hardening: two jobs on one node must not share the default port.
  env["SLURM_JOB_ID"] = "123456";
  EXPECT_EQ(detect_rank_spec(env, "")->init.port, 29500 + 3456);
  // --init-method overrides the node list; MASTER_PORT overrides the port.
  env["MASTER_PORT"] = "4242";
  EXPECT_EQ(detect_rank_spec(env, "")->init.port, 4242);
  EXPECT_EQ(detect_rank_spec(env, "tcp://login:1")->init.host, "login");
  env["SLURM_PROCID"] = "9";
  EXPECT_THROW(detect_rank_spec(env, ""), UsageError);  // rank outside the world
}

TEST(Rendezvous, OpenMpiVariables) {
  Env env = {{"OMPI_COMM_WORLD_RANK", "0"},       {"OMPI_COMM_WORLD_SIZE", "4"},
             {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
             {"MASTER_ADDR", "head"},             {"MASTER_PORT", "7000"}};
  auto s = detect_rank_spec(env, "");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->source, "Open MPI");
  EXPECT_EQ(s->world_size, 4);
  EXPECT_EQ(s->local_world_size, 2);
  EXPECT_TRUE(s->host_store);
  EXPECT_EQ(s->init.text, "tcp://head:7000");
  env.erase("MASTER_ADDR");
  try {
    detect_rank_spec(env, "");
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("mpirun"), std::string::npos) << e.what();
  }
}

// Hardening: as the README says, LOCAL_RANK may come without
// LOCAL_WORLD_SIZE (it was refused: "local rank 1 is outside local world
// size 1").
TEST(Rendezvous, EnvLocalRankWithoutLocalWorldSize) {
  Env env = {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "127.0.0.1"}};
  auto s = detect_rank_spec(env, "");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->local_rank, 1);
  EXPECT_EQ(s->local_world_size, 2);
  EXPECT_TRUE(resolves("127.0.0.1"));
  EXPECT_FALSE(resolves("nohost.invalid"));
}

TEST(Rendezvous, PlainProcessIsSingle) {
  EXPECT_FALSE(detect_rank_spec(Env{{"HOME", "/root"}}, ""));
  Env env = {{"RANK", "1"}, {"WORLD_SIZE", "2"}};
  EXPECT_THROW(detect_rank_spec(env, ""), UsageError);  // env:// without MASTER_ADDR
}
