// Elastic membership (--min-nodes): hosts that leave and join mid-run.
// The multi-host tests run each launcher in a network namespace of its own
// (SKIPPED without root); the others use loopback.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <sstream>

#include "cohort/ckpt/safetensors.hpp"
#include "helpers.hpp"

using cohort::test::Background;
using cohort::test::NetnsHosts;
using cohort::test::read_file;
using cohort::test::run_cohort;
using cohort::test::TempDir;
using namespace std::chrono_literals;

namespace {

using Clock = std::chrono::steady_clock;

using cohort::test::wait_until;

std::vector<nlohmann::json> lines_of_kind(const std::string& metrics, const std::string& kind) {
  std::vector<nlohmann::json> out;
  for (const auto& line : cohort::test::lines_of(read_file(metrics))) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded() && j.value("kind", "") == kind) out.push_back(j);
  }
  return out;
}

// scripts/gpu-check.sh sets COHORT_TEST_CUDA=1 to run a test's ranks on
// the GPU (several ranks share it, over Gloo: NCCL refuses two ranks on one
// device).
std::string device_flags() {
  const char* cuda = std::getenv("COHORT_TEST_CUDA");
  return cuda && std::string(cuda) == "1" ? " --train.device cuda --dist.backend gloo" : "";
}

// Waits for `ready`, or for `job` to end first (then false). No limit of
// the test's own: the job's timeouts (dist.timeout, heartbeats) end it
// however busy the machine is, and ctest's TIMEOUT bounds a broken build.
bool once(const std::function<bool()>& ready, Background& job) {
  while (!ready()) {
    if (job.ended()) return ready();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

bool reached_step(const std::string& metrics, int64_t step) {
  for (const auto& j : lines_of_kind(metrics, "train")) {
    if (j["step"].get<int64_t>() >= step) return true;
  }
  return false;
}

// Every sample of every epoch exactly once over every sample-ids file.
void expect_every_sample_once(const std::string& run, int64_t samples, int64_t epochs) {
  std::map<int64_t, std::vector<int64_t>> per_epoch;
  for (const auto& e : std::filesystem::directory_iterator(run + "/sample-ids")) {
    for (const auto& line : cohort::test::lines_of(read_file(e.path().string()))) {
      auto j = nlohmann::json::parse(line);
      for (int64_t id : j["ids"]) per_epoch[j["epoch"].get<int64_t>()].push_back(id);
    }
  }
  ASSERT_EQ(static_cast<int64_t>(per_epoch.size()), epochs);
  for (auto& [epoch, ids] : per_epoch) {
    std::sort(ids.begin(), ids.end());
    std::vector<int64_t> all(static_cast<size_t>(samples));
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(ids, all) << "epoch " << epoch << ": " << ids.size() << " ids";
  }
}

// The model of a run's newest checkpoint.
std::map<std::string, torch::Tensor> final_model(const std::string& run) {
  std::string latest = read_file(run + "/checkpoints/latest");
  latest.erase(latest.find_last_not_of("\n ") + 1);
  auto file = cohort::load_safetensors(run + "/checkpoints/" + latest + "/model.safetensors");
  return {file.tensors.begin(), file.tensors.end()};
}

// Every step of the run's (80 by default) once in the log, every one of
// the 240 samples once in each of its epochs (4, 20 steps each).
void expect_each_step_and_sample_once(const TempDir& tmp, int64_t epochs = 4) {
  std::set<int64_t> steps;
  for (const auto& j : lines_of_kind(tmp / "run/metrics.jsonl", "train")) {
    EXPECT_TRUE(steps.insert(j["step"].get<int64_t>()).second);
  }
  EXPECT_EQ(static_cast<int64_t>(steps.size()), 20 * epochs);
  expect_every_sample_once(tmp / "run", 240, epochs);
}

// The elastic run's final weights are those of `fixed` (a run checkpointing
// every step) on `from` ranks, resumed at step `resumed` on `to` ranks.
void expect_weights_of_a_resume(const TempDir& tmp, const std::string& fixed, int from, int64_t resumed, int to) {
  const std::string ref = "ref" + std::to_string(from), after = "ref" + std::to_string(to);
  auto first = run_cohort(fixed + " --nproc-per-node " + std::to_string(from) + " --out " + (tmp / ref));
  ASSERT_EQ(first.code, 0) << first.err;
  auto second = run_cohort(" train --quiet --oversubscribe --nproc-per-node " + std::to_string(to) + " --resume " +
                           (tmp / ref) + "/checkpoints/step-" + std::to_string(resumed) + " --out " + (tmp / after));
  ASSERT_EQ(second.code, 0) << second.err;
  auto elastic = final_model(tmp / "run"), reference = final_model(tmp / after);
  ASSERT_EQ(elastic.size(), reference.size());
  for (const auto& [name, t] : reference) {
    ASSERT_TRUE(elastic.count(name)) << name;
    EXPECT_LT((elastic[name] - t).abs().max().item<double>(), 1e-5) << name;
  }
}

// A tiny MLP run long enough to lose a host in: 240 samples, 20 steps an
// epoch; rank 0 of every world is slowed so that the run lasts seconds.
std::string elastic_args(const TempDir& tmp, const std::string& master, int port, int epochs) {
  return cohort::strf(
      " train --model.name mlp --model.dropout 0 --data.global-batch 12 --train.epochs %d --log.every-steps 1 "
      "--log.sample-ids --dist.timeout 30 --init-method tcp://%s:%d --nnodes 3 --min-nodes 2 --quiet "
      "--data.path %s --out %s",
      epochs, master.c_str(), port, tmp.path().c_str(), (tmp / "run").c_str());
}

std::string launcher(const NetnsHosts& net, int host, const std::string& args) {
  return net.on(host, std::string("env COHORT_DEBUG_DELAY=0:60 ") + COHORT_BIN + args + " --node-rank " +
                          std::to_string(host));
}

// Three hosts train the run of `args`; host 2's launcher is killed once
// step 10 is logged, and the other two must finish. `out0`: host 0's output.
void lose_host_two(const NetnsHosts& net, const TempDir& tmp, const std::string& args, std::string* out0 = nullptr) {
  Background h0(launcher(net, 0, args), tmp, "h0"), h1(launcher(net, 1, args), tmp, "h1"),
      h2(launcher(net, 2, args), tmp, "h2");
  const std::string metrics = tmp / "run/metrics.jsonl";
  ASSERT_TRUE(once([&] { return reached_step(metrics, 10); }, h0)) << h0.err() << h2.err();
  kill(h2.pid(), SIGKILL);
  h2.wait(10s);
  ASSERT_EQ(h0.wait_exit(), 0) << h0.err();
  ASSERT_EQ(h1.wait_exit(), 0) << h1.err();
  if (out0) *out0 = h0.out();
}

// A launcher on loopback as node `node`, its rank 0 of every world slowed.
std::unique_ptr<Background> loopback_node(const TempDir& tmp, const std::string& args, int node) {
  return std::make_unique<Background>(std::string("env COHORT_DEBUG_DELAY=0:60 ") + COHORT_BIN + args +
                                          " --node-rank " + std::to_string(node), tmp, "n" + std::to_string(node));
}

// A launcher's worker (its only child), or -1.
pid_t only_child(pid_t launcher) {
  std::string children = read_file("/proc/" + std::to_string(launcher) + "/task/" + std::to_string(launcher) +
                                   "/children");
  return children.empty() ? -1 : std::stoi(children);
}

// Whether process `pid` ignores signal `sig` (its SigIgn mask in /proc).
bool ignores(pid_t pid, int sig) {
  std::istringstream in(read_file("/proc/" + std::to_string(pid) + "/status"));
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("SigIgn:", 0) == 0) return (std::stoull(line.substr(7), nullptr, 16) >> (sig - 1)) & 1u;
  }
  return false;
}

}  // namespace

// Three hosts train; host 2's launcher is killed mid-epoch. The other two
// notice, form a world of two from memory and finish: every sample of every
// epoch is trained on exactly once, and the final weights are those of a run
// checkpointed at the last step before the death and resumed on two ranks.
TEST(Elastic, HostKilledMidEpochTheOthersFinishFromMemory) {
  NetnsHosts net(3, 232);
  if (!net.ok()) GTEST_SKIP() << "SKIPPED: network namespaces need root and iproute2";
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 240);
  const std::string args = elastic_args(tmp, net.address(0), 29641, 4);
  ASSERT_NO_FATAL_FAILURE(lose_host_two(net, tmp, args));
  const std::string metrics = tmp / "run/metrics.jsonl";

  auto changes = lines_of_kind(metrics, "membership");
  ASSERT_EQ(changes.size(), 1u) << read_file(metrics);
  const auto& c = changes[0];
  EXPECT_EQ(c["world_size"], 2);
  EXPECT_EQ(c["nodes"], 2);
  EXPECT_EQ(c["state"], "memory");
  ASSERT_EQ(c["left"].size(), 1u);
  EXPECT_NE(c["left"][0].get<std::string>().find("node 2"), std::string::npos) << c.dump();
  EXPECT_LT(c["recovery_s"].get<double>(), 30.0 + 5.0) << c.dump();
  const int64_t resumed = c["step"];
  EXPECT_GE(resumed, 10);
  EXPECT_LT(resumed, 80);

  // Every step once in the log, every sample once per epoch.
  expect_each_step_and_sample_once(tmp);

  // The same run checkpointed at `resumed` on three ranks and resumed on two.
  const std::string fixed = cohort::strf(
      " train --model.name mlp --model.dropout 0 --data.global-batch 12 --train.epochs 4 --ckpt.every-steps 1 "
      "--ckpt.keep 100 --quiet --data.path %s --oversubscribe",
      tmp.path().c_str());
  expect_weights_of_a_resume(tmp, fixed, 3, resumed, 2);
}

// dist.sync = local: host 2 is killed mid-window. The survivors go on from
// the last sync (its model, step, cursor and outer momentum, the same on
// each) and train the steps since again: every step once in the log, every
// sample once per epoch.
TEST(Elastic, LocalStepsGoOnFromTheLastSync) {
  NetnsHosts net(3, 236);
  if (!net.ok()) GTEST_SKIP() << "SKIPPED: network namespaces need root and iproute2";
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 240);
  std::string args = elastic_args(tmp, net.address(0), 29645, 3) + " --dist.sync local --dist.local-steps 4";
  args.replace(args.find(" --quiet"), 8, "");
  std::string out0;
  ASSERT_NO_FATAL_FAILURE(lose_host_two(net, tmp, args, &out0));
  const std::string metrics = tmp / "run/metrics.jsonl";

  auto changes = lines_of_kind(metrics, "membership");
  ASSERT_EQ(changes.size(), 1u) << read_file(metrics);
  EXPECT_EQ(changes[0]["state"], "memory");
  const int64_t resumed = changes[0]["step"];
  EXPECT_EQ(resumed % 4, 0) << "the new world starts at a sync: " << changes[0].dump();
  std::string note = cohort::strf("going on from the last sync, step %lld", static_cast<long long>(resumed));
  bool at_a_sync = out0.find("going on from the last sync") == std::string::npos;
  EXPECT_TRUE(at_a_sync || out0.find(note) != std::string::npos) << out0;

  std::set<int64_t> steps;
  for (const auto& j : lines_of_kind(metrics, "train")) EXPECT_TRUE(steps.insert(j["step"].get<int64_t>()).second);
  EXPECT_EQ(steps.size(), 60u);
  expect_every_sample_once(tmp / "run", 240, 3);
}

// ModernBERT (packed rows, activation checkpointing, dropout on) loses host
// 2 mid-run: the survivors go on from rank 0's memory at the step they
// reached, every step logged once, every sample once per epoch.
TEST(Elastic, ModernBertGoesOnWithoutALostHost) {
  NetnsHosts net(3, 237);
  if (!net.ok()) GTEST_SKIP() << "SKIPPED: network namespaces need root and iproute2";
  TempDir tmp;
  const std::string data = cohort::test::packable_bert_data();
  const std::string args = " train" + cohort::test::kTinyModernBert + cohort::strf(
      "--data.pack --train.activation-checkpointing --data.global-batch 8 --train.epochs 2 "
      "--train.precision fp32 --log.every-steps 1 --log.sample-ids --dist.timeout 30 --init-method tcp://%s:%d "
      "--nnodes 3 --min-nodes 2 --quiet --data.path %s --out %s",
      net.address(0).c_str(), 29649, data.c_str(), (tmp / "run").c_str());
  ASSERT_NO_FATAL_FAILURE(lose_host_two(net, tmp, args));
  const std::string metrics = tmp / "run/metrics.jsonl";
  auto changes = lines_of_kind(metrics, "membership");
  ASSERT_EQ(changes.size(), 1u) << read_file(metrics);
  EXPECT_EQ(changes[0]["state"], "memory") << changes[0].dump();
  EXPECT_GE(changes[0]["step"].get<int64_t>(), 10) << changes[0].dump();
  std::set<int64_t> steps;
  for (const auto& j : lines_of_kind(metrics, "train")) EXPECT_TRUE(steps.insert(j["step"].get<int64_t>()).second);
  const int64_t samples =
      nlohmann::json::parse(read_file(data + "/manifest.json"))["splits"]["train"]["rows"].get<int64_t>();
  EXPECT_EQ(static_cast<int64_t>(steps.size()), 2 * ((samples + 7) / 8));
  expect_every_sample_once(tmp / "run", samples, 2);
}

// A host lost mid-run joins again: the world shrinks to two and grows back
// to three, and no sample is lost or repeated.
TEST(Elastic, HostJoinsMidRunAndTheWorldGrowsBack) {
  NetnsHosts net(3, 233);
  if (!net.ok()) GTEST_SKIP() << "SKIPPED: network namespaces need root and iproute2";
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 240);
  const std::string args = elastic_args(tmp, net.address(0), 29642, 8);
  Background h0(launcher(net, 0, args), tmp, "h0"), h1(launcher(net, 1, args), tmp, "h1");
  auto h2 = std::make_unique<Background>(launcher(net, 2, args), tmp, "h2");
  const std::string metrics = tmp / "run/metrics.jsonl";
  ASSERT_TRUE(once([&] { return reached_step(metrics, 10); }, h0)) << h0.err();
  kill(h2->pid(), SIGKILL);
  h2->wait(10s);
  ASSERT_TRUE(once([&] { return !lines_of_kind(metrics, "membership").empty(); }, h0))
      << "node 0:\n" << h0.err() << "node 1:\n" << h1.err();
  Background again(launcher(net, 2, args), tmp, "h2-again");
  ASSERT_EQ(h0.wait_exit(), 0) << h0.err();
  ASSERT_EQ(h1.wait_exit(), 0) << h1.err();
  ASSERT_EQ(again.wait_exit(), 0) << again.err();

  auto changes = lines_of_kind(metrics, "membership");
  ASSERT_EQ(changes.size(), 2u) << read_file(metrics);
  EXPECT_EQ(changes[0]["world_size"], 2);
  EXPECT_EQ(changes[1]["world_size"], 3);
  EXPECT_EQ(changes[1]["state"], "memory");
  ASSERT_EQ(changes[1]["joined"].size(), 1u);
  EXPECT_NE(changes[1]["joined"][0].get<std::string>().find("node 2"), std::string::npos) << changes[1].dump();
  EXPECT_GT(changes[1]["step"].get<int64_t>(), changes[0]["step"].get<int64_t>());
  EXPECT_EQ(lines_of_kind(metrics, "train").size(), 160u);
  expect_every_sample_once(tmp / "run", 240, 8);
}

// A rank that stops (SIGSTOP) without dying is noticed through its
// heartbeat: the others abandon the collective it holds up and go on.
TEST(Elastic, StalledRankIsLeftBehind) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 240);
  int port = cohort::test::free_port();
  const std::string args = elastic_args(tmp, "127.0.0.1", port, 4) + " --oversubscribe";
  auto start = [&](int node) { return loopback_node(tmp, args, node); };
  auto n0 = start(0), n1 = start(1), n2 = start(2);
  const std::string metrics = tmp / "run/metrics.jsonl";
  ASSERT_TRUE(once([&] { return reached_step(metrics, 10); }, *n0)) << n0->err();
  pid_t worker = only_child(n2->pid());  // node 2's worker
  ASSERT_GT(worker, 0);
  // A peer's death must fail a collective, not kill the rank writing to it:
  // Gloo writes into sockets the peer has reset, so ranks ignore SIGPIPE.
  EXPECT_TRUE(ignores(worker, SIGPIPE));
  kill(worker, SIGSTOP);
  ASSERT_EQ(n0->wait_exit(), 0) << n0->err();
  ASSERT_EQ(n1->wait_exit(), 0) << n1->err();
  kill(worker, SIGKILL);
  auto changes = lines_of_kind(metrics, "membership");
  ASSERT_EQ(changes.size(), 1u) << read_file(metrics);
  EXPECT_EQ(changes[0]["world_size"], 2);
  EXPECT_NE(changes[0]["cause"].get<std::string>().find("stopped beating"), std::string::npos) << changes[0].dump();
  expect_every_sample_once(tmp / "run", 240, 4);
}

// Fewer than --min-nodes left: the survivor waits dist.timeout for a node to
// join, then its launcher falls back to a restart from the checkpoint (none
// left here: --max-restarts 0) and says why.
TEST(Elastic, FewerThanMinNodesFallsBackToTheLauncher) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 240);
  int port = cohort::test::free_port();
  const std::string args = cohort::strf(
      " train --model.name mlp --data.global-batch 12 --train.epochs 8 --log.every-steps 1 --dist.timeout 4 "
      "--init-method tcp://127.0.0.1:%d --nnodes 2 --min-nodes 2 --quiet --data.path %s --out %s",
      port, tmp.path().c_str(), (tmp / "run").c_str());
  Background n0(std::string("env COHORT_DEBUG_DELAY=0:60 ") + COHORT_BIN + args + " --node-rank 0", tmp, "n0");
  Background n1(std::string("env COHORT_DEBUG_DELAY=0:60 ") + COHORT_BIN + args + " --node-rank 1", tmp, "n1");
  ASSERT_TRUE(once([&] { return reached_step(tmp / "run/metrics.jsonl", 5); }, n0)) << n0.err();
  kill(n1.pid(), SIGKILL);
  auto t0 = Clock::now();
  EXPECT_EQ(n0.wait_exit(), 1) << n0.err();
  EXPECT_LT(Clock::now() - t0, 30s);
  EXPECT_NE(n0.err().find("fewer than --min-nodes 2"), std::string::npos) << n0.err();
}

TEST(Elastic, BadOptionsAreUsageErrors) {
  auto more = run_cohort("train --out /tmp/unused --nnodes 2 --min-nodes 3 --init-method tcp://127.0.0.1:1");
  EXPECT_EQ(more.code, 2);
  EXPECT_NE(more.err.find("--min-nodes 3 must be between 1 and --nnodes 2"), std::string::npos) << more.err;
  auto file = run_cohort("train --out /tmp/unused --nnodes 2 --min-nodes 1 --init-method file:///tmp/cohort-elastic");
  EXPECT_EQ(file.code, 2);
  EXPECT_NE(file.err.find("needs --init-method tcp://"), std::string::npos) << file.err;
  auto max = run_cohort("train --out /tmp/unused --nnodes 2 --max-nodes 3 --init-method tcp://127.0.0.1:1");
  EXPECT_EQ(max.code, 2);
  EXPECT_NE(max.err.find("--max-nodes 3 needs --min-nodes"), std::string::npos) << max.err;
  auto rank = run_cohort("train --out /tmp/unused --nnodes 2 --min-nodes 1 --max-nodes 3 --node-rank 3 "
                         "--init-method tcp://127.0.0.1:1");
  EXPECT_EQ(rank.code, 2);
  EXPECT_NE(rank.err.find("--node-rank 3 is outside"), std::string::npos) << rank.err;
}

// Weights given per rank cannot follow an elastic world's ranks, nor a
// list of island sizes: each is refused with the alternative named, nothing
// written.
TEST(Elastic, PerRankWeightsAreRefused) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 48);
  for (const auto& [flags, says] : std::vector<std::pair<std::string, std::string>>{
           {"--dist.shard optimizer --dist.shard-weights 2,1", "dist.shard-weights '2,1' gives one weight per rank"},
           {"--data.balance weights --data.balance-weights 2,1", "data.balance = weights gives one weight per rank"},
           {"--dist.sync local --dist.islands 1,1", "dist.islands '1,1' lists the islands' sizes"}}) {
    auto r = run_cohort(cohort::strf(
        "train --model.name mlp --data.global-batch 12 --train.max-steps 2 --quiet --nproc-per-node 2 "
        "--oversubscribe --init-method tcp://127.0.0.1:%d --nnodes 1 --min-nodes 1 --data.path %s --out %s %s",
        cohort::test::free_port(), tmp.path().c_str(), (tmp / "run").c_str(), flags.c_str()));
    EXPECT_EQ(r.code, 2) << flags << ": " << r.err;
    EXPECT_NE(r.err.find(says), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(tmp / "run/metrics.jsonl")) << flags;
  }
}

// Two nodes of two ranks each: node 1 is lost, and node 0's two ranks go on
// as a world of two (a node counts only with all of its ranks).
TEST(Elastic, MultiRankNodeIsLostAsAWhole) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 240);
  int port = cohort::test::free_port();
  const std::string args = cohort::strf(
      " train --model.name mlp --model.dropout 0 --data.global-batch 12 --train.epochs 4 --log.every-steps 1 "
      "--log.sample-ids --dist.timeout 30 --init-method tcp://127.0.0.1:%d --nnodes 2 --min-nodes 1 --quiet "
      "--nproc-per-node 2 --oversubscribe --data.path %s --out %s%s",
      port, tmp.path().c_str(), (tmp / "run").c_str(), device_flags().c_str());
  Background n0(std::string("env COHORT_DEBUG_DELAY=0:60 ") + COHORT_BIN + args + " --node-rank 0", tmp, "n0");
  Background n1(std::string("env COHORT_DEBUG_DELAY=0:60 ") + COHORT_BIN + args + " --node-rank 1", tmp, "n1");
  const std::string metrics = tmp / "run/metrics.jsonl";
  ASSERT_TRUE(once([&] { return reached_step(metrics, 10); }, n0)) << n0.err();
  kill(n1.pid(), SIGKILL);
  ASSERT_EQ(n0.wait_exit(), 0) << n0.err();
  auto changes = lines_of_kind(metrics, "membership");
  ASSERT_EQ(changes.size(), 1u) << read_file(metrics);
  EXPECT_EQ(changes[0]["world_size"], 2);
  EXPECT_EQ(changes[0]["nodes"], 1);
  EXPECT_EQ(changes[0]["left"].size(), 2u);
  expect_every_sample_once(tmp / "run", 240, 4);
}

// Newcomers the job cannot take are kept out, and the job goes on
// undisturbed: one with another shared config is refused (exit 2); one past
// --max-nodes waits, and goes home when the job finishes.
TEST(Elastic, NewcomersTheJobCannotTakeAreKeptOut) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 240);
  int port = cohort::test::free_port();
  const std::string args = cohort::strf(
      " train --model.name mlp --data.global-batch 12 --train.epochs 6 --log.every-steps 1 --dist.timeout 30 "
      "--init-method tcp://127.0.0.1:%d --nnodes 2 --min-nodes 1 --max-nodes 2 --quiet --data.path %s --out %s",
      port, tmp.path().c_str(), (tmp / "run").c_str());
  auto node = [&](int rank, const std::string& extra, const std::string& name) {
    return std::make_unique<Background>(std::string("env COHORT_DEBUG_DELAY=0:60 ") + COHORT_BIN + args + extra +
                                            " --node-rank " + std::to_string(rank), tmp, name);
  };
  auto n0 = node(0, "", "n0"), n1 = node(1, "", "n1");
  const std::string metrics = tmp / "run/metrics.jsonl";
  ASSERT_TRUE(once([&] { return reached_step(metrics, 5); }, *n0)) << n0->err();
  auto other_config = run_cohort(args + " --optim.lr 0.5 --node-rank 1");
  EXPECT_EQ(other_config.code, 2) << other_config.err;
  EXPECT_NE(other_config.err.find("another shared config"), std::string::npos) << other_config.err;
  auto extra = node(1, "", "extra");
  ASSERT_EQ(n0->wait_exit(), 0) << n0->err();
  ASSERT_EQ(n1->wait_exit(), 0) << n1->err();
  EXPECT_EQ(extra->wait_exit(), 0) << extra->err();
  EXPECT_NE(extra->err().find("the job finished before this process could join it"), std::string::npos)
      << extra->err();
  EXPECT_TRUE(lines_of_kind(metrics, "membership").empty()) << read_file(metrics);
  EXPECT_EQ(lines_of_kind(metrics, "train").size(), 120u);
}

// Node 0's own rank is lost: its launcher keeps hosting the store, the other
// two nodes go on (a new rank 0 writes the log), and node 0's launcher exits
// 1 when they are done.
TEST(Elastic, NodeZerosRankIsLostAndItsStoreStays) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 240);
  int port = cohort::test::free_port();
  const std::string args = elastic_args(tmp, "127.0.0.1", port, 4) + " --oversubscribe";
  auto start = [&](int node) { return loopback_node(tmp, args, node); };
  auto n0 = start(0), n1 = start(1), n2 = start(2);
  const std::string metrics = tmp / "run/metrics.jsonl";
  ASSERT_TRUE(once([&] { return reached_step(metrics, 10); }, *n0)) << n0->err();
  pid_t worker = only_child(n0->pid());  // node 0's worker
  ASSERT_GT(worker, 0);
  kill(worker, SIGKILL);
  ASSERT_EQ(n1->wait_exit(), 0) << n1->err();
  ASSERT_EQ(n2->wait_exit(), 0) << n2->err();
  EXPECT_EQ(n0->wait_exit(), 1) << n0->err();
  EXPECT_NE(n0->err().find("hosting the rendezvous store until the others finish"), std::string::npos) << n0->err();
  auto changes = lines_of_kind(metrics, "membership");
  ASSERT_EQ(changes.size(), 1u) << read_file(metrics);
  EXPECT_EQ(changes[0]["world_size"], 2);
  EXPECT_EQ(lines_of_kind(metrics, "train").size(), 80u);
  expect_every_sample_once(tmp / "run", 240, 4);
}

// A member lost at a chosen moment of step 13 (COHORT_DEBUG_DIE): after
// its update was applied everywhere but before anything of the step was
// logged, or after the step's train line was agreed but before rank 0 wrote
// it. The next world logs what the old one could not: one train line per
// step, every sample of every epoch once in sample-ids/, and a summary that
// counts every world's steps.
struct LostAt {
  int rank;
  const char* point;
  const char* extra = "";  // more flags
  const char* tag = "";    // the case's name, after rank and point
};

class ElasticLoss : public ::testing::TestWithParam<LostAt> {};

TEST_P(ElasticLoss, TheStepInFlightKeepsItsRecords) {
  const LostAt lost = GetParam();
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 240);
  const int port = cohort::test::free_port();
  std::string args = elastic_args(tmp, "127.0.0.1", port, 4) + " --oversubscribe " + lost.extra;
  args.erase(args.find(" --quiet"), 8);  // the summary line is checked
  std::vector<std::unique_ptr<Background>> nodes;
  for (int n = 0; n < 3; ++n) {
    // The first world's ranks follow the node ranks.
    std::string env = n == lost.rank ? cohort::strf("env COHORT_DEBUG_DIE=%d:13:%s ", n, lost.point) : "";
    nodes.push_back(std::make_unique<Background>(env + COHORT_BIN + args + " --node-rank " + std::to_string(n), tmp,
                                                 "n" + std::to_string(n)));
  }
  std::string survivors_out;
  for (int n = 0; n < 3; ++n) {
    if (n == lost.rank) continue;
    ASSERT_EQ(nodes[static_cast<size_t>(n)]->wait_exit(), 0) << nodes[static_cast<size_t>(n)]->err();
    survivors_out += nodes[static_cast<size_t>(n)]->out() + nodes[static_cast<size_t>(n)]->err();
  }
  const std::string metrics = tmp / "run/metrics.jsonl";
  auto changes = lines_of_kind(metrics, "membership");
  std::string said;  // the changes first: a long log is cut in the middle
  for (const auto& c : changes) said += c.dump() + "\n";
  ASSERT_EQ(changes.size(), 1u) << said << survivors_out << read_file(metrics);
  EXPECT_EQ(changes[0]["world_size"], 2);
  EXPECT_EQ(changes[0]["step"], 13) << changes[0].dump();
  std::vector<int64_t> steps;
  for (const auto& j : lines_of_kind(metrics, "train")) steps.push_back(j["step"].get<int64_t>());
  std::vector<int64_t> every(80);
  std::iota(every.begin(), every.end(), 1);
  EXPECT_EQ(steps, every) << read_file(metrics);
  expect_every_sample_once(tmp / "run", 240, 4);
  EXPECT_NE(survivors_out.find("cohort: done: 80 steps"), std::string::npos) << survivors_out;
  // The job's own run-directory lock passes to the new rank 0 (the same
  // job), never "taken over".
  EXPECT_EQ(survivors_out.find("took over the lock"), std::string::npos) << survivors_out;
}

INSTANTIATE_TEST_SUITE_P(Moments, ElasticLoss,
                         ::testing::Values(LostAt{2, "applied"}, LostAt{0, "applied"}, LostAt{0, "line"},
                                           LostAt{1, "line"},
                                           // data.balance's measurement, a collective before the line
                                           LostAt{1, "applied", "--data.balance auto --data.balance-every 1",
                                                  "_balanced"},
                                           // PowerSGD's sums feeding a sharded optimizer (3 ranks in pairs: one
                                           // group of three, then of two), speed-balanced
                                           LostAt{2, "applied",
                                                  "--dist.shard optimizer --dist.shard-replicas 2 "
                                                  "--dist.grad-compression powersgd --data.balance auto",
                                                  "_powersgd_sharded"}),
                         [](const ::testing::TestParamInfo<LostAt>& i) {
                           return "Rank" + std::to_string(i.param.rank) + "_" + i.param.point + i.param.tag;
                         });

// dist.shard with dist.shard-replicas 2: four ranks on two hosts, each
// range held by a rank on either host. Host 1's first rank dies as a step
// begins (`forward`: its gradients never sent) or right after one's update
// was shared (`applied`); host 0's two ranks re-shard the optimizer state
// in memory and finish, with the weights of a run checkpointed at that step
// on four ranks and resumed on two. `bf16`: sharded gradients summed in
// bf16 on the wire, the same way in memory and from the checkpoint.
struct ShardLoss {
  const char* name;
  const char* dies;  // COHORT_DEBUG_DIE's point
  int subnet;
  const char* shard;
};

class ElasticShards : public ::testing::TestWithParam<ShardLoss> {};

TEST_P(ElasticShards, ReplicasGoOnFromMemory) {
  const ShardLoss& c = GetParam();
  NetnsHosts net(2, c.subnet);
  if (!net.ok()) GTEST_SKIP() << "SKIPPED: network namespaces need root and iproute2";
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 240);
  const std::string shard = std::string(" --dist.shard-replicas 2 --optim.clip-norm 0.05 ") + c.shard;
  std::string args = cohort::strf(
      " train --model.name mlp --model.dropout 0 --data.global-batch 12 --train.epochs 4 --log.every-steps 1 "
      "--log.sample-ids --dist.timeout 30 --init-method tcp://%s:29643 --nnodes 2 --min-nodes 1 "
      "--nproc-per-node 2 --oversubscribe --data.path %s --out %s",
      net.address(0).c_str(), tmp.path().c_str(), (tmp / "run").c_str()) + shard;
  const std::string die = cohort::strf("env COHORT_DEBUG_DELAY=0:30 COHORT_DEBUG_DIE=2:12:%s ", c.dies);
  Background h0(net.on(0, die + COHORT_BIN + args + " --node-rank 0"), tmp, "h0");
  Background h1(net.on(1, die + COHORT_BIN + args + " --node-rank 1"), tmp, "h1");
  ASSERT_EQ(h0.wait_exit(), 0) << h0.err();
  h1.wait(30s);
  const std::string metrics = tmp / "run/metrics.jsonl";
  auto changes = lines_of_kind(metrics, "membership");
  ASSERT_EQ(changes.size(), 1u) << read_file(metrics);
  EXPECT_EQ(changes[0]["state"], "memory") << changes[0].dump();
  EXPECT_EQ(changes[0]["world_size"], 2);
  const int64_t resumed = changes[0]["step"];
  EXPECT_EQ(resumed, std::string(c.dies) == "forward" ? 11 : 12);
  EXPECT_NE(h0.out().find("re-sharded the optimizer state in memory from 2 surviving range(s) into 1"),
            std::string::npos) << h0.out();
  expect_each_step_and_sample_once(tmp);

  const std::string fixed = cohort::strf(
      " train --model.name mlp --model.dropout 0 --data.global-batch 12 --train.epochs 4 --ckpt.every-steps 1 "
      "--ckpt.keep 100 --quiet --data.path %s --oversubscribe", tmp.path().c_str()) + shard;
  expect_weights_of_a_resume(tmp, fixed, 4, resumed, 2);
}

INSTANTIATE_TEST_SUITE_P(Moments, ElasticShards,
                         ::testing::Values(ShardLoss{"forward", "forward", 237, " --dist.shard gradients"},
                                           ShardLoss{"applied", "applied", 238, " --dist.shard gradients"},
                                           ShardLoss{"bf16", "forward", 239,
                                                     " --dist.shard gradients --dist.grad-compression bf16"}),
                         [](const ::testing::TestParamInfo<ShardLoss>& info) { return std::string(info.param.name); });

// dist.shard-replicas 1: the lost ranks' ranges are gone with them, so the
// survivors go on from the latest checkpoint, and the log says why.
TEST(Elastic, LostShardComesFromTheCheckpoint) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 240);
  const int port = cohort::test::free_port();
  const std::string args = cohort::strf(
      " train --model.name mlp --model.dropout 0 --data.global-batch 12 --train.epochs 2 --log.every-steps 1 "
      "--log.sample-ids --dist.timeout 30 --init-method tcp://127.0.0.1:%d --nnodes 2 --min-nodes 1 "
      "--nproc-per-node 2 --oversubscribe --data.path %s --out %s --dist.shard optimizer --ckpt.every-steps 5",
      port, tmp.path().c_str(), (tmp / "run").c_str());
  const std::string die = "env COHORT_DEBUG_DIE=2:12:forward ";
  Background n0(die + COHORT_BIN + args + " --node-rank 0", tmp, "n0");
  Background n1(die + COHORT_BIN + args + " --node-rank 1", tmp, "n1");
  ASSERT_EQ(n0.wait_exit(), 0) << n0.err();
  n1.wait(30s);
  const std::string metrics = tmp / "run/metrics.jsonl";
  auto changes = lines_of_kind(metrics, "membership");
  ASSERT_EQ(changes.size(), 1u) << read_file(metrics);
  EXPECT_EQ(changes[0]["state"], "checkpoint") << changes[0].dump();
  EXPECT_EQ(changes[0]["step"], 10) << changes[0].dump();
  EXPECT_NE(n0.out().find("were held only by the lost rank(s) (dist.shard-replicas = 1); "
                          "continuing from"), std::string::npos) << n0.out();
  std::vector<int64_t> steps;
  for (const auto& j : lines_of_kind(metrics, "train")) steps.push_back(j["step"].get<int64_t>());
  std::vector<int64_t> every(40);
  std::iota(every.begin(), every.end(), 1);
  EXPECT_EQ(steps, every);
  expect_every_sample_once(tmp / "run", 240, 2);
}

// Four netns hosts of one rank train the run of `args`; host `dies`'s rank
// (rank `dies` of the first world) dies as step 13 begins, and the other
// three must finish. `out0`: host 0's output.
static void four_hosts_one_dies(const NetnsHosts& net, const TempDir& tmp, const std::string& args, int dies,
                         std::string* out0) {
  std::vector<std::unique_ptr<Background>> hosts;
  for (int h = 0; h < 4; ++h) {
    const std::string die = h == dies ? cohort::strf("COHORT_DEBUG_DIE=%d:13:forward ", dies) : "";
    hosts.push_back(std::make_unique<Background>(
        net.on(h, "env COHORT_DEBUG_DELAY=0:30 " + die + COHORT_BIN + args + " --node-rank " + std::to_string(h)), tmp,
        "h" + std::to_string(h)));
  }
  std::string errs;
  for (int h = 0; h < 4; ++h) {
    if (h == dies) continue;
    const int code = hosts[static_cast<size_t>(h)]->wait_exit();
    errs += cohort::strf("host %d (exit %d):\n", h, code) + hosts[static_cast<size_t>(h)]->err();
  }
  hosts[static_cast<size_t>(dies)]->wait(30s);
  for (int h = 0; h < 4; ++h) {
    if (h != dies) {
      ASSERT_EQ(hosts[static_cast<size_t>(h)]->wait_exit(), 0) << errs;
    }
  }
  *out0 = hosts[0]->out() + hosts[0]->err();
}

// Islands (dist.islands) in an elastic world: a world plans its islands
// from the members it has, so a lost host is a lost island and a lost rank
// leaves its island smaller, and the survivors go on from the last outer
// sync (every island held the same parameters there). Each case: every step
// once in the log, every sample once per epoch.

// Three hosts of two ranks, an island each; host 2 is killed mid-run. The
// other two islands go on from the last sync as two islands of two.
TEST(ElasticIslands, AWholeIslandLostTheOthersGoOnFromTheLastSync) {
  NetnsHosts net(3, 240);
  if (!net.ok()) GTEST_SKIP() << "SKIPPED: network namespaces need root and iproute2";
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 240);
  std::string args = elastic_args(tmp, net.address(0), 29646, 3) +
                     " --nproc-per-node 2 --oversubscribe --dist.sync local --dist.local-steps 4 --dist.islands node";
  args.replace(args.find(" --quiet"), 8, "");
  std::string out0;
  ASSERT_NO_FATAL_FAILURE(lose_host_two(net, tmp, args, &out0));
  const std::string metrics = tmp / "run/metrics.jsonl";
  auto changes = lines_of_kind(metrics, "membership");
  ASSERT_EQ(changes.size(), 1u) << read_file(metrics);
  EXPECT_EQ(changes[0]["state"], "memory") << changes[0].dump();
  EXPECT_EQ(changes[0]["world_size"], 4) << changes[0].dump();
  EXPECT_EQ(changes[0]["left"].size(), 2u) << changes[0].dump();
  EXPECT_EQ(changes[0]["step"].get<int64_t>() % 4, 0) << "the new world starts at a sync: " << changes[0].dump();
  EXPECT_NE(out0.find("3 island(s) of 2 rank(s) (one per node), gradients summed exactly inside each"),
            std::string::npos) << out0;
  EXPECT_NE(out0.find("2 island(s) of 2 rank(s) (one per node), gradients summed exactly inside each"),
            std::string::npos) << out0;
  expect_each_step_and_sample_once(tmp, 3);
}

// Four hosts of one rank as two islands of two; rank 3 dies as step 13
// begins. Its island goes on with rank 2 alone beside the island of two
// (2,1: the first rank of each island sums the change between them), from
// the sync at step 12; with plain SGD the final weights are those of the
// same run checkpointed at step 12 and resumed as islands of 2 and 1.
TEST(ElasticIslands, ARankLostInsideAnIslandItsIslandGoesOnWithoutIt) {
  NetnsHosts net(4, 241);
  if (!net.ok()) GTEST_SKIP() << "SKIPPED: network namespaces need root and iproute2";
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 240);
  const std::string common = " train --model.name mlp --model.dropout 0 --optim.name sgd --optim.momentum 0 "
                             "--data.global-batch 12 --train.epochs 3 --dist.sync local --dist.local-steps 4 "
                             "--optim.outer-momentum 0.5 --data.path " + tmp.path();
  const std::string args = common + cohort::strf(
      " --log.every-steps 1 --log.sample-ids --dist.timeout 30 --init-method tcp://%s:29647 --nnodes 4 "
      "--min-nodes 2 --dist.islands 2 --out %s", net.address(0).c_str(), (tmp / "run").c_str());
  std::string out0;
  ASSERT_NO_FATAL_FAILURE(four_hosts_one_dies(net, tmp, args, 3, &out0));
  const std::string metrics = tmp / "run/metrics.jsonl";
  auto changes = lines_of_kind(metrics, "membership");
  ASSERT_EQ(changes.size(), 1u) << read_file(metrics);
  EXPECT_EQ(changes[0]["state"], "memory") << changes[0].dump();
  EXPECT_EQ(changes[0]["world_size"], 3) << changes[0].dump();
  EXPECT_EQ(changes[0]["step"], 12) << changes[0].dump();
  EXPECT_NE(out0.find("2 island(s) of 2 rank(s), gradients summed exactly inside each, and each island rank sums its "
                      "1/2"), std::string::npos) << out0;
  EXPECT_NE(out0.find("2 island(s) of 2,1 rank(s), gradients summed exactly inside each, and each of the first 1 "
                      "rank(s) of an island sums its 1/1"), std::string::npos) << out0;
  expect_each_step_and_sample_once(tmp, 3);

  auto first = run_cohort(common + " --quiet --oversubscribe --nproc-per-node 4 --dist.islands 2 --ckpt.every-steps 4 "
                          "--ckpt.keep 100 --out " + (tmp / "ref4"));
  ASSERT_EQ(first.code, 0) << first.err;
  auto second = run_cohort(" train --quiet --oversubscribe --nproc-per-node 3 --dist.islands 2,1 --resume " +
                           (tmp / "ref4") + "/checkpoints/step-12 --out " + (tmp / "ref3"));
  ASSERT_EQ(second.code, 0) << second.err;
  auto elastic = final_model(tmp / "run"), reference = final_model(tmp / "ref3");
  ASSERT_EQ(elastic.size(), reference.size());
  for (const auto& [name, t] : reference) {
    ASSERT_TRUE(elastic.count(name)) << name;
    EXPECT_LT((elastic[name] - t).abs().max().item<double>(), 1e-5) << name;
  }
}

// Sharded islands (dist.shard optimizer, one replica): rank 1 dies as step
// 13 begins, taking half of island 0's optimizer state with it. Island 1's
// state is whole, so the new islands (ranks 0 and 2 of the old world, and
// rank 3) re-shard it in memory and go on from the sync at step 12; no
// checkpoint is read.
TEST(ElasticIslands, ShardedIslandLosesARankAndTakesAWholeIslandsRanges) {
  NetnsHosts net(4, 242);
  if (!net.ok()) GTEST_SKIP() << "SKIPPED: network namespaces need root and iproute2";
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 240);
  const std::string args = cohort::strf(
      " train --model.name mlp --model.dropout 0 --data.global-batch 12 --train.epochs 3 --dist.sync local "
      "--dist.local-steps 4 --dist.islands 2 --dist.shard optimizer --log.every-steps 1 --log.sample-ids "
      "--dist.timeout 30 --init-method tcp://%s:29648 --nnodes 4 --min-nodes 2 --data.path %s --out %s",
      net.address(0).c_str(), tmp.path().c_str(), (tmp / "run").c_str());
  std::string out0;
  ASSERT_NO_FATAL_FAILURE(four_hosts_one_dies(net, tmp, args, 1, &out0));
  const std::string metrics = tmp / "run/metrics.jsonl";
  auto changes = lines_of_kind(metrics, "membership");
  ASSERT_EQ(changes.size(), 1u) << read_file(metrics);
  EXPECT_EQ(changes[0]["state"], "memory") << changes[0].dump();
  EXPECT_EQ(changes[0]["world_size"], 3) << changes[0].dump();
  EXPECT_EQ(changes[0]["step"], 12) << changes[0].dump();
  EXPECT_NE(out0.find("re-sharded the optimizer state in memory from 2 surviving range(s) into 2"), std::string::npos)
      << out0;
  EXPECT_EQ(out0.find("continuing from"), std::string::npos) << "no checkpoint is read\n" << out0;
  expect_each_step_and_sample_once(tmp, 3);
}
