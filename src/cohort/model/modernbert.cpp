#include "cohort/model/modernbert.hpp"

#include <ATen/autocast_mode.h>
#include <torch/autograd.h>
#include <torch/nn.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>

#include "cohort/config/config.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/json_fields.hpp"
#include "cohort/model/dropout.hpp"
#include "cohort/model/model_size.hpp"
#include "cohort/model/rotary.hpp"
#include "cohort/model/sliding_window.hpp"

namespace cohort {

namespace nn = torch::nn;
namespace fs = std::filesystem;

namespace mb {  // a name of its own: the unity build joins this file with bert.cpp

bool known_activation(const std::string& a) {
  return a == "gelu" || a == "gelu_new" || a == "gelu_pytorch_tanh" || a == "silu";
}

torch::Tensor activate(const std::string& a, const torch::Tensor& x) {
  if (a == "gelu") return torch::gelu(x);
  if (a == "silu") return torch::silu(x);
  return torch::gelu(x, "tanh");  // gelu_new, gelu_pytorch_tanh
}

void check_config(const ModernBertConfig& c, const std::string& where) {
  COHORT_CHECK(c.vocab_size >= 5, ConfigError, where, ": the vocabulary is ", c.vocab_size,
               " tokens: set model.vocab-size, or give data.path a manifest.json or vocab.txt");
  COHORT_CHECK(c.hidden % c.heads == 0 && (c.hidden / c.heads) % 2 == 0, ConfigError, where, ": the hidden width ",
               c.hidden, " must be divisible by the ", c.heads, " heads into an even head width (rotary positions)");
  COHORT_CHECK(static_cast<int64_t>(c.global.size()) == c.layers, ConfigError, where, ": ", c.global.size(),
               " layer types for ", c.layers, " layers");
  COHORT_CHECK(c.local_attention >= 2, ConfigError, where, ": the sliding window is ", c.local_attention,
               " tokens; it must be >= 2");
  for (const auto& a : {c.hidden_activation, c.classifier_activation})
    COHORT_CHECK(known_activation(a), ConfigError, where, ": activation '", a,
                 "' is not one of gelu, gelu_new, gelu_pytorch_tanh, silu");
  COHORT_CHECK(c.classifier_pooling == "cls" || c.classifier_pooling == "mean", ConfigError, where,
               ": classifier_pooling '", c.classifier_pooling, "' is not cls or mean");
  const double h = static_cast<double>(c.hidden), inter = static_cast<double>(c.intermediate);
  const double params = static_cast<double>(c.vocab_size) * h +
                        static_cast<double>(c.layers) * (4 * h * h + 3 * h * inter + 2 * h) + h * h + 2 * h;
  check_model_fits(params,
                   detail::cat("model.hidden ", c.hidden, " (with model.layers ", c.layers, ", model.intermediate ",
                               c.intermediate, ", model.vocab-size ", c.vocab_size, ")"),
                   "modernbert");
}

}  // namespace mb

ModernBertConfig ModernBertConfig::from(const ModelOptions& o, int64_t data_vocab_size) {
  ModernBertConfig c;
  c.vocab_size = o.vocab_size > 0 ? o.vocab_size : data_vocab_size;
  c.hidden = o.hidden;
  c.layers = o.layers;
  c.heads = o.heads;
  c.intermediate = o.intermediate > 0 ? o.intermediate : 3 * o.hidden / 2;
  c.max_positions = o.max_positions;
  c.local_attention = o.local_attention;
  c.global_rope_theta = o.global_rope_theta;
  c.local_rope_theta = o.local_rope_theta;
  for (int64_t i = 0; i < c.layers; ++i) c.global.push_back(i % o.global_every == 0);
  c.embedding_dropout = c.mlp_dropout = o.dropout;
  c.attention_dropout = o.attention_dropout;
  mb::check_config(c, "model.*");
  return c;
}

ModernBertConfig ModernBertConfig::from_hf(const nlohmann::json& j, const std::string& file) {
  COHORT_CHECK(j.is_object() && j.value("model_type", "") == "modernbert", DataError, file,
               " is not a ModernBERT config.json (model_type '", j.is_object() ? j.value("model_type", "") : "",
               "')");
  ModernBertConfig c;
  auto integer = [&](const char* key, int64_t& out, int64_t lo) {
    if (j.contains(key)) out = json_int(j.at(key), file + ": field '" + key + "'", lo);
  };
  auto number = [&](const char* key, double& out) {
    if (!j.contains(key)) return;
    COHORT_CHECK(j.at(key).is_number(), DataError, file, ": field '", key, "' must be a number (got ",
                 j.at(key).dump(), ")");
    out = j.at(key).get<double>();
  };
  auto flag = [&](const char* key, bool& out) {
    if (!j.contains(key)) return;
    COHORT_CHECK(j.at(key).is_boolean(), DataError, file, ": field '", key, "' must be true or false");
    out = j.at(key).get<bool>();
  };
  auto text = [&](const char* key, std::string& out) {
    if (!j.contains(key)) return;
    COHORT_CHECK(j.at(key).is_string(), DataError, file, ": field '", key, "' must be a string");
    out = j.at(key).get<std::string>();
  };
  integer("vocab_size", c.vocab_size, 1);
  integer("hidden_size", c.hidden, 1);
  integer("intermediate_size", c.intermediate, 1);
  integer("num_hidden_layers", c.layers, 1);
  integer("num_attention_heads", c.heads, 1);
  integer("max_position_embeddings", c.max_positions, 1);
  integer("local_attention", c.local_attention, 2);
  for (auto* k : {"pad_token_id", "cls_token_id", "sep_token_id"}) {
    if (j.contains(k) && j.at(k).is_null()) continue;
    integer(k, *(k[0] == 'p' ? &c.pad_id : k[0] == 'c' ? &c.cls_id : &c.sep_id), 0);
  }
  number("norm_eps", c.norm_eps);
  number("initializer_range", c.init_range);
  number("initializer_cutoff_factor", c.init_cutoff);
  number("embedding_dropout", c.embedding_dropout);
  number("attention_dropout", c.attention_dropout);
  number("mlp_dropout", c.mlp_dropout);
  number("classifier_dropout", c.classifier_dropout);
  flag("norm_bias", c.norm_bias);
  flag("attention_bias", c.attention_bias);
  flag("mlp_bias", c.mlp_bias);
  flag("decoder_bias", c.decoder_bias);
  flag("classifier_bias", c.classifier_bias);
  text("hidden_activation", c.hidden_activation);
  text("classifier_activation", c.classifier_activation);
  text("classifier_pooling", c.classifier_pooling);
  // Layer types: transformers 5's list, or 4's period.
  if (j.contains("layer_types") && !j.at("layer_types").is_null()) {
    COHORT_CHECK(j.at("layer_types").is_array(), DataError, file, ": field 'layer_types' must be a list");
    for (const auto& t : j.at("layer_types")) {
      COHORT_CHECK(t == "full_attention" || t == "sliding_attention", DataError, file, ": layer type ", t.dump(),
                   " is not full_attention or sliding_attention");
      c.global.push_back(t == "full_attention");
    }
  } else {
    int64_t every = 3;
    integer("global_attn_every_n_layers", every, 1);
    for (int64_t i = 0; i < c.layers; ++i) c.global.push_back(i % every == 0);
  }
  number("global_rope_theta", c.global_rope_theta);
  number("local_rope_theta", c.local_rope_theta);
  if (j.contains("rope_parameters") && j.at("rope_parameters").is_object()) {
    const auto& r = j.at("rope_parameters");
    for (auto [kind, theta] : {std::pair<const char*, double*>{"full_attention", &c.global_rope_theta},
                               {"sliding_attention", &c.local_rope_theta}}) {
      if (!r.contains(kind) || !r.at(kind).is_object()) continue;
      const auto& p = r.at(kind);
      COHORT_CHECK(p.value("rope_type", "default") == "default", DataError, file, ": rope_type '",
                   p.value("rope_type", ""), "' for ", kind, " (Cohort has the default rotary positions only)");
      if (p.contains("rope_theta")) {
        COHORT_CHECK(p.at("rope_theta").is_number(), DataError, file, ": rope_theta of ", kind, " must be a number");
        *theta = p.at("rope_theta").get<double>();
      }
    }
  }
  mb::check_config(c, file);
  return c;
}

nlohmann::json ModernBertConfig::to_hf(const std::string& architecture) const {
  nlohmann::json types = nlohmann::json::array();
  for (bool g : global) types.push_back(g ? "full_attention" : "sliding_attention");
  // The period of the global layers, when they have one (else 1: every
  // layer global for transformers 4, which layer_types overrides in 5).
  int64_t every = 1;
  for (int64_t p = 1; p <= layers; ++p) {
    bool fits = true;
    for (int64_t i = 0; i < layers && fits; ++i) fits = global[static_cast<size_t>(i)] == (i % p == 0);
    if (fits) {
      every = p;
      break;
    }
  }
  return {
      {"architectures", {architecture}},
      {"model_type", "modernbert"},
      {"vocab_size", vocab_size},
      {"hidden_size", hidden},
      {"intermediate_size", intermediate},
      {"num_hidden_layers", layers},
      {"num_attention_heads", heads},
      {"max_position_embeddings", max_positions},
      {"layer_types", types},
      {"local_attention", local_attention},
      // transformers 4 reads these instead of layer_types and rope_parameters.
      {"global_attn_every_n_layers", every},
      {"global_rope_theta", global_rope_theta},
      {"local_rope_theta", local_rope_theta},
      {"rope_parameters",
       {{"full_attention", {{"rope_type", "default"}, {"rope_theta", global_rope_theta}}},
        {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", local_rope_theta}}}}},
      {"norm_eps", norm_eps},
      {"norm_bias", norm_bias},
      {"attention_bias", attention_bias},
      {"mlp_bias", mlp_bias},
      {"decoder_bias", decoder_bias},
      {"classifier_bias", classifier_bias},
      {"hidden_activation", hidden_activation},
      {"classifier_activation", classifier_activation},
      {"classifier_pooling", classifier_pooling},
      {"embedding_dropout", embedding_dropout},
      {"attention_dropout", attention_dropout},
      {"mlp_dropout", mlp_dropout},
      {"classifier_dropout", classifier_dropout},
      {"initializer_range", init_range},
      {"initializer_cutoff_factor", init_cutoff},
      {"pad_token_id", pad_id},
      {"cls_token_id", cls_id},
      {"bos_token_id", cls_id},
      {"sep_token_id", sep_id},
      {"eos_token_id", sep_id},
      {"tie_word_embeddings", true},
      {"sparse_prediction", false},
      {"dtype", "float32"},
  };
}

ModernBertConfig modernbert_config(const ModelOptions& o, int64_t data_vocab_size) {
  // The architecture beside model.init: a Hugging Face directory's
  // config.json, or a Cohort run's hf-config.json (the run itself, one of its
  // checkpoints, or the directory of a model.safetensors).
  fs::path file;
  if (!o.init.empty()) {
    const fs::path init(o.init);
    const fs::path dir = fs::is_directory(init) ? init : init.parent_path();
    for (const auto& candidate : {dir / "config.json", dir / "hf-config.json", dir.parent_path().parent_path() / "hf-config.json"}) {
      if (fs::is_regular_file(candidate)) {
        file = candidate;
        break;
      }
    }
  }
  if (file.empty()) return ModernBertConfig::from(o, data_vocab_size);
  nlohmann::json j;
  {
    std::ifstream in(file);
    try {
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      throw DataError(detail::cat(file.string(), " (model.init) is not JSON: ", e.what()));
    }
  }
  if (!j.is_object() || j.value("model_type", "") != "modernbert") return ModernBertConfig::from(o, data_vocab_size);
  // The architecture is the file's: a size key set as well would be ignored.
  const ModelOptions d;
  const char* set = o.hidden != d.hidden                       ? "model.hidden"
                    : o.layers != d.layers                     ? "model.layers"
                    : o.heads != d.heads                       ? "model.heads"
                    : o.intermediate != d.intermediate         ? "model.intermediate"
                    : o.max_positions != d.max_positions       ? "model.max-positions"
                    : o.vocab_size != d.vocab_size             ? "model.vocab-size"
                    : o.local_attention != d.local_attention   ? "model.local-attention"
                    : o.global_every != d.global_every         ? "model.global-every"
                    : o.global_rope_theta != d.global_rope_theta ? "model.global-rope-theta"
                    : o.local_rope_theta != d.local_rope_theta ? "model.local-rope-theta"
                                                               : nullptr;
  COHORT_CHECK(set == nullptr, ConfigError, set, " has no effect: model.init's ", file.string(),
               " sets the architecture; leave it unset");
  ModernBertConfig c = ModernBertConfig::from_hf(j, file.string());
  c.embedding_dropout = c.mlp_dropout = o.dropout;
  c.attention_dropout = o.attention_dropout;
  return c;
}

namespace mb {  // a name of its own: the unity build joins this file with bert.cpp

// Dropout sites (model/dropout.hpp): the embeddings' is 0; layer i's are
// 3i+1 (attention probabilities), 3i+2 (attention output), 3i+3 (GeGLU).
uint64_t layer_site(int64_t layer, int which) { return static_cast<uint64_t>(3 * layer + which); }

nn::Linear linear(int64_t in, int64_t out, bool bias) { return nn::Linear(nn::LinearOptions(in, out).bias(bias)); }

// LayerNorm with or without a bias (libtorch's nn::LayerNorm always has one).
struct NormImpl : nn::Module {
  NormImpl(int64_t h, double eps, bool with_bias) : eps(eps) {
    weight = register_parameter("weight", torch::ones({h}));
    if (with_bias) bias = register_parameter("bias", torch::zeros({h}));
  }
  torch::Tensor forward(const torch::Tensor& x) { return at::layer_norm(x, {x.size(-1)}, weight, bias, eps); }
  torch::Tensor weight, bias;
  double eps;
};
TORCH_MODULE(Norm);

// Which keys each query sees, for a layer kind: bool, broadcastable to
// [B,A,L,L]. Padded rows: real keys (a padding query sees every key, so
// that no row is empty: its output is never read). Packed rows: its own
// sequence's keys. Sliding layers: within local_attention / 2 positions.
struct Masks {
  torch::Tensor full, sliding;
  // The sliding layers' keys by blocks (banded_attention), when they attend
  // that way: [R * blocks, 1, band, 3 * band], band = local_attention / 2.
  torch::Tensor sliding_band;
  int64_t band = 0;
};

Masks attention_masks(const torch::Tensor& input_mask, const torch::Tensor& positions, const torch::Tensor& seq_ids,
                      int64_t half_window, bool banded) {
  Masks m;
  if (seq_ids.defined()) {
    m.full = seq_ids.unsqueeze(2).eq(seq_ids.unsqueeze(1)).unsqueeze(1);  // [R,1,L,L]
  } else {
    auto real = input_mask.ne(0);
    m.full = real.view({real.size(0), 1, 1, real.size(1)}).logical_or(
        real.logical_not().view({real.size(0), 1, real.size(1), 1}));  // [B,1,L,L]
  }
  if (banded) {
    m.band = half_window;
    m.sliding_band = band_keep(input_mask, positions, seq_ids, half_window);
    return m;
  }
  auto distance = (positions.unsqueeze(2) - positions.unsqueeze(1)).abs().le(half_window).unsqueeze(1);
  m.sliding = m.full.logical_and(distance);
  return m;
}

// Rotary cos and sin [R or 1, L, D] for positions [R or 1, L], in fp32.
std::pair<torch::Tensor, torch::Tensor> rotary(const torch::Tensor& inv_freq, const torch::Tensor& positions) {
  auto freqs = positions.unsqueeze(-1).to(torch::kFloat32) * inv_freq;
  auto emb = torch::cat({freqs, freqs}, -1);
  return {emb.cos(), emb.sin()};
}

struct AttnImpl : nn::Module {
  AttnImpl(const ModernBertConfig& c, int64_t layer)
      : heads(c.heads),
        head_dim(c.hidden / c.heads),
        Wqkv(register_module("Wqkv", linear(c.hidden, 3 * c.hidden, c.attention_bias))),
        Wo(register_module("Wo", linear(c.hidden, c.hidden, c.attention_bias))),
        probs_drop(register_module("probs_drop", SampleDropout(c.attention_dropout, layer_site(layer, 1)))),
        out_drop(register_module("out_drop", SampleDropout(c.attention_dropout, layer_site(layer, 2)))) {}

  // keep: the keys each query sees, [B or 1, 1, L, L]; or, when band > 0,
  // band_keep's blocks for banded_attention.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& keep, int64_t band,
                        const std::pair<torch::Tensor, torch::Tensor>& cs) {
    auto b = x.size(0), l = x.size(1);
    auto [q, k, v] = rotary_qkv(at::linear(x, Wqkv->weight, Wqkv->bias), heads, cs.first, cs.second);
    const double p = is_training() ? probs_drop->p() : 0.0;
    torch::Tensor ctx;
    // Per-sample dropout needs the probabilities themselves. Otherwise the
    // fused kernel, in bf16 too: with libtorch 2.11 on an AMX Xeon it runs
    // this layer's attention (32 x 4 heads x 512 x 64, a windowed mask)
    // forward and backward 3.1 times as fast as the attention written out
    // (0.119 against 0.365 s), unlike BERT's older measurement.
    if (p > 0 && DropoutRows::current() != nullptr) {
      auto scores = torch::matmul(q * (1.0 / std::sqrt(static_cast<double>(head_dim))), k.transpose(-2, -1));
      // Half the dtype's lowest value: finite in fp16 and bf16 alike.
      const double lowest = scores.scalar_type() == torch::kHalf ? double(std::numeric_limits<c10::Half>::lowest())
                            : scores.scalar_type() == torch::kBFloat16
                                ? double(std::numeric_limits<c10::BFloat16>::lowest())
                                : double(std::numeric_limits<float>::lowest());
      auto probs = torch::softmax(scores.masked_fill(keep.logical_not(), lowest / 2), -1, torch::kFloat32)
                       .to(q.scalar_type());
      ctx = torch::matmul(probs_drop(probs), v);
    } else if (band > 0) {
      COHORT_CHECK(p == 0, Error, "banded attention with attention dropout ", p);
      return out_drop(at::linear(banded_attention(q, k, v, keep, band), Wo->weight, Wo->bias));
    } else {
      ctx = at::scaled_dot_product_attention(q, k, v, keep, p);
    }
    auto out = ctx.transpose(1, 2).reshape({b, l, heads * head_dim});
    return out_drop(at::linear(out, Wo->weight, Wo->bias));
  }

  int64_t heads, head_dim;
  nn::Linear Wqkv, Wo;
  SampleDropout probs_drop, out_drop;
};
TORCH_MODULE(Attn);

struct MlpImpl : nn::Module {
  MlpImpl(const ModernBertConfig& c, int64_t layer)
      : activation(c.hidden_activation),
        Wi(register_module("Wi", linear(c.hidden, 2 * c.intermediate, c.mlp_bias))),
        Wo(register_module("Wo", linear(c.intermediate, c.hidden, c.mlp_bias))),
        drop(register_module("drop", SampleDropout(c.mlp_dropout, layer_site(layer, 3)))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    auto parts = at::linear(x, Wi->weight, Wi->bias).chunk(2, -1);
    return at::linear(drop(activate(activation, parts[0]) * parts[1]), Wo->weight, Wo->bias);
  }
  std::string activation;
  nn::Linear Wi, Wo;
  SampleDropout drop;
};
TORCH_MODULE(Mlp);

struct LayerImpl : nn::Module {
  LayerImpl(const ModernBertConfig& c, int64_t layer) : global(c.global.at(static_cast<size_t>(layer))) {
    if (layer > 0) attn_norm = register_module("attn_norm", Norm(c.hidden, c.norm_eps, c.norm_bias));
    attn = register_module("attn", Attn(c, layer));
    mlp_norm = register_module("mlp_norm", Norm(c.hidden, c.norm_eps, c.norm_bias));
    mlp = register_module("mlp", Mlp(c, layer));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& keep, int64_t band,
                        const std::pair<torch::Tensor, torch::Tensor>& cs) {
    auto h = x + attn(attn_norm ? attn_norm(x) : x, keep, band, cs);
    return h + mlp(mlp_norm(h));
  }
  bool global;
  Norm attn_norm{nullptr}, mlp_norm{nullptr};
  Attn attn{nullptr};
  Mlp mlp{nullptr};
};
TORCH_MODULE(Layer);

struct EmbeddingsImpl : nn::Module {
  explicit EmbeddingsImpl(const ModernBertConfig& c)
      : tok_embeddings(register_module(
            "tok_embeddings",
            nn::Embedding(nn::EmbeddingOptions(c.vocab_size, c.hidden)
                              .padding_idx(c.pad_id < c.vocab_size ? std::optional<int64_t>(c.pad_id) : std::nullopt)))),
        norm(register_module("norm", Norm(c.hidden, c.norm_eps, c.norm_bias))),
        drop(register_module("drop", SampleDropout(c.embedding_dropout, 0))) {}
  torch::Tensor forward(const torch::Tensor& ids) { return drop(norm(tok_embeddings(ids))); }
  nn::Embedding tok_embeddings;
  Norm norm;
  SampleDropout drop;
};
TORCH_MODULE(Embeddings);

// Activation checkpointing (train.activation-checkpointing): a layer's
// forward keeps only its input; backward runs the layer again, with the
// forward's autocast and dropout masks, and back-propagates through the
// recomputed graph, whose parameters' gradients accumulate as usual
// (PyTorch's reentrant torch.utils.checkpoint).
// What a recomputation must share with its forward, as tensors and numbers
// that the autograd node keeps (saved_data), made once per forward.
struct ForwardState {
  torch::Tensor keys, token_keys, token_positions;  // DropoutRows::Saved; keys undefined: no scope
  int64_t rows = 0, width = 0;
  c10::DeviceType device = c10::DeviceType::CPU;
  bool autocast = false;
  c10::ScalarType autocast_dtype = torch::kBFloat16;

  static ForwardState capture(const torch::Tensor& x) {
    ForwardState s;
    auto tensor = [](const auto& v) {
      return torch::from_blob(const_cast<void*>(static_cast<const void*>(v.data())),
                              {static_cast<int64_t>(v.size())}, torch::kInt64)
          .clone();
    };
    if (const auto* current = DropoutRows::current()) {
      auto saved = current->save();
      s.keys = tensor(saved.keys);
      s.token_keys = tensor(saved.token_keys);
      s.token_positions = tensor(saved.token_positions);
      s.rows = saved.rows;
      s.width = saved.width;
    }
    s.device = x.device().type();
    s.autocast = at::autocast::is_autocast_enabled(s.device);
    s.autocast_dtype = at::autocast::get_autocast_dtype(s.device);
    return s;
  }
  void keep_in(torch::autograd::AutogradContext* ctx) const {
    ctx->saved_data["keys"] = keys;
    ctx->saved_data["token_keys"] = token_keys;
    ctx->saved_data["token_positions"] = token_positions;
    ctx->saved_data["rows"] = rows;
    ctx->saved_data["width"] = width;
    ctx->saved_data["device"] = static_cast<int64_t>(device);
    ctx->saved_data["autocast"] = autocast;
    ctx->saved_data["autocast_dtype"] = static_cast<int64_t>(autocast_dtype);
  }
  static ForwardState from(torch::autograd::AutogradContext* ctx) {
    ForwardState s;
    s.keys = ctx->saved_data["keys"].toTensor();
    s.token_keys = ctx->saved_data["token_keys"].toTensor();
    s.token_positions = ctx->saved_data["token_positions"].toTensor();
    s.rows = ctx->saved_data["rows"].toInt();
    s.width = ctx->saved_data["width"].toInt();
    s.device = static_cast<c10::DeviceType>(ctx->saved_data["device"].toInt());
    s.autocast = ctx->saved_data["autocast"].toBool();
    s.autocast_dtype = static_cast<c10::ScalarType>(ctx->saved_data["autocast_dtype"].toInt());
    return s;
  }
  // The forward's dropout scope again; nullopt when it had none.
  std::optional<DropoutRows::Saved> dropout_rows() const {
    if (!keys.defined()) return std::nullopt;
    auto vec = [](const torch::Tensor& t, auto* type) {
      using T = std::remove_pointer_t<decltype(type)>;
      const auto* p = reinterpret_cast<const T*>(t.data_ptr<int64_t>());
      return std::vector<T>(p, p + t.numel());
    };
    return DropoutRows::Saved{vec(keys, static_cast<uint64_t*>(nullptr)), vec(token_keys, static_cast<uint64_t*>(nullptr)),
                              vec(token_positions, static_cast<int64_t*>(nullptr)), rows, width};
  }
};

struct RecomputedLayer : torch::autograd::Function<RecomputedLayer> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, LayerImpl* layer,
                               const torch::Tensor& keep, int64_t band, const torch::Tensor& cos,
                               const torch::Tensor& sin, const ForwardState& state) {
    ctx->save_for_backward({x, keep, cos, sin});
    // The module outlives its step's backward.
    ctx->saved_data["layer"] = reinterpret_cast<int64_t>(layer);
    ctx->saved_data["band"] = band;
    state.keep_in(ctx);
    torch::NoGradGuard no_grad;
    return layer->forward(x, keep, band, {cos, sin});
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto* layer = reinterpret_cast<LayerImpl*>(ctx->saved_data["layer"].toInt());
    const ForwardState state = ForwardState::from(ctx);
    auto x = saved[0].detach().requires_grad_(true);
    std::optional<DropoutRows> rows;
    if (auto same = state.dropout_rows()) rows.emplace(*same);
    const bool was = at::autocast::is_autocast_enabled(state.device);
    const auto was_dtype = at::autocast::get_autocast_dtype(state.device);
    at::autocast::set_autocast_enabled(state.device, state.autocast);
    at::autocast::set_autocast_dtype(state.device, state.autocast_dtype);
    torch::Tensor out;
    {
      torch::AutoGradMode grad(true);
      out = layer->forward(x, saved[1], ctx->saved_data["band"].toInt(), {saved[2], saved[3]});
    }
    at::autocast::set_autocast_enabled(state.device, was);
    at::autocast::set_autocast_dtype(state.device, was_dtype);
    if (!was) at::autocast::clear_cache();
    torch::autograd::backward({out}, {grads[0]});
    return {x.grad(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

// Hugging Face's ModernBertModel.
struct EncoderImpl : nn::Module {
  explicit EncoderImpl(const ModernBertConfig& c)
      : embeddings(register_module("embeddings", Embeddings(c))),
        layers(register_module("layers", nn::ModuleList())),
        final_norm(register_module("final_norm", Norm(c.hidden, c.norm_eps, c.norm_bias))),
        half_window(c.local_attention / 2),
        attention_dropout(c.attention_dropout),
        checkpoint(c.checkpoint_layers) {
    for (int64_t i = 0; i < c.layers; ++i) layers->push_back(Layer(c, i));
    const auto d = c.hidden / c.heads;
    auto exponent = torch::arange(0, d, 2, torch::kFloat32) / static_cast<double>(d);
    global_inv_freq = 1.0 / torch::pow(c.global_rope_theta, exponent);
    local_inv_freq = 1.0 / torch::pow(c.local_rope_theta, exponent);
  }

  // The final hidden states [R,L,H]; packed rows give position_ids and seq_ids.
  torch::Tensor forward(const torch::Tensor& ids, const torch::Tensor& input_mask, const torch::Tensor& position_ids,
                        const torch::Tensor& seq_ids) {
    // Packed rows: each token's per-sample dropout masks are its own sample's
    // (made from the device's copy only when the trainer made none).
    std::optional<DropoutRows> packed_rows;
    if (seq_ids.defined() && is_training() && DropoutRows::current() != nullptr && !DropoutRows::current()->packed())
      packed_rows.emplace(*DropoutRows::current(), seq_ids, position_ids);
    auto positions = position_ids.defined() ? position_ids : torch::arange(ids.size(1), ids.options()).unsqueeze(0);
    if (global_inv_freq.device() != ids.device()) {  // once: they are not parameters, so to() does not move them
      global_inv_freq = global_inv_freq.to(ids.device());
      local_inv_freq = local_inv_freq.to(ids.device());
    }
    // Sliding layers by blocks (banded_attention) where that is less work,
    // and no dropout needs their probabilities whole.
    const bool banded = half_window > 0 && ids.size(1) >= 4 * half_window && (!is_training() || attention_dropout == 0);
    Masks masks = attention_masks(input_mask, positions, seq_ids, half_window, banded);
    auto global_cs = rotary(global_inv_freq, positions), local_cs = rotary(local_inv_freq, positions);
    auto x = embeddings(ids);
    const bool recompute = checkpoint && is_training() && torch::GradMode::is_enabled();
    const ForwardState state = recompute ? ForwardState::capture(x) : ForwardState{};
    for (const auto& m : *layers) {
      auto* layer = m->as<LayerImpl>();
      const auto& keep = layer->global ? masks.full : masks.band > 0 ? masks.sliding_band : masks.sliding;
      const int64_t band = layer->global ? 0 : masks.band;
      const auto& cs = layer->global ? global_cs : local_cs;
      x = recompute ? RecomputedLayer::apply(x, layer, keep, band, cs.first, cs.second, state)
                    : layer->forward(x, keep, band, cs);
    }
    return final_norm(x);
  }

  Embeddings embeddings;
  nn::ModuleList layers;
  Norm final_norm;
  int64_t half_window;
  double attention_dropout;
  bool checkpoint;
  torch::Tensor global_inv_freq, local_inv_freq;  // not parameters: Hugging Face keeps them out of the file
};
TORCH_MODULE(Encoder);

// Hugging Face's ModernBertPredictionHead: dense, activation, norm.
struct HeadImpl : nn::Module {
  explicit HeadImpl(const ModernBertConfig& c)
      : activation(c.classifier_activation),
        dense(register_module("dense", linear(c.hidden, c.hidden, c.classifier_bias))),
        norm(register_module("norm", Norm(c.hidden, c.norm_eps, c.norm_bias))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return norm(activate(activation, at::linear(x, dense->weight, dense->bias)).to(torch::kFloat32));
  }
  std::string activation;
  nn::Linear dense;
  Norm norm;
};
TORCH_MODULE(Head);

// torch.nn.init.trunc_normal_: uniform in the normal's CDF between the
// cutoffs, mapped back through the inverse CDF.
void trunc_normal(torch::Tensor& t, double std, double cutoff) {
  auto cdf = [](double x) { return (1.0 + std::erf(x / std::sqrt(2.0))) / 2.0; };
  const double lo = cdf(-cutoff), hi = cdf(cutoff);
  t.uniform_(2 * lo - 1, 2 * hi - 1).erfinv_().mul_(std * std::sqrt(2.0)).clamp_(-cutoff * std, cutoff * std);
}

// Hugging Face's _init_weights for ModernBERT, by parameter name.
void init_modernbert(nn::Module& module, const ModernBertConfig& c) {
  torch::NoGradGuard no_grad;
  const double in = c.init_range, out = c.init_range / std::sqrt(2.0 * static_cast<double>(c.layers));
  const double cutoff = c.init_cutoff;
  auto ends_with = [](const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  };
  for (auto& item : module.named_parameters()) {
    const std::string& name = item.key();
    auto& t = item.value();
    if (ends_with(name, "norm.weight")) {
      t.fill_(1.0);
    } else if (t.dim() < 2) {
      t.zero_();
    } else if (ends_with(name, "tok_embeddings.weight")) {
      trunc_normal(t, in, cutoff);
      if (c.pad_id < c.vocab_size) t[c.pad_id].zero_();
    } else if (ends_with(name, "Wo.weight") || ends_with(name, "head.dense.weight")) {
      trunc_normal(t, out, cutoff);
    } else if (name == "classifier.weight") {
      trunc_normal(t, 1.0 / std::sqrt(static_cast<double>(c.hidden)), cutoff);
    } else {
      trunc_normal(t, in, cutoff);
    }
  }
}

void check_length(const torch::Tensor& ids, int64_t max_positions) {
  COHORT_CHECK(ids.size(1) <= max_positions, DataError, "a batch has sequences of length ", ids.size(1),
               " but model.max-positions is ", max_positions);
}

}  // namespace mb

struct ModernBertForMaskedLMImpl::Parts {
  mb::Encoder model{nullptr};
  mb::Head head{nullptr};
  torch::Tensor decoder_bias;  // decoder.bias; the weight is tied to the token embeddings
};

ModernBertForMaskedLMImpl::ModernBertForMaskedLMImpl(const ModernBertConfig& cfg)
    : cfg_(cfg), p_(std::make_shared<Parts>()) {
  p_->model = register_module("model", mb::Encoder(cfg));
  p_->head = register_module("head", mb::Head(cfg));
  if (cfg.decoder_bias) {
    auto decoder = register_module("decoder", std::make_shared<nn::Module>());
    p_->decoder_bias = decoder->register_parameter("bias", torch::zeros({cfg.vocab_size}));
  }
  reset_parameters();
}

void ModernBertForMaskedLMImpl::reset_parameters() { mb::init_modernbert(*this, cfg_); }

BertOutputs ModernBertForMaskedLMImpl::forward(const BertBatch& batch) {
  mb::check_length(batch.input_ids, cfg_.max_positions);
  auto hidden = p_->model->forward(batch.input_ids, batch.input_mask, batch.position_ids, batch.seq_ids);
  auto [picked, labels] = masked_states(batch, hidden);
  BertOutputs out;
  out.mlm_labels = labels;
  out.mlm_logits = at::linear(p_->head(picked), p_->model->embeddings->tok_embeddings->weight, p_->decoder_bias);
  return out;
}

torch::Tensor ModernBertForMaskedLMImpl::all_logits(const torch::Tensor& input_ids, const torch::Tensor& input_mask) {
  mb::check_length(input_ids, cfg_.max_positions);
  auto hidden = p_->model->forward(input_ids, input_mask, {}, {});
  return at::linear(p_->head(hidden), p_->model->embeddings->tok_embeddings->weight, p_->decoder_bias);
}

struct ModernBertForClassificationImpl::Parts {
  mb::Encoder model{nullptr};
  mb::Head head{nullptr};
  SampleDropout drop{nullptr};
  nn::Linear classifier{nullptr};
};

ModernBertForClassificationImpl::ModernBertForClassificationImpl(const ModernBertConfig& cfg, int64_t classes)
    : cfg_(cfg), p_(std::make_shared<Parts>()) {
  COHORT_CHECK(classes >= 2, ConfigError, "a classifier needs at least 2 classes (got ", classes, ")");
  p_->model = register_module("model", mb::Encoder(cfg));
  p_->head = register_module("head", mb::Head(cfg));
  // After every encoder site (3 * layers + 1 is past the last).
  p_->drop = register_module("drop", SampleDropout(cfg.classifier_dropout, mb::layer_site(cfg.layers, 1)));
  p_->classifier = register_module("classifier", nn::Linear(cfg.hidden, classes));
  mb::init_modernbert(*this, cfg_);
}

torch::Tensor ModernBertForClassificationImpl::forward(const torch::Tensor& input_ids, const torch::Tensor& /*segments*/,
                                                       const torch::Tensor& input_mask) {
  mb::check_length(input_ids, cfg_.max_positions);
  auto hidden = p_->model->forward(input_ids, input_mask, {}, {});
  torch::Tensor pooled;
  if (cfg_.classifier_pooling == "mean") {
    auto real = input_mask.unsqueeze(-1).to(hidden.scalar_type());
    pooled = (hidden * real).sum(1) / real.sum(1);
  } else {
    pooled = hidden.select(1, 0);
  }
  return p_->classifier(p_->drop(p_->head(pooled)));
}

}  // namespace cohort
