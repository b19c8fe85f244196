// defines: ModernBertConfig, modernbert_config, ModernBertForMaskedLM, ModernBertForClassification
//
// ModernBERT (Warner et al., 2024) as Hugging Face's ModernBertForMaskedLM
// and ModernBertForSequenceClassification hold it, with their parameter
// names (model.embeddings.tok_embeddings.weight, model.layers.0.attn.Wqkv.weight,
// head.dense.weight, decoder.bias, ...), so that a model.safetensors goes in
// and out unchanged: token embeddings and a LayerNorm, no positions; rotary
// positions, one theta for global layers and one for local layers; fused
// QKV; layers that alternate global attention and a sliding window
// (|i - j| <= local_attention / 2); GeGLU; pre-norm LayerNorms, without
// biases where the config says so (the first layer has no attention norm);
// a final norm; the MLM head tied to the token embeddings.
//
// Batches are BertBatch, padded or packed (data.pack): packed rows give each
// token its position within its own sequence, so rotary positions and the
// sliding window restart at each sequence, and attention stays within it.
// A packed row then gives the loss of its sequences apart.
#pragma once

#include <nlohmann/json.hpp>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cohort/model/bert.hpp"

namespace cohort {

struct ModelOptions;

struct ModernBertConfig {
  int64_t vocab_size = 50368;
  int64_t hidden = 768;
  int64_t intermediate = 1152;  // GeGLU's width: Wi is [2 * intermediate, hidden]
  int64_t layers = 22;
  int64_t heads = 12;
  int64_t max_positions = 8192;
  std::vector<bool> global;     // per layer: global attention (else the sliding window)
  int64_t local_attention = 128;  // the window's total width: a token sees |i - j| <= local_attention / 2
  double global_rope_theta = 160000.0;
  double local_rope_theta = 10000.0;
  double norm_eps = 1e-5;
  bool norm_bias = false, attention_bias = false, mlp_bias = false, decoder_bias = true, classifier_bias = false;
  std::string hidden_activation = "gelu";      // gelu | gelu_new | gelu_pytorch_tanh | silu
  std::string classifier_activation = "gelu";  // the prediction head's
  std::string classifier_pooling = "cls";      // cls | mean
  double embedding_dropout = 0.0, attention_dropout = 0.0, mlp_dropout = 0.0, classifier_dropout = 0.0;
  double init_range = 0.02, init_cutoff = 2.0;
  int64_t pad_id = 0, cls_id = 2, sep_id = 3, mask_id = 4;  // written to config.json; pad_id has no gradient
  // train.activation-checkpointing: each layer keeps only its input while
  // training and runs again in backward (not a Hugging Face field).
  bool checkpoint_layers = false;

  // From the model.* keys (a vocab size of 0 there: `data_vocab_size`):
  // layer i is global when i % model.global-every == 0, as Hugging Face's
  // global_attn_every_n_layers. ConfigError for inconsistent sizes.
  static ModernBertConfig from(const ModelOptions& opts, int64_t data_vocab_size);
  // From a Hugging Face config.json (model_type modernbert; layer_types and
  // rope_parameters, or the older global_attn_every_n_layers and
  // global_rope_theta / local_rope_theta). DataError naming `file` and the field.
  static ModernBertConfig from_hf(const nlohmann::json& j, const std::string& file);
  // Hugging Face's config.json for `architecture` (ModernBertForMaskedLM, ...).
  nlohmann::json to_hf(const std::string& architecture) const;
};

// The architecture of a run with model.name modernbert: from model.init's
// config.json when model.init names a Hugging Face ModernBERT directory (the
// model.* size keys must then be left unset: ConfigError naming the first
// one set), else from the model.* keys. Dropouts always come from the keys
// (model.dropout: embeddings and GeGLU; model.attention-dropout: attention).
ModernBertConfig modernbert_config(const ModelOptions& opts, int64_t data_vocab_size);

class ModernBertForMaskedLMImpl : public PretrainingModel {
 public:
  explicit ModernBertForMaskedLMImpl(const ModernBertConfig& cfg);
  // MLM logits at the batch's real masked positions (no NSP head).
  BertOutputs forward(const BertBatch& batch) override;
  int64_t vocab_size() const override { return cfg_.vocab_size; }
  int64_t max_positions() const override { return cfg_.max_positions; }
  // Logits at every position [B,L,V] (oracles; padding's are meaningless).
  torch::Tensor all_logits(const torch::Tensor& input_ids, const torch::Tensor& input_mask);
  const ModernBertConfig& config() const { return cfg_; }
  // Hugging Face's initialisation: truncated normals (std init_range for
  // embeddings and input projections, init_range / sqrt(2 layers) for output
  // projections), zero biases, unit norms. Deterministic under torch::manual_seed.
  void reset_parameters();

 private:
  struct Parts;
  ModernBertConfig cfg_;
  std::shared_ptr<Parts> p_;
};
TORCH_MODULE(ModernBertForMaskedLM);

// Hugging Face's ModernBertForSequenceClassification: the encoder, pooling
// ([CLS] or the mean over real tokens), the prediction head, dropout and a
// linear classifier (model.*, head.*, classifier.*).
class ModernBertForClassificationImpl : public ClassificationModel {
 public:
  ModernBertForClassificationImpl(const ModernBertConfig& cfg, int64_t classes);
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& segment_ids,
                        const torch::Tensor& input_mask) override;
  int64_t max_positions() const override { return cfg_.max_positions; }
  const ModernBertConfig& config() const { return cfg_; }

 private:
  struct Parts;
  ModernBertConfig cfg_;
  std::shared_ptr<Parts> p_;
};
TORCH_MODULE(ModernBertForClassification);

}  // namespace cohort
