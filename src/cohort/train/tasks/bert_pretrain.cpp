// The bert-pretrain task: BERT's masked LM and next sentence prediction over
// NVIDIA-layout HDF5 shards (data/bert_shards.hpp). The loss is HetSeq's and
// NVIDIA's: mean MLM cross-entropy over masked tokens plus mean NSP
// cross-entropy over sentence pairs, each a mean over the global batch.
// Metrics: loss, mlm_loss, mlm_accuracy, nsp_loss, nsp_accuracy.
//
// Its keys choose the recipe: task.masking static (the shards' masks, as
// NVIDIA's 2019 recipe) or dynamic (drawn per sample and epoch,
// data/masking.hpp) with task.mask-prob, task.mask-replace,
// task.max-predictions and task.whole-word; task.nsp false drops the NSP
// head (a BertForMaskedLM) and its loss.
#include <torch/nn/functional.h>

#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cohort/ckpt/export.hpp"
#include "cohort/config/config.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/files.hpp"
#include "cohort/data/bert_shards.hpp"
#include "cohort/data/manifest.hpp"
#include "cohort/data/masking.hpp"
#include "cohort/distributed/world.hpp"
#include "cohort/model/bert.hpp"
#include "cohort/model/cross_entropy.hpp"
#include "cohort/model/modernbert.hpp"
#include "cohort/text/hf_tokenizer.hpp"
#include "cohort/text/wordpiece.hpp"
#include "cohort/train/tasks/registry.hpp"

namespace cohort {

namespace {

namespace F = torch::nn::functional;

const char* const kMaskingKey = "task.masking";

// task.mask-replace: three proportions ([MASK], random, unchanged) summing to 1.
std::vector<double> mask_replace(const std::string& text) {
  std::vector<double> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    size_t used = 0;
    double v = -1;
    try {
      v = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    while (used < item.size() && std::isspace(static_cast<unsigned char>(item[used]))) ++used;
    if (used == 0 || used != item.size() || !(v >= 0 && v <= 1)) return {};
    out.push_back(v);
  }
  if (out.size() != 3 || std::abs(out[0] + out[1] + out[2] - 1) > 1e-6) return {};
  return out;
}

const bool bert_pretrain_keys_declared = [] {
  declare_task_keys(keys_of_task("bert-pretrain", {
      {kMaskingKey, std::string("static"),
       "bert-pretrain: static = the masks cohort prepare drew; dynamic = drawn afresh per sample and epoch from "
       "(train.seed, epoch, sample id), the same on any world size",
       KeyScope::kFixed,
       [](const TaskValue& v) {
         const auto& m = std::get<std::string>(v);
         return m == "static" || m == "dynamic" ? "" : "must be static or dynamic";
       }},
      {"task.mask-prob", 0.15, "bert-pretrain, dynamic masking: the chance that a token (a word, with task.whole-word) "
                               "is a target",
       KeyScope::kFixed,
       [](const TaskValue& v) {
         double p = std::get<double>(v);
         return p > 0 && p <= 1 ? "" : "must be in (0, 1]";
       }},
      {"task.mask-replace", std::string("0.8,0.1,0.1"),
       "bert-pretrain, dynamic masking: the targets that become [MASK], a random token, or stay unchanged",
       KeyScope::kFixed,
       [](const TaskValue& v) {
         return mask_replace(std::get<std::string>(v)).empty() ? "must be three proportions >= 0 summing to 1, "
                                                                 "e.g. 0.8,0.1,0.1"
                                                               : "";
       }},
      {"task.max-predictions", int64_t{0}, "bert-pretrain, dynamic masking: targets per sequence, at most; 0 = no cap",
       KeyScope::kFixed, [](const TaskValue& v) { return std::get<int64_t>(v) >= 0 ? "" : "must be >= 0 (0: no cap)"; }},
      {"task.whole-word", false,
       "bert-pretrain, dynamic masking: mask every piece of a word (WordPiece's ## continuations) together"},
      {"task.nsp", true,
       "bert-pretrain: next sentence prediction; false = masked LM only (a BertForMaskedLM, RoBERTa's recipe)"},
  }));
  return true;
}();

// The data's vocabulary: data.vocab, else DIR/vocab.txt; "" when none
// (shards made elsewhere, as NVIDIA's, may come without one).
std::string data_vocab_path(const Config& cfg) {
  if (!cfg.data.vocab.empty()) return cfg.data.vocab;
  auto beside = std::filesystem::path(cfg.data.path) / "vocab.txt";
  return std::filesystem::exists(beside) ? beside.string() : std::string();
}

class BertPretrainTask : public Task {
 public:
  BertPretrainTask(const Config& cfg, const World& world)
      : dir_(cfg.data.path), vocab_path_(data_vocab_path(cfg)), nsp_(cfg.task_key<bool>("task.nsp")),
        shard_opts_(options(cfg, vocab_path_)),
        train_(std::make_shared<BertShards>(cfg.data.path, "train", shard_opts_)), device_(world.device) {
    int64_t data_vocab = data_vocab_size(dir_);
    if (cfg.model.name == "modernbert") {
      COHORT_CHECK(!nsp_, ConfigError, "model.name modernbert has no next-sentence head: set task.nsp false "
                   "(ModernBERT's recipe is masked LM only, on full-sentence rows: cohort prepare --nsp false)");
      ModernBertConfig mc = modernbert_config(cfg.model, data_vocab);
      mc.checkpoint_layers = cfg.train.activation_checkpointing;
      if (!vocab_path_.empty()) {  // the special tokens config.json names, from the shards' vocabulary
        auto vocab = text::Vocab::load(vocab_path_);
        for (auto [token, id] : {std::pair<const char*, int64_t*>{"[PAD]", &mc.pad_id}, {"[CLS]", &mc.cls_id},
                                 {"[SEP]", &mc.sep_id}, {"[MASK]", &mc.mask_id}})
          if (vocab.find(token) >= 0) *id = vocab.find(token);
      }
      hf_config_ = mc.to_hf("ModernBertForMaskedLM").dump(2) + "\n";
      model_ = ModernBertForMaskedLM(mc).ptr();
    } else {
      BertConfig bc = BertConfig::from(cfg.model, data_vocab);
      bc.next_sentence = nsp_;
      model_ = BertForPretraining(bc).ptr();
    }
    check_against_data(data_vocab);
    // The data's case, kept with its vocabulary in the run for `cohort export`.
    auto manifest = read_manifest(dir_);
    lowercase_ = manifest && manifest->lowercase ? *manifest->lowercase : cfg.data.lowercase;
    bpe_data_ = manifest && manifest->tokenizer == "bpe";
    model_->to(device_);
  }

  std::shared_ptr<torch::nn::Module> module() override { return model_; }
  const Dataset& train_set() const override { return *train_; }
  std::string unit_name() const override { return "tokens"; }
  size_t loss_terms() const override { return nsp_ ? 2 : 1; }
  bool units_may_be_zero() const override { return shard_opts_.masking != nullptr; }
  // task.nsp switches between BertForPreTraining's heads and BertForMaskedLM's:
  // model.init may cross it.
  // A ModernBERT file may hold the decoder's weight, tied to the embeddings.
  bool init_may_skip(const std::string& name) const override {
    return name.rfind("bert.pooler.", 0) == 0 || name.rfind("cls.seq_relationship.", 0) == 0 ||
           name == "decoder.weight";
  }
  std::string count_metric() const override { return nsp_ ? "nsp_loss" : "sequences"; }
  std::vector<std::string> metric_names() const override {
    if (!nsp_) return {"mlm_accuracy", "mlm_loss", "sequences"};
    return {"mlm_accuracy", "mlm_loss", "nsp_accuracy", "nsp_loss"};
  }

  std::vector<std::pair<std::string, std::string>> run_files() const override {
    std::vector<std::pair<std::string, std::string>> files;
    if (!hf_config_.empty()) files.emplace_back(kHfConfigFile, hf_config_);  // ModernBERT's architecture
    if (vocab_path_.empty()) return files;
    // Byte-level BPE data (cohort prepare --tokenizer bpe): its tokenizer.json.
    const auto bpe = std::filesystem::path(dir_) / "tokenizer.json";
    COHORT_CHECK(!bpe_data_ || std::filesystem::exists(bpe), DataError, "the shards under ", dir_,
                 " are byte-level BPE's but ", bpe.string(), " is missing: copy the tokenizer.json they were made with");
    const bool byte_level = bpe_data_;
    for (auto& [name, text] : byte_level ? text::hf_bpe_tokenizer_files(read_file(bpe.string()), model_->max_positions())
                                         : text::hf_tokenizer_files(read_file(vocab_path_), lowercase_,
                                                                    model_->max_positions()))
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
    std::vector<int64_t> terms = {b.at("masked_lm_ids").ge(0).sum().item<int64_t>()};
    if (nsp_) terms.push_back(b.at("next_sentence_labels").size(0));
    return {terms, b.at("input_mask").sum().item<int64_t>()};
  }

  // The checks that read the batch, and where its real masked tokens are,
  // while it is on the host.
  void add_host_inputs(Example& b) const override {
    const auto& ids = b.at("input_ids");
    const int64_t vocab = model_->vocab_size();
    const int64_t top = ids.numel() == 0 ? 0 : ids.max().item<int64_t>();
    COHORT_CHECK(top < vocab, DataError, "a batch of ", dir_, " has token id ", top,
                 " but the model's vocabulary is ", vocab, " (model.vocab-size)");
    auto keep = b.at("masked_lm_ids").reshape({-1}).ge(0).nonzero().squeeze(1);
    const bool packed = b.count("seq_ids") > 0;
    const auto& positions = b.at("masked_lm_positions");
    if (keep.numel() > 0) {  // a position outside its row would read another row's token
      const int64_t limit = packed ? ids.numel() : ids.size(1);
      const int64_t last = positions.reshape({-1}).index_select(0, keep).max().item<int64_t>();
      COHORT_CHECK(last < limit, DataError, "a batch of ", dir_, " has a masked position outside its row: ", last,
                   " of ", limit);
    }
    b["masked_lm_index"] = keep;
  }

  TaskOutput forward(const Example& b) override {
    if (!b.count("masked_lm_index")) {  // a caller that skipped add_host_inputs: it reads the batch here
      Example with = b;
      add_host_inputs(with);
      return forward(with);
    }
    BertOutputs out = model_->forward(BertBatch::from(b));
    const auto& nsp_labels = b.at("next_sentence_labels");
    auto sum = F::CrossEntropyFuncOptions().reduction(torch::kSum);
    CrossEntropySum mlm = cross_entropy_sum(out.mlm_logits, out.mlm_labels);  // in fp32
    TaskOutput r;
    r.loss_sums = {mlm.loss};
    double m = static_cast<double>(out.mlm_labels.size(0)), n = static_cast<double>(nsp_labels.size(0));
    r.tally.add("mlm_loss", mlm.loss, m);
    r.tally.add("mlm_accuracy", mlm.hits, m);
    if (!nsp_) {
      r.tally.add("sequences", n, n);
      return r;
    }
    auto nsp_logits = out.nsp_logits.to(torch::kFloat32);
    auto nsp = F::cross_entropy(nsp_logits, nsp_labels, sum);
    r.loss_sums.push_back(nsp);
    r.tally.add("nsp_loss", nsp, n);
    r.tally.add("nsp_accuracy", nsp_logits.argmax(1).eq(nsp_labels).sum(), n);
    return r;
  }

  std::vector<std::pair<std::string, double>> report(const Tally& t) const override {
    double mlm = mean_or_zero(t, "mlm_loss");
    if (!nsp_) return {{"loss", mlm}, {"mlm_loss", mlm}, {"mlm_accuracy", mean_or_zero(t, "mlm_accuracy")}};
    double nsp = mean_or_zero(t, "nsp_loss");
    return {{"loss", mlm + nsp},
            {"mlm_loss", mlm},
            {"mlm_accuracy", mean_or_zero(t, "mlm_accuracy")},
            {"nsp_loss", nsp},
            {"nsp_accuracy", mean_or_zero(t, "nsp_accuracy")}};
  }

 private:
  // The shards' reading options; for dynamic masking, the masker. Config
  // errors that need no shards fail here.
  static BertShardsOptions options(const Config& cfg, const std::string& vocab_path) {
    BertShardsOptions o;
    o.pack = cfg.data.pack;
    const bool dynamic = cfg.task_key<std::string>(kMaskingKey) == "dynamic";
    MaskOptions m;
    m.prob = cfg.task_key<double>("task.mask-prob");
    std::vector<double> replace = mask_replace(cfg.task_key<std::string>("task.mask-replace"));
    COHORT_CHECK(!replace.empty(), ConfigError, "task.mask-replace must be three proportions >= 0 summing to 1 (got ",
                 cfg.task_key<std::string>("task.mask-replace"), ")");
    m.replace_mask = replace.at(0);
    m.replace_random = replace.at(1);
    m.max_predictions = cfg.task_key<int64_t>("task.max-predictions");
    m.whole_word = cfg.task_key<bool>("task.whole-word");
    m.seed = cfg.train.seed;
    if (!dynamic) {
      // The shards' masks are what they are: a dynamic-masking key would be ignored.
      const MaskOptions d;
      const char* set = m.prob != d.prob                                               ? "task.mask-prob"
                        : m.replace_mask != d.replace_mask || m.replace_random != d.replace_random ? "task.mask-replace"
                        : m.max_predictions != d.max_predictions                                  ? "task.max-predictions"
                        : m.whole_word                                                             ? "task.whole-word"
                                                                                                   : nullptr;
      COHORT_CHECK(set == nullptr, ConfigError, set, " applies to task.masking dynamic; with static masking the "
                   "shards' masks are used (cohort prepare --masked-lm-prob, --whole-word-mask)");
      return o;
    }
    if (auto manifest = read_manifest(cfg.data.path); manifest && manifest->tokenizer == "bpe")
      COHORT_CHECK(!m.whole_word, ConfigError, "task.whole-word finds words by WordPiece's ## continuations, and the "
                   "shards under ", cfg.data.path, " are byte-level BPE's: drop it");
    COHORT_CHECK(!vocab_path.empty(), ConfigError, "task.masking dynamic needs the vocabulary the shards were made "
                 "with ([MASK], [CLS], [SEP], ## pieces): set data.vocab (", cfg.data.path, " has no vocab.txt)");
    o.masking = std::make_shared<DynamicMasking>(MaskingVocab::from(text::Vocab::load(vocab_path)), m);
    return o;
  }

  // A config that cannot fit its data fails here, before any step.
  void check_against_data(int64_t data_vocab) const {
    const int64_t model_vocab = model_->vocab_size(), max_positions = model_->max_positions();
    const auto& info = train_->info();
    COHORT_CHECK(info.masked || shard_opts_.masking, ConfigError, "the shards under ", dir_,
                 " carry no masks (cohort prepare --masking none): set task.masking dynamic");
    COHORT_CHECK(info.next_sentence || !nsp_, ConfigError, "the shards under ", dir_,
                 " hold full-sentence rows, not sentence pairs (cohort prepare --nsp false): set task.nsp false");
    if (shard_opts_.masking) {
      // Masking reads the special ids and ## pieces from this file: it must be the shards'.
      const auto vocab = static_cast<int64_t>(shard_opts_.masking->vocab().continuation.size());
      COHORT_CHECK(data_vocab <= 0 ? vocab <= model_vocab : vocab == data_vocab, ConfigError, vocab_path_,
                   " holds ", vocab, " tokens but ",
                   data_vocab > 0 ? detail::cat("the shards under ", dir_, " were made with ", data_vocab)
                                  : detail::cat("the model's vocabulary is ", model_vocab),
                   ": is it the vocabulary the shards were made with? (data.vocab)");
    }
    COHORT_CHECK(info.seq_len <= max_positions, ConfigError, "model.max-positions is ", max_positions,
                 " but the shards under ", dir_, " hold sequences of length ", info.seq_len);
    COHORT_CHECK(data_vocab <= 0 || data_vocab <= model_vocab, ConfigError, "model.vocab-size is ",
                 model_vocab, " but the data under ", dir_, " was made with a vocabulary of ", data_vocab);
    // Shards without a manifest: look at the first rows' ids and targets.
    std::vector<int64_t> first;
    for (int64_t i = 0; i < std::min<int64_t>(train_->size(), 256); ++i) first.push_back(i);
    if (first.empty()) return;
    Example head = train_->get_batch(first);
    int64_t max_id = head.at("input_ids").max().item<int64_t>();
    COHORT_CHECK(max_id < model_vocab, ConfigError, "model.vocab-size is ", model_vocab,
                 " but the shards under ", dir_, " hold token id ", max_id);
    COHORT_CHECK(shard_opts_.masking || head.at("masked_lm_ids").ge(0).any().item<bool>(), ConfigError, "the first ",
                 first.size(), " rows of the shards under ", dir_,
                 " hold no masked-LM targets: for unmasked shards set task.masking dynamic");
  }

  std::string dir_;
  std::string vocab_path_;  // "": none known
  bool nsp_ = true;
  bool lowercase_ = true;
  bool bpe_data_ = false;  // cohort prepare --tokenizer bpe: tokenizer.json beside vocab.txt
  std::string hf_config_;  // model.name modernbert: Hugging Face's config.json, kept in the run for export
  BertShardsOptions shard_opts_;
  std::shared_ptr<BertShards> train_;
  c10::Device device_;
  std::shared_ptr<PretrainingModel> model_;
};

}  // namespace

std::unique_ptr<Task> make_bert_pretrain_task(const Config& cfg, const World& world) {
  COHORT_CHECK(cfg.model.name == "bert" || cfg.model.name == "modernbert", ConfigError,
               "train.task bert-pretrain needs model.name bert or modernbert (got '",
               cfg.model.name, "')");
  return std::make_unique<BertPretrainTask>(cfg, world);
}

}  // namespace cohort
