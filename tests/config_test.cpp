#include <CLI/CLI.hpp>
#include <gtest/gtest.h>

#include "cohort/config/config.hpp"
#include "cohort/core/error.hpp"
#include "helpers.hpp"

using namespace cohort;
using cohort::test::error_of;
using cohort::test::TempDir;
using cohort::test::write_file;

namespace {

// Parses `args` (without the program name) and optionally a config file, the
// way main does.
Config parse(std::vector<std::string> args, const std::string& file = "") {
  CLI::App app;
  Config cfg;
  ConfigBinding binding(app, cfg);
  std::reverse(args.begin(), args.end());  // CLI11 takes them reversed
  app.parse(args);
  if (!file.empty()) binding.apply_file(file);
  return cfg;
}

}  // namespace

TEST(Config, DefaultsAreValid) {
  Config cfg;
  EXPECT_NO_THROW(validate(cfg));
  EXPECT_EQ(cfg.train.max_steps, -1);
  EXPECT_EQ(cfg.optim.name, OptimizerKind::kAdamW);
}

TEST(Config, CommandLineSetsTypedFields) {
  Config cfg = parse({"--optim.lr", "0.25", "--data.global-batch", "96", "--model.name", "mlp",
                      "--data.drop-last", "--threads", "3"});
  EXPECT_DOUBLE_EQ(cfg.optim.lr, 0.25);
  EXPECT_EQ(cfg.data.global_batch, 96);
  EXPECT_EQ(cfg.model.name, "mlp");
  EXPECT_TRUE(cfg.data.drop_last);
  EXPECT_EQ(cfg.train.threads, 3);
}

// A boolean key takes no value, =false, or true/false as the next word, as
// `prepare --nsp false` does; a word that is neither is refused.
TEST(Config, BooleanKeysTakeTrueOrFalseAsTheirOwnWord) {
  EXPECT_FALSE(parse({"--task.nsp", "false", "--optim.lr", "0.5"}).task_key<bool>("task.nsp"));
  EXPECT_TRUE(parse({"--task.nsp", "true"}).task_key<bool>("task.nsp"));
  EXPECT_FALSE(parse({"--task.nsp=false"}).task_key<bool>("task.nsp"));
  Config flag = parse({"--data.drop-last", "--optim.lr", "0.5"});
  EXPECT_TRUE(flag.data.drop_last);
  EXPECT_DOUBLE_EQ(flag.optim.lr, 0.5);
  EXPECT_FALSE(parse({"--data.drop-last", "false"}).data.drop_last);
  EXPECT_NE(error_of([] { parse({"--data.drop-last", "maybe"}); }).find("maybe"), std::string::npos);
}

TEST(Config, FileSetsKeysAndCommandLineWins) {
  TempDir tmp;
  write_file(tmp / "c.toml",
             "# comment\n[optim]\nlr = 0.5\nname = \"sgd\"\n\n[data]\nglobal-batch = 32\ndrop-last = true\n"
             "[train]\nseed = 7\n");
  Config cfg = parse({"--optim.lr", "0.125"}, tmp / "c.toml");
  EXPECT_DOUBLE_EQ(cfg.optim.lr, 0.125);  // command line wins
  EXPECT_EQ(cfg.optim.name, OptimizerKind::kSgd);       // file applies
  EXPECT_EQ(cfg.data.global_batch, 32);
  EXPECT_TRUE(cfg.data.drop_last);
  EXPECT_EQ(cfg.train.seed, 7u);
}

TEST(Config, UnknownFileKeyIsAnErrorNamingFileAndKey) {
  TempDir tmp;
  write_file(tmp / "c.toml", "[optim]\nlearning-rate = 0.5\n");
  std::string msg = error_of([&] { parse({}, tmp / "c.toml"); });
  EXPECT_NE(msg.find("c.toml"), std::string::npos) << msg;
  EXPECT_NE(msg.find("optim.learning-rate"), std::string::npos) << msg;

  write_file(tmp / "d.toml", "[optim]\nlrr = 0.5\n");
  msg = error_of([&] { parse({}, tmp / "d.toml"); });
  EXPECT_NE(msg.find("did you mean 'optim.lr'"), std::string::npos) << msg;

  // As few edits from optim.name as from optim.lr: the common start decides.
  write_file(tmp / "f.toml", "[optim]\nlrate = 0.5\n");
  msg = error_of([&] { parse({}, tmp / "f.toml"); });
  EXPECT_NE(msg.find("did you mean 'optim.lr'"), std::string::npos) << msg;

  write_file(tmp / "e.toml", "[nosuch]\nlr = 0.5\n");
  EXPECT_THROW(parse({}, tmp / "e.toml"), UsageError);
}

TEST(Config, UnknownCommandLineKeyIsAnError) {
  EXPECT_THROW(parse({"--optim.learning-rate", "1"}), CLI::ParseError);
}

TEST(Config, WrongTypeIsAnError) {
  TempDir tmp;
  write_file(tmp / "c.toml", "[data]\nglobal-batch = \"many\"\n");
  std::string msg = error_of([&] { parse({}, tmp / "c.toml"); });
  EXPECT_NE(msg.find("data.global-batch"), std::string::npos) << msg;
  EXPECT_NE(msg.find("many"), std::string::npos) << msg;
  EXPECT_THROW(parse({"--optim.lr", "fast"}), CLI::ParseError);
}

// Hardening: CLI11's reader took an unterminated string as a value ('"abc')
// and `[model` as part of a key name. The line is named instead.
TEST(Config, MalformedTomlNamesTheLine) {
  TempDir tmp;
  struct Case {
    std::string text, expected;
  };
  for (const auto& c : std::vector<Case>{
           {"[optim]\nlr = \"abc\n", "c.toml:2: unterminated string"},
           {"[optim]\nlr = 0.1\n[model\nname = \"mlp\"\n", "c.toml:3: table header without ']'"},
           {"[model]\nname = 'mlp\n", "c.toml:2: unterminated string"},
           {"[model]\nname \"mlp\"\n", "c.toml:2: expected key = value"},
           {"[model]\nname =\n", "c.toml:2: a key without a value"},
           {"[data]\nbalance-weights = [1.0,\n  2.0\n", "an array is not closed"},
           {"[model] x\n", "c.toml:1: text after a table header"},
           {"[mo del]\n", "c.toml:1: malformed table header"},
       }) {
    write_file(tmp / "c.toml", c.text);
    std::string msg = error_of([&] { parse({}, tmp / "c.toml"); });
    EXPECT_NE(msg.find(c.expected), std::string::npos) << c.text << " -> " << msg;
  }
  // What is valid stays valid: comments, quotes with '#' and escapes,
  // arrays over lines.
  write_file(tmp / "ok.toml", "# c\n[model]  # the model\nname = \"mlp\" # x\n[data]\npath = \"/a#b\\\"c\"\n"
                              "balance-weights = [\n  2.0,  # fast\n  1.0,\n]\n");
  Config cfg = parse({}, tmp / "ok.toml");
  EXPECT_EQ(cfg.model.name, "mlp");
  EXPECT_EQ(cfg.data.path, "/a#b\"c");
  EXPECT_EQ(cfg.data.balance_weights, (std::vector<double>{2.0, 1.0}));
}

TEST(Config, UnreadableFileIsAUsageError) {
  std::string msg;
  try {
    parse({}, "/nonexistent/cohort.toml");
  } catch (const UsageError& e) {
    msg = e.what();
    EXPECT_EQ(e.exit_code(), 2);
  }
  EXPECT_NE(msg.find("/nonexistent/cohort.toml"), std::string::npos) << msg;
}

struct BadValue {
  std::vector<std::string> args;
  std::string key;
  std::string value;
};

void PrintTo(const BadValue& b, std::ostream* os) { *os << b.key << " = " << b.value; }

class ConfigValidation : public ::testing::TestWithParam<BadValue> {};

TEST_P(ConfigValidation, NamesKeyAndValue) {
  const BadValue& bad = GetParam();
  try {
    validate(parse(bad.args));  // a word outside a choice's table fails in parse already
    FAIL() << "accepted " << bad.key << " = " << bad.value;
  } catch (const ConfigError& e) {
    std::string msg = e.what();
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_NE(msg.find(bad.key), std::string::npos) << msg;
    EXPECT_NE(msg.find(bad.value), std::string::npos) << msg;
  }
}

INSTANTIATE_TEST_SUITE_P(
    OutOfRange, ConfigValidation,
    ::testing::Values(BadValue{{"--optim.lr", "-0.1"}, "optim.lr", "-0.1"},
                      BadValue{{"--optim.lr", "0"}, "optim.lr", "0"},
                      BadValue{{"--data.global-batch", "0"}, "data.global-batch", "0"},
                      BadValue{{"--train.max-steps", "0"}, "train.max-steps", "0"},
                      BadValue{{"--train.epochs", "0"}, "train.epochs", "0"},
                      BadValue{{"--data.micro-batch", "-1"}, "data.micro-batch", "-1"},
                      BadValue{{"--optim.name", "adam"}, "optim.name", "adam"},
                      BadValue{{"--optim.schedule", "step"}, "optim.schedule", "step"},
                      BadValue{{"--optim.warmup-ratio", "1.5"}, "optim.warmup-ratio", "1.5"},
                      BadValue{{"--model.dropout", "1"}, "model.dropout", "1"},
                      BadValue{{"--dist.timeout", "-5"}, "dist.timeout", "-5"},
                      BadValue{{"--train.precision", "fp8"}, "train.precision", "fp8"},
                      BadValue{{"--log.every-steps", "0"}, "log.every-steps", "0"}),
    [](const ::testing::TestParamInfo<BadValue>& info) {
      std::string name = std::to_string(info.index) + "_" + info.param.key;
      for (char& c : name) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
      return name;
    });

TEST(Config, ResolvedTomlRoundTrips) {
  CLI::App app;
  Config cfg;
  ConfigBinding binding(app, cfg);
  std::vector<std::string> args = {"0.003", "--optim.lr", "a \"quoted\" path", "--data.path", "--data.drop-last", "123", "--train.seed"};
  app.parse(args);
  std::string toml = binding.to_toml();

  TempDir tmp;
  write_file(tmp / "resolved.toml", toml);
  Config back = parse({}, tmp / "resolved.toml");
  EXPECT_DOUBLE_EQ(back.optim.lr, 0.003);
  EXPECT_EQ(back.data.path, "a \"quoted\" path");
  EXPECT_TRUE(back.data.drop_last);
  EXPECT_EQ(back.train.seed, 123u);

  CLI::App app2;
  Config cfg2;
  ConfigBinding binding2(app2, cfg2);
  app2.parse(std::vector<std::string>{});
  binding2.apply_file(tmp / "resolved.toml");
  EXPECT_EQ(binding2.to_toml(), toml);
}

TEST(Config, EveryKeyIsSectionDotName) {
  CLI::App app;
  Config cfg;
  ConfigBinding binding(app, cfg);
  auto keys = binding.keys();
  for (const char* fixed : {"train.max-steps", "train.seed", "train.epochs", "data.global-batch", "data.workers",
                            "optim.name", "optim.lr", "data.micro-batch", "eval.every-steps", "log.every-steps",
                            "ckpt.every-steps", "ckpt.keep", "dist.timeout", "dist.bucket-cap-mb", "model.name"}) {
    EXPECT_NE(std::find(keys.begin(), keys.end(), fixed), keys.end()) << fixed;
  }
}

TEST(Config, ResumeRefusesFixedKeysAndReportsTheRest) {
  std::string saved = "[model]\nname = \"mlp\"\nhidden = 64\n[optim]\nlr = 0.001\n[log]\nevery-steps = 50\n";
  auto ok = check_resume_config(saved, "[model]\nname = \"mlp\"\nhidden = 64\n[optim]\nlr = 0.0005\n[log]\n"
                                       "every-steps = 10\n");
  EXPECT_EQ(ok, (std::vector<std::string>{"optim.lr: 0.001 -> 0.0005", "log.every-steps: 50 -> 10"}));
  std::string e = error_of([&] { check_resume_config(saved, "[model]\nname = \"mlp\"\nhidden = 128\n"); });
  EXPECT_NE(e.find("model.hidden was 64 in the checkpoint but is 128"), std::string::npos) << e;
  // A key the checkpoint's config lacks had its default then.
  std::string older = "[model]\nname = \"mlp\"\n";
  EXPECT_TRUE(check_resume_config(older, "[model]\nname = \"mlp\"\nhidden = 256\n").empty());
  e = error_of([&] { check_resume_config(older, "[model]\nname = \"mlp\"\nhidden = 64\n"); });
  EXPECT_NE(e.find("model.hidden was 256 (the default; the checkpoint's config predates the key)"), std::string::npos)
      << e;
}

// optim.accum-steps and data.max-micro-batch are gone (data.micro-batch
// cuts the same micro-batches at every world size). A run's own config.toml
// from before still loads (it is checksummed: eval, export and resume must
// read it), and a resume from it says that the steps now round differently;
// in a config the user writes they are refused with the key that replaced
// them.
TEST(Config, RetiredKeysAreReadFromARunsConfigAndRefusedInAUsersOne) {
  TempDir tmp;
  std::string resolved;
  {
    CLI::App app;
    Config cfg;
    ConfigBinding binding(app, cfg);
    app.parse(std::vector<std::string>{});
    resolved = binding.to_toml();
  }
  std::string old = resolved;
  old.replace(old.find("[optim]\n"), 8, "[optim]\naccum-steps = 4\n");
  old.replace(old.find("[data]\n"), 7, "[data]\nmax-micro-batch = 16\n");
  old.erase(old.find("micro-batch = 0\n"), 16);  // it predates data.micro-batch
  write_file(tmp / "old-run.toml", old);
  Config back = parse({}, tmp / "old-run.toml");
  EXPECT_EQ(back.data.micro_batch, 0);
  auto changes = check_resume_config(old, resolved);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_NE(changes[0].find("data.micro-batch: each rank's share whole, summed in fp32"), std::string::npos)
      << changes[0];

  write_file(tmp / "mine.toml", "[optim]\naccum-steps = 4\n");
  std::string e = error_of([&] { parse({}, tmp / "mine.toml"); });
  EXPECT_NE(e.find("unknown key 'optim.accum-steps' (did you mean 'data.micro-batch'?)"), std::string::npos) << e;
}

TEST(Config, EveryKeyHasOneScope) {
  CLI::App app;
  Config cfg;
  ConfigBinding binding(app, cfg);
  EXPECT_EQ(binding.scope("model.hidden"), KeyScope::kFixed);
  EXPECT_EQ(binding.scope("data.global-batch"), KeyScope::kFixed);
  EXPECT_EQ(binding.scope("data.path"), KeyScope::kPerNode);  // a mount point differs between nodes
  EXPECT_EQ(binding.scope("train.threads"), KeyScope::kPerNode);
  EXPECT_EQ(binding.scope("optim.lr"), KeyScope::kShared);
  EXPECT_EQ(binding.scope("log.every-steps"), KeyScope::kShared);  // log lines are collectives
  // The start-up check hashes every key but the per-node ones.
  std::string toml = binding.to_toml();
  std::string shared = shared_config(toml);
  EXPECT_NE(shared.find("optim.lr="), std::string::npos);
  EXPECT_NE(shared.find("model.hidden="), std::string::npos);
  EXPECT_EQ(shared.find("data.path="), std::string::npos);
  EXPECT_EQ(shared.find("train.threads="), std::string::npos);
  // A per-node key may change on resume; a fixed one may not.
  auto changes = check_resume_config("[data]\npath = \"/a\"\n", "[data]\npath = \"/b\"\n");
  EXPECT_EQ(changes, (std::vector<std::string>{"data.path: \"/a\" -> \"/b\""}));
  EXPECT_THROW(check_resume_config("[train]\nseed = 1\n", "[train]\nseed = 2\n"), ConfigError);
}

TEST(Config, ChoicesParseFromTheirTableOnly) {
  Config cfg = parse({"--train.precision", "bf16", "--optim.schedule", "cosine", "--dist.grad-compression", "fp16",
                      "--optim.name", "lamb", "--train.device", "cpu"});
  EXPECT_EQ(cfg.train.precision, Precision::kBf16);
  EXPECT_EQ(cfg.optim.schedule, Schedule::kCosine);
  EXPECT_EQ(cfg.dist.grad_compression, Compression::kFp16);
  EXPECT_EQ(cfg.optim.name, OptimizerKind::kLamb);
  EXPECT_EQ(cfg.train.device, DeviceKind::kCpu);
  std::string e = error_of([&] { parse({"--optim.schedule", "step"}); });
  EXPECT_NE(e.find("optim.schedule must be one of constant | linear | cosine | poly (got 'step')"),
            std::string::npos) << e;
  // And from a file, naming it.
  TempDir tmp;
  write_file(tmp / "c.toml", "[dist]\ngrad-compression = \"int2\"\n");
  e = error_of([&] { parse({}, tmp / "c.toml"); });
  EXPECT_NE(e.find("c.toml"), std::string::npos) << e;
  EXPECT_NE(e.find("dist.grad-compression must be one of none | fp32 | bf16 | fp16 | powersgd | int8 | int4 (got "
                   "'int2')"),
            std::string::npos) << e;
}


TEST(Config, BalanceWeightsAreAListOnTheCommandLineAndInAFile) {
  Config cli = parse({"--data.balance", "weights", "--data.balance-weights", "3,1.5"});
  EXPECT_EQ(cli.data.balance, Balance::kWeights);
  EXPECT_EQ(cli.data.balance_weights, (std::vector<double>{3.0, 1.5}));
  TempDir tmp;
  write_file(tmp / "c.toml", "[data]\nbalance = \"weights\"\nbalance-weights = [2.0, 1.0, 1.0]\n");
  Config file = parse({}, tmp / "c.toml");
  EXPECT_EQ(file.data.balance_weights, (std::vector<double>{2.0, 1.0, 1.0}));
  // The resolved config round-trips, with and without weights.
  for (const auto& args : {std::vector<std::string>{}, std::vector<std::string>{"--data.balance-weights", "2,1"}}) {
    CLI::App app;
    Config cfg;
    ConfigBinding binding(app, cfg);
    std::vector<std::string> reversed(args.rbegin(), args.rend());
    app.parse(reversed);
    write_file(tmp / "resolved.toml", binding.to_toml());
    EXPECT_EQ(parse({}, tmp / "resolved.toml").data.balance_weights, cfg.data.balance_weights);
  }
  EXPECT_NE(error_of([] { validate(parse({"--data.balance-weights", "2,0"})); }).find("data.balance-weights must all be > 0"),
            std::string::npos);
  EXPECT_NE(error_of([] { validate(parse({"--data.balance", "weights"})); }).find("one weight per rank"), std::string::npos);
  EXPECT_NE(error_of([] { parse({"--data.balance", "fastest"}); }).find("equal | auto | weights"), std::string::npos);
}

// Hardening: bad files that used to be accepted silently.
TEST(Config, DirectoriesRepeatedKeysAndNonBooleansAreRefused) {
  TempDir tmp;
  EXPECT_NE(error_of([&] { parse({}, tmp.path()); }).find("is a directory; --config takes a TOML file"),
            std::string::npos);
  write_file(tmp / "twice.toml", "[optim]\nlr = 0.5\n[data]\nworkers = 1\n[optim]\nlr = 0.1\n");
  EXPECT_NE(error_of([&] { parse({}, tmp / "twice.toml"); }).find("key 'optim.lr' is given twice"), std::string::npos)
      << error_of([&] { parse({}, tmp / "twice.toml"); });
  write_file(tmp / "three.toml", "[data]\ndrop-last = 3\n");
  EXPECT_NE(error_of([&] { parse({}, tmp / "three.toml"); }).find("key 'data.drop-last' takes true or false (got '3')"),
            std::string::npos) << error_of([&] { parse({}, tmp / "three.toml"); });
  write_file(tmp / "ok.toml", "[data]\ndrop-last = true\n");
  EXPECT_TRUE(parse({}, tmp / "ok.toml").data.drop_last);
}

TEST(Config, InfiniteAndAbsurdNumbersAreRefused) {
  EXPECT_NE(error_of([] { validate(parse({"--optim.lr", "inf"})); }).find("optim.lr must be finite and > 0 (got inf)"),
            std::string::npos) << error_of([] { validate(parse({"--optim.lr", "inf"})); });
  EXPECT_NE(error_of([] { validate(parse({"--dist.timeout", "1e300"})); }).find("dist.timeout must be > 0 and <= 1e7"),
            std::string::npos);
  EXPECT_NE(error_of([] { validate(parse({"--optim.clip-norm", "nan"})); }).find("optim.clip-norm must be finite"),
            std::string::npos);
}

TEST(Config, AListForAOneValueKeyIsRefused) {
  TempDir tmp;
  write_file(tmp / "list.toml", "[model]\nhidden = [64]\n");
  EXPECT_NE(error_of([&] { parse({}, tmp / "list.toml"); }).find("key 'model.hidden' takes one value, not a list"),
            std::string::npos) << error_of([&] { parse({}, tmp / "list.toml"); });
  write_file(tmp / "weights.toml", "[data]\nbalance-weights = [2.0, 1.0]\n  # [model] in a comment\nbucket = 4\n");
  EXPECT_EQ(parse({}, tmp / "weights.toml").data.bucket, 4);
}

// bert-classify declares its columns itself (TaskKey): they are config keys
// like the built-in ones, in the same [data] table, with their own checks.
TEST(Config, ATaskKeyIsAConfigKeyLikeTheBuiltInOnes) {
  TempDir tmp;
  write_file(tmp / "c.toml", "[data]\ntext-column = \"sentence\"\n");
  Config cfg = parse({"--data.max-seq-length", "64"}, tmp / "c.toml");
  EXPECT_EQ(cfg.task_key<int64_t>("data.max-seq-length"), 64);
  EXPECT_EQ(cfg.task_key<std::string>("data.text-column"), "sentence");
  EXPECT_EQ(Config().task_key<std::string>("data.label-column"), "label");  // the declared default

  CLI::App app;
  Config bound;
  ConfigBinding binding(app, bound);
  EXPECT_EQ(binding.scope("data.text-column"), KeyScope::kFixed);
  EXPECT_EQ(binding.scope("data.id-column"), KeyScope::kShared);
  std::string toml = binding.to_toml();
  size_t data = toml.find("[data]\n");
  ASSERT_NE(data, std::string::npos) << toml;
  EXPECT_EQ(toml.find("[data]\n", data + 1), std::string::npos) << "[data] twice:\n" << toml;
  EXPECT_LT(toml.find("text-column = \"text\""), toml.find("[dist]")) << toml;
  EXPECT_NE(toml.find("max-seq-length = 128\n"), std::string::npos) << toml;

  cfg.task["data.max-seq-length"] = int64_t{2};
  std::string e = cohort::test::error_of([&] { validate(cfg); });
  EXPECT_NE(e.find("data.max-seq-length must be >= 4 (got 2)"), std::string::npos) << e;
  cfg.task["data.max-seq-length"] = int64_t{64};
  cfg.task["data.label-column"] = std::string();
  e = cohort::test::error_of([&] { validate(cfg); });
  EXPECT_NE(e.find("data.label-column must name a column (got '')"), std::string::npos) << e;
  EXPECT_THROW(declare_task_keys({{"data.text-column", std::string("x"), "again"}}), UsageError);
}
