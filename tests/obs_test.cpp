// Observability: TensorBoard records read back independently, the step-time
// breakdown, and the straggler report.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <set>

#include "cohort/obs/tensorboard.hpp"
#include "helpers.hpp"

using namespace cohort;
using cohort::test::read_file;
using cohort::test::run_cohort;
using cohort::test::TempDir;
using cohort::test::write_file;

namespace {

struct Scalar {
  int64_t step;
  std::string tag;
  float value;
};

uint64_t read_varint(const std::string& b, size_t& i) {
  uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    auto c = static_cast<unsigned char>(b.at(i++));
    v |= uint64_t(c & 0x7F) << shift;
    if (!(c & 0x80)) return v;
  }
}

// Calls fn(field, wire, payload) for each field of a protobuf message.
template <class Fn>
void fields(const std::string& msg, Fn fn) {
  size_t i = 0;
  while (i < msg.size()) {
    uint64_t key = read_varint(msg, i);
    int field = static_cast<int>(key >> 3), wire = static_cast<int>(key & 7);
    std::string payload;
    if (wire == 0) {
      uint64_t v = read_varint(msg, i);
      payload.assign(reinterpret_cast<const char*>(&v), 8);
    } else if (wire == 1) {
      payload = msg.substr(i, 8), i += 8;
    } else if (wire == 5) {
      payload = msg.substr(i, 4), i += 4;
    } else if (wire == 2) {
      size_t n = read_varint(msg, i);
      payload = msg.substr(i, n), i += n;
    } else {
      FAIL() << "unexpected wire type " << wire;
    }
    fn(field, wire, payload);
  }
}

// Every scalar in an event file; checks both CRCs of every record.
std::vector<Scalar> read_events(const std::string& path, std::string* version) {
  std::string b = read_file(path);
  std::vector<Scalar> out;
  size_t i = 0;
  while (i < b.size()) {
    EXPECT_LE(i + 12, b.size());
    uint64_t len;
    uint32_t len_crc, data_crc;
    std::memcpy(&len, b.data() + i, 8);
    std::memcpy(&len_crc, b.data() + i + 8, 4);
    EXPECT_EQ(len_crc, masked_crc32c(b.data() + i, 8)) << "length CRC at " << i;
    std::string event = b.substr(i + 12, len);
    std::memcpy(&data_crc, b.data() + i + 12 + len, 4);
    EXPECT_EQ(data_crc, masked_crc32c(event.data(), event.size())) << "data CRC at " << i;
    i += 12 + len + 4;
    int64_t step = 0;
    fields(event, [&](int f, int, const std::string& p) {
      if (f == 2) std::memcpy(&step, p.data(), 8);
      if (f == 3) *version = p;
      if (f == 5) {
        fields(p, [&](int vf, int, const std::string& value) {
          if (vf != 1) return;
          Scalar s{step, "", 0};
          fields(value, [&](int ff, int, const std::string& q) {
            if (ff == 1) s.tag = q;
            if (ff == 2) std::memcpy(&s.value, q.data(), 4);
          });
          out.push_back(s);
        });
      }
    });
  }
  return out;
}

}  // namespace

TEST(TensorBoard, Crc32cCheckValue) {
  // The standard check value of CRC-32C (Castagnoli) over "123456789".
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
}

TEST(TensorBoard, RecordsReadBack) {
  TempDir tmp;
  std::string path;
  {
    TensorBoardWriter w(tmp / "tb");
    path = w.path();
    w.scalars(3, {{"train/loss", 1.25}, {"train/lr", 1e-3}});
    w.scalars(300, {{"test/accuracy", 0.875}});
  }
  std::string version;
  auto s = read_events(path, &version);
  EXPECT_EQ(version, "brain.Event:2");
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].step, 3);
  EXPECT_EQ(s[0].tag, "train/loss");
  EXPECT_EQ(s[0].value, 1.25f);
  EXPECT_EQ(s[1].value, 1e-3f);
  EXPECT_EQ(s[2].step, 300);
  EXPECT_EQ(s[2].tag, "test/accuracy");
  EXPECT_EQ(s[2].value, 0.875f);
}

TEST(TensorBoard, TrainingRunMatchesMetricsJsonl) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 32);
  auto r = run_cohort("train --model.name mlp --data.global-batch 4 --train.max-steps 6 --log.every-steps 2 "
                      "--quiet --data.path " + tmp.path() + " --out " + (tmp / "run"));
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(tmp / "run/tensorboard")) files.push_back(e.path());
  ASSERT_EQ(files.size(), 1u);
  std::string version;
  auto scalars = read_events(files[0], &version);
  std::vector<double> tb_loss, jsonl_loss;
  for (const auto& s : scalars)
    if (s.tag == "train/loss") tb_loss.push_back(s.value);
  for (const auto& line : cohort::test::lines_of(read_file(tmp / "run/metrics.jsonl"))) {
    auto j = nlohmann::json::parse(line);
    if (j["kind"] == "train") jsonl_loss.push_back(j["loss"].get<double>());
  }
  ASSERT_EQ(tb_loss.size(), 3u);
  ASSERT_EQ(jsonl_loss.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(static_cast<float>(tb_loss[i]), static_cast<float>(jsonl_loss[i]));
  // The rate's chart is named by what it counts (metrics.jsonl says it as "unit").
  auto first = nlohmann::json::parse(cohort::test::lines_of(read_file(tmp / "run/metrics.jsonl"))[0]);
  const std::string unit = first.value("unit", "");
  ASSERT_FALSE(unit.empty() || unit == "tokens") << first.dump();
  std::set<std::string> tags;
  for (const auto& s : scalars) tags.insert(s.tag);
  EXPECT_TRUE(tags.count("train/" + unit + "_per_s")) << unit;
  EXPECT_FALSE(tags.count("train/tokens_per_s"));
  EXPECT_FALSE(tags.count("train/unit"));
}

// The phases of the breakdown add up to the measured step time, and a rank
// made artificially slow is the one the report names.
TEST(StepTimes, PhasesSumToTheStepAndTheStragglerIsNamed) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 64);
  std::string cmd = "env COHORT_DEBUG_DELAY=2:15 " + std::string(COHORT_BIN) +
                    " train --model.name mlp --data.global-batch 6 --train.max-steps 30 --log.every-steps 10 "
                    "--nproc-per-node 3 --oversubscribe --quiet --data.path " + tmp.path() + " --out " + (tmp / "run") +
                    " >/dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  int lines = 0;
  for (const auto& line : cohort::test::lines_of(read_file(tmp / "run/metrics.jsonl"))) {
    auto j = nlohmann::json::parse(line);
    if (j["kind"] != "train") continue;
    ++lines;
    EXPECT_EQ(j["slowest_rank"], 2) << line;
    auto p = j["phase_ms"];
    double sum = p["data"].get<double>() + p["forward"].get<double>() + p["backward"].get<double>() +
                 p["comm"].get<double>() + p["optim"].get<double>();
    // Max over ranks per phase: the sum can only exceed a rank's step, and by
    // no more than the waiting the slow rank caused elsewhere; the slow rank's
    // own phases cover its step within 5%.
    EXPECT_GE(p["forward"].get<double>(), 15.0) << line;
    EXPECT_GT(sum, 0.95 * p["step"].get<double>()) << line;
  }
  EXPECT_EQ(lines, 3);
}

TEST(Plot, DrawsAPngOfARealRun) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) GTEST_SKIP() << "SKIPPED: gnuplot is not installed";
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 32);
  auto r = run_cohort("train --model.name mlp --data.global-batch 4 --train.max-steps 16 --log.every-steps 2 "
                      "--eval.every-steps 4 --quiet --data.path " + tmp.path() + " --out " + (tmp / "run"));
  ASSERT_EQ(r.code, 0) << r.err;
  auto p = run_cohort("plot " + (tmp / "run"));
  ASSERT_EQ(p.code, 0) << p.err;
  std::string png = read_file(tmp / "run/plots.png");
  ASSERT_GT(png.size(), 10000u);
  EXPECT_EQ(png.substr(1, 3), "PNG");
  // Labelled axes, a panel per quantity, throughput in the run's own units,
  // the whole learning-rate schedule (warm-up included) from step 0.
  std::string script = read_file(tmp / "run/.plot/plot.gp");
  for (const char* want : {"set ylabel 'loss (cross-entropy)'", "set title 'accuracy'", "set ylabel 'images/s'",
                           "title 'schedule'", "set xrange [0:17]", "set key outside"}) {
    EXPECT_NE(script.find(want), std::string::npos) << want << " in\n" << script;
  }
  EXPECT_EQ(script.find("units/s"), std::string::npos) << script;
  // The last evaluation's value is in the key, with four significant
  // digits, not written over the curves.
  EXPECT_NE(script.find("title 'eval (test), last "), std::string::npos) << script;
  EXPECT_EQ(script.find("set label"), std::string::npos) << script;
  // A run of train.epochs has its whole schedule too (its length from the
  // training set's size in the checkpoint).
  auto epochs = run_cohort("train --model.name mlp --data.global-batch 4 --train.epochs 2 --optim.warmup-ratio 0.2 "
                           "--quiet --data.path " + tmp.path() + " --out " + (tmp / "epochs"));
  ASSERT_EQ(epochs.code, 0) << epochs.err;
  ASSERT_EQ(run_cohort("plot " + (tmp / "epochs")).code, 0);
  EXPECT_NE(read_file(tmp / "epochs/.plot/plot.gp").find("title 'schedule'"), std::string::npos);
  EXPECT_EQ(cohort::test::lines_of(read_file(tmp / "epochs/.plot/lr.dat")).size(), 16u);
  // Five panels (BERT's loss, two accuracies, lr, throughput): the sixth
  // says the run in figures; an accuracy that barely moves gets a 0.1-wide
  // range, not one that makes 0.003 look like a cliff.
  std::string lines;
  for (int step = 1; step <= 4; ++step) {
    lines += "{\"kind\":\"train\",\"step\":" + std::to_string(step) + ",\"loss\":" + std::to_string(7.0 - step * 0.1) +
             ",\"mlm_accuracy\":0.05,\"nsp_accuracy\":" + std::to_string(0.5 + step * 0.001) +
             ",\"lr\":0.001,\"tokens_per_s\":1000,\"unit\":\"tokens\"}\n";
  }
  std::filesystem::create_directories(tmp / "five");
  write_file(tmp / "five/metrics.jsonl", lines);
  ASSERT_EQ(run_cohort("plot " + (tmp / "five")).code, 0);
  script = read_file(tmp / "five/.plot/plot.gp");
  EXPECT_NE(script.find("set title 'the run'"), std::string::npos) << script;
  EXPECT_NE(script.find("last train loss: 6.600"), std::string::npos) << script;
  EXPECT_NE(script.find("set yrange [0.4525:0.5525]"), std::string::npos) << script;
  auto other = run_cohort("plot " + (tmp / "run") + " --out " + (tmp / "other.png"));
  ASSERT_EQ(other.code, 0) << other.err;
  EXPECT_TRUE(std::filesystem::exists(tmp / "other.png"));
  auto missing = run_cohort("plot " + (tmp / "nope"));
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.err.find("metrics.jsonl"), std::string::npos) << missing.err;
}

TEST(Bench, PrintsTheScalingTable) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 64);
  auto r = run_cohort("bench --ranks 1,2 --per-rank-batch 4 --steps 12 -- --model.name mlp --data.path " + tmp.path());
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  auto lines = cohort::test::lines_of(r.out);
  ASSERT_EQ(lines.size(), 4u) << r.out;
  EXPECT_NE(lines[1].find("efficiency"), std::string::npos);
  int ranks = 0, batch = 0;
  double step_ms = 0, rate = 0, speedup = 0, eff = 0;
  ASSERT_EQ(sscanf(lines[3].c_str(), "%d %d %lf %lf %lf %lf", &ranks, &batch, &step_ms, &rate, &speedup, &eff), 6);
  EXPECT_EQ(ranks, 2);
  EXPECT_EQ(batch, 8);
  EXPECT_GT(rate, 0);
  // speedup is printed to 2 decimals (±0.005), efficiency to 3 (±0.0005).
  EXPECT_NEAR(eff, speedup / 2, 0.0031);
  auto bad = run_cohort("bench --ranks 0");
  EXPECT_EQ(bad.code, 2);
  EXPECT_EQ(run_cohort("bench --ranks 1,x").code, 2);
  // --ranks right before "--" (the list option must not swallow it).
  auto last = run_cohort("bench --per-rank-batch 4 --steps 8 --ranks 1 -- --model.name mlp --data.path " + tmp.path());
  EXPECT_EQ(last.code, 0) << last.err;
  EXPECT_EQ(cohort::test::lines_of(last.out).size(), 3u) << last.out;
  EXPECT_EQ(run_cohort("bench --hosts 0").code, 2);
  EXPECT_EQ(run_cohort("bench --hosts 1 --netem 'delay 1ms'").code, 2);
  auto inject = run_cohort("bench --hosts 2 --netem 'delay 1ms; touch /tmp/x'");
  EXPECT_EQ(inject.code, 2) << inject.err;
}

// --hosts: the same short run as two network-namespace "hosts" meeting over
// tcp://, printed as an extra row that says so.
TEST(Bench, NamespaceHostsRow) {
  if (geteuid() != 0) GTEST_SKIP() << "SKIPPED: network namespaces need root";
  if (std::system("ip -V >/dev/null 2>&1") != 0) GTEST_SKIP() << "SKIPPED: iproute2 ('ip') is not installed";
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 64);
  auto r = run_cohort("bench --ranks 1 --hosts 2 --per-rank-batch 4 --steps 12 -- --model.name mlp --data.path " +
                      tmp.path());
  if (r.code != 0 && r.err.find("could not create") != std::string::npos) {
    GTEST_SKIP() << "SKIPPED: cannot create network namespaces here";
  }
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  auto lines = cohort::test::lines_of(r.out);
  ASSERT_EQ(lines.size(), 4u) << r.out;
  int ranks = 0, batch = 0;
  ASSERT_EQ(sscanf(lines[3].c_str(), "%d %d", &ranks, &batch), 2) << lines[3];
  EXPECT_EQ(ranks, 2);
  EXPECT_EQ(batch, 8);
  EXPECT_NE(lines[3].find("2 namespace hosts x 1 rank(s)"), std::string::npos) << lines[3];
}
