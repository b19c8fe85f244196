// The bert-pretrain task: BERT's masked LM and next sentence prediction over
// NVIDIA-layout HDF5 shards (data/bert_shards.hpp). The loss is HetSeq's and
// NVIDIA's: mean MLM cross-entropy over masked tokens plus mean NSP
// cross-entropy over sentence pairs, each a mean over the global batch.
// Metrics: loss, mlm_loss, mlm_accuracy, nsp_loss, nsp_accuracy.
#include <torch/nn/functional.h>

#include <filesystem>
#include <fstream>

#include "cohort/config/config.hpp"
#include "cohort/core/error.hpp"
#include "cohort/data/bert_shards.hpp"
#include "cohort/data/manifest.hpp"
#include "cohort/distributed/world.hpp"
#include "cohort/core/files.hpp"
#include "cohort/model/bert.hpp"
#include "cohort/text/hf_tokenizer.hpp"
#include "cohort/train/tasks/registry.hpp"

namespace cohort {

namespace {

namespace F = torch::nn::functional;

class BertPretrainTask : public Task {
 public:
  BertPretrainTask(const Config& cfg, const World& world)
      : dir_(cfg.data.path), shard_opts_(options(cfg)),
        train_(std::make_shared<BertShards>(cfg.data.path, "train", shard_opts_)), device_(world.device) {
    int64_t data_vocab = data_vocab_size(dir_);
    BertConfig bc = BertConfig::from(cfg.model, data_vocab);
    check_against_data(bc, data_vocab);
    max_positions_ = bc.max_positions;
    // The data's vocabulary and case, kept in the run for `cohort export`;
    // shards made elsewhere (NVIDIA's) may come without one.
    if (!cfg.data.vocab.empty()) {
      vocab_path_ = cfg.data.vocab;
    } else if (auto beside = std::filesystem::path(dir_) / "vocab.txt"; std::filesystem::exists(beside)) {
      vocab_path_ = beside.string();
    }
    auto manifest = read_manifest(dir_);
    lowercase_ = manifest && manifest->lowercase ? *manifest->lowercase : cfg.data.lowercase;
    model_ = BertForPretraining(bc);
    model_->to(device_);
  }

  std::shared_ptr<torch::nn::Module> module() override { return model_.ptr(); }
  const Dataset& train_set() const override { return *train_; }
  std::string unit_name() const override { return "tokens"; }
  size_t loss_terms() const override { return 2; }
  std::string count_metric() const override { return "nsp_loss"; }
  std::vector<std::string> metric_names() const override {
    return {"mlm_accuracy", "mlm_loss", "nsp_accuracy", "nsp_loss"};
  }

  std::vector<std::pair<std::string, std::string>> run_files() const override {
    std::vector<std::pair<std::string, std::string>> files;
    if (vocab_path_.empty()) return files;
    for (auto& [name, text] : text::hf_tokenizer_files(read_file(vocab_path_), lowercase_, max_positions_))
      files.emplace_back((std::filesystem::path(text::kTokenizerDir) / name).string(), std::move(text));
    return files;
  }

  std::shared_ptr<const Dataset> eval_set(const std::string& split) const override {
    if (split == "train") return train_;
    auto data = std::make_shared<BertShards>(dir_, split, shard_opts_);
    COHORT_CHECK(data->info().seq_len == train_->info().seq_len, DataError, "split '", split, "' under ", dir_,
                 " has sequence length ", data->info().seq_len, " but the train split has ",
                 train_->info().seq_len);
    return data;
  }

  Units count_units(const Example& b) const override {
    return {{b.at("masked_lm_ids").ge(0).sum().item<int64_t>(), b.at("next_sentence_labels").size(0)},
            b.at("input_mask").sum().item<int64_t>()};
  }

  TaskOutput forward(const Example& b) override {
    const auto& ids = b.at("input_ids");
    int64_t vocab = model_->config().vocab_size;
    COHORT_CHECK(ids.numel() == 0 || ids.max().item<int64_t>() < vocab, DataError, "a batch of ", dir_,
                 " has token id ", ids.max().item<int64_t>(), " but the model's vocabulary is ", vocab,
                 " (model.vocab-size)");
    BertOutputs out = model_->forward(BertBatch::from(b));
    const auto& nsp_labels = b.at("next_sentence_labels");
    auto sum = F::CrossEntropyFuncOptions().reduction(torch::kSum);
    auto mlm_logits = out.mlm_logits.to(torch::kFloat32);
    auto nsp_logits = out.nsp_logits.to(torch::kFloat32);
    auto mlm = F::cross_entropy(mlm_logits, out.mlm_labels, sum);
    auto nsp = F::cross_entropy(nsp_logits, nsp_labels, sum);
    TaskOutput r;
    r.loss_sums = {mlm, nsp};
    double m = static_cast<double>(out.mlm_labels.size(0)), n = static_cast<double>(nsp_labels.size(0));
    r.tally.add("mlm_loss", mlm.detach().item<double>(), m);
    r.tally.add("mlm_accuracy", mlm_logits.argmax(1).eq(out.mlm_labels).sum().item<double>(), m);
    r.tally.add("nsp_loss", nsp.detach().item<double>(), n);
    r.tally.add("nsp_accuracy", nsp_logits.argmax(1).eq(nsp_labels).sum().item<double>(), n);
    return r;
  }

  std::vector<std::pair<std::string, double>> report(const Tally& t) const override {
    double mlm = mean_or_zero(t, "mlm_loss"), nsp = mean_or_zero(t, "nsp_loss");
    return {{"loss", mlm + nsp},
            {"mlm_loss", mlm},
            {"mlm_accuracy", mean_or_zero(t, "mlm_accuracy")},
            {"nsp_loss", nsp},
            {"nsp_accuracy", mean_or_zero(t, "nsp_accuracy")}};
  }

 private:
  static BertShardsOptions options(const Config& cfg) {
    BertShardsOptions o;
    o.pack = cfg.data.pack;
    return o;
  }

  // A config that cannot fit its data fails here, before any step.
  void check_against_data(const BertConfig& bc, int64_t data_vocab) const {
    const auto& info = train_->info();
    COHORT_CHECK(info.seq_len <= bc.max_positions, ConfigError, "model.max-positions is ", bc.max_positions,
                 " but the shards under ", dir_, " hold sequences of length ", info.seq_len);
    COHORT_CHECK(data_vocab <= 0 || data_vocab <= bc.vocab_size, ConfigError, "model.vocab-size is ",
                 bc.vocab_size, " but the data under ", dir_, " was made with a vocabulary of ", data_vocab);
    // Shards without a manifest: look at the first rows' ids.
    std::vector<int64_t> first;
    for (int64_t i = 0; i < std::min<int64_t>(train_->size(), 256); ++i) first.push_back(i);
    if (first.empty()) return;
    int64_t max_id = train_->get_batch(first).at("input_ids").max().item<int64_t>();
    COHORT_CHECK(max_id < bc.vocab_size, ConfigError, "model.vocab-size is ", bc.vocab_size,
                 " but the shards under ", dir_, " hold token id ", max_id);
  }

  std::string dir_;
  std::string vocab_path_;  // "": none known
  bool lowercase_ = true;
  int64_t max_positions_ = 512;
  BertShardsOptions shard_opts_;
  std::shared_ptr<BertShards> train_;
  c10::Device device_;
  BertForPretraining model_{nullptr};
};

}  // namespace

std::unique_ptr<Task> make_bert_pretrain_task(const Config& cfg, const World& world) {
  COHORT_CHECK(cfg.model.name == "bert", ConfigError, "train.task bert-pretrain needs model.name bert (got '",
               cfg.model.name, "')");
  return std::make_unique<BertPretrainTask>(cfg, world);
}

}  // namespace cohort
