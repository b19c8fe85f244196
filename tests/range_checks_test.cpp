// Out-of-range and malformed input is refused before any work starts, with
// one line naming the key (or file) and the value; a data problem is named
// with its file. Most cases run the binary: the exit code and the one line
// on stderr are what a user sees.
#include <CLI/CLI.hpp>
#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <thread>

#include "cohort/ckpt/checkpoint.hpp"
#include "cohort/config/config.hpp"
#include "cohort/core/error.hpp"
#include "cohort/data/text_classify.hpp"
#include "cohort/distributed/comm.hpp"
#include "cohort/distributed/rendezvous.hpp"
#include "cohort/text/wordpiece.hpp"
#include "helpers.hpp"

using namespace cohort;
using namespace std::chrono_literals;
using cohort::test::Background;
using cohort::test::error_of;
using cohort::test::lines_of;
using cohort::test::Result;
using cohort::test::run_cohort;
using cohort::test::TempDir;
using cohort::test::write_file;

namespace {

// A tiny image dataset and the start of a short `cohort train` on it.
std::string tiny_train(const TempDir& tmp) {
  cohort::test::write_tiny_dataset(tmp);
  return "train --model.name mlp --model.hidden 8 --train.max-steps 1 --data.path " + tmp.path() + " --out " +
         (tmp / "run") + " --quiet";
}

// Expects exit code `code` and exactly one stderr line, `cohort: error: ...`,
// that contains every one of `parts`.
void expect_one_line(const Result& r, int code, const std::vector<std::string>& parts) {
  EXPECT_EQ(r.code, code) << r.err << r.out;
  auto lines = lines_of(r.err);
  ASSERT_EQ(lines.size(), 1u) << r.err;
  EXPECT_EQ(lines[0].rfind("cohort: error: ", 0), 0u) << lines[0];
  for (const auto& p : parts) EXPECT_NE(lines[0].find(p), std::string::npos) << "'" << p << "' not in: " << lines[0];
}

// An IDX file of unsigned bytes with these dimensions.
std::string idx(const std::vector<uint32_t>& dims) {
  std::string s = {0, 0, 8, static_cast<char>(dims.size())};
  size_t n = 1;
  for (uint32_t d : dims) {
    n *= d;
    for (int shift : {24, 16, 8, 0}) s += static_cast<char>((d >> shift) & 0xFF);
  }
  for (size_t i = 0; i < n; ++i) s += static_cast<char>(dims.size() == 1 ? i % 4 : i % 251);
  return s;
}

// Parses `args` as the train subcommand does (CLI11 takes them reversed).
Config parse(std::vector<std::string> args, const std::string& file = "") {
  CLI::App app;
  Config cfg;
  ConfigBinding binding(app, cfg);
  std::reverse(args.begin(), args.end());
  app.parse(args);
  if (!file.empty()) binding.apply_file(file);
  return cfg;
}

}  // namespace

// --data.workers 100000 aborted (terminate); --threads 100000 hung.
TEST(RangeChecks, WorkersAndThreadsHaveAnUpperBound) {
  TempDir tmp;
  std::string train = tiny_train(tmp);
  expect_one_line(run_cohort(train + " --data.workers 100000"), 2, {"data.workers", "100000", "256"});
  expect_one_line(run_cohort(train + " --threads 100000"), 2, {"train.threads", "100000", "1024"});
  expect_one_line(run_cohort(train + " --data.workers 257"), 2, {"data.workers", "257"});
}

// 99999999999999999999 became 2^63-1, on the command line and in a file.
TEST(RangeChecks, IntegerOverflowIsAnError) {
  TempDir tmp;
  std::string train = tiny_train(tmp);
  expect_one_line(run_cohort(train + " --data.global-batch 99999999999999999999"), 2,
                  {"data.global-batch", "99999999999999999999", "out of range"});
  write_file(tmp / "c.toml", "[data]\nglobal-batch = 99999999999999999999\n");
  expect_one_line(run_cohort(train + " --config " + (tmp / "c.toml")), 2,
                  {"c.toml:2", "data.global-batch", "99999999999999999999", "out of range"});
  // int keys overflow at 2^31.
  expect_one_line(run_cohort(train + " --ckpt.keep 4294967297"), 2, {"ckpt.keep", "4294967297"});
  // Octal was read as such: 010 was 8.
  EXPECT_NE(error_of([] { parse({"--data.global-batch", "010"}); }).find("leading zeros"), std::string::npos);
}

TEST(RangeChecks, GlobalBatchLargerThanTheSplitIsNamed) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp);  // 8 training images
  auto r = run_cohort("train --model.name mlp --model.hidden 8 --train.max-steps 1 "
                      "--data.global-batch 16 --data.path " + tmp.path() + " --out " + (tmp / "run"));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE((r.out + r.err).find("data.global-batch 16 is larger than the training split (8 samples): each step "
                                 "takes the whole split"),
            std::string::npos)
      << r.out << r.err;
}

// -1 became 18446744073709551615.
TEST(RangeChecks, NegativeSeedIsRefused) {
  TempDir tmp;
  expect_one_line(run_cohort(tiny_train(tmp) + " --train.seed -1"), 2, {"train.seed", "-1", ">= 0"});
  write_file(tmp / "c.toml", "[train]\nseed = -1\n");
  EXPECT_NE(error_of([&] { parse({}, tmp / "c.toml"); }).find("c.toml:2: key 'train.seed' must be >= 0 (got -1)"),
            std::string::npos)
      << error_of([&] { parse({}, tmp / "c.toml"); });
}

TEST(RangeChecks, LaunchFlagsAreChecked) {
  TempDir tmp;
  std::string train = tiny_train(tmp);
  expect_one_line(run_cohort(train + " --node-rank -1"), 2, {"--node-rank", "-1"});
  expect_one_line(run_cohort(train + " --distributed-world-size 0"), 2, {"--distributed-world-size", "0"});
  expect_one_line(run_cohort(train + " --distributed-rank -3"), 2, {"--distributed-rank", "-3"});
  expect_one_line(run_cohort(train + " --node-rank 2"), 2, {"--node-rank 2", "--nnodes 1"});
}

TEST(RangeChecks, PredictBatchMustNotBeNegative) {
  TempDir tmp;
  expect_one_line(run_cohort("predict " + tmp.path() + " --input " + (tmp / "in.tsv") + " --batch -1"), 2,
                  {"--batch", "-1"});
  expect_one_line(run_cohort("eval " + tmp.path() + " --max-samples -5"), 2, {"--max-samples", "-5"});
}

// The README says a key given twice is exit 2; the last one won.
TEST(RangeChecks, KeyGivenTwiceOnTheCommandLine) {
  TempDir tmp;
  std::string train = tiny_train(tmp);
  expect_one_line(run_cohort(train + " --optim.lr 0.1 --optim.lr 0.2"), 2, {"--optim.lr", "0.1", "0.2", "twice"});
  expect_one_line(run_cohort(train + " --threads 2 --train.threads 3"), 2, {"train.threads", "2", "3"});
  expect_one_line(run_cohort(train + " --data.balance-weights 2,1 --data.balance-weights 3"), 2,
                  {"data.balance-weights", "2,1", "3"});
  // A list is one value: still accepted.
  Config cfg = parse({"--data.balance", "weights", "--data.balance-weights", "3,1.5"});
  EXPECT_EQ(cfg.data.balance_weights, (std::vector<double>{3.0, 1.5}));
}

TEST(RangeChecks, TomlTableGivenTwice) {
  TempDir tmp;
  write_file(tmp / "c.toml", "[optim]\nlr = 0.1\n[data]\nworkers = 1\n[optim]\nbeta1 = 0.8\n");
  expect_one_line(run_cohort(tiny_train(tmp) + " --config " + (tmp / "c.toml")), 2,
                  {"c.toml:5", "table [optim] is given twice (first at line 1)"});
}

TEST(RangeChecks, TomlStringForANumber) {
  TempDir tmp;
  write_file(tmp / "c.toml", "[optim]\nlr = \"0.1\"\n");
  expect_one_line(run_cohort(tiny_train(tmp) + " --config " + (tmp / "c.toml")), 2,
                  {"c.toml:2", "optim.lr", "\"0.1\"", "not a string"});
  write_file(tmp / "d.toml", "[data]\ndrop-last = \"true\"\n");
  EXPECT_NE(error_of([&] { parse({}, tmp / "d.toml"); }).find("data.drop-last' takes true or false"),
            std::string::npos);
  write_file(tmp / "e.toml", "[data]\nbalance = \"weights\"\nbalance-weights = [\"2\", 1.0]\n");
  EXPECT_NE(error_of([&] { parse({}, tmp / "e.toml"); }).find("takes numbers, not a string"), std::string::npos)
      << error_of([&] { parse({}, tmp / "e.toml"); });
}

TEST(RangeChecks, TomlWithAByteOrderMarkIsRead) {
  TempDir tmp;
  write_file(tmp / "c.toml", "\xEF\xBB\xBF[optim]\nlr = 0.5\n");
  EXPECT_DOUBLE_EQ(parse({}, tmp / "c.toml").optim.lr, 0.5);
}

// "(got 0)" named a value nobody gave.
TEST(RangeChecks, EmptyNumberIsNamedAsEmpty) {
  TempDir tmp;
  auto r = run_cohort(tiny_train(tmp) + " --optim.lr ''");
  expect_one_line(r, 2, {"optim.lr", "must be a number (got '')"});
  EXPECT_EQ(r.err.find("got 0"), std::string::npos) << r.err;
}

// With one rank the init method was never read.
TEST(RangeChecks, InitMethodIsCheckedWithOneRank) {
  TempDir tmp;
  std::string train = tiny_train(tmp);
  for (std::string bad : {"http://127.0.0.1:1234", "tcp://127.0.0.1:99999", "tcp://127.0.0.1", "file://relative/x"}) {
    expect_one_line(run_cohort(train + " --init-method " + bad), 2, {"init method '" + bad + "'"});
  }
}

// Two nodes with different --nnodes each waited dist.timeout and exited 1.
TEST(RangeChecks, NodesWithDifferentNnodesAreToldAtOnce) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp);
  int port = cohort::test::free_port();
  std::string common = std::string(COHORT_BIN) + " train --model.name mlp --model.hidden 8 --train.max-steps 1 "
                       "--dist.timeout 600 --quiet --data.path " + tmp.path() + " --out " + (tmp / "run") +
                       " --init-method tcp://127.0.0.1:" + std::to_string(port);
  Background n0(common + " --nnodes 2 --node-rank 0", tmp, "n0");
  Background n1(common + " --nnodes 3 --node-rank 1", tmp, "n1");
  // Each exits once it has seen the other's count: long before
  // dist.timeout (600 s), however loaded the machine.
  int c1 = n1.wait(300s), c0 = n0.wait(300s);
  EXPECT_EQ(c0, 2) << n0.err();
  EXPECT_EQ(c1, 2) << n1.err();
  for (const std::string& err : {n0.err(), n1.err()}) {
    EXPECT_NE(err.find("--nnodes differs between nodes"), std::string::npos) << err;
  }
  EXPECT_NE(n0.err().find("this node has --nnodes 2 but node 1 has --nnodes 3"), std::string::npos) << n0.err();
  EXPECT_NE(n1.err().find("this node has --nnodes 3 but node 0 has --nnodes 2"), std::string::npos) << n1.err();
}

// A stranger with the wrong secret: a configuration mismatch, exit 2.
TEST(RangeChecks, WrongSecretIsAUsageError) {
  int port = cohort::test::free_port();
  std::vector<int> codes(2, 0);
  std::vector<std::string> errors(2);
  cohort::test::spawn(2, [&](int rank) {
    RankSpec s;
    s.rank = s.local_rank = rank;
    s.world_size = s.local_world_size = 2;
    s.init = parse_init_method("tcp://127.0.0.1:" + std::to_string(port));
    s.host_store = rank == 0;
    CommOptions o;
    o.timeout = std::chrono::seconds(3);  // rank 0 waits for a peer that never joins
    o.device = DeviceKind::kCpu;
    o.secret = rank == 0 ? "right" : "wrong";
    try {
      Comm::connect(s, o);
    } catch (const Error& e) {
      codes[rank] = e.exit_code();
      errors[rank] = e.what();
    }
  });
  EXPECT_EQ(codes[1], 2) << errors[1];
  EXPECT_NE(errors[1].find("secret differs"), std::string::npos) << errors[1];
}

TEST(RangeChecks, PrepareRefusesATruncatedGzip) {
  TempDir tmp;
  std::string corpus;
  std::mt19937 rng(7);
  const char* words[] = {"alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta"};
  for (int doc = 0; doc < 400; ++doc) {
    for (int s = 0; s < 5; ++s) {
      for (int w = 0; w < 9; ++w) corpus += std::string(words[rng() % 8]) + (w < 8 ? " " : ".\n");
    }
    corpus += "\n";
  }
  write_file(tmp / "c.txt", corpus);
  ASSERT_EQ(std::system(("gzip -c " + (tmp / "c.txt") + " > " + (tmp / "c.txt.gz")).c_str()), 0);
  std::filesystem::resize_file(tmp / "c.txt.gz", std::filesystem::file_size(tmp / "c.txt.gz") / 2);
  expect_one_line(run_cohort("prepare --input " + (tmp / "c.txt.gz") + " --out " + (tmp / "out") + " --quiet"), 1,
                  {"c.txt.gz", "truncated"});
  EXPECT_FALSE(std::filesystem::exists(tmp / "out/vocab.txt"));
}

TEST(RangeChecks, PrepareRefusesRandomBytesAsADictionary) {
  TempDir tmp;
  std::string noise;
  std::mt19937 rng(11);
  for (int i = 0; i < 200000; ++i) noise += static_cast<char>(rng() & 0xFF);
  write_file(tmp / "x.dict.dz", noise);
  expect_one_line(run_cohort("prepare --input " + (tmp / "x.dict.dz") + " --out " + (tmp / "out") + " --quiet"), 1,
                  {"x.dict.dz", "not gzip-compressed"});
  write_file(tmp / "y.dict", noise);
  expect_one_line(run_cohort("prepare --input " + (tmp / "y.dict") + " --out " + (tmp / "out2") + " --quiet"), 1,
                  {"y.dict", "not a dictd dictionary"});
}

// The CNN then failed at eval with a raw libtorch shape message.
TEST(RangeChecks, TestImagesOfAnotherShapeAreNamed) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp);
  write_file(tmp / "t10k-images-idx3-ubyte", idx({8, 12, 12}));
  auto r = run_cohort("train --model.name cnn --model.hidden 8 --train.max-steps 1 --quiet --data.path " +
                      tmp.path() + " --out " + (tmp / "run"));
  expect_one_line(r, 1, {tmp.path() + " (test)", "images of 12x12 but the training set's are 8x8"});
  EXPECT_FALSE(std::filesystem::exists(tmp / "run/checkpoints"));
}

TEST(RangeChecks, EveryCorruptCheckpointSaysWhy) {
  TempDir tmp;
  for (const char* step : {"step-1", "step-2"}) {
    std::filesystem::create_directories(tmp / ("checkpoints/" + std::string(step)));
    write_file(tmp / ("checkpoints/" + std::string(step) + "/state.json"), "{not json");
  }
  std::string msg = error_of([&] { Checkpoints::resolve(tmp.path(), nullptr); });
  EXPECT_NE(msg.find("every one was rejected"), std::string::npos) << msg;
  EXPECT_NE(msg.find("step-2: "), std::string::npos) << msg;
  EXPECT_NE(msg.find("step-1: "), std::string::npos) << msg;
  EXPECT_NE(msg.find("state.json"), std::string::npos) << msg;
}

TEST(RangeChecks, ModelInitOfAnEmptyDirectory) {
  TempDir tmp;
  std::string msg = error_of([&] { model_weights_file(tmp.path()); });
  EXPECT_EQ(msg.find("resume"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no weights here"), std::string::npos) << msg;
  std::filesystem::create_directories(tmp / "empty");
  auto r = run_cohort(tiny_train(tmp) + " --model.init " + (tmp / "empty"));
  expect_one_line(r, 1, {"model.init " + (tmp / "empty"), "no weights here"});
  EXPECT_EQ(r.err.find("resume"), std::string::npos) << r.err;
}

TEST(RangeChecks, PlotNamesTheLineOfANullStep) {
  TempDir tmp;
  write_file(tmp / "metrics.jsonl", "{\"kind\":\"train\",\"step\":1,\"loss\":2.0}\n"
                                    "{\"kind\":\"train\",\"step\":null,\"loss\":1.0}\n");
  expect_one_line(run_cohort("plot " + tmp.path()), 1, {"metrics.jsonl:2", "\"step\" must be a number (got null)"});
}

// "empty file" for a directory.
TEST(RangeChecks, ClassifyInputThatIsADirectory) {
  TempDir tmp;
  std::vector<std::string> tokens = text::special_tokens();
  tokens.push_back("a");
  text::WordPiece wp(text::Vocab(tokens), text::TokenizerOptions{});
  TextClassifyOptions opts;
  opts.require_labels = false;
  std::string msg = error_of([&] { TextClassification data(tmp.path(), wp, opts); });
  EXPECT_NE(msg.find(tmp.path() + ": is a directory"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("empty file"), std::string::npos) << msg;
}

// A raw allocator message named no key.
TEST(RangeChecks, AModelTooLargeNamesTheKey) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp);
  std::string train = "train --train.max-steps 1 --quiet --data.path " + tmp.path() + " --out " + (tmp / "run");
  expect_one_line(run_cohort(train + " --model.name mlp --model.hidden 100000000"), 2,
                  {"model.hidden 100000000 makes the mlp model", "GiB"});
  expect_one_line(run_cohort(train + " --model.name cnn --model.hidden 100000000000"), 2,
                  {"model.hidden 100000000000 makes the cnn model", "GiB"});
  EXPECT_FALSE(std::filesystem::exists(tmp / "run/checkpoints"));
}

TEST(RangeChecks, OutThatIsAFileIsAUsageError) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp);
  write_file(tmp / "file", "x");
  expect_one_line(run_cohort("train --model.name mlp --train.max-steps 1 --quiet --data.path " + tmp.path() +
                             " --out " + (tmp / "file")),
                  2, {"--out " + (tmp / "file"), "existing file"});
}

// bench adds its own keys to each `cohort train`; the same key after -- was
// silently overridden, and is now named.
TEST(RangeChecks, BenchNamesTheTrainKeysItSets) {
  expect_one_line(run_cohort("bench --ranks 1 -- --threads 2"), 2, {"bench sets --threads", "--threads-per-rank"});
  expect_one_line(run_cohort("bench --ranks 1 -- --data.global-batch=8"), 2,
                  {"bench sets --data.global-batch", "--per-rank-batch", "--data.global-batch=8"});
}
