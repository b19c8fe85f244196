#include "cohort/ckpt/export.hpp"

#include <filesystem>
#include <fstream>

#include "cohort/ckpt/checkpoint.hpp"
#include "cohort/config/config.hpp"
#include "cohort/core/error.hpp"

namespace cohort {

namespace fs = std::filesystem;

namespace {

// Hugging Face's BertConfig; sizes come from the tensors themselves.
nlohmann::json bert_config(const SafetensorsFile& f, const ModelOptions& model) {
  auto dim = [&](const std::string& name, int i) { return f.tensors.at(name).size(i); };
  int64_t layers = 0;
  while (f.tensors.count("bert.encoder.layer." + std::to_string(layers) + ".attention.self.query.weight")) ++layers;
  return {
      {"architectures", {"BertForPreTraining"}},
      {"model_type", "bert"},
      {"vocab_size", dim("bert.embeddings.word_embeddings.weight", 0)},
      {"hidden_size", dim("bert.embeddings.word_embeddings.weight", 1)},
      {"num_hidden_layers", layers},
      {"num_attention_heads", model.heads},
      {"intermediate_size", dim("bert.encoder.layer.0.intermediate.dense.weight", 0)},
      {"max_position_embeddings", dim("bert.embeddings.position_embeddings.weight", 0)},
      {"type_vocab_size", dim("bert.embeddings.token_type_embeddings.weight", 0)},
      {"hidden_act", "gelu"},
      {"hidden_dropout_prob", model.dropout},
      {"attention_probs_dropout_prob", model.attention_dropout},
      {"layer_norm_eps", 1e-12},
      {"initializer_range", 0.02},
      {"pad_token_id", 0},
      {"tie_word_embeddings", true},
  };
}

}  // namespace

std::string export_model(const std::string& path, const std::string& requested_out) {
  std::vector<std::string> warnings;
  std::string dir = Checkpoints::resolve(path, &warnings).dir;  // verified
  for (const auto& w : warnings) std::fprintf(stderr, "cohort: warning: %s\n", w.c_str());
  const std::string out_dir =
      requested_out.empty() ? (fs::path(Checkpoints::run_dir_of(dir)) / "export").string() : requested_out;
  SafetensorsFile f = load_safetensors((fs::path(dir) / "model.safetensors").string());
  Config cfg = load_config((fs::path(dir) / "config.toml").string());

  fs::create_directories(out_dir);
  NamedTensors tensors(f.tensors.begin(), f.tensors.end());
  bool bert = cfg.model.name == "bert";
  if (bert) {
    // BertForPreTraining's state_dict() also names the tied MLM decoder, so
    // that load_state_dict(strict=True) finds every key it expects.
    tensors.emplace_back("cls.predictions.decoder.weight", f.tensors.at("bert.embeddings.word_embeddings.weight"));
    tensors.emplace_back("cls.predictions.decoder.bias", f.tensors.at("cls.predictions.bias"));
  }
  auto out = fs::path(out_dir) / "model.safetensors";
  save_safetensors(out.string(), tensors, {{"format", "pt"}, {"source", fs::absolute(dir).string()}});
  if (bert) {
    std::ofstream json(fs::path(out_dir) / "config.json");
    json << bert_config(f, cfg.model).dump(2) << "\n";
    COHORT_CHECK(json, Error, "cannot write ", (fs::path(out_dir) / "config.json").string());
    auto vocab = fs::path(cfg.data.path) / "vocab.txt";
    if (fs::exists(vocab)) fs::copy_file(vocab, fs::path(out_dir) / "vocab.txt", fs::copy_options::overwrite_existing);
  }
  return out.string();
}

}  // namespace cohort
