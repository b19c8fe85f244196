#include "cohort/ckpt/export.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>

#include "cohort/ckpt/checkpoint.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/files.hpp"
#include "cohort/core/registry.hpp"
#include "cohort/data/manifest.hpp"
#include "cohort/data/text_classify.hpp"
#include "cohort/text/hf_tokenizer.hpp"

namespace cohort {

namespace fs = std::filesystem;

namespace {

const torch::Tensor& tensor(const ExportSource& s, const std::string& name) {
  auto it = s.weights.tensors.find(name);
  COHORT_CHECK(it != s.weights.tensors.end(), DataError, s.checkpoint_dir, "/model.safetensors has no '", name,
               "': is this a ", s.cfg.train.task, " checkpoint?");
  return it->second;
}

void write_text(const std::string& out_dir, const std::string& name, const std::string& text, ExportResult& result) {
  write_file_atomically((fs::path(out_dir) / name).string(), text);
  result.files.push_back(name);
}

void write_weights(const ExportSource& s, const NamedTensors& tensors, const std::string& out_dir,
                   ExportResult& result) {
  save_safetensors((fs::path(out_dir) / "model.safetensors").string(), tensors,
                   {{"format", "pt"}, {"source", fs::absolute(s.checkpoint_dir).string()}});
  result.files.push_back("model.safetensors");
}

// Hugging Face's BertConfig; sizes come from the tensors themselves.
nlohmann::json bert_config(const ExportSource& s, const std::string& architecture) {
  auto dim = [&](const std::string& name, int i) { return tensor(s, name).size(i); };
  int64_t layers = 0;
  while (s.weights.tensors.count("bert.encoder.layer." + std::to_string(layers) + ".attention.self.query.weight"))
    ++layers;
  return {
      {"architectures", {architecture}},
      {"model_type", "bert"},
      {"vocab_size", dim("bert.embeddings.word_embeddings.weight", 0)},
      {"hidden_size", dim("bert.embeddings.word_embeddings.weight", 1)},
      {"num_hidden_layers", layers},
      {"num_attention_heads", s.cfg.model.heads},
      {"intermediate_size", dim("bert.encoder.layer.0.intermediate.dense.weight", 0)},
      {"max_position_embeddings", dim("bert.embeddings.position_embeddings.weight", 0)},
      {"type_vocab_size", dim("bert.embeddings.token_type_embeddings.weight", 0)},
      {"hidden_act", "gelu"},
      {"hidden_dropout_prob", s.cfg.model.dropout},
      {"attention_probs_dropout_prob", s.cfg.model.attention_dropout},
      {"layer_norm_eps", 1e-12},
      {"initializer_range", 0.02},
      {"pad_token_id", 0},
      {"tie_word_embeddings", true},
  };
}

// The tokenizer the run trained with: RUN_DIR/tokenizer/ (written at its
// start); for a run made before Cohort kept one, the vocabulary its config
// names, said so; else a note that the export has none.
void write_tokenizer(const ExportSource& s, const std::string& out_dir, int64_t max_len, ExportResult& result) {
  const fs::path kept = fs::path(s.run_dir) / text::kTokenizerDir;
  if (!s.run_dir.empty() && fs::exists(kept / "tokenizer.json")) {  // byte-level BPE
    for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}) {
      COHORT_CHECK(fs::exists(kept / name), DataError, (kept / name).string(), ": missing (the run's tokenizer is incomplete)");
      write_text(out_dir, name, read_file((kept / name).string()), result);
    }
    return;
  }
  if (!s.run_dir.empty() && fs::exists(kept / "vocab.txt")) {
    for (const char* name : {"vocab.txt", "tokenizer_config.json", "special_tokens_map.json"}) {
      COHORT_CHECK(fs::exists(kept / name), DataError, (kept / name).string(), ": missing (the run's tokenizer is incomplete)");
      write_text(out_dir, name, read_file((kept / name).string()), result);
    }
    return;
  }
  fs::path vocab = s.cfg.data.vocab.empty() ? fs::path(s.cfg.data.path) / "vocab.txt" : fs::path(s.cfg.data.vocab);
  if (!fs::exists(vocab)) {
    result.notes.push_back("no vocabulary is known for this run (" + (s.run_dir.empty() ? std::string("no run beside the checkpoint") : kept.string() + " does not exist") +
                           ", nor " + vocab.string() +
                           (s.cfg.train.task == "bert-pretrain" ? "; shards made elsewhere, as NVIDIA's, come without one" : "") +
                           "): the export has no tokenizer files; copy the vocab.txt the model was trained with into " + out_dir);
    return;
  }
  bool lowercase = s.cfg.data.lowercase;
  if (s.cfg.train.task == "bert-pretrain") {
    if (auto m = read_manifest(s.cfg.data.path); m && m->lowercase) lowercase = *m->lowercase;
  }
  result.notes.push_back("the run keeps no tokenizer (" + kept.string() + "): took " + vocab.string() +
                         (lowercase ? " (uncased)" : " (cased)") + " from its config; check that it is the one the run trained with");
  for (const auto& [name, text] : text::hf_tokenizer_files(read_file(vocab.string()), lowercase, max_len))
    write_text(out_dir, name, text, result);
}

// AutoTokenizer builds a ModernBERT's tokenizer from tokenizer.json alone: a
// WordPiece run's export gets one made from its vocab.txt (a byte-level BPE
// run's has its own).
void write_tokenizer_json(const std::string& out_dir, ExportResult& result) {
  const fs::path vocab = fs::path(out_dir) / "vocab.txt";
  if (!fs::exists(vocab) || fs::exists(fs::path(out_dir) / "tokenizer.json")) return;
  auto tc = nlohmann::json::parse(read_file((fs::path(out_dir) / "tokenizer_config.json").string()));
  write_text(out_dir, "tokenizer.json", text::hf_wordpiece_json(read_file(vocab.string()), tc.value("do_lower_case", true)),
             result);
}

int64_t bert_max_len(const ExportSource& s) {
  return tensor(s, "bert.embeddings.position_embeddings.weight").size(0);
}

// model.name modernbert: Hugging Face's ModernBertForMaskedLM or
// ModernBertForSequenceClassification, with the config.json the run wrote
// at its start (RUN_DIR/hf-config.json, kHfConfigFile: the architecture may come from
// model.init's config.json, which the run's keys do not describe).
nlohmann::json modernbert_config(const ExportSource& s, const std::string& architecture) {
  const fs::path kept = fs::path(s.run_dir) / kHfConfigFile;
  COHORT_CHECK(!s.run_dir.empty() && fs::exists(kept), DataError, "a ModernBERT export needs the run's hf-config.json",
               s.run_dir.empty() ? " (this checkpoint is outside its run: copy RUN_DIR/hf-config.json beside it)"
                                 : detail::cat(" (", kept.string(), " does not exist)"));
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(read_file(kept.string()));
  } catch (const nlohmann::json::exception& e) {
    throw DataError(detail::cat(kept.string(), " is not JSON: ", e.what()));
  }
  config["architectures"] = {architecture};
  config["vocab_size"] = tensor(s, "model.embeddings.tok_embeddings.weight").size(0);
  return config;
}

void export_bert_pretrain(const ExportSource& s, const std::string& out_dir, ExportResult& result) {
  if (s.cfg.model.name == "modernbert") {
    // The decoder is tied to the token embeddings: Hugging Face's file leaves its weight out.
    write_weights(s, NamedTensors(s.weights.tensors.begin(), s.weights.tensors.end()), out_dir, result);
    result.hf_class = "ModernBertForMaskedLM";
    nlohmann::json config = modernbert_config(s, result.hf_class);
    write_text(out_dir, "config.json", config.dump(2) + "\n", result);
    write_tokenizer(s, out_dir, config.value("max_position_embeddings", int64_t{8192}), result);
    write_tokenizer_json(out_dir, result);
    return;
  }
  // BertForPreTraining's (and BertForMaskedLM's) state_dict() also names the
  // tied MLM decoder, so that load_state_dict(strict=True) finds every key
  // it expects.
  NamedTensors tensors(s.weights.tensors.begin(), s.weights.tensors.end());
  tensors.emplace_back("cls.predictions.decoder.weight", tensor(s, "bert.embeddings.word_embeddings.weight"));
  tensors.emplace_back("cls.predictions.decoder.bias", tensor(s, "cls.predictions.bias"));
  write_weights(s, tensors, out_dir, result);
  // task.nsp false trains no NSP head and no pooler: a BertForMaskedLM.
  const bool nsp = s.weights.tensors.count("cls.seq_relationship.weight") > 0;
  result.hf_class = nsp ? "BertForPreTraining" : "BertForMaskedLM";
  write_text(out_dir, "config.json", bert_config(s, result.hf_class).dump(2) + "\n", result);
  write_tokenizer(s, out_dir, bert_max_len(s), result);
}

void export_bert_classify(const ExportSource& s, const std::string& out_dir, ExportResult& result) {
  const int64_t classes = tensor(s, "classifier.weight").size(0);
  // The label names, in id order: the run's labels.json (or data.labels).
  fs::path labels_file = s.run_dir.empty() ? fs::path() : fs::path(s.run_dir) / "labels.json";
  if ((labels_file.empty() || !fs::exists(labels_file)) && !s.cfg.data.labels.empty()) labels_file = s.cfg.data.labels;
  std::vector<std::string> names;
  if (!labels_file.empty() && fs::exists(labels_file)) {
    names = LabelSet::from_json(read_file(labels_file.string()), labels_file.string()).names();
    COHORT_CHECK(static_cast<int64_t>(names.size()) == classes, DataError, labels_file.string(), " names ",
                 names.size(), " labels but the classifier has ", classes, " classes");
  } else {
    for (int64_t i = 0; i < classes; ++i) names.push_back("LABEL_" + std::to_string(i));
    result.notes.push_back("no labels.json for this checkpoint: the labels are named LABEL_0..LABEL_" +
                           std::to_string(classes - 1));
  }
  write_weights(s, NamedTensors(s.weights.tensors.begin(), s.weights.tensors.end()), out_dir, result);
  const bool modern = s.cfg.model.name == "modernbert";
  result.hf_class = modern ? "ModernBertForSequenceClassification" : "BertForSequenceClassification";
  nlohmann::json config = modern ? modernbert_config(s, result.hf_class) : bert_config(s, result.hf_class);
  nlohmann::json id2label = nlohmann::json::object(), label2id = nlohmann::json::object();
  for (size_t i = 0; i < names.size(); ++i) {
    id2label[std::to_string(i)] = names[i];
    label2id[names[i]] = i;
  }
  config["num_labels"] = classes;
  config["id2label"] = id2label;
  config["label2id"] = label2id;
  config["problem_type"] = "single_label_classification";
  if (!modern) config["classifier_dropout"] = nullptr;  // hidden_dropout_prob, as Cohort's classifier
  write_text(out_dir, "config.json", config.dump(2) + "\n", result);
  write_tokenizer(s, out_dir, modern ? config.value("max_position_embeddings", int64_t{8192}) : bert_max_len(s), result);
  if (modern) write_tokenizer_json(out_dir, result);
}

void export_image_classify(const ExportSource& s, const std::string& out_dir, ExportResult& result) {
  write_weights(s, NamedTensors(s.weights.tensors.begin(), s.weights.tensors.end()), out_dir, result);
  nlohmann::json shapes = nlohmann::json::object();
  for (const auto& [name, t] : s.weights.tensors) shapes[name] = t.sizes().vec();
  nlohmann::json config = {{"cohort_task", s.cfg.train.task},
                           {"cohort_model", s.cfg.model.name},
                           {"hidden", s.cfg.model.hidden},
                           {"dropout", s.cfg.model.dropout},
                           {"tensors", shapes}};
  write_text(out_dir, "config.json", config.dump(2) + "\n", result);
  result.notes.push_back("no Hugging Face class exists for Cohort's '" + s.cfg.model.name +
                         "' image model: model.safetensors holds its weights by Cohort's names, and config.json "
                         "its model keys and tensor shapes");
}

Registry<Exporter>& exporters() {
  static Registry<Exporter> r("export", {{"bert-classify", export_bert_classify},
                                         {"bert-pretrain", export_bert_pretrain},
                                         {"image-classify", export_image_classify}});
  return r;
}

}  // namespace

void register_exporter(const std::string& task, Exporter exporter) { exporters().add(task, std::move(exporter)); }

ExportResult export_model(const std::string& path, const std::string& requested_out) {
  std::vector<std::string> warnings;
  ExportSource source;
  const ResolvedCheckpoint resolved = Checkpoints::resolve(path, &warnings);  // verified, and held
  source.checkpoint_dir = resolved.dir;
  // The run's own files (tokenizer/, labels.json) only for a checkpoint
  // still in its run: one copied out of it has no run beside it.
  fs::path ckpt = fs::path(source.checkpoint_dir).lexically_normal();
  if (!ckpt.has_filename()) ckpt = ckpt.parent_path();  // a trailing '/'
  const bool in_run = ckpt.parent_path().filename() == "checkpoints";
  source.run_dir = in_run ? Checkpoints::run_dir_of(source.checkpoint_dir) : "";
  source.cfg = load_config(resolved.file("config.toml"));
  const auto known = exporters().names();
  COHORT_CHECK(std::find(known.begin(), known.end(), source.cfg.train.task) != known.end(), ConfigError,
               "cohort export knows the tasks ", detail::join(known), ", not '", source.cfg.train.task,
               "': the program that registers that task registers its exporter too (register_exporter, "
               "cohort/ckpt/export.hpp); until then ", source.checkpoint_dir,
               "/model.safetensors holds its weights by their module names");
  source.weights = load_safetensors(resolved.file("model.safetensors"));

  ExportResult result;
  result.dir = !requested_out.empty() ? requested_out
               : in_run                 ? (fs::path(source.run_dir) / "export").string()
                                        : (fs::path(source.checkpoint_dir) / "export").string();
  result.warnings = warnings;
  result.run_dir = source.run_dir;
  result.mlflow = source.cfg.log.mlflow;
  std::error_code ec;
  COHORT_CHECK(!fs::exists(result.dir, ec) || fs::is_directory(result.dir, ec), UsageError, result.dir,
               " is a file, not a directory", requested_out.empty() ? " (name another with --out DIR)" : "");
  fs::create_directories(result.dir);
  exporters().get(source.cfg.train.task)(source, result.dir, result);
  return result;
}

}  // namespace cohort
