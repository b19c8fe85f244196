// defines: BertConfig, BertBatch, BertOutputs, PretrainingModel, ClassificationModel,
//          BertForPretraining, BertForClassification
//
// A BERT encoder with the pretraining heads (masked LM and next sentence).
// Parameters carry Hugging Face's names (bert.embeddings.word_embeddings.weight,
// bert.encoder.layer.0.attention.self.query.weight, cls.predictions.bias, ...)
// so a checkpoint's model.safetensors loads into BertForPreTraining. The MLM
// decoder is tied to the word embeddings and, unlike HetSeq, is applied only
// at the masked positions: [M,H] x [H,V] rather than [B*L,H] x [H,V].
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <utility>

#include "cohort/data/dataset.hpp"

namespace cohort {

struct ModelOptions;

struct BertConfig {
  int64_t vocab_size = 30522;
  int64_t hidden = 768;
  int64_t layers = 12;
  int64_t heads = 12;
  int64_t intermediate = 3072;
  int64_t max_positions = 512;
  int64_t type_vocab = 2;
  double hidden_dropout = 0.1;
  double attention_dropout = 0.1;
  double init_std = 0.02;
  double layer_norm_eps = 1e-12;
  // The NSP head (and the pooler it reads). Without it the model is Hugging
  // Face's BertForMaskedLM: bert.* without bert.pooler, and cls.predictions.
  bool next_sentence = true;

  // From model.* keys (next_sentence stays true: the task decides); a vocab
  // size of 0 there means `data_vocab_size`.
  // Throws ConfigError for inconsistent sizes (hidden not divisible by heads).
  static BertConfig from(const ModelOptions& opts, int64_t data_vocab_size);
};

struct BertBatch {
  torch::Tensor input_ids;        // int64 [B,L]
  torch::Tensor segment_ids;      // int64 [B,L]
  torch::Tensor input_mask;       // int64 [B,L], 1 for real tokens
  torch::Tensor masked_positions; // int64 [B,P]; packed: flat over the [R,L] rows
  torch::Tensor masked_ids;       // int64 [B,P], -1 where no prediction
  // data.pack (pack_bert_rows): B instances in R rows. Undefined: one
  // instance per row.
  torch::Tensor position_ids = {};  // int64 [R,L], restarting at every instance
  torch::Tensor seq_ids = {};       // int64 [R,L], the instance of each token; -1 on padding
  torch::Tensor cls_index = {};     // int64 [B], each instance's [CLS], flat over the rows
  // int64 [M]: where masked_ids >= 0, flat over [B*P], found on the host
  // (bert-pretrain's add_host_inputs) so that forward reads nothing back
  // from the device. Undefined: forward finds them, and waits for the device.
  torch::Tensor masked_index = {};
  bool packed() const { return seq_ids.defined(); }

  // A collated batch of BertShards (data/bert_shards.hpp): input_ids,
  // segment_ids, input_mask, masked_lm_positions, masked_lm_ids.
  static BertBatch from(const Example& batch);
};

struct BertOutputs {
  torch::Tensor mlm_logits;  // [M,V] at the M real masked positions (row-major over [B,P])
  torch::Tensor mlm_labels;  // int64 [M]
  torch::Tensor nsp_logits;  // [B,2]; undefined without the NSP head
};

// The final hidden states [M,H] at a batch's M real masked positions
// (row-major over [B,P]; packed positions are flat over the [R,L] rows),
// picked from `hidden` [R,L,H], and their labels [M].
std::pair<torch::Tensor, torch::Tensor> masked_states(const BertBatch& batch, const torch::Tensor& hidden);

// What bert-pretrain trains (model.name bert or modernbert): an encoder
// with a masked-LM head, and an NSP head where the model has one.
class PretrainingModel : public torch::nn::Module {
 public:
  virtual BertOutputs forward(const BertBatch& batch) = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t max_positions() const = 0;
};

// What bert-classify trains: logits [B, classes] of padded rows.
class ClassificationModel : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& segment_ids,
                                const torch::Tensor& input_mask) = 0;
  virtual int64_t max_positions() const = 0;
};

class BertForPretrainingImpl : public PretrainingModel {
 public:
  explicit BertForPretrainingImpl(const BertConfig& cfg);
  BertOutputs forward(const BertBatch& batch) override;
  int64_t vocab_size() const override { return cfg_.vocab_size; }
  int64_t max_positions() const override { return cfg_.max_positions; }
  // The encoder's last hidden states [B,L,H] (no heads). Packed rows give
  // position_ids and seq_ids (attention stays within an instance).
  torch::Tensor encode(const torch::Tensor& input_ids, const torch::Tensor& segment_ids,
                       const torch::Tensor& input_mask, const torch::Tensor& position_ids = {},
                       const torch::Tensor& seq_ids = {});
  const BertConfig& config() const { return cfg_; }
  // BERT's initialisation: normal(0, init_std) weights, zero biases, unit
  // LayerNorm scales. Deterministic under torch::manual_seed.
  void reset_parameters();

 private:
  struct Parts;
  BertConfig cfg_;
  std::shared_ptr<Parts> p_;
};
TORCH_MODULE(BertForPretraining);

// BERT for sequence classification, Hugging Face's
// BertForSequenceClassification: the encoder, the pooler ([CLS] -> dense ->
// tanh), dropout and a linear classifier. Names: bert.* as above,
// classifier.weight, classifier.bias; so a pretraining checkpoint's bert.*
// initialises it and its cls.* heads are left out.
class BertForClassificationImpl : public ClassificationModel {
 public:
  BertForClassificationImpl(const BertConfig& cfg, int64_t classes);
  // Logits [B, classes].
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& segment_ids,
                        const torch::Tensor& input_mask) override;
  int64_t max_positions() const override { return cfg_.max_positions; }
  const BertConfig& config() const { return cfg_; }

 private:
  struct Parts;
  BertConfig cfg_;
  std::shared_ptr<Parts> p_;
};
TORCH_MODULE(BertForClassification);

}  // namespace cohort
