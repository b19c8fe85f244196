// BERT pretraining step throughput, the model alone: forward, backward,
// global-norm clipping and AdamW, as bench/peers/bert_pretrain.py does in
// PyTorch eager. bench/bert_vs_pytorch.py runs both side by side.
// Batches are synthetic and full length (every token real, P masked
// positions per row), or with --data DIR the rows of DIR's train shards in
// file order, B at a time, through Cohort's reader (which trims each batch to
// its longest row): the rows the peer reads with --data.
//
//   build/bench/bert_step_bench --hidden 256 --layers 4 --heads 4 --seq 128
//       --batch 16 --precision bf16 --threads 2 --steps 20 [--data data/gcide]
// prints one JSON line: {"step_ms": ..., "tokens_per_s": ..., ...}; tokens
// are real (non-padding) tokens.
#include <CLI/CLI.hpp>
#include <torch/nn/utils/clip_grad.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "bert_options.hpp"
#include "cohort/config/config.hpp"
#include "cohort/data/bert_shards.hpp"
#include "cohort/model/bert.hpp"
#include "cohort/train/optim.hpp"
#include "cohort/train/precision.hpp"

int main(int argc, char** argv) {
  using namespace cohort;
  CLI::App app{"BERT pretraining step throughput (model only, synthetic batch)"};
  bench::BertOptions shape(app);
  int64_t seq = 128, predictions = 20, batch = 16, steps = 20;
  int threads = 1;
  std::string precision_name = "fp32", data;
  app.add_option("--seq", seq)->capture_default_str();
  app.add_option("--predictions", predictions)->capture_default_str();
  app.add_option("--batch", batch)->capture_default_str();
  app.add_option("--steps", steps)->capture_default_str();
  app.add_option("--threads", threads)->capture_default_str();
  app.add_option("--precision", precision_name, "fp32 | bf16")->capture_default_str();
  app.add_option("--data", data, "shards from cohort prepare (train split); default: synthetic batches");
  CLI11_PARSE(app, argc, argv);
  Precision precision = Precision::kFp32;
  try {
    precision = parse_choice<Precision>("--precision", precision_name);
    COHORT_CHECK(precision == Precision::kFp32 || precision == Precision::kBf16, ConfigError,
                 "--precision must be fp32 or bf16 on CPU (got '", precision_name, "')");
  } catch (const Error& e) {
    std::fprintf(stderr, "bert_step_bench: error: %s\n", e.what());
    return 2;
  }
  const BertConfig& c = shape.resolve();

  torch::set_num_threads(threads);
  torch::manual_seed(1);
  BertForPretraining model(c);
  model->train();
  OptimOptions oo;
  oo.lr = 1e-4;
  oo.eps = 1e-6;
  auto opt = make_optimizer(oo, *model);

  std::unique_ptr<BertShards> shards;
  if (!data.empty()) shards = std::make_unique<BertShards>(data, "train");
  auto ids = torch::randint(5, c.vocab_size, {batch, seq}, torch::kLong);
  auto seg = torch::zeros({batch, seq}, torch::kLong);
  seg.slice(1, seq / 2).fill_(1);
  auto mask = torch::ones({batch, seq}, torch::kLong);
  std::vector<torch::Tensor> rows;
  for (int64_t r = 0; r < batch; ++r) rows.push_back(std::get<0>((torch::randperm(seq - 1).slice(0, 0, predictions) + 1).sort()));
  BertBatch synthetic{ids, seg, mask, torch::stack(rows), torch::randint(5, c.vocab_size, {batch, predictions}, torch::kLong)};
  auto synthetic_nsp = torch::randint(0, 2, {batch}, torch::kLong);
  // Batch s: synthetic, or rows s*B .. s*B+B-1 of the shards (as the peer).
  auto batch_at = [&](int64_t s) -> std::pair<BertBatch, torch::Tensor> {
    if (!shards) return {synthetic, synthetic_nsp};
    std::vector<int64_t> idx;
    for (int64_t r = 0; r < batch; ++r) idx.push_back((s * batch) % (shards->size() - batch) + r);
    Example e = shards->get_batch(idx);
    return {BertBatch::from(e), e.at("next_sentence_labels")};
  };
  c10::Device cpu(torch::kCPU);

  std::vector<double> times, tokens;
  for (int64_t s = 0; s < steps; ++s) {
    auto [b, nsp_labels] = batch_at(s);
    auto t0 = std::chrono::steady_clock::now();
    for (auto& p : model->parameters()) {
      if (p.grad().defined()) p.mutable_grad().zero_();
    }
    torch::Tensor loss;
    {
      AutocastScope autocast(precision, cpu);
      BertOutputs out = model->forward(b);
      loss = torch::nn::functional::cross_entropy(out.mlm_logits.to(torch::kFloat32), out.mlm_labels) +
             torch::nn::functional::cross_entropy(out.nsp_logits.to(torch::kFloat32), nsp_labels);
    }
    loss.backward();
    torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    opt->step();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    tokens.push_back(static_cast<double>(b.input_mask.sum().item<int64_t>()));
  }
  // Steady state: the first quarter dropped; the rate over the rest.
  const size_t k = static_cast<size_t>(steps / 4);
  std::vector<double> steady(times.begin() + k, times.end());
  double secs = 0, toks = 0;
  for (size_t i = k; i < times.size(); ++i) secs += times[i], toks += tokens[i];
  std::sort(steady.begin(), steady.end());
  double step_s = steady[steady.size() / 2];
  std::printf("{\"step_ms\": %.3f, \"tokens_per_s\": %.1f, \"samples_per_s\": %.2f, \"precision\": \"%s\"}\n",
              step_s * 1e3, toks / secs, static_cast<double>(batch) * static_cast<double>(steady.size()) / secs,
              name_of(precision));
  return 0;
}
