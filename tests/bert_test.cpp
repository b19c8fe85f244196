// The BERT model, optimizers and schedules against PyTorch. The reference
// numbers come from tests/golden/make_golden.py (PyTorch, float64), which writes
// tests/golden/golden.safetensors; the script says how each was computed.
#include <gtest/gtest.h>
#include <torch/nn/utils/clip_grad.h>

#include <cmath>
#include <limits>
#include <set>

#include "cohort/ckpt/checkpoint.hpp"
#include "cohort/ckpt/safetensors.hpp"
#include "cohort/config/config.hpp"
#include "cohort/core/error.hpp"
#include "cohort/model/bert.hpp"
#include "cohort/train/optimization/optim.hpp"
#include "cohort/train/optimization/precision.hpp"
#include "helpers.hpp"

namespace cohort {
namespace {

const SafetensorsFile& golden() {
  static const SafetensorsFile g = load_safetensors(COHORT_SOURCE_DIR "/tests/golden/golden.safetensors");
  return g;
}

const torch::Tensor& gold(const std::string& name) {
  auto it = golden().tensors.find(name);
  if (it == golden().tensors.end()) throw std::runtime_error("golden file has no " + name);
  return it->second;
}

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

BertConfig golden_config() {
  BertConfig c;
  c.vocab_size = 50;
  c.hidden = 16;
  c.layers = 2;
  c.heads = 2;
  c.intermediate = 32;
  c.max_positions = 24;
  c.type_vocab = 2;
  c.hidden_dropout = 0.0;
  c.attention_dropout = 0.0;
  return c;
}

TEST(Bert, ParameterNamesAreHuggingFaces) {
  BertForPretraining model(golden_config());
  std::set<std::string> ours, theirs;
  for (const auto& item : model->named_parameters()) ours.insert(item.key());
  for (const auto& [name, t] : golden().tensors) {
    if (name.rfind("bert.param.", 0) == 0) theirs.insert(name.substr(11));
  }
  EXPECT_EQ(ours, theirs);
  EXPECT_TRUE(ours.count("bert.encoder.layer.1.attention.self.query.weight"));
}

// Hugging Face files name the tied MLM decoder too (cohort export writes it
// for load_state_dict(strict=True)): model.init accepts it when it equals
// the embeddings, and refuses an untied one by name.
TEST(Bert, LoadsTiedDecoderKeysAndRefusesUntiedOnes) {
  test::TempDir tmp;
  BertForPretraining src(golden_config()), dst(golden_config());
  NamedTensors tensors;
  for (const auto& item : src->named_parameters()) tensors.emplace_back(item.key(), item.value().detach());
  auto embeddings = src->named_parameters()["bert.embeddings.word_embeddings.weight"].detach();
  auto bias = src->named_parameters()["cls.predictions.bias"].detach();
  tensors.emplace_back("cls.predictions.decoder.bias", bias);
  auto tied = tensors;
  tied.emplace_back("cls.predictions.decoder.weight", embeddings);
  save_safetensors(tmp / "tied.safetensors", tied, {});
  load_model_weights(*dst, tmp / "tied.safetensors");
  EXPECT_TRUE(torch::equal(dst->named_parameters()["bert.embeddings.word_embeddings.weight"], embeddings));
  auto untied = tensors;
  untied.emplace_back("cls.predictions.decoder.weight", embeddings + 1);
  save_safetensors(tmp / "untied.safetensors", untied, {});
  auto err = test::error_of([&] { load_model_weights(*dst, tmp / "untied.safetensors"); });
  EXPECT_NE(err.find("cls.predictions.decoder.weight"), std::string::npos) << err;
}

TEST(Bert, ForwardLossesAndEveryGradientMatchPyTorch) {
  BertForPretraining model(golden_config());
  {
    torch::NoGradGuard no_grad;
    for (auto& item : model->named_parameters()) {
      const auto& ref = gold("bert.param." + item.key());
      ASSERT_EQ(item.value().sizes(), ref.sizes()) << item.key();
      item.value().copy_(ref);
    }
  }
  model->train();
  BertBatch batch{gold("bert.in.input_ids"), gold("bert.in.segment_ids"), gold("bert.in.input_mask"),
                  gold("bert.in.masked_lm_positions"), gold("bert.in.masked_lm_ids")};
  BertOutputs out = model->forward(batch);
  auto sum = torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum);
  auto mlm = torch::nn::functional::cross_entropy(out.mlm_logits, out.mlm_labels, sum);
  auto nsp = torch::nn::functional::cross_entropy(out.nsp_logits, gold("bert.in.next_sentence_labels"), sum);
  double m = gold("bert.out.mlm_count").item<double>(), b = gold("bert.out.nsp_count").item<double>();
  ASSERT_EQ(out.mlm_labels.size(0), static_cast<int64_t>(m));
  EXPECT_NEAR(mlm.item<double>(), gold("bert.out.mlm_sum").item<double>(), 1e-5);
  EXPECT_NEAR(nsp.item<double>(), gold("bert.out.nsp_sum").item<double>(), 1e-5);
  (mlm / m + nsp / b).backward();
  double worst = 0;
  std::string worst_name;
  for (const auto& item : model->named_parameters()) {
    ASSERT_TRUE(item.value().grad().defined()) << item.key();
    const auto& ref = gold("bert.grad." + item.key());
    double d = max_abs_diff(item.value().grad(), ref);
    EXPECT_LE(d, 1e-5) << item.key() << " max |grad - pytorch| = " << d;
    // A gradient that is all zero would pass trivially, so the reference must
    // not be; except the key bias's, which is zero in exact arithmetic: it adds
    // the same q.b_k to every score of a query, and softmax ignores that.
    if (item.key().find("attention.self.key.bias") == std::string::npos) {
      EXPECT_GT(ref.abs().max().item<double>(), 1e-3) << item.key();
    }
    if (d > worst) worst = d, worst_name = item.key();
  }
  std::printf("[ golden ] worst gradient difference %.3g (%s)\n", worst, worst_name.c_str());
}

TEST(Bert, FreshModelLossIsLnVocabPlusLn2) {
  torch::manual_seed(7);
  BertConfig c;
  c.vocab_size = 1000;
  c.hidden = 64;
  c.layers = 2;
  c.heads = 2;
  c.intermediate = 128;
  c.max_positions = 64;
  BertForPretraining model(c);
  model->eval();
  int64_t bsz = 16, len = 32, p = 5;
  BertBatch batch{torch::randint(5, c.vocab_size, {bsz, len}, torch::kLong), torch::zeros({bsz, len}, torch::kLong),
                  torch::ones({bsz, len}, torch::kLong), torch::randint(1, len, {bsz, p}, torch::kLong),
                  torch::randint(5, c.vocab_size, {bsz, p}, torch::kLong)};
  torch::NoGradGuard no_grad;
  auto out = model->forward(batch);
  double mlm = torch::nn::functional::cross_entropy(out.mlm_logits, out.mlm_labels).item<double>();
  double nsp = torch::nn::functional::cross_entropy(out.nsp_logits, torch::randint(0, 2, {bsz}, torch::kLong))
                   .item<double>();
  EXPECT_NEAR(mlm + nsp, std::log(1000.0) + std::log(2.0), 0.05);
}

TEST(Bert, MlmLogitsOnlyAtMaskedPositions) {
  BertConfig c = golden_config();
  BertForPretraining model(c);
  auto ids = torch::randint(5, c.vocab_size, {2, 8}, torch::kLong);
  BertBatch batch{ids, torch::zeros_like(ids), torch::ones_like(ids), torch::tensor({{1, 2, 0}, {3, 0, 0}}),
                  torch::tensor({{7, 8, -1}, {9, -1, -1}})};
  auto out = model->forward(batch);
  EXPECT_EQ(out.mlm_logits.sizes(), (std::vector<int64_t>{3, c.vocab_size}));
  EXPECT_TRUE(out.mlm_labels.equal(torch::tensor({7, 8, 9})));
  EXPECT_EQ(out.nsp_logits.sizes(), (std::vector<int64_t>{2, 2}));
}

struct TwoParams : torch::nn::Module {
  TwoParams() {
    w = register_parameter("w", gold("optim.w0").clone());
    b = register_parameter("b", gold("optim.b0").clone());
  }
  torch::Tensor w, b;
};

// bf16 autocast (the default on CPUs that have it) runs the whole model and
// gives nearly the fp32 losses; gradients stay fp32.
TEST(Bert, Bf16AutocastForwardBackward) {
  BertForPretraining model(golden_config());
  BertBatch batch{gold("bert.in.input_ids"), gold("bert.in.segment_ids"), gold("bert.in.input_mask"),
                  gold("bert.in.masked_lm_positions"), gold("bert.in.masked_lm_ids")};
  auto losses = [&](Precision precision) {
    torch::Tensor mlm;
    {
      AutocastScope autocast(precision, c10::Device(torch::kCPU));
      auto out = model->forward(batch);
      // Autocast really ran the decoder in bf16 (or, for fp32, did not).
      EXPECT_EQ(out.mlm_logits.scalar_type(), precision == Precision::kBf16 ? torch::kBFloat16 : torch::kFloat32);
      mlm = torch::nn::functional::cross_entropy(out.mlm_logits.to(torch::kFloat32), out.mlm_labels) +
            torch::nn::functional::cross_entropy(out.nsp_logits.to(torch::kFloat32),
                                                 gold("bert.in.next_sentence_labels"));
    }
    return mlm;
  };
  double fp32 = losses(Precision::kFp32).item<double>();
  auto bf16 = losses(Precision::kBf16);
  EXPECT_NEAR(bf16.item<double>(), fp32, 0.02 * fp32);
  bf16.backward();
  for (const auto& p : model->parameters()) {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_EQ(p.grad().scalar_type(), torch::kFloat32);
  }
}

TEST(LossScaler, SkipsOverflowingStepsAndAdaptsTheScale) {
  TwoParams m;
  LossScaler scaler(true, 1024.0, 2.0, 0.5, /*growth_interval=*/2);
  EXPECT_DOUBLE_EQ(scaler.scale(torch::ones({})).item<double>(), 1024.0);
  m.w.mutable_grad() = torch::full_like(m.w, 2048.0);
  m.b.mutable_grad() = torch::full_like(m.b, 1024.0);
  EXPECT_TRUE(scaler.unscale_and_update(m));
  EXPECT_DOUBLE_EQ(m.w.grad()[0][0].item<double>(), 2.0);  // unscaled in place
  m.b.mutable_grad()[0] = std::numeric_limits<double>::infinity();
  EXPECT_FALSE(scaler.unscale_and_update(m));
  EXPECT_DOUBLE_EQ(scaler.scale(), 512.0);  // backed off
  EXPECT_EQ(scaler.skipped(), 1);
  m.b.mutable_grad().fill_(1.0);
  EXPECT_TRUE(scaler.unscale_and_update(m));
  EXPECT_TRUE(scaler.unscale_and_update(m));
  EXPECT_DOUBLE_EQ(scaler.scale(), 1024.0);  // grew after 2 clean steps
  // Its state survives a checkpoint: a restored scaler continues identically.
  LossScaler restored(true);
  restored.restore(scaler.state());
  EXPECT_DOUBLE_EQ(restored.scale(), scaler.scale());
  EXPECT_EQ(restored.skipped(), scaler.skipped());
  LossScaler off(false);
  EXPECT_TRUE(off.unscale_and_update(m));
  EXPECT_DOUBLE_EQ(off.scale(torch::ones({})).item<double>(), 1.0);
}

TEST(Precision, AutoPicksWhatTheDeviceRuns) {
  c10::Device cpu(torch::kCPU);
  EXPECT_EQ(resolve_precision(Precision::kAuto, cpu), cpu_has_amx_bf16() ? Precision::kBf16 : Precision::kFp32);
  EXPECT_EQ(resolve_precision(Precision::kAuto, c10::Device(torch::kCUDA, 0)), Precision::kFp16);
  EXPECT_EQ(resolve_precision(Precision::kFp32, cpu), Precision::kFp32);
  // fp16 on a CPU runs (libtorch 2.4+ autocasts to it there), with loss scaling.
  EXPECT_EQ(resolve_precision(Precision::kFp16, cpu), Precision::kFp16);
}


void check_optimizer(const std::string& name) {
  OptimOptions o;
  o.name = parse_choice<OptimizerKind>("optim.name", name);
  o.lr = 1e-2;
  o.weight_decay = 0.01;
  o.beta1 = 0.9;
  o.beta2 = 0.999;
  o.eps = 1e-6;
  TwoParams m;
  auto opt = make_optimizer(o, m);
  const auto& gw = gold("optim.gw");
  const auto& gb = gold("optim.gb");
  for (int64_t k = 0; k < gw.size(0); ++k) {
    m.w.mutable_grad() = gw[k].clone();
    m.b.mutable_grad() = gb[k].clone();
    opt->step();
  }
  EXPECT_LE(max_abs_diff(m.w, gold("optim." + name + ".w")), 1e-9) << name;
  EXPECT_LE(max_abs_diff(m.b, gold("optim." + name + ".b")), 1e-9) << name;
  EXPECT_GT(max_abs_diff(m.w, gold("optim.w0")), 1e-2) << name << " barely moved the weights";
}

TEST(Optim, AdamWMatchesPyTorchOver20Steps) { check_optimizer("adamw"); }
TEST(Optim, LambMatchesThePublishedFormulaOver20Steps) { check_optimizer("lamb"); }

TEST(Optim, ClippingMatchesLibtorchsClipGradNorm) {
  for (double max_norm : {0.5, 1e6}) {
    TwoParams a, b;
    for (auto* m : {&a, &b}) {
      m->w.mutable_grad() = gold("optim.gw")[0].clone();
      m->b.mutable_grad() = gold("optim.gb")[0].clone();
    }
    double norm = clip_gradients(a, max_norm).item<double>();
    double ref = torch::nn::utils::clip_grad_norm_(b.parameters(), max_norm);
    EXPECT_NEAR(norm, ref, 1e-12);
    EXPECT_LE(max_abs_diff(a.w.grad(), b.w.grad()), 1e-12) << max_norm;
    EXPECT_LE(max_abs_diff(a.b.grad(), b.b.grad()), 1e-12) << max_norm;
  }
  TwoParams c;
  c.w.mutable_grad() = torch::full_like(c.w, std::numeric_limits<double>::quiet_NaN());
  EXPECT_TRUE(std::isnan(clip_gradients(c, 1.0).item<double>()));
}

TEST(Optim, SchedulesMatchPyTorchSchedulers) {
  for (const std::string kind : {"constant", "linear", "cosine", "poly"}) {
    LrSchedule s;
    s.kind = parse_choice<Schedule>("optim.schedule", kind);
    s.peak = 1e-3;
    s.warmup = 5;
    s.total = 20;
    s.min_ratio = kind == "poly" ? 0.0 : 0.1;
    s.power = 2.0;
    const auto& ref = gold("sched." + kind);
    for (int64_t k = 0; k < 20; ++k) {
      EXPECT_NEAR(s.at(k), ref[k].item<double>(), 1e-12) << kind << " step " << k;
    }
  }
}

}  // namespace
}  // namespace cohort
