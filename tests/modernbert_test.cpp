// model.name modernbert: Hugging Face's names, packed rows that compute what
// their rows apart do (rotary positions and the sliding window restart), the
// same loss curve packed or not and on any world size with dropout on, exact
// resume, the slow-link modes, and the configuration's refusals. Its logits
// against transformers' are oracle.hf_modernbert's; a host lost mid-run,
// Elastic.ModernBertGoesOnWithoutALostHost.
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <numeric>
#include <optional>

#include "cohort/ckpt/checkpoint.hpp"
#include "cohort/core/error.hpp"
#include "cohort/data/bert_shards.hpp"
#include "cohort/model/dropout.hpp"
#include "cohort/model/modernbert.hpp"
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

// Over the tiny data's vocabulary: layers 0 and 3 global, 1 and 2 in a
// window of 8 (+-4 tokens), shorter than the instances.
cohort::ModernBertConfig tiny(double dropout) {
  cohort::ModernBertConfig c;
  c.vocab_size = 200;
  c.hidden = 32;
  c.intermediate = 48;
  c.layers = 4;
  c.heads = 4;
  c.max_positions = 128;
  c.global = {true, false, false, true};
  c.local_attention = 8;
  c.embedding_dropout = c.mlp_dropout = dropout;
  c.attention_dropout = dropout;
  return c;
}

// The MLM loss sum and every gradient of one forward and backward, under
// per-sample dropout masks for samples 0..n-1.
torch::Tensor loss_and_grads(cohort::ModernBertForMaskedLM& model, const cohort::Example& b,
                             std::vector<torch::Tensor>& grads) {
  for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
  torch::Tensor loss;
  {
    cohort::DropoutRows rows(11, 4, first_ids(b.at("next_sentence_labels").size(0)));
    auto out = model->forward(cohort::BertBatch::from(b));
    loss = F::cross_entropy(out.mlm_logits, out.mlm_labels, F::CrossEntropyFuncOptions().reduction(torch::kSum));
  }
  loss.backward();
  grads.clear();
  for (auto& p : model->parameters()) grads.push_back(p.grad().clone());
  return loss.detach();
}

}  // namespace

TEST(ModernBert, ParameterNamesAreHuggingFaces) {
  auto c = tiny(0);
  c.layers = 2;
  c.global = {true, false};
  cohort::ModernBertForMaskedLM model(c);
  std::vector<std::string> names;
  for (const auto& p : model->named_parameters()) names.push_back(p.key());
  std::sort(names.begin(), names.end());
  // As save_pretrained writes a ModernBertForMaskedLM (no decoder.weight: tied).
  std::vector<std::string> hf = {
      "decoder.bias", "head.dense.weight", "head.norm.weight", "model.embeddings.norm.weight",
      "model.embeddings.tok_embeddings.weight", "model.final_norm.weight", "model.layers.0.attn.Wo.weight",
      "model.layers.0.attn.Wqkv.weight", "model.layers.0.mlp.Wi.weight", "model.layers.0.mlp.Wo.weight",
      "model.layers.0.mlp_norm.weight", "model.layers.1.attn.Wo.weight", "model.layers.1.attn.Wqkv.weight",
      "model.layers.1.attn_norm.weight", "model.layers.1.mlp.Wi.weight", "model.layers.1.mlp.Wo.weight",
      "model.layers.1.mlp_norm.weight"};
  EXPECT_EQ(names, hf);
  EXPECT_EQ(model->named_parameters()["model.layers.0.mlp.Wi.weight"].sizes(), (std::vector<int64_t>{96, 32}));
  // Biases where the config turns them on.
  c.norm_bias = c.attention_bias = c.mlp_bias = c.classifier_bias = true;
  cohort::ModernBertForMaskedLM biased(c);
  for (const char* name : {"model.embeddings.norm.bias", "model.layers.1.attn.Wqkv.bias", "model.layers.0.mlp.Wo.bias",
                           "head.dense.bias", "model.final_norm.bias"})
    EXPECT_TRUE(biased->named_parameters().contains(name)) << name;
}

// A packed batch gives the loss and gradients of its rows apart, with dropout
// on at every site; rotary positions and the window restart at each
// sequence.
TEST(ModernBert, PackedRowsGiveTheLossAndGradientsOfTheirRowsApart) {
  cohort::BertShards data(packable_bert_data(), "train");
  auto batch = data.get_batch(first_ids(24));
  auto packed = cohort::pack_bert_rows(batch, data.info().seq_len);
  ASSERT_LT(packed.at("input_ids").size(0), 12) << "nothing was packed";
  torch::manual_seed(3);
  auto c = tiny(0.1);
  c.init_range = 0.2;  // attention far from uniform, so that leaking across sequences shows
  cohort::ModernBertForMaskedLM model(c);
  model->train();
  std::vector<torch::Tensor> ga, gb;
  auto a = loss_and_grads(model, batch, ga), b = loss_and_grads(model, packed, gb);
  EXPECT_NEAR(a.item<double>(), b.item<double>(), 1e-5 * a.item<double>());
  auto names = model->named_parameters().keys();
  for (size_t i = 0; i < ga.size(); ++i)
    EXPECT_LE(max_abs(ga[i] - gb[i]), 1e-5 * std::max(1.0, max_abs(ga[i]))) << names[i];
  // Dropout did act.
  model->eval();
  std::vector<torch::Tensor> gc;
  auto off = loss_and_grads(model, batch, gc);
  EXPECT_GT(std::abs(off.item<double>() - a.item<double>()), 1e-3);
  // Attention across the sequences of a row would change the loss. (Positions
  // running on along the row would not: rotary scores and the window depend
  // on the distance between two tokens of one sequence only.)
  torch::NoGradGuard no_grad;
  auto eval_loss = [&](const cohort::Example& e) {
    auto out = model->forward(cohort::BertBatch::from(e));
    return F::cross_entropy(out.mlm_logits, out.mlm_labels).item<double>();
  };
  auto leaky = packed;
  leaky["seq_ids"] = packed.at("seq_ids").ge(0).to(torch::kInt64);
  EXPECT_NEAR(eval_loss(packed), eval_loss(batch), 1e-5 * eval_loss(batch));
  EXPECT_GT(std::abs(eval_loss(leaky) - eval_loss(batch)), 1e-3);
}

// train.activation-checkpointing: each layer runs again in backward, with
// the forward's dropout masks (packed rows too) and autocast, and the
// gradients are the ones kept activations give, bit for bit in fp32.
TEST(ModernBert, ActivationCheckpointingGivesTheSameGradients) {
  cohort::BertShards data(packable_bert_data(), "train");
  auto packed = cohort::pack_bert_rows(data.get_batch(first_ids(24)), data.info().seq_len);
  // With dropout the sliding layers attend over the whole row (their
  // probabilities take per-sample masks); without, by blocks.
  for (double dropout : {0.1, 0.0}) {
    SCOPED_TRACE(dropout > 0 ? "dropout 0.1" : "no dropout");
    auto c = tiny(dropout);
    c.init_range = 0.2;
    torch::manual_seed(3);
    cohort::ModernBertForMaskedLM kept(c);
    c.checkpoint_layers = true;
    cohort::ModernBertForMaskedLM recomputed(c);
    {
      torch::NoGradGuard no_grad;
      auto from = kept->parameters(), to = recomputed->parameters();
      for (size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i]);
    }
    kept->train();
    recomputed->train();
    std::vector<torch::Tensor> ga, gb;
    auto a = loss_and_grads(kept, packed, ga), b = loss_and_grads(recomputed, packed, gb);
    EXPECT_EQ(a.item<double>(), b.item<double>());
    auto names = kept->named_parameters().keys();
    for (size_t i = 0; i < ga.size(); ++i) EXPECT_TRUE(ga[i].equal(gb[i])) << names[i];
    // Under bf16 autocast the recomputation runs in bf16 as the forward did.
    {
      at::autocast::set_autocast_enabled(c10::DeviceType::CPU, true);
      at::autocast::set_autocast_dtype(c10::DeviceType::CPU, torch::kBFloat16);
      a = loss_and_grads(kept, packed, ga);
      b = loss_and_grads(recomputed, packed, gb);
      at::autocast::set_autocast_enabled(c10::DeviceType::CPU, false);
      at::autocast::clear_cache();
    }
    EXPECT_EQ(a.item<double>(), b.item<double>());
    for (size_t i = 0; i < ga.size(); ++i)
      EXPECT_LE(max_abs(ga[i] - gb[i]), 1e-6 * std::max(1.0, max_abs(ga[i]))) << names[i];
  }
}

// The sliding window acts: a token's change reaches a query beyond the
// window only through a global layer.
TEST(ModernBert, SlidingLayersSeeOnlyTheirWindow) {
  auto c = tiny(0);
  c.layers = 2;
  c.global = {false, false};  // windows of +-4 only: two layers reach +-8
  torch::manual_seed(5);
  cohort::ModernBertForMaskedLM model(c);
  model->eval();
  torch::NoGradGuard no_grad;
  auto ids = torch::randint(5, 200, {1, 40}, torch::kInt64), mask = torch::ones({1, 40}, torch::kInt64);
  auto changed = ids.clone();
  changed[0][0] = (ids[0][0].item<int64_t>() + 1) % 200;
  auto before = model->all_logits(ids, mask), after = model->all_logits(changed, mask);
  auto moved = (after - before).abs().amax(-1)[0];
  EXPECT_GT(moved[8].item<double>(), 0);
  EXPECT_EQ(moved.narrow(0, 9, 31).max().item<double>(), 0.0) << "a token beyond two windows moved";
  c.global = {true, false};
  torch::manual_seed(5);
  cohort::ModernBertForMaskedLM global(c);
  global->eval();
  auto far = (global->all_logits(changed, mask) - global->all_logits(ids, mask)).abs().amax(-1)[0];
  EXPECT_GT(far[39].item<double>(), 0) << "a global layer did not carry the change across the row";
}

// Hugging Face's config.json, today's (layer_types, rope_parameters) and
// transformers 4's (global_attn_every_n_layers, global_rope_theta), and the
// fields Cohort cannot honour refused by name.
TEST(ModernBert, ReadsHuggingFacesConfigOldAndNew) {
  nlohmann::json now = {{"model_type", "modernbert"},
                        {"vocab_size", 300},
                        {"hidden_size", 64},
                        {"num_hidden_layers", 3},
                        {"num_attention_heads", 4},
                        {"intermediate_size", 80},
                        {"layer_types", {"full_attention", "sliding_attention", "full_attention"}},
                        {"rope_parameters",
                         {{"full_attention", {{"rope_type", "default"}, {"rope_theta", 1000.0}}},
                          {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 100.0}}}}},
                        {"local_attention", 32}};
  auto c = cohort::ModernBertConfig::from_hf(now, "config.json");
  EXPECT_EQ(c.global, (std::vector<bool>{true, false, true}));
  EXPECT_EQ(c.global_rope_theta, 1000.0);
  EXPECT_EQ(c.local_rope_theta, 100.0);
  EXPECT_EQ(c.local_attention, 32);
  auto back = cohort::ModernBertConfig::from_hf(c.to_hf("ModernBertForMaskedLM"), "again");
  EXPECT_EQ(back.to_hf("x"), c.to_hf("x"));
  nlohmann::json old = {{"model_type", "modernbert"},   {"num_hidden_layers", 4},
                        {"hidden_size", 64},            {"num_attention_heads", 4},
                        {"global_attn_every_n_layers", 2}, {"global_rope_theta", 160000.0},
                        {"local_rope_theta", 10000.0}};
  auto o = cohort::ModernBertConfig::from_hf(old, "old.json");
  EXPECT_EQ(o.global, (std::vector<bool>{true, false, true, false}));
  auto error = [](const nlohmann::json& j) {
    return cohort::test::error_of([&] { cohort::ModernBertConfig::from_hf(j, "bad.json"); });
  };
  auto yarn = now;
  yarn["rope_parameters"]["full_attention"]["rope_type"] = "yarn";
  EXPECT_NE(error(yarn).find("rope_type 'yarn'"), std::string::npos) << error(yarn);
  auto bert = now;
  bert["model_type"] = "bert";
  EXPECT_NE(error(bert).find("not a ModernBERT"), std::string::npos) << error(bert);
  auto odd = now;
  odd["hidden_size"] = 60;  // 15 per head: rotary positions need an even width
  EXPECT_NE(error(odd).find("even head width"), std::string::npos) << error(odd);
  auto act = now;
  act["hidden_activation"] = "relu";
  EXPECT_NE(error(act).find("'relu'"), std::string::npos) << error(act);
}

namespace {

const std::string kTrain = " train" + cohort::test::kTinyModernBert +
                           "--data.global-batch 16 --log.every-steps 1 --quiet --train.precision fp32 --data.path ";

}  // namespace

// With dropout on: the same loss curve packed or not, and on 2 ranks with
// activation checkpointing and the optimizer state sharded.
TEST(ModernBert, TrainsTheSameCurvePackedAndOnAnyWorldSize) {
  TempDir tmp;
  const std::string args = kTrain + packable_bert_data() + " --train.max-steps 6";
  auto plain = run_cohort(args + " --out " + (tmp / "plain"));
  auto packed = run_cohort(args + " --data.pack --out " + (tmp / "packed"));
  auto packed2 = run_cohort(args + " --data.pack --nproc-per-node 2 --oversubscribe --train.activation-checkpointing "
                            "--dist.shard optimizer --out " + (tmp / "packed2"));
  ASSERT_EQ(plain.code, 0) << plain.err;
  ASSERT_EQ(packed.code, 0) << packed.err;
  ASSERT_EQ(packed2.code, 0) << packed2.err;
  auto a = cohort::test::train_losses(tmp / "plain"), b = cohort::test::train_losses(tmp / "packed"),
       c = cohort::test::train_losses(tmp / "packed2");
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  ASSERT_EQ(c.size(), 6u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i], b[i], 1e-4 * a[i]) << "step " << i + 1;
    EXPECT_NEAR(b[i], c[i], 1e-4 * b[i]) << "step " << i + 1;
  }
  EXPECT_LT(a.back(), a.front()) << "the loss did not fall";
}

// The slow-link modes hold for it as they do for BERT: 2 islands of 2 ranks
// (exact and sharded inside each, local steps between) train as 2 flat
// ranks with local steps, and PowerSGD between 2 islands of 2 as flat
// PowerSGD on 2 ranks (dropout on, packed rows).
TEST(ModernBert, IslandsAndPowerSgdTrainAsTheirFlatForms) {
  TempDir tmp;
  const std::string args = kTrain + packable_bert_data() + " --data.pack --train.max-steps 6 --oversubscribe";
  const std::string local = " --dist.sync local --dist.local-steps 2";
  const std::string powersgd = " --dist.grad-compression powersgd --dist.powersgd-rank 2";
  struct Pair {
    std::string name, flat, islands;
  };
  for (const Pair& p : {Pair{"local", " --nproc-per-node 2 --dist.islands rank" + local,
                             " --nproc-per-node 4 --dist.islands 2 --dist.shard optimizer" + local},
                        Pair{"powersgd", " --nproc-per-node 2" + powersgd, " --nproc-per-node 4 --dist.islands 2" + powersgd}}) {
    auto flat = run_cohort(args + p.flat + " --out " + (tmp / (p.name + "-flat")));
    auto islands = run_cohort(args + p.islands + " --out " + (tmp / (p.name + "-islands")));
    ASSERT_EQ(flat.code, 0) << p.name << ": " << flat.err;
    ASSERT_EQ(islands.code, 0) << p.name << ": " << islands.err;
    auto a = cohort::test::train_losses(tmp / (p.name + "-flat")), b = cohort::test::train_losses(tmp / (p.name + "-islands"));
    ASSERT_EQ(a.size(), 6u) << p.name;
    ASSERT_EQ(b.size(), 6u) << p.name;
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5 * a[i]) << p.name << ", step " << i + 1;
    EXPECT_LT(b.back(), b.front()) << p.name << ": the loss did not fall";
  }
}

// A run stopped at step 3 and resumed ends with the weights of one that ran
// through, bit for bit (fp32, dropout on).
TEST(ModernBert, ResumesBitIdentically) {
  TempDir tmp;
  const std::string args = kTrain + packable_bert_data() + " --data.pack --ckpt.every-steps 3 --optim.schedule constant";
  auto through = run_cohort(args + " --train.max-steps 6 --out " + (tmp / "through"));
  auto part = run_cohort(args + " --train.max-steps 3 --out " + (tmp / "part"));
  ASSERT_EQ(through.code, 0) << through.err;
  ASSERT_EQ(part.code, 0) << part.err;
  auto rest = run_cohort("train --resume " + (tmp / "part") + " --train.max-steps 6");
  ASSERT_EQ(rest.code, 0) << rest.err;
  auto a = cohort::load_safetensors(tmp / "through/checkpoints/step-6/model.safetensors");
  auto b = cohort::load_safetensors(tmp / "part/checkpoints/step-6/model.safetensors");
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [name, t] : a.tensors) EXPECT_TRUE(t.equal(b.tensors.at(name))) << name;
}

TEST(ModernBert, ConfigurationsThatCannotWorkAreRefusedInOneLine) {
  TempDir tmp;
  auto expect_usage = [](const cohort::test::Result& r, const std::string& says) {
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_NE(r.err.find(says), std::string::npos) << r.err;
  };
  // No NSP head.
  expect_usage(run_cohort("train --train.task bert-pretrain --model.name modernbert --data.path " + packable_bert_data() +
                          " --out " + (tmp / "a")),
               "set task.nsp false");
  // A ModernBERT key on BERT, and BERT's segments on ModernBERT, have no effect.
  expect_usage(run_cohort("train --train.task bert-pretrain --model.name bert --model.local-attention 64 "
                          "--data.path " + packable_bert_data() + " --out " + (tmp / "b")),
               "model.local-attention applies to model.name modernbert");
  expect_usage(run_cohort(kTrain + packable_bert_data() + " --model.type-vocab 3 --out " + (tmp / "c")),
               "model.type-vocab applies to model.name bert");
  // model.init's config.json sets the architecture: a size key would be ignored.
  cohort::ModernBertConfig c = tiny(0);
  cohort::ModernBertForMaskedLM model(c);
  const std::string hf = tmp / "hf";
  std::filesystem::create_directories(hf);
  cohort::save_safetensors(hf + "/model.safetensors", cohort::module_tensors(*model), {});
  cohort::test::write_file(hf + "/config.json", c.to_hf("ModernBertForMaskedLM").dump());
  expect_usage(run_cohort(kTrain + packable_bert_data() + " --model.init " + hf + " --out " + (tmp / "d")),
               "model.hidden has no effect: model.init's");
  // Without them, it trains from the file.
  auto ok = run_cohort("train --train.task bert-pretrain --model.name modernbert --task.nsp=false --model.init " + hf +
                       " --train.max-steps 2 --data.global-batch 8 --quiet --data.path " + packable_bert_data() + " --out " +
                       (tmp / "e"));
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_NE(read_file(tmp / "e/hf-config.json").find("\"local_attention\": 8"), std::string::npos);
}
