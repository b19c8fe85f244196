// The BERT pipeline end to end: shards of different sizes dealt to ranks
// exactly once (with and without length bucketing), and `cohort prepare` ->
// `cohort train` (bert-pretrain) -> `cohort eval` -> `cohort export` through
// the binary, on a small generated corpus.
#include <gtest/gtest.h>

#include <set>

#include "cohort/ckpt/safetensors.hpp"
#include "cohort/data/bert_shards.hpp"
#include "cohort/data/loader.hpp"
#include "cohort/data/order.hpp"
#include "helpers.hpp"

namespace cohort {
namespace {

using test::TempDir;

// Row g's first two ids encode g, so a batch says which rows it holds. Rows
// have lengths 6..L so bucketing has something to sort.
void write_numbered_shards(const std::string& dir, const std::vector<int64_t>& sizes, int64_t L = 16,
                           int64_t P = 3) {
  std::filesystem::create_directories(dir + "/train");
  int64_t g = 0;
  for (size_t s = 0; s < sizes.size(); ++s) {
    BertRows rows;
    rows.seq_len = L;
    rows.max_predictions = P;
    for (int64_t r = 0; r < sizes[s]; ++r, ++g) {
      int64_t len = 6 + (g * 7) % (L - 5);
      for (int64_t i = 0; i < L; ++i) {
        int32_t id = i == 0 ? static_cast<int32_t>(5 + g / 1000) : i == 1 ? static_cast<int32_t>(5 + g % 1000) : 7;
        rows.input_ids.push_back(i < len ? id : 0);
        rows.input_mask.push_back(i < len ? 1 : 0);
        rows.segment_ids.push_back(i >= len / 2 && i < len ? 1 : 0);
      }
      for (int64_t p = 0; p < P; ++p) {
        rows.masked_lm_positions.push_back(static_cast<int32_t>(p < 2 ? 2 + p : 0));
        rows.masked_lm_ids.push_back(p < 2 ? 9 : 0);
      }
      rows.next_sentence_labels.push_back(static_cast<int8_t>(g % 2));
    }
    char name[64];
    std::snprintf(name, sizeof name, "/train/part-%05zu.hdf5", s);
    write_bert_shard(dir + name, rows);
  }
}

std::vector<int64_t> rows_in(const Example& batch) {
  std::vector<int64_t> out;
  if (batch.empty()) return out;
  auto ids = batch.at("input_ids");
  for (int64_t i = 0; i < ids.size(0); ++i) {
    out.push_back((ids[i][0].item<int64_t>() - 5) * 1000 + ids[i][1].item<int64_t>() - 5);
  }
  return out;
}

struct Case {
  int world;
  int64_t bucket;
};

class ShardCoverage : public ::testing::TestWithParam<Case> {};

TEST_P(ShardCoverage, EveryRowExactlyOncePerEpochAcrossRanks) {
  TempDir tmp;
  const std::vector<int64_t> sizes = {1, 300, 17, 64, 513, 40, 2, 129};
  write_numbered_shards(tmp.path(), sizes);
  BertShards data(tmp.path(), "train");
  int64_t n = 0;
  for (auto s : sizes) n += s;
  ASSERT_EQ(data.size(), n);
  Case c = GetParam();
  Bucketing bucketing;
  if (c.bucket > 0) bucketing = {c.bucket, [&data](int64_t i) { return data.length(i); }};
  const int64_t global_batch = 48;
  GlobalOrder order(n, global_batch, 11, false, bucketing);
  std::multiset<int64_t> seen;
  std::vector<std::vector<int64_t>> steps;
  for (int r = 0; r < c.world; ++r) {
    LoaderOptions o;
    o.rank = r;
    o.world_size = c.world;
    o.micro_batch = 10;
    o.workers = 0;
    Loader loader(data, order, o, Cursor{});
    for (int64_t k = 0; k < order.steps_per_epoch(); ++k) {
      StepBatch b = loader.build(k, std::vector<int64_t>(static_cast<size_t>(c.world), 1));
      if (static_cast<int64_t>(steps.size()) <= k) steps.resize(static_cast<size_t>(k + 1));
      for (const auto& m : b.micro) {
        auto rows = rows_in(m);
        // The rows the batch holds are the ids the loader says it dealt.
        seen.insert(rows.begin(), rows.end());
        steps[static_cast<size_t>(k)].insert(steps[static_cast<size_t>(k)].end(), rows.begin(), rows.end());
      }
    }
  }
  ASSERT_EQ(static_cast<int64_t>(seen.size()), n);
  for (int64_t g = 0; g < n; ++g) ASSERT_EQ(seen.count(g), 1u) << "row " << g;
  // The same global batches at every world size: compare with one rank.
  LoaderOptions one;
  one.workers = 0;
  Loader single(data, order, one, Cursor{});
  for (int64_t k = 0; k < order.steps_per_epoch(); ++k) {
    std::vector<int64_t> expect;
    for (const auto& m : single.build(k, {1}).micro) {
      auto rows = rows_in(m);
      expect.insert(expect.end(), rows.begin(), rows.end());
    }
    std::sort(expect.begin(), expect.end());
    auto got = steps[static_cast<size_t>(k)];
    std::sort(got.begin(), got.end());
    ASSERT_EQ(got, expect) << "step " << k;
  }
}

INSTANTIATE_TEST_SUITE_P(WorldsAndBuckets, ShardCoverage,
                         ::testing::Values(Case{1, 0}, Case{2, 0}, Case{3, 0}, Case{2, 4}, Case{3, 4}));

TEST(Bucketing, BatchesHoldSimilarLengthsAndStayAPermutation) {
  TempDir tmp;
  write_numbered_shards(tmp.path(), {200, 311});
  BertShards data(tmp.path(), "train");
  auto spread = [&](int64_t bucket) {
    Bucketing b;
    if (bucket > 0) b = {bucket, [&data](int64_t i) { return data.length(i); }};
    GlobalOrder order(data.size(), 32, 3, false, b);
    auto perm = *order.permutation(0);
    std::vector<int64_t> sorted = perm;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t i = 0; i < data.size(); ++i) EXPECT_EQ(sorted[i], i);
    double total = 0;
    for (int64_t start = 0; start + 32 <= data.size(); start += 32) {
      int64_t lo = 1 << 30, hi = 0;
      for (int64_t i = start; i < start + 32; ++i) {
        lo = std::min(lo, data.length(perm[i]));
        hi = std::max(hi, data.length(perm[i]));
      }
      total += static_cast<double>(hi - lo);
    }
    return total;
  };
  double plain = spread(0), bucketed = spread(8);
  EXPECT_LT(bucketed, plain / 3) << "bucketing should narrow each batch's length range";
}

// The whole job through the binary, on a corpus small enough for CI.
TEST(BertPipeline, PrepareTrainEvalExport) {
  TempDir tmp;
  auto prep = test::prepare_tiny_bert(tmp);
  ASSERT_EQ(prep.code, 0) << prep.err;
  // model.max-positions is not in `common`: a key given twice is an error.
  std::string common = " --train.task bert-pretrain --model.name bert --model.hidden 32 --model.layers 1"
                       " --model.heads 2 --data.path " + tmp / "data" +
                       " --data.global-batch 16 --eval.split valid --log.every-steps 5 --quiet";
  auto train = test::run_cohort("train" + common + " --model.max-positions 64 --train.max-steps 20 --optim.lr 0.003 "
                                "--ckpt.every-steps 10 --out " + tmp / "run");
  ASSERT_EQ(train.code, 0) << train.err;
  auto lines = test::lines_of(test::read_file(tmp / "run/metrics.jsonl"));
  int train_lines = 0, eval_lines = 0;
  for (const auto& l : lines) {
    auto j = nlohmann::json::parse(l);
    if (j["kind"] == "train") {
      ++train_lines;
      for (const char* k : {"loss", "mlm_loss", "mlm_accuracy", "nsp_loss", "nsp_accuracy", "tokens_per_s"}) {
        EXPECT_TRUE(j.contains(k)) << k << " missing from " << l;
      }
      EXPECT_NEAR(j["loss"].get<double>(), j["mlm_loss"].get<double>() + j["nsp_loss"].get<double>(), 1e-9);
    }
    if (j["kind"] == "eval") ++eval_lines;
  }
  EXPECT_EQ(train_lines, 4);
  EXPECT_GE(eval_lines, 1);

  auto eval = test::run_cohort("eval " + tmp / "run" + " --split test");
  ASSERT_EQ(eval.code, 0) << eval.err;
  auto last = nlohmann::json::parse(test::lines_of(test::read_file(tmp / "run/metrics.jsonl")).back());
  EXPECT_EQ(last["kind"], "eval");
  EXPECT_EQ(last["split"], "test");
  EXPECT_GT(last["count"].get<int64_t>(), 0);

  // Evaluating an older checkpoint leaves the run's newer ones in place.
  auto older = test::run_cohort("eval " + tmp / "run/checkpoints/step-10" + " --split valid --max-samples 8");
  ASSERT_EQ(older.code, 0) << older.err;
  EXPECT_TRUE(std::filesystem::exists(tmp / "run/checkpoints/step-20"));
  EXPECT_NE(test::read_file(tmp / "run/checkpoints/latest").find("step-20"), std::string::npos);

  auto exp = test::run_cohort("export " + tmp / "run" + " -o " + tmp / "export");
  ASSERT_EQ(exp.code, 0) << exp.err;
  auto cfg = nlohmann::json::parse(test::read_file(tmp / "export/config.json"));
  EXPECT_EQ(cfg["hidden_size"], 32);
  EXPECT_EQ(cfg["num_hidden_layers"], 1);
  EXPECT_TRUE(std::filesystem::exists(tmp / "export/vocab.txt"));
  EXPECT_EQ(cfg["architectures"][0], "BertForPreTraining");
  EXPECT_TRUE(std::filesystem::exists(tmp / "export/tokenizer_config.json"));
  EXPECT_TRUE(std::filesystem::exists(tmp / "export/special_tokens_map.json"));

  // A model that cannot hold the data is refused before the first step.
  auto small_vocab = test::run_cohort("train" + common +
                                      " --model.max-positions 64 --train.max-steps 2 --model.vocab-size 50 --out " +
                                      tmp / "bad1");
  EXPECT_EQ(small_vocab.code, 2) << small_vocab.err;
  EXPECT_NE(small_vocab.err.find("model.vocab-size"), std::string::npos) << small_vocab.err;
  auto short_pos = test::run_cohort("train" + common + " --train.max-steps 2 --model.max-positions 16 --out " +
                                    tmp / "bad2");
  EXPECT_EQ(short_pos.code, 2) << short_pos.err;
  EXPECT_NE(short_pos.err.find("model.max-positions"), std::string::npos) << short_pos.err;

  // model.init starts a new run from the first run's weights: with a
  // vanishing lr, its one step leaves them where they were.
  auto init = test::run_cohort("train" + common +
                               " --model.max-positions 64 --train.max-steps 1 --optim.lr 1e-30 --model.init " +
                               tmp / "export" + " --out " + tmp / "run2");
  ASSERT_EQ(init.code, 0) << init.err;
  ASSERT_EQ(test::run_cohort("export " + tmp / "run2" + " -o " + tmp / "export2").code, 0);
  auto a = load_safetensors(tmp / "export/model.safetensors");
  auto b = load_safetensors(tmp / "export2/model.safetensors");
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [name, t] : a.tensors) {
    EXPECT_TRUE(torch::allclose(t, b.tensors.at(name), 0, 1e-6)) << name;
  }
}

// A broken shard stops `cohort train` with exit code 1 and one line naming
// the file (and the dataset, where HDF5 can open the file at all).
TEST(BertPipeline, BrokenShardIsOneLineAndExitCode1) {
  TempDir tmp;
  write_numbered_shards(tmp.path(), {40, 50});
  std::string part = tmp / "train/part-00001.hdf5";
  auto size = std::filesystem::file_size(part);
  std::filesystem::resize_file(part, size / 2);
  auto r = test::run_cohort("train --train.task bert-pretrain --model.name bert --model.hidden 16 --model.layers 1"
                            " --model.vocab-size 1100 --eval.split train --train.max-steps 2 --quiet --data.path " +
                            tmp.path() + " --out " + tmp / "run");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("part-00001.hdf5"), std::string::npos) << r.err;
  EXPECT_EQ(test::lines_of(r.err).size(), 1u) << r.err;
  EXPECT_EQ(r.err.rfind("cohort: error: ", 0), 0u) << r.err;
}

// Hardening: train read vocab.txt as a line count, so a vocabulary with a
// token twice (which prepare --vocab refuses) was accepted.
TEST(BertPipeline, DuplicateVocabularyTokenIsRefused) {
  TempDir tmp;
  auto prep = test::prepare_tiny_bert(tmp);
  ASSERT_EQ(prep.code, 0) << prep.err;
  std::string vocab_path = tmp / "data/vocab.txt";
  auto lines = test::lines_of(test::read_file(vocab_path));
  ASSERT_GT(lines.size(), 10u);
  lines.back() = lines[8];
  std::string vocab;
  for (const auto& l : lines) vocab += l + "\n";
  test::write_file(vocab_path, vocab);
  auto r = test::run_cohort("train --train.task bert-pretrain --model.name bert --model.hidden 16 --model.layers 1"
                            " --train.max-steps 1 --quiet --data.path " + (tmp / "data") + " --out " + tmp / "run");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("vocab.txt: token '" + lines[8] + "' on line " + std::to_string(lines.size()) +
                       " already appears on line 9"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace cohort
