#include "cohort/model/bert.hpp"

#include <torch/nn.h>

#include <cmath>
#include <limits>
#include <optional>

#include "cohort/config/config.hpp"
#include "cohort/core/error.hpp"
#include "cohort/device/host_read.hpp"
#include "cohort/model/dropout.hpp"
#include "cohort/model/model_size.hpp"
#include "cohort/model/residual_norm.hpp"

namespace cohort {

namespace nn = torch::nn;

BertConfig BertConfig::from(const ModelOptions& o, int64_t data_vocab_size) {
  BertConfig c;
  c.vocab_size = o.vocab_size > 0 ? o.vocab_size : data_vocab_size;
  c.hidden = o.hidden;
  c.layers = o.layers;
  c.heads = o.heads;
  c.intermediate = o.intermediate > 0 ? o.intermediate : 4 * o.hidden;
  c.max_positions = o.max_positions;
  c.type_vocab = o.type_vocab;
  c.hidden_dropout = o.dropout;
  c.attention_dropout = o.attention_dropout;
  COHORT_CHECK(c.vocab_size >= 5, ConfigError, "model.vocab-size is ", c.vocab_size,
               ": set it, or give data.path a manifest.json or vocab.txt that names the vocabulary");
  COHORT_CHECK(c.hidden % c.heads == 0, ConfigError, "model.hidden (", c.hidden,
               ") must be divisible by model.heads (", c.heads, ")");
  // Embeddings, layers (attention 4h^2, feed-forward 2hI) and the pooler and
  // heads (about 2h^2), before any tensor is allocated.
  const double h = static_cast<double>(c.hidden), inter = static_cast<double>(c.intermediate);
  const double params = (static_cast<double>(c.vocab_size) + static_cast<double>(c.max_positions) +
                         static_cast<double>(c.type_vocab)) * h +
                        static_cast<double>(c.layers) * (4 * h * h + 2 * h * inter + 9 * h + inter) + 2 * h * h;
  check_model_fits(params,
                   detail::cat("model.hidden ", c.hidden, " (with model.layers ", c.layers, ", model.intermediate ",
                               c.intermediate, ", model.vocab-size ", c.vocab_size, ", model.max-positions ",
                               c.max_positions, ")"),
                   "bert");
  return c;
}

namespace {

// Dropout sites (model/dropout.hpp): the embeddings' is 0, layer i's are
// 3i+1 (attention probabilities), 3i+2 (attention output), 3i+3 (feed-forward output).
uint64_t layer_site(int64_t layer, int which) { return static_cast<uint64_t>(3 * layer + which); }

// A Linear on [B, L, in]. nn::Linear's forward multiplies and then adds the
// bias in a second pass for inputs of more than 2 dims, and under autocast
// adds the fp32 bias into the bf16 product; at::linear (what PyTorch's
// nn.Linear calls) folds a contiguous input into one addmm, the bias inside
// the GEMM, and autocast casts the bias with the rest.
torch::Tensor linear(const nn::Linear& m, const torch::Tensor& x) { return at::linear(x, m->weight, m->bias); }

// Which keys each query attends to: `keep`, bool [B,1,1,L] (padding keys
// masked out) or [B,1,L,L] (packed rows, block-diagonal), for the fused
// kernel; and the same as an additive bias for attention written out (as
// HF's extended attention mask), made once per forward in the scores' dtype.
// The bias is 0 or half the dtype's lowest finite value: never -inf, so a
// query with no key to attend to (an empty row) gets finite probabilities,
// as in the fused kernel, and half, so that adding any score within half
// the dtype's range (in fp16, above -32752) stays finite. A masked key's
// probability is exactly 0 either way. Adding the bias is about twice as
// fast forward and backward as masked_fill with the bool mask.
struct AttentionMask {
  torch::Tensor keep;
  mutable torch::Tensor bias;

  const torch::Tensor& additive(c10::ScalarType dtype) const {
    if (!bias.defined() || bias.scalar_type() != dtype) {
      const double lowest = dtype == torch::kHalf       ? double(std::numeric_limits<c10::Half>::lowest())
                            : dtype == torch::kBFloat16 ? double(std::numeric_limits<c10::BFloat16>::lowest())
                                                        : double(std::numeric_limits<float>::lowest());
      bias = torch::zeros(keep.sizes(), keep.options().dtype(dtype)).masked_fill_(keep.logical_not(), lowest / 2);
    }
    return bias;
  }
};

// Hugging Face's module tree, so parameter names match BertForPreTraining.
struct SelfAttentionImpl : nn::Module {
  SelfAttentionImpl(const BertConfig& c, int64_t layer)
      : heads(c.heads),
        head_dim(c.hidden / c.heads),
        query(register_module("query", nn::Linear(c.hidden, c.hidden))),
        key(register_module("key", nn::Linear(c.hidden, c.hidden))),
        value(register_module("value", nn::Linear(c.hidden, c.hidden))),
        dropout(register_module("dropout", SampleDropout(c.attention_dropout, layer_site(layer, 1)))) {}

  // x [B,L,H]. Queries, keys and values from one product with the three
  // weights side by side: one GEMM of 3H columns rather than three of H, and
  // one for x's gradient rather than three and two sums (a bf16 step on an
  // AMX CPU 3% faster, fp32 no different); the parameters keep Hugging
  // Face's names. Then one fused
  // scaled_dot_product_attention (libtorch picks the kernel), with the
  // attention dropout only while training. Per-sample dropout masks need the
  // probabilities themselves, so that path computes them explicitly.
  torch::Tensor forward(const torch::Tensor& x, const AttentionMask& mask) {
    auto b = x.size(0), l = x.size(1);
    auto qkv = at::linear(x, torch::cat({query->weight, key->weight, value->weight}),
                          torch::cat({query->bias, key->bias, value->bias}))
                   .view({b, l, 3, heads, head_dim})
                   .permute({2, 0, 3, 1, 4})  // [3,B,A,L,D]
                   .unbind(0);                // one backward stack, not a zero-filled [3,...] per part
    const auto &q = qkv[0], &k = qkv[1], &v = qkv[2];
    double p = is_training() ? dropout->p() : 0.0;
    torch::Tensor ctx;  // [B,A,L,D]
    // On the CPU in bf16, libtorch's fused kernel is 2.5x (AVX512-BF16) to
    // 3.6x (AMX) slower than the attention written out
    // (bench/attention_bench.py); in fp32 it is faster.
    const bool written_out = q.is_cpu() && q.scalar_type() == torch::kBFloat16;
    if ((p > 0 && DropoutRows::current() != nullptr) || written_out) {
      auto scores = torch::matmul(q * (1.0 / std::sqrt(static_cast<double>(head_dim))), k.transpose(-2, -1));
      auto probs = torch::softmax(scores + mask.additive(scores.scalar_type()), -1);
      ctx = torch::matmul(dropout(probs), v);
    } else {
      ctx = at::scaled_dot_product_attention(q, k, v, mask.keep, p);
    }
    return ctx.transpose(1, 2).reshape({b, l, heads * head_dim});
  }

  int64_t heads, head_dim;
  nn::Linear query, key, value;
  SampleDropout dropout;
};
TORCH_MODULE(SelfAttention);

// dense -> dropout -> LayerNorm(residual + .), HF's BertSelfOutput / BertOutput;
// the last three fused (model/residual_norm.hpp).
struct ResidualOutImpl : nn::Module {
  ResidualOutImpl(const BertConfig& c, int64_t in, uint64_t site)
      : dense(register_module("dense", nn::Linear(in, c.hidden))),
        LayerNorm(register_module("LayerNorm",
                                  nn::LayerNorm(nn::LayerNormOptions({c.hidden}).eps(c.layer_norm_eps)))),
        dropout(register_module("dropout", SampleDropout(c.hidden_dropout, site))) {}
  Hidden forward(const torch::Tensor& x, const torch::Tensor& residual) {
    return dropout_add_layer_norm(linear(dense, x), residual, LayerNorm->weight, LayerNorm->bias,
                                  LayerNorm->options.eps(), dropout->p(), dropout->site(), is_training());
  }
  nn::Linear dense;
  nn::LayerNorm LayerNorm;
  SampleDropout dropout;
};
TORCH_MODULE(ResidualOut);

struct AttentionImpl : nn::Module {
  AttentionImpl(const BertConfig& c, int64_t layer)
      : self(register_module("self", SelfAttention(c, layer))),
        output(register_module("output", ResidualOut(c, c.hidden, layer_site(layer, 2)))) {}
  Hidden forward(const Hidden& x, const AttentionMask& mask) { return output(self(x.for_products(), mask), x.full); }
  SelfAttention self;
  ResidualOut output;
};
TORCH_MODULE(Attention);

struct DenseImpl : nn::Module {  // HF's BertIntermediate: a module holding `dense`
  DenseImpl(int64_t in, int64_t out) : dense(register_module("dense", nn::Linear(in, out))) {}
  nn::Linear dense;
};
TORCH_MODULE(Dense);

struct LayerImpl : nn::Module {
  LayerImpl(const BertConfig& c, int64_t layer)
      : attention(register_module("attention", Attention(c, layer))),
        intermediate(register_module("intermediate", Dense(c.hidden, c.intermediate))),
        output(register_module("output", ResidualOut(c, c.intermediate, layer_site(layer, 3)))) {}
  Hidden forward(const Hidden& x, const AttentionMask& mask) {
    Hidden a = attention(x, mask);
    return output(torch::gelu(linear(intermediate->dense, a.for_products())), a.full);
  }
  Attention attention;
  Dense intermediate;
  ResidualOut output;
};
TORCH_MODULE(Layer);

struct EmbeddingsImpl : nn::Module {
  EmbeddingsImpl(const BertConfig& c)
      : word_embeddings(register_module("word_embeddings", nn::Embedding(c.vocab_size, c.hidden))),
        position_embeddings(register_module("position_embeddings", nn::Embedding(c.max_positions, c.hidden))),
        token_type_embeddings(register_module("token_type_embeddings", nn::Embedding(c.type_vocab, c.hidden))),
        LayerNorm(register_module("LayerNorm",
                                  nn::LayerNorm(nn::LayerNormOptions({c.hidden}).eps(c.layer_norm_eps)))),
        dropout(register_module("dropout", SampleDropout(c.hidden_dropout, 0))) {}
  torch::Tensor forward(const torch::Tensor& ids, const torch::Tensor& segments, const torch::Tensor& position_ids) {
    auto positions = position_ids.defined() ? position_ids : torch::arange(ids.size(1), ids.options()).unsqueeze(0);
    auto e = word_embeddings(ids) + position_embeddings(positions) + token_type_embeddings(segments);
    return dropout(LayerNorm(e));
  }
  nn::Embedding word_embeddings, position_embeddings, token_type_embeddings;
  nn::LayerNorm LayerNorm;
  SampleDropout dropout;
};
TORCH_MODULE(Embeddings);

struct EncoderImpl : nn::Module {
  EncoderImpl(const BertConfig& c) : layer(register_module("layer", nn::ModuleList())) {
    for (int64_t i = 0; i < c.layers; ++i) layer->push_back(Layer(c, i));
  }
  nn::ModuleList layer;
};
TORCH_MODULE(Encoder);

struct BertImpl : nn::Module {
  // Without NSP, no pooler: Hugging Face's BertModel(add_pooling_layer=False),
  // as BertForMaskedLM holds it.
  BertImpl(const BertConfig& c, bool pooler_too)
      : embeddings(register_module("embeddings", Embeddings(c))), encoder(register_module("encoder", Encoder(c))) {
    if (pooler_too) pooler = register_module("pooler", Dense(c.hidden, c.hidden));
  }
  Embeddings embeddings;
  Encoder encoder;
  Dense pooler{nullptr};
};
TORCH_MODULE(Bert);

struct TransformImpl : nn::Module {  // HF's BertPredictionHeadTransform
  TransformImpl(const BertConfig& c)
      : dense(register_module("dense", nn::Linear(c.hidden, c.hidden))),
        LayerNorm(register_module("LayerNorm",
                                  nn::LayerNorm(nn::LayerNormOptions({c.hidden}).eps(c.layer_norm_eps)))) {}
  // LayerNorm in fp32, as CUDA autocast runs it; the explicit cast makes CPU
  // autocast do the same.
  torch::Tensor forward(const torch::Tensor& x) { return LayerNorm(torch::gelu(dense(x)).to(torch::kFloat32)); }
  nn::Linear dense;
  nn::LayerNorm LayerNorm;
};
TORCH_MODULE(Transform);

struct PredictionsImpl : nn::Module {  // cls.predictions: transform + tied decoder + bias
  PredictionsImpl(const BertConfig& c)
      : transform(register_module("transform", Transform(c))),
        bias(register_parameter("bias", torch::zeros({c.vocab_size}))) {}
  Transform transform;
  torch::Tensor bias;
};
TORCH_MODULE(Predictions);

struct ClsImpl : nn::Module {
  ClsImpl(const BertConfig& c) : predictions(register_module("predictions", Predictions(c))) {
    if (c.next_sentence) seq_relationship = register_module("seq_relationship", nn::Linear(c.hidden, 2));
  }
  Predictions predictions;
  nn::Linear seq_relationship{nullptr};  // NSP only
};
TORCH_MODULE(Cls);

// The encoder's last hidden states [B,L,H].
torch::Tensor encode_with(Bert& bert, const torch::Tensor& input_ids, const torch::Tensor& segment_ids,
                          const torch::Tensor& input_mask, const torch::Tensor& position_ids = {},
                          const torch::Tensor& seq_ids = {}) {
  // Packed rows: each token's per-sample dropout masks are its own sample's.
  std::optional<DropoutRows> packed_rows;
  // (The trainer makes them from the host's copy of the batch: seq_ids here
  // may be on the device, whose copy back would make the host wait.)
  if (seq_ids.defined() && bert->is_training() && DropoutRows::current() != nullptr &&
      !DropoutRows::current()->packed()) {
    packed_rows.emplace(*DropoutRows::current(), seq_ids, position_ids);
  }
  Hidden x{bert->embeddings(input_ids, segment_ids, position_ids), {}};
  // Padding keys are masked out for every head and query; packed rows keep
  // each query among its own instance's keys (block-diagonal; padding
  // attends to padding, whose outputs nothing reads).
  AttentionMask mask;
  mask.keep = seq_ids.defined() ? seq_ids.unsqueeze(2).eq(seq_ids.unsqueeze(1)).unsqueeze(1)
                                : input_mask.ne(0).view({input_mask.size(0), 1, 1, input_mask.size(1)});
  for (const auto& layer : *bert->encoder->layer) x = layer->as<LayerImpl>()->forward(x, mask);
  return x.full;
}

// BERT's initialisation: normal(0, std) weights, zero biases, unit LayerNorm scales.
void init_bert_parameters(nn::Module& module, double std) {
  torch::NoGradGuard no_grad;
  for (auto& item : module.named_parameters()) {
    const std::string& name = item.key();
    auto& t = item.value();
    bool is_norm = name.find("LayerNorm") != std::string::npos;
    if (is_norm && name.size() >= 6 && name.compare(name.size() - 6, 6, "weight") == 0) {
      t.fill_(1.0);
    } else if (t.dim() >= 2) {
      t.normal_(0.0, std);
    } else {
      t.zero_();
    }
  }
}

}  // namespace

struct BertForPretrainingImpl::Parts {
  Bert bert{nullptr};
  Cls cls{nullptr};
};

BertForPretrainingImpl::BertForPretrainingImpl(const BertConfig& cfg) : cfg_(cfg), p_(std::make_shared<Parts>()) {
  p_->bert = register_module("bert", Bert(cfg, /*pooler_too=*/cfg.next_sentence));
  p_->cls = register_module("cls", Cls(cfg));
  reset_parameters();
}

void BertForPretrainingImpl::reset_parameters() { init_bert_parameters(*this, cfg_.init_std); }

torch::Tensor BertForPretrainingImpl::encode(const torch::Tensor& input_ids, const torch::Tensor& segment_ids,
                                             const torch::Tensor& input_mask, const torch::Tensor& position_ids,
                                             const torch::Tensor& seq_ids) {
  return encode_with(p_->bert, input_ids, segment_ids, input_mask, position_ids, seq_ids);
}

BertBatch BertBatch::from(const Example& b) {
  BertBatch out;
  out.input_ids = b.at("input_ids");
  out.segment_ids = b.at("segment_ids");
  out.input_mask = b.at("input_mask");
  out.masked_positions = b.at("masked_lm_positions");
  out.masked_ids = b.at("masked_lm_ids");
  if (auto it = b.find("masked_lm_index"); it != b.end()) out.masked_index = it->second;
  if (auto it = b.find("seq_ids"); it != b.end()) {
    out.seq_ids = it->second;
    out.position_ids = b.at("position_ids");
    out.cls_index = b.at("cls_index");
  }
  return out;
}

std::pair<torch::Tensor, torch::Tensor> masked_states(const BertBatch& batch, const torch::Tensor& hidden) {
  const auto rows = hidden.size(0), width = hidden.size(1), h = hidden.size(2);
  auto flat = hidden.reshape({rows * width, h});
  // Only the M real predictions, picked from the flat rows.
  const bool from_host = batch.masked_index.defined();  // the host found and checked the positions
  auto keep = from_host ? batch.masked_index : batch.masked_ids.reshape({-1}).ge(0).nonzero().squeeze(1);
  auto at = batch.packed() ? batch.masked_positions
                           : batch.masked_positions.clamp_min(0) +
                                 torch::arange(rows, batch.masked_positions.options()).unsqueeze(1) * width;
  auto picked_at = at.reshape({-1}).index_select(0, keep);
  if (!from_host && picked_at.numel() > 0) {  // a position outside its row would read another row's token
    auto within = batch.packed() ? picked_at : batch.masked_positions.reshape({-1}).index_select(0, keep);
    const auto last = static_cast<int64_t>(host_value(within.max()));
    COHORT_CHECK(last < (batch.packed() ? rows * width : width), DataError, "a masked position lies outside its row: ",
                 last, " of ", batch.packed() ? rows * width : width);
  }
  return {flat.index_select(0, picked_at), batch.masked_ids.reshape({-1}).index_select(0, keep)};
}

BertOutputs BertForPretrainingImpl::forward(const BertBatch& batch) {
  COHORT_CHECK(batch.input_ids.size(1) <= cfg_.max_positions, DataError, "a batch has sequences of length ",
               batch.input_ids.size(1), " but model.max-positions is ", cfg_.max_positions);
  auto hidden = encode(batch.input_ids, batch.segment_ids, batch.input_mask, batch.position_ids,
                       batch.seq_ids);  // [R,L,H]
  auto& bert = p_->bert;
  auto& cls = p_->cls;
  BertOutputs out;
  const auto rows = hidden.size(0), width = hidden.size(1), h = hidden.size(2);
  auto flat = hidden.reshape({rows * width, h});
  // NSP from each instance's pooled [CLS] state.
  if (cfg_.next_sentence) {
    auto first = batch.packed() ? flat.index_select(0, batch.cls_index) : hidden.select(1, 0);
    auto pooled = torch::tanh(bert->pooler->dense(first));
    out.nsp_logits = cls->seq_relationship(pooled);
  }
  auto [picked, labels] = masked_states(batch, hidden);
  out.mlm_labels = labels;
  auto t = cls->predictions->transform(picked);
  const auto& decoder = bert->embeddings->word_embeddings->weight;  // tied
  out.mlm_logits = torch::nn::functional::linear(t, decoder, cls->predictions->bias);
  return out;
}

}  // namespace cohort

namespace cohort {

struct BertForClassificationImpl::Parts {
  Bert bert{nullptr};
  SampleDropout dropout{nullptr};
  nn::Linear classifier{nullptr};
};

BertForClassificationImpl::BertForClassificationImpl(const BertConfig& cfg, int64_t classes)
    : cfg_(cfg), p_(std::make_shared<Parts>()) {
  COHORT_CHECK(classes >= 2, ConfigError, "a classifier needs at least 2 classes (got ", classes, ")");
  p_->bert = register_module("bert", Bert(cfg, /*pooler_too=*/true));
  // After every encoder site (3 * layers + 1 is past the last).
  p_->dropout = register_module("dropout", SampleDropout(cfg.hidden_dropout, layer_site(cfg.layers, 1)));
  p_->classifier = register_module("classifier", nn::Linear(cfg.hidden, classes));
  init_bert_parameters(*this, cfg_.init_std);
}

torch::Tensor BertForClassificationImpl::forward(const torch::Tensor& input_ids, const torch::Tensor& segment_ids,
                                                 const torch::Tensor& input_mask) {
  COHORT_CHECK(input_ids.size(1) <= cfg_.max_positions, DataError, "a batch has sequences of length ",
               input_ids.size(1), " but model.max-positions is ", cfg_.max_positions);
  auto hidden = encode_with(p_->bert, input_ids, segment_ids, input_mask);
  auto pooled = torch::tanh(p_->bert->pooler->dense(hidden.select(1, 0)));
  return p_->classifier(p_->dropout(pooled));
}

}  // namespace cohort
