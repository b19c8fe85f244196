// Checkpoints: the safetensors format, atomic writes with checksums and
// fallback, exact resume, resume at another world size, restarts after kill -9.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "cohort/ckpt/checkpoint.hpp"
#include "cohort/config/config.hpp"
#include "cohort/core/error.hpp"
#include "cohort/data/order.hpp"
#include "helpers.hpp"

using namespace cohort;
using namespace std::chrono_literals;
using cohort::test::read_file;
using cohort::test::run_cohort;
using cohort::test::error_of;
using cohort::test::TempDir;
using cohort::test::write_file;

namespace {

// The tensor bytes of a checkpoint's model (everything after the header).
std::string weights_of(const std::string& ckpt_dir) {
  std::string b = read_file(ckpt_dir + "/model.safetensors");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(static_cast<unsigned char>(b[i])) << (8 * i);
  return b.substr(8 + n);
}

// step -> ids of the whole global batch, from every rank's sample-id log;
// a step recorded again by a later attempt replaces the earlier record.
std::map<int64_t, std::vector<int64_t>> ids_per_step(const std::string& run_dir) {
  std::map<int64_t, std::map<int, std::vector<int64_t>>> by_step;  // step -> rank -> ids
  for (const auto& e : std::filesystem::directory_iterator(run_dir + "/sample-ids")) {
    int rank = std::stoi(e.path().stem().string().substr(5));
    for (const auto& line : cohort::test::lines_of(read_file(e.path().string()))) {
      auto j = nlohmann::json::parse(line);
      by_step[j["step"].get<int64_t>()][rank] = j["ids"].get<std::vector<int64_t>>();
    }
  }
  std::map<int64_t, std::vector<int64_t>> out;
  for (auto& [step, ranks] : by_step) {
    for (auto& [rank, ids] : ranks) out[step].insert(out[step].end(), ids.begin(), ids.end());
  }
  return out;
}

// (rank, step) pairs logged more than once: steps replayed after a restart
// must replace, not repeat, their lines.
int repeated_sample_id_lines(const std::string& run_dir) {
  int repeated = 0;
  for (const auto& e : std::filesystem::directory_iterator(run_dir + "/sample-ids")) {
    std::set<int64_t> steps;
    for (const auto& line : cohort::test::lines_of(read_file(e.path().string())))
      repeated += steps.insert(nlohmann::json::parse(line)["step"].get<int64_t>()).second ? 0 : 1;
  }
  return repeated;
}

const std::string kTiny = " --model.name mlp --model.hidden 16 --model.dropout 0.1 --optim.schedule constant "
                          "--log.every-steps 1 --eval.every-steps 1000000 --eval.max-samples 8 --quiet ";

}  // namespace

TEST(Safetensors, RoundTripsEveryDtypeAndMetadata) {
  TempDir tmp;
  NamedTensors ts = {{"a.weight", torch::randn({3, 4})},
                     {"b", torch::arange(6, torch::kInt64).reshape({2, 3})},
                     {"h", torch::randn({5}).to(torch::kFloat16)},
                     {"bf", torch::randn({2, 2}).to(torch::kBFloat16)},
                     {"u", torch::tensor({1, 255}, torch::kUInt8)},
                     {"scalar", torch::tensor(3.5)}};
  save_safetensors(tmp / "m.safetensors", ts, {{"format", "pt"}});
  auto back = load_safetensors(tmp / "m.safetensors");
  EXPECT_EQ(back.metadata.at("format"), "pt");
  ASSERT_EQ(back.tensors.size(), ts.size());
  for (auto& [name, t] : ts) {
    EXPECT_EQ(back.tensors.at(name).scalar_type(), t.scalar_type()) << name;
    EXPECT_TRUE(torch::equal(back.tensors.at(name), t)) << name;
  }
  // The header is 8-byte aligned JSON, as the format recommends.
  std::string raw = read_file(tmp / "m.safetensors");
  EXPECT_EQ((static_cast<unsigned char>(raw[0]) | static_cast<unsigned char>(raw[1]) << 8) % 8, 0);
  EXPECT_EQ(raw[8], '{');
}

TEST(Safetensors, MalformedFilesNameFileAndKey) {
  TempDir tmp;
  save_safetensors(tmp / "m.safetensors", {{"w", torch::randn({64})}});
  std::string good = read_file(tmp / "m.safetensors");
  write_file(tmp / "trunc.safetensors", good.substr(0, good.size() - 10));
  std::string e = error_of([&] { load_safetensors(tmp / "trunc.safetensors"); });
  EXPECT_NE(e.find("trunc.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("'w'"), std::string::npos) << e;
  write_file(tmp / "short", "abc");
  EXPECT_NE(error_of([&] { load_safetensors(tmp / "short"); }).find("truncated"), std::string::npos);
  std::string bad = good;
  bad[9] = '#';  // break the JSON
  write_file(tmp / "json.safetensors", bad);
  EXPECT_NE(error_of([&] { load_safetensors(tmp / "json.safetensors"); }).find("JSON"), std::string::npos);
}

TEST(Checkpoints, CorruptLatestFallsBackToThePrevious) {
  TempDir tmp;
  torch::nn::Linear lin(3, 2);
  auto opt = torch::optim::SGD(lin->parameters(), 0.1);
  Checkpoints store(tmp.path(), 3);
  for (int64_t step : {10, 20, 30}) {
    CheckpointState st;
    st.step = step;
    st.cursor = {0, step * 4};
    store.write(st, {{"w", lin->weight}}, opt, {{"rank.0", torch::zeros({4}, torch::kUInt8)}}, "[x]\n");
  }
  EXPECT_EQ(read_file(tmp / "checkpoints/latest"), "step-30\n");
  std::vector<std::string> warnings;
  EXPECT_EQ(Checkpoints::resolve(tmp.path(), &warnings).dir, tmp / "checkpoints/step-30");
  EXPECT_TRUE(warnings.empty());

  // Corrupt step-30's weights (one flipped byte), truncate step-20's optimizer.
  std::string m = read_file(tmp / "checkpoints/step-30/model.safetensors");
  m[m.size() - 1] ^= 1;
  write_file(tmp / "checkpoints/step-30/model.safetensors", m);
  std::string o = read_file(tmp / "checkpoints/step-20/optimizer.pt");
  write_file(tmp / "checkpoints/step-20/optimizer.pt", o.substr(0, o.size() / 2));
  EXPECT_EQ(Checkpoints::resolve(tmp.path(), &warnings).dir, tmp / "checkpoints/step-10");
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_NE(warnings[0].find("step-30/model.safetensors: checksum mismatch"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[1].find("step-20/optimizer.pt"), std::string::npos) << warnings[1];
  EXPECT_EQ(Checkpoints::verify(tmp / "checkpoints/step-10").cursor.consumed, 40);

  // Hardening: state.json is covered too. One flipped bit in the cursor
  // (40 -> 41) used to resume silently at the wrong sample.
  std::string state = read_file(tmp / "checkpoints/step-10/state.json");
  auto at = state.find("\"consumed\": 40");
  ASSERT_NE(at, std::string::npos) << state;
  std::string flipped = state;
  flipped[at + 13] ^= 1;
  write_file(tmp / "checkpoints/step-10/state.json", flipped);
  try {
    Checkpoints::verify(tmp / "checkpoints/step-10");
    ADD_FAILURE() << "a changed cursor was accepted";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("state.json: checksum mismatch"), std::string::npos) << e.what();
  }
  write_file(tmp / "checkpoints/step-10/state.json", state);
  EXPECT_EQ(Checkpoints::verify(tmp / "checkpoints/step-10").cursor.consumed, 40);

  // A half-written directory (no state.json) is skipped too; keep=3 pruned nothing yet.
  std::filesystem::remove(tmp / "checkpoints/step-10/state.json");
  EXPECT_THROW(Checkpoints::resolve(tmp.path(), nullptr), DataError);
}

// A held file (read through /proc/self/fd/N, so the keep rotation cannot
// take it away) is named by its own path in errors: here a config.toml that
// the reader refuses.
TEST(Checkpoints, AnErrorInAHeldFileNamesTheFilesPath) {
  TempDir tmp;
  const std::string dir = tmp / "step-3";
  std::filesystem::create_directories(dir);
  write_file(dir + "/state.json", "{}");
  write_file(dir + "/config.toml", "[train]\nno-such-key = 1\n");
  HeldFiles held;
  ASSERT_TRUE(held.open(dir));
  const std::string through = held.path("config.toml");
  ASSERT_EQ(through.rfind("/proc/self/fd/", 0), 0u) << through;
  std::string e = error_of([&] { load_config(through); });
  EXPECT_NE(e.find(dir + "/config.toml:2: unknown key 'train.no-such-key'"), std::string::npos) << e;
  EXPECT_EQ(e.find("/proc/self/fd/"), std::string::npos) << e;
}

TEST(Checkpoints, KeepsTheNewestK) {
  TempDir tmp;
  torch::nn::Linear lin(2, 2);
  auto opt = torch::optim::SGD(lin->parameters(), 0.1);
  Checkpoints store(tmp.path(), 2);
  for (int64_t step = 1; step <= 5; ++step) {
    CheckpointState st;
    st.step = step;
    store.write(st, {{"w", lin->weight}}, opt, {}, "");
  }
  std::set<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(tmp / "checkpoints")) names.insert(e.path().filename());
  EXPECT_EQ(names, (std::set<std::string>{"latest", "step-4", "step-5"}));
}

TEST(Resume, ModelShapeMismatchNamesTheKey) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp);
  auto a = run_cohort("train" + kTiny + "--train.max-steps 2 --data.path " + tmp.path() + " --out " + (tmp / "run"));
  ASSERT_EQ(a.code, 0) << a.err;
  auto b = run_cohort("train --resume " + (tmp / "run") + " --model.hidden 32 --train.max-steps 4");
  EXPECT_EQ(b.code, 2) << b.err;
  EXPECT_NE(b.err.find("model.hidden was 16 in the checkpoint but is 32"), std::string::npos) << b.err;
}

// Contract 5: at the same world size, stopping and resuming gives the
// uninterrupted run's weights bit for bit (fp32, dropout on: RNG restored).
TEST(Resume, BitIdenticalAtTheSameWorldSize) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 40);
  std::string common = "train" + kTiny + "--data.global-batch 6 --nproc-per-node 2 --data.path " + tmp.path();
  auto full = run_cohort(common + " --train.max-steps 20 --out " + (tmp / "full"));
  ASSERT_EQ(full.code, 0) << full.err;
  auto first = run_cohort(common + " --train.max-steps 9 --out " + (tmp / "split"));
  ASSERT_EQ(first.code, 0) << first.err;
  // No launch flags: the resume launches the run's recorded shape (2 ranks).
  auto second = run_cohort("train --resume " + (tmp / "split") + " --train.max-steps 20");
  ASSERT_EQ(second.code, 0) << second.err;
  const std::string said = second.out + second.err;
  EXPECT_NE(said.find("(written by 2 rank(s), now 2)"), std::string::npos) << said;
  EXPECT_EQ(said.find("launch shape changed"), std::string::npos) << said;
  EXPECT_EQ(weights_of(tmp / "full/checkpoints/step-20"), weights_of(tmp / "split/checkpoints/step-20"));
}

// A resume with train.threads auto takes the recorded threads, not this
// machine's cores / ranks (another machine, or a run recorded as 1 thread
// here): the start-up line says which.
TEST(Resume, KeepsTheRecordedThreads) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 40);
  auto first = run_cohort("train" + kTiny + "--train.max-steps 2 --data.path " + tmp.path() + " --out " + (tmp / "run"));
  ASSERT_EQ(first.code, 0) << first.err;
  const std::string recorded = read_file(tmp / "run/launch.json");
  EXPECT_NE(recorded.find("\"ranks\": 1"), std::string::npos) << recorded;
  write_file(tmp / "run/launch.json", R"({"nodes": [{"ranks": 1, "threads": 1}]})");
  auto second = run_cohort("train --resume " + (tmp / "run") + " --train.max-steps 4");
  ASSERT_EQ(second.code, 0) << second.err;
  const std::string said = second.out + second.err;
  EXPECT_NE(said.find(" 1 thread(s) of "), std::string::npos) << said;
  EXPECT_EQ(said.find("launch shape changed"), std::string::npos) << said;
}

// A run of several nodes continues on each node with its own command: a
// resume without --nnodes names it in one line, and a damaged record is
// named too.
TEST(Resume, MultiNodeShapeNamesTheCommandForEachNode) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 40);
  auto first = run_cohort("train" + kTiny + "--train.max-steps 2 --data.path " + tmp.path() + " --out " + (tmp / "run"));
  ASSERT_EQ(first.code, 0) << first.err;
  write_file(tmp / "run/launch.json", R"({"nodes": [{"ranks": 2, "threads": 1}, {"ranks": 1, "threads": 2}]})");
  auto r = run_cohort("train --resume " + (tmp / "run") + " --train.max-steps 4");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("ran as 3 rank(s) on 2 nodes (2+1), 1/2 thread(s) per rank by node: continue it with this "
                       "command on each node: cohort train --resume " + (tmp / "run") +
                       " --nnodes 2 --node-rank K --init-method"),
            std::string::npos) << r.err;
  write_file(tmp / "run/launch.json", R"({"nodes": [{"ranks": 0, "threads": 1}]})");
  r = run_cohort("train --resume " + (tmp / "run") + " --train.max-steps 4");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("launch.json: a node with 0 rank(s)"), std::string::npos) << r.err;
  // --nnodes 1 goes on with this node alone, at the flags' shape.
  write_file(tmp / "run/launch.json", R"({"nodes": [{"ranks": 2, "threads": 1}, {"ranks": 1, "threads": 2}]})");
  r = run_cohort("train --resume " + (tmp / "run") + " --train.max-steps 4 --nnodes 1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("launch shape changed on resume: was 3 rank(s) on 2 nodes (2+1)"), std::string::npos) << r.out;
}

// Contract 2 across resumes: 2 ranks, then 3, then 1, consume each epoch's
// samples exactly once, in the global order.
TEST(Resume, OtherWorldSizesConsumeExactlyTheRemainingSamples) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 100);
  std::string common = "train" + kTiny + "--log.sample-ids --data.global-batch 6 --data.path " + tmp.path();
  ASSERT_EQ(run_cohort(common + " --nproc-per-node 2 --train.max-steps 5 --out " + (tmp / "run")).code, 0);
  auto r3 = run_cohort("train --resume " + (tmp / "run") + " --nproc-per-node 3 --oversubscribe --train.max-steps 11");
  ASSERT_EQ(r3.code, 0) << r3.err;
  EXPECT_NE(r3.out.find("launch shape changed on resume: was 2 rank(s), "), std::string::npos) << r3.out;
  EXPECT_NE(r3.out.find(", now 3 rank(s), "), std::string::npos) << r3.out;
  auto r1 = run_cohort("train --resume " + (tmp / "run") + " --nproc-per-node 1 --train.max-steps 19");
  ASSERT_EQ(r1.code, 0) << r1.err;

  auto steps = ids_per_step(tmp / "run");
  ASSERT_EQ(steps.size(), 19u);
  auto perm0 = epoch_permutation(100, 1, 0);
  std::vector<int64_t> epoch0;
  for (int64_t s = 1; s <= 17; ++s) epoch0.insert(epoch0.end(), steps[s].begin(), steps[s].end());
  EXPECT_EQ(epoch0, perm0);  // every sample once, in the global order
  auto perm1 = epoch_permutation(100, 1, 1);
  std::vector<int64_t> epoch1 = steps[18];
  epoch1.insert(epoch1.end(), steps[19].begin(), steps[19].end());
  EXPECT_EQ(epoch1, std::vector<int64_t>(perm1.begin(), perm1.begin() + 12));
}

// Kill -9 a random rank at a random moment, several times: the launcher
// restarts the job from the latest checkpoint each time, the job finishes
// with the uninterrupted run's weights, every step's samples are the global
// order's, and no process is left behind.
TEST(Restart, KillNineAtRandomStepsStillFinishesExactly) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 60);
  std::string common = std::string(COHORT_BIN) + " train" + kTiny +
                       "--log.sample-ids --data.global-batch 6 --ckpt.every-steps 25 --train.max-steps 600 "
                       "--nproc-per-node 3 --oversubscribe --data.path " + tmp.path();
  auto reference = run_cohort(common.substr(std::string(COHORT_BIN).size() + 1) + " --out " + (tmp / "ref"));
  ASSERT_EQ(reference.code, 0) << reference.err;

  // The job may run only as far as the gate file allows (COHORT_DEBUG_GATE),
  // so it cannot finish before the faults however fast or slow the machine.
  const std::string gate = tmp / "gate";
  auto allow = [&](int64_t step) { cohort::test::write_file(gate, std::to_string(step)); };
  allow(150);
  cohort::test::Background job("env COHORT_DEBUG_GATE=" + gate + " " + common + " --max-restarts 5 --out " + (tmp / "run"),
                               tmp, "job");
  std::mt19937 rng(12345);
  int kills = 0;
  std::set<pid_t> all_workers;
  auto latest_step = [&] {
    std::string name = cohort::test::read_file(tmp / "run/checkpoints/latest");
    return name.rfind("step-", 0) == 0 ? std::stoll(name.substr(5)) : int64_t{-1};
  };
  for (int trial = 0; trial < 3; ++trial) {
    // This generation's checkpoint beyond what the last one was allowed to
    // reach, then a random moment more (the job may be waiting at the gate).
    const int64_t limit = 150 * (trial + 1);
    auto deadline = std::chrono::steady_clock::now() + 300s;
    while (latest_step() < limit - 50 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ASSERT_GE(latest_step(), limit - 50) << job.err();
    std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(10, 300)(rng)));
    auto workers = cohort::test::children_of(job.pid());
    ASSERT_EQ(workers.size(), 3u) << job.err();
    all_workers.insert(workers.begin(), workers.end());
    pid_t victim = workers[std::uniform_int_distribution<size_t>(0, 2)(rng)];
    if (kill(victim, SIGKILL) == 0) ++kills;
    allow(limit + 150);
  }
  allow(600);
  int code = job.wait(300s);
  ASSERT_EQ(code, 0) << job.err();
  EXPECT_EQ(kills, 3);
  EXPECT_NE(job.err().find("restarting all 3 local rank(s)"), std::string::npos) << job.err();
  for (pid_t p : all_workers) EXPECT_FALSE(cohort::test::alive(p)) << "worker " << p << " left behind";

  EXPECT_EQ(weights_of(tmp / "ref/checkpoints/step-600"), weights_of(tmp / "run/checkpoints/step-600"));
  EXPECT_EQ(repeated_sample_id_lines(tmp / "run"), 0);
  auto steps = ids_per_step(tmp / "run");
  ASSERT_EQ(steps.size(), 600u);
  for (int64_t epoch = 0; epoch < 60; ++epoch) {
    std::vector<int64_t> seen;
    for (int64_t s = epoch * 10 + 1; s <= epoch * 10 + 10; ++s) seen.insert(seen.end(), steps[s].begin(), steps[s].end());
    ASSERT_EQ(seen, epoch_permutation(60, 1, epoch)) << "epoch " << epoch;
  }
}
