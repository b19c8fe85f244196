// task.masking dynamic, task.nsp false and the shards behind them
// (data/masking.hpp; cohort prepare --masking none, --nsp false).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <numeric>
#include <set>

#include "cohort/ckpt/safetensors.hpp"
#include "cohort/core/random.hpp"
#include "cohort/data/bert_shards.hpp"
#include "cohort/data/loader.hpp"
#include "cohort/data/masking.hpp"
#include "cohort/prep/instances.hpp"
#include "cohort/text/wordpiece.hpp"
#include "helpers.hpp"

using cohort::test::read_file;
using cohort::test::run_cohort;
using cohort::test::TempDir;

namespace {

// [PAD] [UNK] [CLS] [SEP] [MASK], then words, then "##" pieces.
cohort::text::Vocab test_vocab() {
  std::vector<std::string> tokens = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
  for (int i = 0; i < 60; ++i) tokens.push_back("w" + std::to_string(i));
  for (int i = 0; i < 40; ++i) tokens.push_back("##p" + std::to_string(i));
  return cohort::text::Vocab(tokens);
}
constexpr int64_t kCls = 2, kSep = 3, kMask = 4, kFirstWord = 5, kFirstPiece = 65, kVocab = 105;

// n rows of `len` tokens: [CLS] words and pieces (a piece follows a word or
// a piece) [SEP], with an [UNK] now and then; the rest padding.
cohort::Example rows(int64_t n, int64_t len, int64_t width, uint64_t seed) {
  cohort::Rng rng(seed);
  auto ids = torch::zeros({n, width}, torch::kInt64), mask = torch::zeros({n, width}, torch::kInt64);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t i = 0; i < len; ++i) {
      int64_t id = i == 0 ? kCls : i == len - 1 ? kSep
                   : i > 1 && rng.uniform() < 0.4 ? kFirstPiece + static_cast<int64_t>(rng.below(40))
                   : rng.uniform() < 0.02 ? 1
                                          : kFirstWord + static_cast<int64_t>(rng.below(60));
      ids[r][i] = id;
      mask[r][i] = 1;
    }
  }
  return {{"input_ids", ids}, {"input_mask", mask}};
}

cohort::DynamicMasking masking(cohort::MaskOptions o) {
  return cohort::DynamicMasking(cohort::MaskingVocab::from(test_vocab()), o);
}

std::vector<int64_t> iota(int64_t n, int64_t from = 0) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), from);
  return v;
}

// Row r's targets: (position, label) pairs.
std::vector<std::pair<int64_t, int64_t>> targets(const cohort::Example& b, int64_t r) {
  std::vector<std::pair<int64_t, int64_t>> out;
  auto pos = b.at("masked_lm_positions")[r], lab = b.at("masked_lm_ids")[r];
  for (int64_t j = 0; j < pos.size(0); ++j) {
    if (lab[j].item<int64_t>() >= 0) out.emplace_back(pos[j].item<int64_t>(), lab[j].item<int64_t>());
  }
  return out;
}

// The corpus prepare_tiny_bert(dir, length) wrote, prepared again into
// dir/name with `extra` flags.
cohort::test::Result prepare_again(const TempDir& dir, const std::string& name, int length, const std::string& extra) {
  return run_cohort("prepare --input " + dir / "corpus.txt" + " --out " + dir / name + " --vocab-size 200" +
                    " --max-seq-length " + std::to_string(length) +
                    " --max-predictions 5 --valid-fraction 0.1 --test-fraction 0.1 --quiet " + extra);
}

}  // namespace

TEST(DynamicMasking, MasksDependOnlyOnSeedEpochAndSample) {
  cohort::MaskOptions o;
  o.prob = 0.3;
  o.seed = 7;
  auto m = masking(o);
  const auto base = rows(8, 40, 48, 1);
  auto all = base;
  m.apply(all, iota(8, 100), /*epoch=*/2);
  // Rows 5 and 1 alone, in another order and a narrower batch: the same masks.
  cohort::Example part = {{"input_ids", torch::stack({base.at("input_ids")[5], base.at("input_ids")[1]})
                                            .narrow(1, 0, 40).clone()},
                          {"input_mask", torch::stack({base.at("input_mask")[5], base.at("input_mask")[1]})
                                             .narrow(1, 0, 40).clone()}};
  m.apply(part, {105, 101}, 2);
  EXPECT_TRUE(torch::equal(part.at("input_ids")[0], all.at("input_ids")[5].narrow(0, 0, 40)));
  EXPECT_TRUE(torch::equal(part.at("input_ids")[1], all.at("input_ids")[1].narrow(0, 0, 40)));
  EXPECT_EQ(targets(part, 0), targets(all, 5));
  EXPECT_EQ(targets(part, 1), targets(all, 1));
  // Another epoch, seed or sample id: other masks.
  auto other = [&](cohort::MaskOptions opts, int64_t epoch, int64_t first_id) {
    auto b = base;
    masking(opts).apply(b, iota(8, first_id), epoch);
    return !torch::equal(b.at("input_ids"), all.at("input_ids"));
  };
  EXPECT_TRUE(other(o, 3, 100));
  EXPECT_TRUE(other(o, 2, 200));
  cohort::MaskOptions seeded = o;
  seeded.seed = 8;
  EXPECT_TRUE(other(seeded, 2, 100));
  EXPECT_FALSE(other(o, 2, 100));
}

TEST(DynamicMasking, RatesAndReplacementsMatchTheOptions) {
  for (double prob : {0.15, 0.3}) {
    cohort::MaskOptions o;
    o.prob = prob;
    o.replace_mask = 0.7;
    o.replace_random = 0.2;
    auto m = masking(o);
    auto b = rows(1500, 100, 100, 3);
    const auto original = b.at("input_ids").clone();
    m.apply(b, iota(1500), 0);
    int64_t maskable = 0, picked = 0, as_mask = 0, unchanged = 0;
    for (int64_t r = 0; r < 1500; ++r) {
      const int64_t* orig = original[r].data_ptr<int64_t>();
      for (int64_t i = 0; i < 100; ++i) maskable += orig[i] >= kFirstWord;
      int64_t last = -1;
      for (auto [at, label] : targets(b, r)) {
        ASSERT_GT(at, last) << "positions ascend";
        last = at;
        ASSERT_EQ(label, orig[at]);
        ASSERT_GE(orig[at], kFirstWord) << "a special token was picked";
        ++picked;
        int64_t now = b.at("input_ids")[r][at].item<int64_t>();
        as_mask += now == kMask;
        unchanged += now == label;
      }
    }
    // Tokens that are no target keep their ids.
    auto is_target = torch::zeros_like(original, torch::kBool);
    for (int64_t r = 0; r < 1500; ++r)
      for (auto [at, label] : targets(b, r)) is_target[r][at] = true;
    EXPECT_TRUE(torch::equal(b.at("input_ids").masked_select(~is_target), original.masked_select(~is_target)));
    auto within = [](double got, double want, int64_t n, const char* what) {
      const double se = std::sqrt(want * (1 - want) / static_cast<double>(n));
      EXPECT_NEAR(got, want, 3 * se) << what << " over " << n;
    };
    const double n = static_cast<double>(picked);
    within(n / static_cast<double>(maskable), prob, maskable, "masked fraction");
    within(static_cast<double>(as_mask) / n, 0.7, picked, "[MASK]");
    // A random token equal to the original (1 in 100) counts as unchanged.
    within(static_cast<double>(unchanged) / n, 0.1 + 0.2 / 100, picked, "unchanged");
    within(static_cast<double>(picked - as_mask - unchanged) / n, 0.2 * 99 / 100, picked, "random");
  }
}

TEST(DynamicMasking, WholeWordsAreNeverSplitAndTheCapHolds) {
  for (int64_t cap : {0, 6}) {
    cohort::MaskOptions o;
    o.prob = 0.3;
    o.whole_word = true;
    o.max_predictions = cap;
    auto b = rows(400, 60, 64, 5);
    const auto original = b.at("input_ids").clone();
    masking(o).apply(b, iota(400), 1);
    int64_t picked = 0, maskable = 0;
    for (int64_t r = 0; r < 400; ++r) {
      const int64_t* orig = original[r].data_ptr<int64_t>();
      std::set<int64_t> at;
      for (auto [p, label] : targets(b, r)) at.insert(p);
      if (cap > 0) {
        EXPECT_LE(static_cast<int64_t>(at.size()), cap) << "row " << r;
      }
      picked += static_cast<int64_t>(at.size());
      // A word: a word token and the pieces right after it, all or none.
      for (int64_t i = 0; i < 60; ++i) {
        if (orig[i] < kFirstWord) continue;
        ++maskable;
        if (orig[i] >= kFirstPiece && orig[i - 1] >= kFirstWord) {
          ASSERT_EQ(at.count(i), at.count(i - 1)) << "row " << r << " splits the word ending at " << i;
        }
      }
    }
    if (cap == 0) {  // words are picked at 0.3, so their tokens are too
      const double se = std::sqrt(0.3 * 0.7 / static_cast<double>(maskable));
      EXPECT_NEAR(static_cast<double>(picked) / static_cast<double>(maskable), 0.3, 6 * se);
    }
  }
}

TEST(DynamicMasking, BadOptionsAreConfigErrors) {
  auto error = [](cohort::MaskOptions o) { return cohort::test::error_of([&] { masking(o); }); };
  cohort::MaskOptions o;
  o.prob = 1.5;
  EXPECT_NE(error(o).find("task.mask-prob"), std::string::npos);
  o = {};
  o.replace_mask = 0.9;
  o.replace_random = 0.2;
  EXPECT_NE(error(o).find("task.mask-replace"), std::string::npos);
  o = {};
  o.max_predictions = -1;
  EXPECT_NE(error(o).find("task.max-predictions"), std::string::npos);
}

TEST(FullSentences, RowsHoldWholeSentencesInOrderAcrossDocuments) {
  cohort::prep::MaskingVocab v = cohort::MaskingVocab::from(test_vocab());
  cohort::prep::InstanceOptions o;
  o.max_seq_length = 16;
  // Documents of sentences; one sentence longer than a row.
  std::vector<cohort::prep::TokenDocument> docs;
  int32_t next = kFirstWord;
  auto sentence = [&](int n) {
    std::vector<int32_t> s;
    for (int i = 0; i < n; ++i) s.push_back(static_cast<int32_t>(kFirstWord + (next++ - kFirstWord) % 60));
    return s;
  };
  docs.push_back({sentence(5), sentence(4), sentence(6)});
  docs.push_back({sentence(3)});
  docs.push_back({sentence(20), sentence(2)});
  docs.push_back({sentence(7), sentence(7)});
  auto out = cohort::prep::full_sentence_rows(docs, v, o);
  ASSERT_FALSE(out.empty());
  std::vector<int32_t> text, seen;
  for (const auto& d : docs)
    for (const auto& s : d) text.insert(text.end(), s.begin(), s.end());
  int separators = 0;
  for (const auto& inst : out) {
    ASSERT_LE(inst.tokens.size(), 16u);
    EXPECT_EQ(inst.tokens.front(), kCls);
    EXPECT_EQ(inst.tokens.back(), kSep);
    EXPECT_EQ(inst.segment_a, static_cast<int32_t>(inst.tokens.size())) << "one segment";
    EXPECT_TRUE(inst.positions.empty());
    EXPECT_FALSE(inst.random_next);
    for (size_t i = 1; i + 1 < inst.tokens.size(); ++i) {
      if (inst.tokens[i] == kSep) {
        ++separators;
        EXPECT_NE(inst.tokens[i + 1], kSep);
      } else {
        seen.push_back(inst.tokens[i]);
      }
    }
  }
  EXPECT_EQ(seen, text) << "every token once, in order";
  EXPECT_GE(separators, 1) << "a [SEP] between documents that share a row";
  // Rows are filled (worked by hand: 14 tokens a row): [5 4], [6 | 3], [14
  // of the 20], [6 2], [7 7]; one [SEP] between documents inside a row.
  EXPECT_EQ(out.size(), 5u);
  EXPECT_EQ(separators, 1);

  // Static masks on full-sentence rows never pick a [CLS] or [SEP].
  o.next_sentence = false;
  o.max_predictions = 4;
  o.dupe_factor = 3;
  o.threads = 2;
  auto masked = cohort::prep::make_instances(docs, v, o);
  ASSERT_EQ(masked.size(), 3 * out.size());
  for (const auto& inst : masked) {
    EXPECT_EQ(static_cast<int64_t>(inst.positions.size()), cohort::prep::num_to_predict(
                                                                static_cast<int64_t>(inst.tokens.size()), o));
    for (size_t j = 0; j < inst.positions.size(); ++j) {
      const int32_t original = inst.labels[j];
      EXPECT_NE(original, kSep);
      EXPECT_NE(original, kCls);
    }
  }
}

// The loader hands a dataset each step's epoch: the epoch of the cursor the
// step starts at, also when a step's batch is built ahead on a worker.
TEST(DynamicMasking, TheLoaderDrawsEachStepWithItsEpoch) {
  struct Draws : cohort::Dataset {
    int64_t size() const override { return 10; }
    cohort::Example get(int64_t) const override { throw std::logic_error("draw_batch only"); }
    cohort::Example get_batch(const std::vector<int64_t>&) const override { throw std::logic_error("draw_batch only"); }
    cohort::Example draw_batch(const std::vector<int64_t>& ids, int64_t epoch) const override {
      return {{"epoch", torch::full({static_cast<int64_t>(ids.size())}, epoch, torch::kInt64)}};
    }
    std::string describe() const override { return "draws"; }
  } data;
  cohort::GlobalOrder order(10, 4, 1, false);  // 3 steps an epoch: 4, 4, 2
  cohort::LoaderOptions lo;
  lo.micro_batch = 4;
  lo.workers = 2;
  cohort::Loader loader(data, order, lo, cohort::Cursor{1, 4});
  std::set<int64_t> epochs;
  for (int step = 0; step < 7; ++step) {
    cohort::StepBatch b = loader.next();
    ASSERT_FALSE(b.micro.empty());
    EXPECT_TRUE(b.micro[0].at("epoch").eq(b.cursor.epoch).all().item<bool>()) << "step " << step;
    epochs.insert(b.cursor.epoch);
  }
  EXPECT_EQ(epochs, (std::set<int64_t>{1, 2, 3}));
}

// Shards with static masks, restored, are exactly the unmasked shards
// `--masking none` writes from the same input and seed.
TEST(DynamicMasking, RestoredShardsAreTheUnmaskedShards) {
  TempDir tmp;
  ASSERT_EQ(cohort::test::prepare_tiny_bert(tmp, 64).code, 0);
  auto none = prepare_again(tmp, "none", 64, "--dupe-factor 2 --masking none");
  ASSERT_EQ(none.code, 0) << none.err;
  auto manifest = nlohmann::json::parse(read_file(tmp / "none/manifest.json"));
  EXPECT_EQ(manifest["masking"], "none");
  for (const char* split : {"train", "valid"}) {
    cohort::BertShards masked(tmp / "data", split), unmasked(tmp / "none", split);
    ASSERT_EQ(masked.size(), unmasked.size());
    ASSERT_FALSE(unmasked.info().masked);
    EXPECT_EQ(unmasked.info().max_predictions, 1);
    auto all = iota(masked.size());
    auto a = masked.get_batch(all), b = unmasked.get_batch(all);
    EXPECT_FALSE(torch::equal(a.at("input_ids"), b.at("input_ids"))) << "the static shards are masked";
    EXPECT_TRUE(b.at("masked_lm_ids").lt(0).all().item<bool>()) << "no targets in unmasked shards";
    cohort::restore_masked_tokens(a);
    EXPECT_TRUE(torch::equal(a.at("input_ids"), b.at("input_ids"))) << split;
    for (const char* k : {"input_mask", "segment_ids", "next_sentence_labels"})
      EXPECT_TRUE(torch::equal(a.at(k), b.at(k))) << k;
  }
  // Dynamic masking draws the same masks from either.
  cohort::MaskOptions o;
  o.seed = 3;
  auto m = std::make_shared<cohort::DynamicMasking>(
      cohort::MaskingVocab::from(cohort::text::Vocab::load(tmp / "data/vocab.txt")), o);
  cohort::BertShardsOptions with;
  with.masking = m;
  auto ids = iota(32, 10);
  auto x = cohort::BertShards(tmp / "data", "train", with).draw_batch(ids, 4);
  auto y = cohort::BertShards(tmp / "none", "train", with).draw_batch(ids, 4);
  for (const char* k : {"input_ids", "masked_lm_positions", "masked_lm_ids"})
    EXPECT_TRUE(torch::equal(x.at(k), y.at(k))) << k;
  // Evaluation of unmasked shards draws fixed masks; of masked ones, keeps theirs.
  cohort::BertShards eval_none(tmp / "none", "valid", with), eval_static(tmp / "data", "valid", with);
  auto v = iota(eval_none.size());
  EXPECT_TRUE(torch::equal(eval_none.get_batch(v).at("input_ids"), eval_none.get_batch(v).at("input_ids")));
  EXPECT_GT(eval_none.get_batch(v).at("masked_lm_ids").ge(0).sum().item<int64_t>(), 0);
  EXPECT_TRUE(torch::equal(eval_static.get_batch(v).at("input_ids"),
                           cohort::BertShards(tmp / "data", "valid").get_batch(v).at("input_ids")));
}

// The loss curve with dynamic masks (and dropout) is the same on 1, 2 and 3
// ranks, with 0 or 2 loader workers, packed or not, and across a resume;
// 20 steps cross an epoch, so new masks are drawn.
TEST(DynamicMasking, LossCurveIsTheSameOnAnyWorldWorkersPackingAndResume) {
  TempDir tmp;
  ASSERT_EQ(cohort::test::prepare_tiny_bert(tmp, 128).code, 0);
  ASSERT_LT(cohort::BertShards(tmp / "data", "train").size(), 20 * 20) << "20 steps should cross an epoch";
  const std::string args = " --train.task bert-pretrain --model.name bert --model.hidden 32 --model.layers 2 "
                           "--model.heads 4 --model.intermediate 64 --model.max-positions 128 --model.dropout 0.1 "
                           "--model.attention-dropout 0.1 --data.global-batch 20 --log.every-steps 1 --quiet "
                           "--optim.schedule constant "
                           "--data.path " + tmp / "data";
  const std::string dynamic = " --task.masking dynamic --task.mask-prob 0.3 --task.max-predictions 12 ";
  auto train = [&](const std::string& name, const std::string& extra) {
    auto r = run_cohort("train" + args + " --train.max-steps 20 --out " + tmp / name + " " + extra);
    EXPECT_EQ(r.code, 0) << name << ": " << r.err;
    return cohort::test::train_losses(tmp / name);
  };
  auto one = train("w1", dynamic + "--data.workers 0");
  auto two = train("w2", dynamic + "--nproc-per-node 2 --data.workers 2");
  auto three = train("w3", dynamic + "--nproc-per-node 3 --oversubscribe --data.pack");
  auto first = run_cohort("train" + args + dynamic + " --train.max-steps 9 --out " + tmp / "split");
  ASSERT_EQ(first.code, 0) << first.err;
  auto second = run_cohort("train --resume " + tmp / "split" + " --train.max-steps 20 --nproc-per-node 2");
  ASSERT_EQ(second.code, 0) << second.err;
  auto resumed = cohort::test::train_losses(tmp / "split");
  auto statik = train("static", "");
  ASSERT_EQ(one.size(), 20u);
  for (const auto* other : {&two, &three, &resumed}) {
    ASSERT_EQ(other->size(), 20u);
    for (size_t i = 0; i < 20; ++i) EXPECT_NEAR((*other)[i], one[i], 1e-5 * one[i]) << "step " << i + 1;
  }
  // The masks matter: the shards' own (static) masks give another curve.
  ASSERT_EQ(statik.size(), 20u);
  double most = 0;
  for (size_t i = 0; i < 20; ++i) most = std::max(most, std::abs(statik[i] - one[i]));
  EXPECT_GT(most, 1e-2);
}

TEST(DynamicMasking, MaskedLmOnlyTrainsAndExportsBertForMaskedLM) {
  TempDir tmp;
  ASSERT_EQ(cohort::test::prepare_tiny_bert(tmp, 64).code, 0);
  auto prep = prepare_again(tmp, "full", 64, "--masking none --nsp false");
  ASSERT_EQ(prep.code, 0) << prep.err;
  cohort::BertShards full(tmp / "full", "train");
  EXPECT_FALSE(full.info().next_sentence);
  auto b = full.get_batch(iota(full.size()));
  EXPECT_EQ(b.at("segment_ids").max().item<int64_t>(), 0);
  EXPECT_EQ(b.at("next_sentence_labels").max().item<int64_t>(), 0);
  // Full rows: most are filled to within a sentence of the length.
  EXPECT_GT(b.at("input_mask").sum(1).ge(48).sum().item<int64_t>(), full.size() / 2);

  const std::string args = "train --train.task bert-pretrain --model.name bert --model.hidden 32 --model.layers 1 "
                           "--model.heads 2 --model.max-positions 64 --data.global-batch 16 --train.max-steps 6 "
                           "--log.every-steps 3 --eval.split valid --quiet --task.nsp=false --task.masking dynamic "
                           "--data.path " + tmp / "full";
  auto r = run_cohort(args + " --out " + tmp / "run");
  ASSERT_EQ(r.code, 0) << r.err;
  int lines = 0;
  for (const auto& line : cohort::test::lines_of(read_file(tmp / "run/metrics.jsonl"))) {
    auto j = nlohmann::json::parse(line);
    if (j["kind"] != "train" && j["kind"] != "eval") continue;
    ++lines;
    EXPECT_FALSE(j.contains("nsp_loss")) << line;
    EXPECT_DOUBLE_EQ(j["loss"].get<double>(), j["mlm_loss"].get<double>()) << line;
    if (j["kind"] == "eval") {
      EXPECT_GT(j["count"].get<int64_t>(), 0) << line;
    }
  }
  EXPECT_GE(lines, 3);
  auto exp = run_cohort("export " + tmp / "run" + " -o " + tmp / "export");
  ASSERT_EQ(exp.code, 0) << exp.err;
  EXPECT_NE(exp.out.find("BertForMaskedLM"), std::string::npos) << exp.out;
  auto cfg = nlohmann::json::parse(read_file(tmp / "export/config.json"));
  EXPECT_EQ(cfg["architectures"][0], "BertForMaskedLM");
  auto weights = cohort::load_safetensors(tmp / "export/model.safetensors");
  EXPECT_EQ(weights.tensors.count("bert.pooler.dense.weight"), 0u);
  EXPECT_EQ(weights.tensors.count("cls.seq_relationship.weight"), 0u);
  EXPECT_EQ(weights.tensors.count("cls.predictions.decoder.weight"), 1u);
}

// model.init crosses task.nsp: an NSP run's weights start an MLM-only run
// (its pooler and NSP head left out) and back (initialised), with a note.
// task.* keys are fixed on resume.
TEST(DynamicMasking, InitCrossesTheNspHeadAndResumeKeepsTheRecipe) {
  TempDir tmp;
  ASSERT_EQ(cohort::test::prepare_tiny_bert(tmp, 32).code, 0);
  const std::string base = "train --train.task bert-pretrain --model.name bert --model.hidden 16 --model.layers 1 "
                           "--model.heads 2 --model.max-positions 32 --train.max-steps 2 --data.global-batch 8 "
                           "--data.path " + tmp / "data";
  auto nsp = run_cohort(base + " --quiet --out " + tmp / "nsp");
  ASSERT_EQ(nsp.code, 0) << nsp.err;
  auto mlm = run_cohort(base + " --task.nsp=false --task.masking dynamic --model.init " + tmp / "nsp" + " --out " +
                        tmp / "mlm");
  ASSERT_EQ(mlm.code, 0) << mlm.err;
  EXPECT_NE((mlm.out + mlm.err).find("cls.seq_relationship.weight"), std::string::npos) << mlm.out << mlm.err;
  auto back = run_cohort(base + " --quiet --model.init " + tmp / "mlm" + " --out " + tmp / "back");
  ASSERT_EQ(back.code, 0) << back.err;
  // Other tensors must still match.
  auto wrong = run_cohort(base + " --quiet --model.hidden 32 --model.init " + tmp / "nsp" + " --out " + tmp / "wrong");
  EXPECT_EQ(wrong.code, 2) << wrong.err;
  // The recipe is fixed on resume.
  auto resumed = run_cohort("train --resume " + tmp / "nsp" + " --train.max-steps 4 --task.masking dynamic");
  EXPECT_EQ(resumed.code, 2) << resumed.err;
  EXPECT_NE(resumed.err.find("cannot resume: task.masking was"), std::string::npos) << resumed.err;
}

TEST(DynamicMasking, BadSettingsAreConfigErrors) {
  TempDir tmp;
  ASSERT_EQ(cohort::test::prepare_tiny_bert(tmp, 32).code, 0);
  auto none = prepare_again(tmp, "none", 32, "--masking none --nsp false");
  ASSERT_EQ(none.code, 0) << none.err;
  std::filesystem::copy(tmp / "data", tmp / "novocab", std::filesystem::copy_options::recursive);
  std::filesystem::remove(tmp / "novocab/vocab.txt");
  const std::string base = "train --train.task bert-pretrain --model.name bert --model.hidden 16 --model.layers 1 "
                           "--model.heads 2 --model.max-positions 32 --model.vocab-size 200 --train.max-steps 1 --quiet";
  struct Case {
    std::string args, message;
  };
  std::vector<Case> cases = {
      {"--data.path " + tmp / "data" + " --task.mask-prob 0.3", "task.mask-prob applies to task.masking dynamic"},
      {"--data.path " + tmp / "data" + " --task.whole-word", "task.whole-word applies to task.masking dynamic"},
      {"--data.path " + tmp / "data" + " --task.masking sometimes", "task.masking must be static or dynamic"},
      {"--data.path " + tmp / "data" + " --task.masking dynamic --task.mask-replace 0.5,0.4", "task.mask-replace"},
      {"--data.path " + tmp / "data" + " --task.masking dynamic --task.mask-prob 0", "task.mask-prob must be in (0, 1]"},
      {"--data.path " + tmp / "data" + " --task.masking dynamic --task.max-predictions -2", "task.max-predictions"},
      {"--data.path " + tmp / "none" + " --task.nsp=false", "carry no masks"},
      {"--data.path " + tmp / "none" + " --task.masking dynamic", "set task.nsp false"},
      {"--data.path " + tmp / "novocab" + " --task.masking dynamic", "set data.vocab"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    auto r = run_cohort(base + " " + cases[i].args + " --out " + tmp / ("bad" + std::to_string(i)));
    EXPECT_EQ(r.code, 2) << cases[i].args << ": " << r.err;
    EXPECT_NE(r.err.find(cases[i].message), std::string::npos) << cases[i].args << ": " << r.err;
    EXPECT_EQ(cohort::test::lines_of(r.err).size(), 1u) << r.err;
  }
  auto dupes = prepare_again(tmp, "dupes", 32, "--masking none --nsp false --dupe-factor 3");
  EXPECT_EQ(dupes.code, 2) << dupes.err;
  EXPECT_NE(dupes.err.find("--dupe-factor 1"), std::string::npos) << dupes.err;
}
