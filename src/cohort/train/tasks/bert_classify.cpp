// The bert-classify task: fine-tuning BERT for sequence classification
// (single sentences or pairs) on TSV or JSONL (data/text_classify.hpp),
// usually from a pretrained checkpoint or a Hugging Face BERT through
// model.init. The loss is the mean cross-entropy over the global batch.
// Metrics come from a confusion matrix of sums, all-reduced like every
// tally, so they are identical at any world size: loss, accuracy, macro-F1
// (over the classes that occur or are predicted, as scikit-learn's) and
// per-class F1 ("f1/<label>": metrics.jsonl and TensorBoard only).
#include <torch/nn/functional.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <mutex>

#include "cohort/ckpt/export.hpp"
#include "cohort/config/config.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/files.hpp"
#include "cohort/core/format.hpp"
#include "cohort/data/text_classify.hpp"
#include "cohort/distributed/world.hpp"
#include "cohort/model/bert.hpp"
#include "cohort/model/modernbert.hpp"
#include "cohort/text/bpe.hpp"
#include "cohort/text/hf_tokenizer.hpp"
#include "cohort/text/wordpiece.hpp"
#include "cohort/train/tasks/registry.hpp"

namespace cohort {

namespace {

namespace fs = std::filesystem;
namespace F = torch::nn::functional;

// bert-classify's own config keys (Config::task), declared when the task is
// part of the program.
std::string names_a_column(const TaskValue& v) { return std::get<std::string>(v).empty() ? "must name a column" : ""; }

const bool bert_classify_keys_declared = [] {
  declare_task_keys(keys_of_task("bert-classify", {
      {"data.text-column", std::string("text"), "bert-classify: the column (TSV header) or field (JSONL) of the text",
       KeyScope::kFixed, names_a_column},
      {"data.text-pair-column", std::string(), "bert-classify: the second text of sentence pairs; '' = single sentences"},
      {"data.label-column", std::string("label"), "bert-classify: the label column; labels are strings",
       KeyScope::kFixed, names_a_column},
      {"data.id-column", std::string(), "bert-classify predict: a column written beside each prediction "
                                        "instead of the text; '' = the text", KeyScope::kShared},
      {"data.max-seq-length", int64_t{128},
       "bert-classify: tokens per input with [CLS] and [SEP]s; the longer text is cut first", KeyScope::kFixed,
       [](const TaskValue& v) { return std::get<int64_t>(v) >= 4 ? "" : "must be >= 4"; }},
  }));
  return true;
}();

// data.vocab (a vocab.txt, or a byte-level BPE's tokenizer.json), else
// DIR/vocab.txt, else the one beside model.init (a Hugging Face directory,
// an export) or kept in its run (tokenizer/): at each place vocab.txt first,
// then tokenizer.json.
std::string find_vocab(const Config& cfg) {
  if (!cfg.data.vocab.empty()) return cfg.data.vocab;
  std::vector<fs::path> tried = {fs::path(cfg.data.path) / "vocab.txt"};
  if (!cfg.model.init.empty()) {
    fs::path init(cfg.model.init);
    std::vector<fs::path> dirs = {fs::is_directory(init) ? init : init.parent_path(),
                                  init / "tokenizer"};  // a Cohort run keeps the one it trained with
    if (init.parent_path().filename() == "checkpoints")  // one of its checkpoints
      dirs.push_back(init.parent_path().parent_path() / "tokenizer");
    dirs.push_back(init / "export");
    for (const auto& dir : dirs) {
      tried.push_back(dir / "vocab.txt");
      tried.push_back(dir / "tokenizer.json");
    }
  }
  std::string list;
  for (const auto& p : tried) {
    if (fs::exists(p)) return p.string();
    list += (list.empty() ? "" : ", ") + p.string();
  }
  throw ConfigError(detail::cat("bert-classify needs the model's vocab.txt or tokenizer.json: set data.vocab "
                                "(looked for ", list, ")"));
}

bool is_tokenizer_json(const std::string& path) { return fs::path(path).extension() == ".json"; }

std::string cell_name(int64_t truth, int64_t predicted) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "confusion/%04lld/%04lld", static_cast<long long>(truth),
                static_cast<long long>(predicted));
  return buf;
}

class BertClassifyTask : public Task {
 public:
  BertClassifyTask(const Config& cfg, const World& world)
      : dir_(cfg.data.path), vocab_path_(find_vocab(cfg)), lowercase_(cfg.data.lowercase), device_(world.device) {
    int64_t vocab_size = 0;
    if (is_tokenizer_json(vocab_path_)) {  // byte-level BPE, as ModernBERT's
      bpe_ = std::make_unique<text::ByteLevelBpe>(text::ByteLevelBpe::load(vocab_path_));
      COHORT_CHECK(bpe_->find("[CLS]") >= 0 && bpe_->find("[SEP]") >= 0, DataError, vocab_path_,
                   " has no [CLS] or [SEP] token, which the rows begin and end with");
      tokenizer_ = {[bpe = bpe_.get()](const std::string& t) { return bpe->encode(t, /*add_special_tokens=*/false); },
                    bpe_->find("[CLS]"), bpe_->find("[SEP]")};
      vocab_size = bpe_->size();
    } else {
      wordpiece_ = std::make_unique<text::WordPiece>(text::Vocab::load(vocab_path_), text::TokenizerOptions{lowercase_});
      tokenizer_ = {[wp = wordpiece_.get()](const std::string& t) { return wp->encode(t); },
                    wordpiece_->vocab().require("[CLS]"), wordpiece_->vocab().require("[SEP]")};
      vocab_size = wordpiece_->vocab().size();
    }
    opts_.columns = {cfg.task_key<std::string>("data.text-column"), cfg.task_key<std::string>("data.text-pair-column"),
                     cfg.task_key<std::string>("data.label-column"), ""};
    id_column_ = cfg.task_key<std::string>("data.id-column");
    opts_.max_seq_length = cfg.task_key<int64_t>("data.max-seq-length");
    if (!cfg.data.labels.empty()) {
      labels_ = LabelSet::from_json(read_file(cfg.data.labels), cfg.data.labels);  // the train split loads when needed
    } else {
      train_ = std::make_shared<TextClassification>(classify_file(dir_, "train"), tokenizer_, opts_);
      labels_ = train_->labels();
    }
    COHORT_CHECK(labels_.size() >= 2, DataError, cfg.data.labels, ": fewer than two labels");
    int64_t model_vocab = 0;
    if (cfg.model.name == "modernbert") {
      ModernBertConfig mc = modernbert_config(cfg.model, vocab_size);
      mc.checkpoint_layers = cfg.train.activation_checkpointing;
      mc.cls_id = tokenizer_.cls;  // the ids config.json names: the tokenizer's
      mc.sep_id = tokenizer_.sep;
      if (const int32_t pad = bpe_ ? bpe_->find("[PAD]") : wordpiece_->vocab().find("[PAD]"); pad >= 0) mc.pad_id = pad;
      model_vocab = mc.vocab_size;
      auto hf = mc.to_hf("ModernBertForSequenceClassification");
      hf_config_ = hf.dump(2) + "\n";
      model_ = ModernBertForClassification(mc, labels().size()).ptr();
    } else {
      BertConfig bc = BertConfig::from(cfg.model, vocab_size);
      model_vocab = bc.vocab_size;
      model_ = BertForClassification(bc, labels().size()).ptr();
    }
    COHORT_CHECK(model_vocab >= vocab_size, ConfigError, "model.vocab-size ", model_vocab,
                 " is smaller than the vocabulary's ", vocab_size, " tokens (", vocab_path_, ")");
    COHORT_CHECK(opts_.max_seq_length <= model_->max_positions(), ConfigError, "data.max-seq-length ",
                 opts_.max_seq_length, " exceeds model.max-positions ", model_->max_positions());
    max_positions_ = model_->max_positions();
    model_->to(device_);
  }

  std::shared_ptr<torch::nn::Module> module() override { return model_; }
  const Dataset& train_set() const override {
    std::call_once(train_once_, [&] {
      if (!train_) train_ = std::make_shared<TextClassification>(classify_file(dir_, "train"), tokenizer_, opts_, labels_);
    });
    return *train_;
  }
  std::string unit_name() const override { return "samples"; }
  bool units_are_samples() const override { return true; }
  bool init_partially() const override { return true; }

  // Every confusion cell's name, in order: one block of the tally.
  std::shared_ptr<const std::vector<std::string>> cell_names() {
    if (!cells_) {
      auto names = std::make_shared<std::vector<std::string>>();
      for (int64_t t = 0; t < labels().size(); ++t)
        for (int64_t p = 0; p < labels().size(); ++p) names->push_back(cell_name(t, p));
      cells_ = std::move(names);
    }
    return cells_;
  }

  std::vector<std::string> metric_names() const override {
    std::vector<std::string> names = {"accuracy", "loss"};
    for (int64_t t = 0; t < labels().size(); ++t)
      for (int64_t p = 0; p < labels().size(); ++p) names.push_back(cell_name(t, p));
    return names;
  }

  std::shared_ptr<const Dataset> eval_set(const std::string& split) const override {
    if (split == "train") {
      train_set();
      return train_;
    }
    return std::make_shared<TextClassification>(classify_file(dir_, split), tokenizer_, opts_, labels());
  }

  std::shared_ptr<const Dataset> input_set(const std::string& path) const override {
    TextClassifyOptions o = opts_;
    o.require_labels = false;
    o.keep_inputs = true;
    o.columns.id = id_column_;
    return std::make_shared<TextClassification>(path, tokenizer_, o, labels());
  }
  std::vector<std::pair<std::string, std::string>> input_fields(const Dataset& inputs, int64_t index) const override {
    const auto* rows = dynamic_cast<const TextClassification*>(&inputs);
    return rows ? rows->inputs(index) : std::vector<std::pair<std::string, std::string>>{};
  }
  std::vector<std::string> class_names() const override { return labels().names(); }
  std::vector<std::pair<std::string, std::string>> run_files() const override {
    // The tokenizer the run trains with, for `cohort export`.
    std::vector<std::pair<std::string, std::string>> files = {{"labels.json", labels().to_json()}};
    if (!hf_config_.empty()) files.emplace_back(kHfConfigFile, hf_config_);  // ModernBERT's architecture
    for (auto& [name, text] : bpe_ ? text::hf_bpe_tokenizer_files(read_file(vocab_path_), max_positions_)
                                   : text::hf_tokenizer_files(read_file(vocab_path_), lowercase_, max_positions_))
      files.emplace_back((fs::path(text::kTokenizerDir) / name).string(), std::move(text));
    return files;
  }

  Units count_units(const Example& b) const override {
    int64_t n = b.at("label").size(0);
    return {{n}, n};
  }

  torch::Tensor logits(const Example& b) {
    return model_->forward(b.at("input_ids"), b.at("segment_ids"), b.at("input_mask")).to(torch::kFloat32);
  }

  torch::Tensor probabilities(const Example& b) override { return torch::softmax(logits(b), 1); }

  TaskOutput forward(const Example& b) override {
    const auto& label = b.at("label");
    auto z = logits(b);
    TaskOutput out;
    auto loss = F::cross_entropy(z, label, F::CrossEntropyFuncOptions().reduction(torch::kSum));
    out.loss_sums = {loss};
    const double n = static_cast<double>(label.size(0));
    auto predicted = z.argmax(1);
    out.tally.add("loss", loss, n);
    out.tally.add("accuracy", predicted.eq(label).sum(), n);
    const int64_t k = labels().size();
    // The cells stay on the device, one block (their names sort together);
    // a scatter, not bincount, which reads the bounds back to size its output.
    auto at = label * k + predicted;
    auto cells = torch::zeros({k * k}, at.options()).scatter_add_(0, at, torch::ones_like(at));
    out.tally.add(cell_names(), cells, cells);
    return out;
  }

  std::vector<std::pair<std::string, double>> report(const Tally& tally) const override {
    std::vector<std::pair<std::string, double>> out = {{"loss", mean_or_zero(tally, "loss")}, {"accuracy", mean_or_zero(tally, "accuracy")}};
    auto f1 = per_class_f1(tally);
    double sum = 0;
    int used = 0;
    for (const auto& [name, value] : f1) {
      if (value >= 0) sum += value, ++used;
    }
    out.emplace_back("macro_f1", used ? sum / used : 0.0);
    for (const auto& [name, value] : f1) out.emplace_back("f1/" + name, std::max(0.0, value));
    return out;
  }

  std::vector<std::vector<double>> confusion(const Tally& tally) const override {
    const int64_t k = labels().size();
    std::vector<std::vector<double>> m(static_cast<size_t>(k), std::vector<double>(static_cast<size_t>(k)));
    for (int64_t t = 0; t < k; ++t)
      for (int64_t p = 0; p < k; ++p)
        if (tally.has(cell_name(t, p))) m[static_cast<size_t>(t)][static_cast<size_t>(p)] = tally.sum(cell_name(t, p));
    return m;
  }

  EvalDetails eval_details(const Tally& tally) const override {
    auto f1 = per_class_f1(tally);
    return {f1_summary(tally, f1), confusion_table(tally, f1)};
  }

 private:
  const LabelSet& labels() const { return labels_; }

  // One line: every class's F1 when they are few, else the three best, the
  // three worst and how many classes were never predicted.
  std::string f1_summary(const Tally& tally, const std::vector<std::pair<std::string, double>>& f1) const {
    const int64_t k = labels().size();
    std::vector<std::pair<double, std::string>> present;  // F1, name; classes neither present nor predicted left out
    for (const auto& [name, value] : f1) {
      if (value >= 0) present.emplace_back(value, name);
    }
    std::stable_sort(present.begin(), present.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    auto list = [](auto first, auto last) {
      std::string out;
      for (auto it = first; it != last; ++it) out += strf("%s%s %.3f", out.empty() ? "" : ", ", it->second.c_str(), it->first);
      return out;
    };
    std::string out = strf("per-class F1 (%zu of %lld classes in the split or predicted): ", present.size(),
                           static_cast<long long>(k));
    if (present.size() <= 6) return out + list(present.begin(), present.end());
    out += "best " + list(present.begin(), present.begin() + 3) + "; worst " + list(present.end() - 3, present.end());
    int64_t never = 0;
    for (int64_t p = 0; p < k; ++p) {
      double predicted = 0;
      for (int64_t t = 0; t < k; ++t) predicted += tally.has(cell_name(t, p)) ? tally.sum(cell_name(t, p)) : 0.0;
      never += predicted == 0;
    }
    return out + strf("; %lld class(es) never predicted", static_cast<long long>(never));
  }

  std::string confusion_table(const Tally& tally, const std::vector<std::pair<std::string, double>>& f1) const {
    const int64_t k = labels().size();
    size_t width = 5;
    for (const auto& name : labels().names()) width = std::max(width, name.size());
    std::string out = "confusion matrix (rows: true label, columns: predicted, in this order):\n";
    char buf[64];
    for (int64_t t = 0; t < k; ++t) {
      std::snprintf(buf, sizeof buf, "  %2lld %-*s", static_cast<long long>(t), static_cast<int>(width),
                    labels().name(t).c_str());
      out += buf;
      double support = 0;
      for (int64_t p = 0; p < k; ++p) {
        double v = tally.sum(cell_name(t, p));
        support += v;
        std::snprintf(buf, sizeof buf, " %5.0f", v);
        out += buf;
      }
      std::snprintf(buf, sizeof buf, "   f1 %.4f  n %.0f\n", std::max(0.0, f1[static_cast<size_t>(t)].second), support);
      out += buf;
    }
    return out;
  }

  // Per class: F1 from the confusion sums; -1 for a class neither present
  // nor predicted (left out of the macro mean).
  std::vector<std::pair<std::string, double>> per_class_f1(const Tally& tally) const {
    const int64_t k = labels().size();
    std::vector<double> tp(static_cast<size_t>(k)), row(static_cast<size_t>(k)), col(static_cast<size_t>(k));
    for (int64_t t = 0; t < k; ++t) {
      for (int64_t p = 0; p < k; ++p) {
        double v = tally.has(cell_name(t, p)) ? tally.sum(cell_name(t, p)) : 0.0;
        row[static_cast<size_t>(t)] += v;
        col[static_cast<size_t>(p)] += v;
        if (t == p) tp[static_cast<size_t>(t)] = v;
      }
    }
    std::vector<std::pair<std::string, double>> out;
    for (int64_t c = 0; c < k; ++c) {
      auto i = static_cast<size_t>(c);
      double denom = row[i] + col[i];  // 2tp + fp + fn
      out.emplace_back(labels().name(c), denom > 0 ? 2 * tp[i] / denom : -1.0);
    }
    return out;
  }

  std::string dir_;
  std::string vocab_path_;
  std::string id_column_;  // data.id-column
  bool lowercase_ = true;
  int64_t max_positions_ = 512;
  c10::Device device_;
  std::unique_ptr<text::WordPiece> wordpiece_;  // one of these two
  std::unique_ptr<text::ByteLevelBpe> bpe_;
  TextTokenizer tokenizer_;
  std::string hf_config_;  // model.name modernbert: Hugging Face's config.json, kept in the run for export
  TextClassifyOptions opts_;
  LabelSet labels_;
  mutable std::once_flag train_once_;
  std::shared_ptr<const std::vector<std::string>> cells_;  // cell_names()
  mutable std::shared_ptr<TextClassification> train_;  // loaded at once, or on first use after data.labels
  std::shared_ptr<ClassificationModel> model_;
};

}  // namespace

std::unique_ptr<Task> make_bert_classify_task(const Config& cfg, const World& world) {
  return std::make_unique<BertClassifyTask>(cfg, world);
}

}  // namespace cohort
