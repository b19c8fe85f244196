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
// are real (non-padding) tokens. --dropout-rng both alternates steps with
// per-sample masks and with torch's generator (model.dropout-rng sample and
// rank) and prints the median step of each and their ratio instead.
#include <ATen/record_function.h>
#include <CLI/CLI.hpp>
#include <torch/cuda.h>
#include <torch/nn/utils/clip_grad.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <cstdio>

#include "bert_options.hpp"
#include "cohort/config/config.hpp"
#include "cohort/data/bert_shards.hpp"
#include "cohort/model/bert.hpp"
#include "cohort/model/dropout.hpp"
#include "cohort/train/optimization/optim.hpp"
#include "cohort/train/optimization/precision.hpp"
#include "interleave.hpp"

namespace {

// --profile: every ATen op's self time (its time less its children's), from
// RecordFunction callbacks on every thread, summed by name.
struct OpTimes {
  struct Stat {
    double self_s = 0;
    int64_t calls = 0;
  };
  std::mutex mu;
  std::map<std::string, Stat> by_name;
};
OpTimes op_times;
struct Open {
  std::chrono::steady_clock::time_point start;
  double children_s = 0;
  std::string key;  // --profile-shapes: read at the start, while the inputs are there
};
thread_local std::vector<Open> open_ops;

// --profile-shapes: ops are told apart by their inputs' dtypes and sizes too.
bool profile_shapes = false;
std::string op_key(const at::RecordFunction& fn) {
  std::string key = fn.name();
  for (const auto& v : fn.inputs()) {
    if (!v.isTensor() || !v.toTensor().defined()) continue;
    const auto& t = v.toTensor();
    key += " " + std::string(c10::toString(t.scalar_type())) + c10::str(t.sizes());
  }
  return key;
}

at::CallbackHandle start_profiling() {
  auto cb = at::RecordFunctionCallback(
      [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
        std::string key = profile_shapes ? op_key(fn) : std::string();  // not timed as the op's
        open_ops.push_back({std::chrono::steady_clock::now(), 0, std::move(key)});
        return nullptr;
      },
      [](const at::RecordFunction& fn, at::ObserverContext*) {
        if (open_ops.empty()) return;
        Open op = open_ops.back();
        open_ops.pop_back();
        double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - op.start).count();
        if (!open_ops.empty()) open_ops.back().children_s += total;
        std::lock_guard<std::mutex> lock(op_times.mu);
        auto& s = op_times.by_name[profile_shapes ? op.key : std::string(fn.name())];
        s.self_s += total - op.children_s;
        ++s.calls;
      });
  cb.scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION});
  cb.needsInputs(profile_shapes);
  return at::addGlobalCallback(cb);
}

// The top ops by self time, per step, on stderr.
void print_profile(int64_t steps, int top) {
  std::vector<std::pair<std::string, OpTimes::Stat>> v(op_times.by_name.begin(), op_times.by_name.end());
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second.self_s > b.second.self_s; });
  double all = 0;
  for (const auto& [name, s] : v) all += s.self_s;
  std::fprintf(stderr, "%-44s %10s %7s %8s\n", "op (self time)", "ms/step", "share", "calls");
  for (int i = 0; i < top && i < static_cast<int>(v.size()); ++i) {
    std::fprintf(stderr, "%-44s %10.1f %6.1f%% %8.1f\n", v[i].first.c_str(), v[i].second.self_s * 1e3 / steps,
                 100 * v[i].second.self_s / all, static_cast<double>(v[i].second.calls) / steps);
  }
  std::fprintf(stderr, "%-44s %10.1f\n", "all ops", all * 1e3 / steps);
}

}  // namespace

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
  bool pack = false;
  app.add_flag("--pack", pack, "with --data: pack each batch's instances into rows (data.pack)");
  int profile = 0;
  app.add_option("--profile", profile, "print the top N ops by self time per step (on stderr), over the steady "
                 "steps; 0: off");
  app.add_flag("--profile-shapes", profile_shapes, "--profile: one line per op and input dtypes and sizes");
  std::string device_name = "cpu", dropout_rng = "sample";
  app.add_option("--dropout-rng", dropout_rng, "sample (model.dropout-rng's default) | rank | both (alternating)")
      ->capture_default_str();
  double peak_tflops = 0;
  app.add_option("--device", device_name, "cpu | cuda")->capture_default_str();
  app.add_option("--peak-tflops", peak_tflops, "the device's dense peak at --precision, for MFU; 0: not printed");
  CLI11_PARSE(app, argc, argv);
  Precision precision = Precision::kFp32;
  try {
    precision = parse_choice<Precision>("--precision", precision_name);
    COHORT_CHECK(precision == Precision::kFp32 || precision == Precision::kBf16, ConfigError,
                 "--precision must be fp32 or bf16 on CPU (got '", precision_name, "')");
    COHORT_CHECK(!pack || !data.empty(), ConfigError, "--pack packs real instances: it needs --data DIR");
  } catch (const Error& e) {
    std::fprintf(stderr, "bert_step_bench: error: %s\n", e.what());
    return 2;
  }
  const BertConfig& c = shape.resolve();

  torch::set_num_threads(threads);
  torch::manual_seed(1);
  const c10::Device device(device_name == "cuda" ? torch::kCUDA : torch::kCPU);
  BertForPretraining model(c);
  model->to(device);
  model->train();
  OptimOptions oo;
  oo.lr = 1e-4;
  oo.eps = 1e-6;
  auto opt = make_optimizer(oo, *model);

  std::unique_ptr<BertShards> shards;
  if (!data.empty()) {
    BertShardsOptions so;
    so.pack = pack;
    shards = std::make_unique<BertShards>(data, "train", so);
  }
  auto ids = torch::randint(5, c.vocab_size, {batch, seq}, torch::kLong);
  auto seg = torch::zeros({batch, seq}, torch::kLong);
  seg.slice(1, seq / 2).fill_(1);
  auto mask = torch::ones({batch, seq}, torch::kLong);
  std::vector<torch::Tensor> rows;
  for (int64_t r = 0; r < batch; ++r) rows.push_back(std::get<0>((torch::randperm(seq - 1).slice(0, 0, predictions) + 1).sort()));
  BertBatch synthetic;
  synthetic.input_ids = ids;
  synthetic.segment_ids = seg;
  synthetic.input_mask = mask;
  synthetic.masked_positions = torch::stack(rows);
  synthetic.masked_ids = torch::randint(5, c.vocab_size, {batch, predictions}, torch::kLong);
  auto synthetic_nsp = torch::randint(0, 2, {batch}, torch::kLong);
  // Batch s: synthetic, or rows s*B .. s*B+B-1 of the shards (as the peer).
  auto batch_at = [&](int64_t s) -> std::pair<BertBatch, torch::Tensor> {
    if (!shards) return {synthetic, synthetic_nsp};
    std::vector<int64_t> idx;
    for (int64_t r = 0; r < batch; ++r) idx.push_back((s * batch) % (shards->size() - batch) + r);
    Example e = shards->get_batch(idx);
    return {BertBatch::from(e), e.at("next_sentence_labels")};
  };

  std::vector<double> times, tokens, sample_times, real_sq, masked;
  std::optional<at::CallbackHandle> profiling;
  for (int64_t s = 0; s < steps; ++s) {
    if (profile > 0 && s == steps / 4) profiling = start_profiling();
    const bool sample_masks = dropout_rng == "sample" || (dropout_rng == "both" && s % 2 == 1);
    auto [host, host_nsp] = batch_at(s);
    BertBatch b = host;
    for (auto* t : {&b.input_ids, &b.segment_ids, &b.input_mask, &b.masked_positions, &b.masked_ids, &b.position_ids,
                    &b.seq_ids, &b.cls_index}) {
      if (t->defined()) *t = t->to(device);
    }
    torch::Tensor nsp_labels = host_nsp.to(device);
    if (device.is_cuda()) torch::cuda::synchronize();
    auto t0 = std::chrono::steady_clock::now();
    for (auto& p : model->parameters()) {
      if (p.grad().defined()) p.mutable_grad().zero_();
    }
    torch::Tensor loss;
    {
      std::optional<DropoutRows> rows;
      if (sample_masks) {
        std::vector<int64_t> ids_of_rows(static_cast<size_t>(batch));
        for (int64_t r = 0; r < batch; ++r) ids_of_rows[static_cast<size_t>(r)] = s * batch + r;
        rows.emplace(1, s, ids_of_rows);
      }
      AutocastScope autocast(precision, device);
      BertOutputs out = model->forward(b);
      loss = torch::nn::functional::cross_entropy(out.mlm_logits.to(torch::kFloat32), out.mlm_labels) +
             torch::nn::functional::cross_entropy(out.nsp_logits.to(torch::kFloat32), nsp_labels);
    }
    loss.backward();
    torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    opt->step();
    if (device.is_cuda()) torch::cuda::synchronize();
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (dropout_rng == "both" && sample_masks) {
      sample_times.push_back(secs);
      continue;
    }
    times.push_back(secs);
    tokens.push_back(static_cast<double>(host.input_mask.sum().item<int64_t>()));
    // Model FLOPs on real tokens only: every instance's own length.
    torch::Tensor lengths = host.packed() ? host.seq_ids.flatten().masked_select(host.seq_ids.flatten().ge(0)).bincount()
                                          : host.input_mask.sum(1);
    real_sq.push_back(lengths.to(torch::kFloat64).pow(2).sum().item<double>());
    masked.push_back(static_cast<double>(host.masked_ids.ge(0).sum().item<int64_t>()));
  }
  if (profiling) {
    at::removeCallback(*profiling);
    print_profile(steps - steps / 4, profile);
  }
  if (dropout_rng == "both") {
    auto median = [](std::vector<double> v) {  // of the steady steps: the first quarter dropped
      v.erase(v.begin(), v.begin() + static_cast<long>(v.size() / 4));
      return bench::median(std::move(v));
    };
    double rank_ms = median(times) * 1e3, sample_ms = median(sample_times) * 1e3;
    std::printf("{\"step_ms_rank\": %.3f, \"step_ms_sample\": %.3f, \"sample_over_rank\": %.4f, \"precision\": \"%s\"}\n",
                rank_ms, sample_ms, sample_ms / rank_ms, name_of(precision));
    return 0;
  }
  // Steady state: the first quarter dropped; the rate over the rest.
  const size_t k = static_cast<size_t>(steps / 4);
  std::vector<double> steady(times.begin() + k, times.end());
  double secs = 0, toks = 0;
  for (size_t i = k; i < times.size(); ++i) secs += times[i], toks += tokens[i];
  std::sort(steady.begin(), steady.end());
  double step_s = steady[steady.size() / 2];
  // Model FLOPs per step (Megatron's count, as MFU is usually quoted):
  // 6 per weight per token for the encoder's matrices, attention's QK^T and
  // AV at 12*L*H*S per token, and the MLM decoder on the masked positions.
  const double tokens_per_s = toks / secs;
  const double seq_per_s = static_cast<double>(batch) * static_cast<double>(steady.size()) / secs;
  const double h = static_cast<double>(c.hidden), l = static_cast<double>(c.layers);
  const double encoder = l * (4 * h * h + 2 * h * static_cast<double>(c.intermediate));
  const double per_token = 6 * encoder + 12 * l * h * static_cast<double>(seq);
  const double per_seq = per_token * static_cast<double>(seq) +
                         6 * (h * h + h * static_cast<double>(c.vocab_size)) * static_cast<double>(predictions);
  const double tflops = per_seq * seq_per_s / 1e12;
  // On real tokens: the encoder's matrices per token, attention per
  // instance (its length squared), the decoder per prediction.
  double real_flops = 0;
  for (size_t i = k; i < times.size(); ++i) {
    real_flops += 6 * encoder * tokens[i] + 12 * l * h * real_sq[i] +
                  6 * (h * h + h * static_cast<double>(c.vocab_size)) * masked[i];
  }
  const double real_tflops = real_flops / secs / 1e12;
  std::printf("{\"step_ms\": %.3f, \"tokens_per_s\": %.1f, \"samples_per_s\": %.2f, \"precision\": \"%s\", "
              "\"device\": \"%s\", \"model_tflops\": %.2f, \"real_tflops\": %.4f, \"mfu\": %.4f}\n",
              step_s * 1e3, tokens_per_s, seq_per_s, name_of(precision), device.str().c_str(), tflops, real_tflops,
              peak_tflops > 0 ? real_tflops / peak_tflops : 0.0);
  return 0;
}
