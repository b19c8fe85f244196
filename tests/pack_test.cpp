// data.pack: BERT instances packed into rows without cross-contamination.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <numeric>
#include <optional>
#include <set>

#include "cohort/data/bert_shards.hpp"
#include "cohort/model/bert.hpp"
#include "cohort/model/dropout.hpp"
#include "cohort/train/optimization/precision.hpp"
#include "helpers.hpp"
#include "tensor_helpers.hpp"

using cohort::test::read_file;
using cohort::test::run_cohort;
using cohort::test::TempDir;

using cohort::test::first_ids;
using cohort::test::max_abs;
using cohort::test::packable_bert_data;

namespace {

namespace F = torch::nn::functional;

struct Losses {
  torch::Tensor mlm, nsp;
};

Losses losses(cohort::BertForPretraining& model, const cohort::Example& batch) {
  auto out = model->forward(cohort::BertBatch::from(batch));
  auto sum = F::CrossEntropyFuncOptions().reduction(torch::kSum);
  return {F::cross_entropy(out.mlm_logits, out.mlm_labels, sum),
          F::cross_entropy(out.nsp_logits, batch.at("next_sentence_labels"), sum)};
}

// A tiny BERT over the tiny data's vocabulary, without dropout.
cohort::BertConfig tiny_bert(int64_t layers, int64_t max_positions) {
  cohort::BertConfig cfg;
  cfg.vocab_size = 200;
  cfg.hidden = 32;
  cfg.layers = layers;
  cfg.heads = 4;
  cfg.intermediate = 64;
  cfg.max_positions = max_positions;
  cfg.hidden_dropout = cfg.attention_dropout = 0;
  return cfg;
}

}  // namespace

TEST(Pack, RowsHoldEveryInstanceOnceWithoutCrossing) {
  cohort::BertShards data(packable_bert_data(), "train");
  auto batch = data.get_batch(first_ids(24));
  const int64_t row_len = data.info().seq_len;
  auto packed = cohort::pack_bert_rows(batch, row_len);
  const auto& ids = packed.at("input_ids");
  ASSERT_LE(ids.size(1), row_len);
  EXPECT_LT(ids.size(0), 24) << "nothing was packed";
  EXPECT_TRUE(packed.at("next_sentence_labels").equal(batch.at("next_sentence_labels")));
  EXPECT_TRUE(packed.at("masked_lm_ids").equal(batch.at("masked_lm_ids")));
  EXPECT_EQ(packed.at("input_mask").sum().item<int64_t>(), batch.at("input_mask").sum().item<int64_t>());
  auto seq = packed.at("seq_ids"), pos = packed.at("position_ids"), cls = packed.at("cls_index");
  auto flat_ids = ids.reshape({-1}), flat_seq = seq.reshape({-1}), flat_pos = pos.reshape({-1});
  for (int64_t i = 0; i < 24; ++i) {
    int64_t len = batch.at("input_mask")[i].sum().item<int64_t>();
    int64_t start = cls[i].item<int64_t>();
    // The instance's tokens, in order, at one place; positions restart; the
    // segment is its alone.
    EXPECT_TRUE(flat_ids.narrow(0, start, len).equal(batch.at("input_ids")[i].narrow(0, 0, len))) << i;
    EXPECT_TRUE(flat_pos.narrow(0, start, len).equal(torch::arange(len, torch::kInt64))) << i;
    EXPECT_EQ(flat_seq.narrow(0, start, len).eq(i).sum().item<int64_t>(), len) << i;
    EXPECT_EQ(flat_seq.eq(i).sum().item<int64_t>(), len) << i;
    EXPECT_EQ(start / ids.size(1), (start + len - 1) / ids.size(1)) << "instance " << i << " crosses rows";
    // Every masked position points at the same token as before.
    auto mp = packed.at("masked_lm_positions")[i], op = batch.at("masked_lm_positions")[i];
    auto real = batch.at("masked_lm_ids")[i].ge(0);
    for (int64_t j = 0; j < mp.size(0); ++j) {
      if (!real[j].item<bool>()) continue;
      EXPECT_EQ(flat_ids[mp[j].item<int64_t>()].item<int64_t>(),
                batch.at("input_ids")[i][op[j].item<int64_t>()].item<int64_t>());
    }
  }
  // Padding belongs to no instance, and packing is deterministic.
  EXPECT_TRUE(seq.lt(0).equal(packed.at("input_mask").eq(0)));
  auto again = cohort::pack_bert_rows(batch, row_len);
  for (const auto& [name, t] : packed) EXPECT_TRUE(t.equal(again.at(name))) << name;
}

namespace {

// Losses and gradients of one forward and backward, under per-sample
// dropout masks for samples 0..n-1 when `dropout_rows`.
std::vector<torch::Tensor> grads_of(cohort::BertForPretraining& model, const cohort::Example& b, Losses& l,
                                    bool dropout_rows) {
  for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
  {
    std::optional<cohort::DropoutRows> rows;
    if (dropout_rows) rows.emplace(11, 4, first_ids(b.at("next_sentence_labels").size(0)));
    l = losses(model, b);
  }
  (l.mlm + l.nsp).backward();
  std::vector<torch::Tensor> g;
  for (auto& p : model->parameters()) g.push_back(p.grad().clone());
  return g;
}

void expect_same(cohort::BertForPretraining& model, const Losses& a, const std::vector<torch::Tensor>& ga,
                 const Losses& b, const std::vector<torch::Tensor>& gb) {
  EXPECT_NEAR(a.mlm.item<double>(), b.mlm.item<double>(), 1e-5 * std::abs(a.mlm.item<double>()));
  EXPECT_NEAR(a.nsp.item<double>(), b.nsp.item<double>(), 1e-5 * std::abs(a.nsp.item<double>()));
  auto names = model->named_parameters().keys();
  for (size_t i = 0; i < ga.size(); ++i) {
    EXPECT_LE(max_abs(ga[i] - gb[i]), 1e-5 * std::max(1.0, max_abs(ga[i]))) << names[i];
  }
}

}  // namespace

// The packed batch computes what the unpacked one does: the same MLM and NSP
// loss sums and the same gradients (fp32, within 1e-5).
TEST(Pack, PackedBatchGivesTheSameLossesAndGradients) {
  cohort::BertShards data(packable_bert_data(), "train");
  auto batch = data.get_batch(first_ids(24));
  auto packed = cohort::pack_bert_rows(batch, data.info().seq_len);
  ASSERT_LT(packed.at("input_ids").size(0), 24);
  torch::manual_seed(3);
  cohort::BertForPretraining model(tiny_bert(2, 128));
  Losses a, b;
  auto ga = grads_of(model, batch, a, false), gb = grads_of(model, packed, b, false);
  expect_same(model, a, ga, b, gb);
  // And a contaminated packing would not: attention across instances changes them.
  auto leaky = packed;
  leaky["seq_ids"] = packed.at("seq_ids").ge(0).to(torch::kInt64);
  Losses c = losses(model, leaky);
  EXPECT_GT(std::abs(c.mlm.item<double>() - a.mlm.item<double>()), 1e-3);
}

// With dropout on (every site: embeddings, attention probabilities, both
// residual outputs), per-sample masks follow each instance into its packed
// row: the same losses and gradients again.
TEST(Pack, PerSampleDropoutMasksFollowInstancesIntoPackedRows) {
  cohort::BertShards data(packable_bert_data(), "train");
  auto batch = data.get_batch(first_ids(24));
  auto packed = cohort::pack_bert_rows(batch, data.info().seq_len);
  auto cfg = tiny_bert(2, 128);
  cfg.hidden_dropout = 0.1;
  cfg.attention_dropout = 0.2;
  torch::manual_seed(3);
  cohort::BertForPretraining model(cfg);
  model->train();
  Losses a, b, off;
  auto ga = grads_of(model, batch, a, true), gb = grads_of(model, packed, b, true);
  expect_same(model, a, ga, b, gb);
  // Dropout did act: without it the loss is another.
  model->eval();
  grads_of(model, batch, off, true);
  EXPECT_GT(std::abs(off.mlm.item<double>() - a.mlm.item<double>()), 1e-3);
}

// A run with data.pack trains as one without: the same loss curve on one
// rank, and on two, with dropout on (per-sample masks follow each instance
// into its packed row).
TEST(Pack, TrainingWithPackKeepsTheLossCurveAtAnyWorldSize) {
  TempDir tmp;
  const std::string args = " train --train.task bert-pretrain --model.name bert --model.hidden 32 --model.layers 2 "
                           "--model.heads 4 --model.intermediate 64 --model.max-positions 128 --model.dropout 0.1 "
                           "--model.attention-dropout 0.1 --data.global-batch 16 --train.max-steps 6 "
                           "--log.every-steps 1 --quiet --data.path " + packable_bert_data();
  auto plain = run_cohort(args + " --out " + (tmp / "plain"));
  auto packed = run_cohort(args + " --data.pack --out " + (tmp / "packed"));
  auto packed2 = run_cohort(args + " --data.pack --nproc-per-node 2 --oversubscribe --out " + (tmp / "packed2"));
  ASSERT_EQ(plain.code, 0) << plain.err;
  ASSERT_EQ(packed.code, 0) << packed.err;
  ASSERT_EQ(packed2.code, 0) << packed2.err;
  auto curve = [&](const std::string& run) {
    std::vector<double> out;
    for (const auto& line : cohort::test::lines_of(read_file(run + "/metrics.jsonl"))) {
      auto j = nlohmann::json::parse(line);
      if (j["kind"] == "train") out.push_back(j["loss"].get<double>());
    }
    return out;
  };
  auto a = curve(tmp / "plain"), b = curve(tmp / "packed"), c = curve(tmp / "packed2");
  {  // the data does pack: a global batch's 16 instances take fewer rows
    cohort::BertShardsOptions o;
    o.pack = true;
    EXPECT_LT(cohort::BertShards(packable_bert_data(), "train", o).get_batch(first_ids(16)).at("input_ids").size(0), 8);
  }
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  ASSERT_EQ(c.size(), 6u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i], b[i], 1e-4 * a[i]) << "step " << i + 1;
    EXPECT_NEAR(b[i], c[i], 1e-4 * b[i]) << "step " << i + 1;
  }
}

TEST(Pack, IsForBertPretraining) {
  auto image = run_cohort("train --out /tmp/unused --data.pack");
  EXPECT_EQ(image.code, 2);
  EXPECT_NE(image.err.find("data.pack"), std::string::npos) << image.err;
  EXPECT_NE(image.err.find("bert-pretrain"), std::string::npos) << image.err;
}

namespace {

// A hand-built collated batch: rows of `width`, instance i real for
// lengths[i] tokens, one prediction at position 1 (when it has 2 tokens).
cohort::Example hand_batch(const std::vector<int64_t>& lengths, int64_t width) {
  const int64_t n = static_cast<int64_t>(lengths.size());
  auto ids = torch::randint(5, 200, {n, width}, torch::kInt64), mask = torch::zeros({n, width}, torch::kInt64);
  auto pos = torch::zeros({n, 2}, torch::kInt64), mlm = torch::full({n, 2}, -1, torch::kInt64);
  for (int64_t i = 0; i < n; ++i) {
    mask[i].narrow(0, 0, lengths[static_cast<size_t>(i)]).fill_(1);
    if (lengths[static_cast<size_t>(i)] >= 2) {
      pos[i][0] = 1;
      mlm[i][0] = 7;
    }
  }
  return {{"input_ids", ids * mask},
          {"segment_ids", torch::zeros({n, width}, torch::kInt64)},
          {"input_mask", mask},
          {"masked_lm_positions", pos},
          {"masked_lm_ids", mlm},
          {"next_sentence_labels", torch::zeros({n}, torch::kInt64)}};
}

}  // namespace

// Edge cases: an instance as long as a row takes one alone, an empty one
// still gets its [CLS] slot, and rows packing cannot move faithfully (a hole
// in the mask, a prediction past the real tokens) are refused, not mangled.
TEST(Pack, EdgeCasesAreKeptOrRefused) {
  auto b = hand_batch({16, 0, 5, 11}, 16);
  auto p = cohort::pack_bert_rows(b, 16);
  EXPECT_EQ(p.at("input_ids").size(0), 3);  // 16 | 11+5 | the empty one's [CLS] slot
  EXPECT_EQ(p.at("seq_ids").eq(0).sum().item<int64_t>(), 16);
  EXPECT_EQ(p.at("input_mask").sum().item<int64_t>(), 32);

  auto hole = hand_batch({4, 6}, 8);
  hole["input_mask"][1][2] = 0;
  EXPECT_NE(cohort::test::error_of([&] { cohort::pack_bert_rows(hole, 8); }).find("padding inside it"),
            std::string::npos);
  auto past = hand_batch({4, 6}, 8);
  past["masked_lm_positions"][0][0] = 5;
  EXPECT_NE(cohort::test::error_of([&] { cohort::pack_bert_rows(past, 8); }).find("outside its 4 real tokens"),
            std::string::npos);
  // A negative position would read the previous instance's token.
  auto before = hand_batch({4, 6}, 8);
  before["masked_lm_positions"][1][0] = -1;
  EXPECT_NE(cohort::test::error_of([&] { cohort::pack_bert_rows(before, 8); }).find("predicts position -1"),
            std::string::npos);
  // Given the dataset's sample ids, the error names the sample.
  EXPECT_NE(cohort::test::error_of([&] { cohort::pack_bert_rows(before, 8, {40, 41}); }).find("sample 41 predicts"),
            std::string::npos);
}

// bf16 on the CPU writes attention out: an empty row (no key to attend to)
// must stay finite there, packed or not. (Its outputs need not match: an
// empty instance attends over its padding unpacked, and over its own [CLS]
// slot packed. cohort prepare writes no empty instances.)
TEST(Pack, Bf16AttentionStaysFiniteForAnEmptyRow) {
  torch::manual_seed(5);
  cohort::BertForPretraining model(tiny_bert(1, 32));
  auto b = hand_batch({9, 0, 5, 12}, 16);
  for (const auto& batch : {b, cohort::pack_bert_rows(b, 16)}) {
    cohort::BertOutputs out;
    {
      cohort::AutocastScope autocast(cohort::Precision::kBf16, c10::Device(c10::kCPU));
      out = model->forward(cohort::BertBatch::from(batch));
    }
    EXPECT_TRUE(torch::isfinite(out.nsp_logits.to(torch::kFloat32)).all().item<bool>());
    EXPECT_TRUE(torch::isfinite(out.mlm_logits.to(torch::kFloat32)).all().item<bool>());
  }
}
