// End-to-end checks of the `cohort` binary: exit codes and the one-line
// error contract.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <zlib.h>

#include <CLI/CLI.hpp>

#include "cohort/config/config.hpp"
#include "helpers.hpp"

using cohort::test::Result;
using cohort::test::run_cohort;
using cohort::test::TempDir;
using cohort::test::write_file;

namespace {

// Exactly one line on stderr, starting "cohort: error:", containing `needle`.
void expect_one_error_line(const Result& r, int code, const std::string& needle) {
  EXPECT_EQ(r.code, code) << r.err;
  auto lines = cohort::test::lines_of(r.err);
  ASSERT_EQ(lines.size(), 1u) << r.err;
  EXPECT_EQ(lines[0].rfind("cohort: error: ", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find(needle), std::string::npos) << lines[0];
}

}  // namespace

TEST(Cli, HelpListsEveryKeyWithItsDefault) {
  Result r = run_cohort("train --help");
  ASSERT_EQ(r.code, 0) << r.err;
  CLI::App app;
  cohort::Config cfg;
  cohort::ConfigBinding binding(app, cfg);
  auto toml = binding.to_toml();
  for (const auto& key : binding.keys()) {
    auto at = r.out.find("--" + key);
    ASSERT_NE(at, std::string::npos) << key;
    // The flag is followed by its type and "=default" (bools: "=false").
    auto line_end = r.out.find('\n', at);
    EXPECT_NE(r.out.substr(at, line_end - at).find('='), std::string::npos) << key;
  }
  EXPECT_NE(r.out.find("--optim.lr FLOAT=0.001"), std::string::npos);
}

TEST(Cli, UsageErrorsExitTwo) {
  TempDir tmp;
  expect_one_error_line(run_cohort("train --out " + (tmp / "r") + " --no-such-flag 3"), 2, "--no-such-flag");
  expect_one_error_line(run_cohort("train --out " + (tmp / "r") + " --optim.lr fast"), 2, "fast");
  expect_one_error_line(run_cohort("train --out " + (tmp / "r") + " --optim.lr -1"), 2, "optim.lr");
  expect_one_error_line(run_cohort("train --out " + (tmp / "r") + " --data.global-batch 0"), 2, "data.global-batch");
  expect_one_error_line(run_cohort("train --out " + (tmp / "r") + " --train.max-steps 0"), 2, "train.max-steps");
  expect_one_error_line(run_cohort("train --out " + (tmp / "r") + " --model.name resnet"), 2, "resnet");
  expect_one_error_line(run_cohort("train --out " + (tmp / "r") + " --config " + (tmp / "missing.toml")), 2,
                        "missing.toml");
  write_file(tmp / "bad.toml", "[optim]\nlearning_rate = 1\n");
  expect_one_error_line(run_cohort("train --out " + (tmp / "r") + " --config " + (tmp / "bad.toml")), 2,
                        "optim.learning_rate");
  write_file(tmp / "type.toml", "[train]\nmax-steps = 2.5\n");
  expect_one_error_line(run_cohort("train --out " + (tmp / "r") + " --config " + (tmp / "type.toml")), 2,
                        "train.max-steps");
  expect_one_error_line(run_cohort("frobnicate"), 2, "frobnicate");
  expect_one_error_line(run_cohort("eval " + (tmp / "wordnet-tin")), 2, "wordnet-tin: no such directory");
  expect_one_error_line(run_cohort("train --resume " + (tmp / "wordnet-tin")), 2, "wordnet-tin: no such directory");
  EXPECT_FALSE(std::filesystem::exists(tmp / "r")) << "a refused run must not create its run dir";
}

// Issue 46: a key that has no effect in the run's configuration was
// accepted (exit 0) and silently ignored. Each is one line, exit 2, that
// names the key and what would make it count; nothing is created.
TEST(Cli, KeysThatWouldBeIgnoredAreRefusedNamingWhy) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 16);
  const std::string train = "train --model.name mlp --model.hidden 8 --data.path " + tmp.path() + " --out " + (tmp / "r");
  expect_one_error_line(run_cohort(train + " --dist.shard-replicas 2"), 2, "dist.shard-replicas");
  expect_one_error_line(run_cohort(train + " --dist.shard-weights 2,1"), 2, "dist.shard-weights");
  expect_one_error_line(run_cohort(train + " --optim.outer-lr 0.5"), 2, "optim.outer-lr");
  expect_one_error_line(run_cohort(train + " --optim.outer-momentum 0.9"), 2, "dist.sync = local");
  expect_one_error_line(run_cohort(train + " --dist.local-steps 4"), 2, "dist.local-steps");
  expect_one_error_line(run_cohort(train + " --task.masking dynamic"), 2, "applies to train.task bert-pretrain");
  expect_one_error_line(run_cohort(train + " --data.max-seq-length 64"), 2, "applies to train.task bert-classify");
  // Sharding that the world cannot hold: one range held by every rank
  // would be no sharding at all.
  expect_one_error_line(run_cohort(train + " --optim.name adamw --dist.shard optimizer --dist.shard-replicas 2"), 2,
                        "dist.shard-replicas 2");
  Result three = run_cohort(train + " --optim.name adamw --dist.shard optimizer --dist.shard-replicas 2 "
                                    "--nproc-per-node 3 --oversubscribe");
  expect_one_error_line(three, 2, "this one has 3 rank(s): use 2 or 4 ranks");
  // One line from the launcher, not one per rank besides.
  expect_one_error_line(run_cohort(train + " --optim.name adamw --dist.shard optimizer --dist.shard-weights 2,1,1 "
                                           "--nproc-per-node 2 --oversubscribe"),
                        2, "gives 3 weight(s)");
  // A tracking address that cannot be one fails at start-up, as a bad
  // --init-method does, not as a warning at the end.
  expect_one_error_line(run_cohort(train + " --log.mlflow http://127.0.0.1:99999"), 2, "outside 1..65535");
  expect_one_error_line(run_cohort(train + " --log.mlflow 'http://127.0.0.1:1 x'"), 2, "without spaces");
  expect_one_error_line(run_cohort(train + " --log.mlflow http://:5000"), 2, "names no host");
  expect_one_error_line(run_cohort(train + " --log.mlflow http://host:port"), 2, "not a number");
  EXPECT_FALSE(std::filesystem::exists(tmp / "r")) << "a refused run must not create its run dir";
  // The same keys where they count are accepted (their modes on).
  Result ok = run_cohort(train + " --train.max-steps 2 --quiet --log.tensorboard=false --dist.sync local "
                                 "--optim.outer-lr 0.5 --dist.local-steps 2");
  EXPECT_EQ(ok.code, 0) << ok.err;
}

TEST(Cli, BadDataExitsOneNamingTheFile) {
  TempDir tmp;
  std::string base = "train --out " + (tmp / "r") + " --overwrite --data.path " + tmp.path();
  expect_one_error_line(run_cohort(base), 1, "train-images-idx3-ubyte");

  cohort::test::write_tiny_dataset(tmp);
  std::string images = tmp / "train-images-idx3-ubyte";
  std::string good = cohort::test::read_file(images);
  write_file(images, good.substr(0, good.size() - 100));
  expect_one_error_line(run_cohort(base), 1, images);

  write_file(images, "garbage that is not IDX");
  expect_one_error_line(run_cohort(base), 1, images);

  std::filesystem::remove(images);
  write_file(images + ".gz", "\x1f\x8b\x08\x00 this is not deflate data at all, it is corrupt");
  expect_one_error_line(run_cohort(base), 1, images + ".gz");
}

TEST(Cli, TrainsOnATinyDatasetAndResolvesTheConfig) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp);
  write_file(tmp / "c.toml", "[train]\nmax-steps = 4\n[optim]\nlr = 0.5\n[data]\nglobal-batch = 4\n");
  Result r = run_cohort("train --config " + (tmp / "c.toml") + " --optim.lr 0.01 --model.name mlp --data.path " +
                        tmp.path() + " --out " + (tmp / "run") + " --log.every-steps 1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(r.err.empty()) << r.err;
  EXPECT_NE(r.out.find("step      4/4"), std::string::npos) << r.out;
  std::string resolved = cohort::test::read_file(tmp / "run/config.toml");
  EXPECT_NE(resolved.find("[optim]\nname = \"adamw\"\nlr = 0.01\n"), std::string::npos) << resolved;
  EXPECT_NE(resolved.find("max-steps = 4\n"), std::string::npos) << resolved;
  // 4 train lines, an eval at the end of epoch 0 (8 samples = 2 steps) and one
  // at the last step.
  EXPECT_EQ(cohort::test::lines_of(cohort::test::read_file(tmp / "run/metrics.jsonl")).size(), 6u);

  // The resolved config is itself a valid config that reproduces the run.
  Result again = run_cohort("train --config " + (tmp / "run/config.toml") + " --out " + (tmp / "run2") + " --quiet");
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_EQ(cohort::test::read_file(tmp / "run2/config.toml"), resolved);
  EXPECT_EQ(cohort::test::read_file(tmp / "run2/metrics.jsonl").size() > 0, true);

  // The same run dir again is refused, and nothing in it is lost.
  expect_one_error_line(run_cohort("train --config " + (tmp / "run/config.toml") + " --out " + (tmp / "run")), 2,
                        "already holds a run");
  EXPECT_EQ(cohort::test::read_file(tmp / "run/config.toml"), resolved);

  // An image model exports its weights and a description, and says that no
  // Hugging Face class loads it.
  Result exp = run_cohort("export " + (tmp / "run"));
  ASSERT_EQ(exp.code, 0) << exp.err;
  EXPECT_NE(exp.err.find("no Hugging Face class exists for Cohort's 'mlp' image model"), std::string::npos) << exp.err;
  auto described = nlohmann::json::parse(cohort::test::read_file(tmp / "run/export/config.json"));
  EXPECT_EQ(described["cohort_model"], "mlp");
  EXPECT_FALSE(described["tensors"].empty());
  EXPECT_TRUE(std::filesystem::exists(tmp / "run/export/model.safetensors"));
  expect_one_error_line(run_cohort("export " + (tmp / "run") + " --out " + (tmp / "c.toml")), 2, "is a file");
}

// Every example config the README points to loads and validates.
TEST(Cli, EveryExampleConfigLoads) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(std::string(COHORT_SOURCE_DIR) + "/examples")) {
    if (e.path().extension() != ".toml") continue;
    EXPECT_NO_THROW(cohort::load_config(e.path().string())) << e.path();
    ++n;
  }
  EXPECT_GE(n, 8);
}

// The README points to docs/configuration.md for the full key table.
TEST(Cli, ConfigReferenceDocumentsEveryKey) {
  std::string reference = cohort::test::read_file(std::string(COHORT_SOURCE_DIR) + "/docs/configuration.md");
  ASSERT_FALSE(reference.empty());
  std::string readme = cohort::test::read_file(std::string(COHORT_SOURCE_DIR) + "/README.md");
  EXPECT_NE(readme.find("docs/configuration.md"), std::string::npos);
  CLI::App app;
  cohort::Config cfg;
  cohort::ConfigBinding binding(app, cfg);
  for (const auto& key : binding.keys()) {
    EXPECT_NE(reference.find("| `" + key + "`"), std::string::npos)
        << key << " is missing from docs/configuration.md's key table";
  }
}

TEST(Cli, UnknownCommandLineKeyGetsTheNearestKey) {
  Result r = run_cohort("train --optim.lrr 3 --out /tmp/never");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("(did you mean '--optim.lr'?)"), std::string::npos) << r.err;
}

// The flags torchrun and Hugging Face Trainer users type get Cohort's
// spelling, and the message names the option, not its value first.
TEST(Cli, ForeignSpellingsGetCohortsFlag) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"train --nproc_per_node 2", "--nproc-per-node"},
      {"train --node_rank 1", "--node-rank"},
      {"train --master-addr 10.0.0.1", "--init-method tcp://HOST:PORT"},
      {"train --master_port 29500", "--init-method tcp://HOST:PORT"},
      {"train --seed 3", "--train.seed"},
      {"train --max-steps 3", "--train.max-steps"},
      {"train --max_steps 3", "--train.max-steps"},
      {"train --bf16", "--train.precision bf16"},
      {"train --output_dir x", "--out"},
      {"train --learning_rate 1e-4", "--optim.lr"},
      {"train --resume_from_checkpoint x", "--resume"},
      {"train --optimizer.lr 0.1", "--optim.lr"},
      {"plot --output_dir x RUN", "--out"},
  };
  for (const auto& [args, want] : cases) {
    Result r = run_cohort(args);
    EXPECT_EQ(r.code, 2) << args;
    const std::string flag = args.substr(args.find(' ') + 1, args.find(' ', args.find(' ') + 1) - args.find(' ') - 1);
    EXPECT_NE(r.err.find("unknown option '" + flag + "'"), std::string::npos) << args << ": " << r.err;
    EXPECT_NE(r.err.find("(did you mean '" + want + "'?)"), std::string::npos) << args << ": " << r.err;
    const std::string sub = args.substr(0, args.find(' '));
    EXPECT_NE(r.err.find("(see 'cohort " + sub + " --help')"), std::string::npos) << args << ": " << r.err;
  }
  // A batch size by Hugging Face's name is not a rename: the hint says how they differ.
  Result batch = run_cohort("train --per_device_train_batch_size 8");
  EXPECT_EQ(batch.code, 2);
  EXPECT_NE(batch.err.find("(did you mean '--data.micro-batch'?): a step takes --data.global-batch samples over all "
                           "ranks (per-device batch x devices x accumulation steps)"),
            std::string::npos) << batch.err;
  // In a config file: a section by another tool's name.
  TempDir tmp;
  write_file(tmp / "c.toml", "[optimizer]\nlr = 0.1\n");
  Result file = run_cohort("train --config " + (tmp / "c.toml") + " --out " + (tmp / "run"));
  EXPECT_EQ(file.code, 2);
  EXPECT_NE(file.err.find("(did you mean 'optim.lr'?)"), std::string::npos) << file.err;
  // A value of the wrong type names the type.
  Result type = run_cohort("train --data.global-batch 64.5 --out " + (tmp / "run"));
  EXPECT_NE(type.err.find("--data.global-batch: must be an integer (got '64.5')"), std::string::npos) << type.err;
}

// train.early-stop-patience: with a learning rate too small to change any
// weight, accuracy never improves on its first evaluation (step 2), so the
// run stops after two more (step 6) and says why; the best checkpoint stays.
TEST(Cli, EarlyStopEndsTheRunAfterPatienceEvaluationsWithoutImprovement) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp);
  const std::string base = "train --model.name mlp --data.global-batch 4 --train.max-steps 100 --eval.every-steps 2"
                           " --optim.lr 1e-30 --optim.weight-decay 0 --data.path " + tmp.path();
  Result r = run_cohort(base + " --ckpt.best-metric accuracy --train.early-stop-patience 2 --out " + (tmp / "run"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("early stop: accuracy did not improve for 2 evaluations (best "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("at step 2) at step 6"), std::string::npos) << r.out;
  int64_t last = 0;
  for (const auto& line : cohort::test::lines_of(cohort::test::read_file(tmp / "run/metrics.jsonl"))) {
    auto j = nlohmann::json::parse(line);
    if (j["kind"] == "train") last = j["step"];
  }
  EXPECT_EQ(last, 6);
  EXPECT_EQ(nlohmann::json::parse(cohort::test::read_file(tmp / "run/checkpoints/best.json"))["step"], 2);
  expect_one_error_line(run_cohort(base + " --train.early-stop-patience 2 --out " + (tmp / "no")), 2,
                        "train.early-stop-patience needs ckpt.best-metric");

  // The count goes on across a resume: best at step 2, one evaluation
  // without improvement (step 4) before it, two after (6, 8), not three.
  const std::string shorter = "train --model.name mlp --data.global-batch 4 --eval.every-steps 2"
                              " --optim.lr 1e-30 --optim.weight-decay 0 --data.path " + tmp.path();
  Result first = run_cohort(shorter + " --train.max-steps 4 --ckpt.best-metric accuracy --train.early-stop-patience 3"
                            " --out " + (tmp / "resumed"));
  ASSERT_EQ(first.code, 0) << first.err;
  Result resumed = run_cohort("train --resume " + (tmp / "resumed") + " --train.max-steps 100");
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("early stop: accuracy did not improve for 3 evaluations (best "), std::string::npos)
      << resumed.out;
  EXPECT_NE(resumed.out.find("at step 2) at step 8"), std::string::npos) << resumed.out;
}

// The automatic cut keeps a multiple of 12 micro-batches, which for a small
// global batch means pieces of a few samples, slow to compute: start-up
// names a larger data.micro-batch, and says nothing when one is given.
TEST(Cli, SmallAutomaticMicroBatchesNameAFasterCut) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp, 64);
  const std::string train = "train --model.name mlp --model.hidden 8 --data.global-batch 32 --train.max-steps 1 "
                            "--data.path " + tmp.path();
  Result automatic = run_cohort(train + " --out " + (tmp / "auto"));
  ASSERT_EQ(automatic.code, 0) << automatic.err;
  const std::string said = automatic.out + automatic.err;
  EXPECT_NE(said.find("global batch 32 = 12 micro-batch(es) of 2-3 sample(s)"), std::string::npos) << said;
  EXPECT_NE(said.find("note: the automatic cut makes micro-batches of only 2-3 sample(s), so that 1 to 12 ranks get "
                      "equal shares; data.micro-batch 32 computes 1 larger one(s)"),
            std::string::npos) << said;
  Result given = run_cohort(train + " --data.micro-batch 32 --out " + (tmp / "given"));
  ASSERT_EQ(given.code, 0) << given.err;
  EXPECT_EQ((given.out + given.err).find("the automatic cut"), std::string::npos) << given.out;
}
