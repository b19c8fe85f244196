// The C++ half of the oracle checks in tests/oracles/*.py: Cohort's own code
// computes what the Python side compares against Hugging Face's libraries.
//
//   cohort_oracle_tool bert-logits MODEL_DIR DATA_DIR SPLIT ROWS OUT.safetensors
//       loads MODEL_DIR (config.json + model.safetensors, as `cohort export`
//       writes it) through load_model_weights, runs the first ROWS rows of
//       DATA_DIR's SPLIT through the reader and BertForPretraining in eval
//       mode (fp32), and writes the batch and both heads' logits
//       (BertForMaskedLM exports: no NSP logits)
//   cohort_oracle_tool modernbert-logits MODEL_DIR DATA_DIR SPLIT ROWS OUT.safetensors
//       loads a Hugging Face ModernBERT directory (config.json +
//       model.safetensors, as save_pretrained or `cohort export` writes it)
//       into ModernBertForMaskedLM, runs the first ROWS rows of DATA_DIR's
//       SPLIT in eval mode (fp32), padded and packed (data.pack's packing,
//       rows twice as long when model's max positions allow),
//       and writes the batch, the logits at every position (all_logits) and
//       the MLM logits at the masked positions, padded and packed
//   cohort_oracle_tool mask-draws DATA_DIR SPLIT ROWS PROB WHOLE_WORD EPOCH OUT.safetensors
//       the first ROWS rows of DATA_DIR's SPLIT restored (their stored
//       targets put back) and masked afresh as task.masking dynamic does
//       (DATA_DIR/vocab.txt, train.seed 1, 0.8/0.1/0.1, no cap), for sample
//       ids 0..ROWS-1 in EPOCH: original_ids, input_ids, input_mask,
//       masked_lm_positions, masked_lm_ids
//   cohort_oracle_tool gcide-lines GCIDE.dict.dz OUT.txt
//       every sentence `cohort prepare` reads from GCIDE, one per line
//   cohort_oracle_tool bpe TOKENIZER.json TEXTS.jsonl OUT.txt
//       each text's byte-level BPE ids (text/bpe.hpp, with the special
//       tokens), space-separated, one line per text; TEXTS.jsonl holds one
//       JSON string per line, so that a text may hold any character
//   cohort_oracle_tool bpe-train LINES.txt VOCAB_SIZE OUT.json
//       a byte-level BPE of VOCAB_SIZE tokens trained on the lines, as
//       `cohort prepare --tokenizer bpe` trains one: its tokenizer.json
//   cohort_oracle_tool wordpiece VOCAB uncased|cased LINES.txt OUT.txt
//       each line's WordPiece ids, space-separated, one line per input line
#include <filesystem>
#include <fstream>
#include <iostream>
#include <numeric>

#include "cohort/ckpt/checkpoint.hpp"
#include "cohort/ckpt/safetensors.hpp"
#include "cohort/core/error.hpp"
#include "cohort/data/bert_shards.hpp"
#include "cohort/model/bert.hpp"
#include "cohort/model/modernbert.hpp"
#include "cohort/prep/prepare.hpp"
#include "cohort/text/bpe.hpp"
#include "cohort/text/wordpiece.hpp"

namespace fs = std::filesystem;
using namespace cohort;

namespace {

int bert_logits(const std::string& model_dir, const std::string& data_dir, const std::string& split, int64_t rows,
                const std::string& out) {
  std::ifstream in(fs::path(model_dir) / "config.json");
  COHORT_CHECK(in, DataError, "no config.json in ", model_dir);
  auto j = nlohmann::json::parse(in);
  BertConfig c;
  c.vocab_size = j.at("vocab_size");
  c.hidden = j.at("hidden_size");
  c.layers = j.at("num_hidden_layers");
  c.heads = j.at("num_attention_heads");
  c.intermediate = j.at("intermediate_size");
  c.max_positions = j.at("max_position_embeddings");
  c.type_vocab = j.at("type_vocab_size");
  c.layer_norm_eps = j.at("layer_norm_eps");
  c.next_sentence = j.at("architectures").at(0) != "BertForMaskedLM";
  BertForPretraining model(c);
  load_model_weights(*model, (fs::path(model_dir) / "model.safetensors").string());
  model->eval();

  BertShards data(data_dir, split);
  std::vector<int64_t> ids(static_cast<size_t>(std::min(rows, data.size())));
  std::iota(ids.begin(), ids.end(), 0);
  Example b = data.get_batch(ids);
  torch::NoGradGuard no_grad;
  auto o = model->forward(BertBatch::from(b));
  NamedTensors t;
  for (const char* k : {"input_ids", "segment_ids", "input_mask", "masked_lm_positions", "masked_lm_ids",
                        "next_sentence_labels"}) {
    t.emplace_back(k, b.at(k).contiguous());
  }
  t.emplace_back("mlm_logits", o.mlm_logits.contiguous());
  t.emplace_back("mlm_labels", o.mlm_labels.contiguous());
  if (o.nsp_logits.defined()) t.emplace_back("nsp_logits", o.nsp_logits.contiguous());
  save_safetensors(out, t, {});
  return 0;
}

int modernbert_logits(const std::string& model_dir, const std::string& data_dir, const std::string& split,
                      int64_t rows, const std::string& out) {
  std::ifstream in(fs::path(model_dir) / "config.json");
  COHORT_CHECK(in, DataError, "no config.json in ", model_dir);
  ModernBertConfig c = ModernBertConfig::from_hf(nlohmann::json::parse(in), model_dir + "/config.json");
  ModernBertForMaskedLM model(c);
  load_model_weights(*model, (fs::path(model_dir) / "model.safetensors").string(),
                     [](const std::string& name) { return name == "decoder.weight"; });
  model->eval();

  BertShards data(data_dir, split);
  std::vector<int64_t> ids(static_cast<size_t>(std::min(rows, data.size())));
  std::iota(ids.begin(), ids.end(), 0);
  Example b = data.get_batch(ids);
  // Rows twice as long where the model takes them: two sequences share a
  // row, and positions restart.
  const int64_t width = b.at("input_ids").size(1);
  Example packed = pack_bert_rows(b, 2 * width <= c.max_positions ? 2 * width : width);
  torch::NoGradGuard no_grad;
  auto padded_out = model->forward(BertBatch::from(b));
  auto packed_out = model->forward(BertBatch::from(packed));
  NamedTensors t;
  for (const char* k : {"input_ids", "input_mask", "masked_lm_positions", "masked_lm_ids"})
    t.emplace_back(k, b.at(k).contiguous());
  t.emplace_back("packed_rows", torch::tensor(packed.at("input_ids").size(0)));
  t.emplace_back("all_logits", model->all_logits(b.at("input_ids"), b.at("input_mask")).contiguous());
  t.emplace_back("mlm_logits", padded_out.mlm_logits.contiguous());
  t.emplace_back("mlm_labels", padded_out.mlm_labels.contiguous());
  t.emplace_back("mlm_logits_packed", packed_out.mlm_logits.contiguous());
  t.emplace_back("mlm_labels_packed", packed_out.mlm_labels.contiguous());
  save_safetensors(out, t, {});
  return 0;
}

int mask_draws(const std::string& data_dir, const std::string& split, int64_t rows, double prob, bool whole_word,
               int64_t epoch, const std::string& out) {
  MaskOptions m;
  m.prob = prob;
  m.whole_word = whole_word;
  m.seed = 1;
  BertShardsOptions o;
  o.masking = std::make_shared<DynamicMasking>(
      MaskingVocab::from(text::Vocab::load((fs::path(data_dir) / "vocab.txt").string())), m);
  BertShards data(data_dir, split, o);
  std::vector<int64_t> ids(static_cast<size_t>(std::min(rows, data.size())));
  std::iota(ids.begin(), ids.end(), 0);
  Example original = BertShards(data_dir, split).get_batch(ids);
  restore_masked_tokens(original);
  Example b = data.draw_batch(ids, epoch);
  NamedTensors t;
  t.emplace_back("original_ids", original.at("input_ids").contiguous());
  for (const char* k : {"input_ids", "input_mask", "masked_lm_positions", "masked_lm_ids"})
    t.emplace_back(k, b.at(k).contiguous());
  save_safetensors(out, t, {});
  return 0;
}

int gcide_lines(const std::string& dict, const std::string& out) {
  std::ofstream o(out);
  int64_t n = 0;
  for (const auto& doc : prep::read_gcide_documents(dict)) {
    for (const auto& sentence : doc) {
      COHORT_CHECK(sentence.find('\n') == std::string::npos, Error, "a GCIDE sentence holds a newline");
      o << sentence << '\n';
      ++n;
    }
  }
  COHORT_CHECK(o, Error, "cannot write ", out);
  std::cerr << "gcide-lines: " << n << " sentences\n";
  return 0;
}

int wordpiece(const std::string& vocab, const std::string& casing, const std::string& lines, const std::string& out) {
  text::TokenizerOptions opts;
  opts.lowercase = casing != "cased";
  text::WordPiece wp(text::Vocab::load(vocab), opts);
  std::ifstream in(lines);
  COHORT_CHECK(in, DataError, "cannot read ", lines);
  std::ofstream o(out);
  std::string line;
  while (std::getline(in, line)) {
    auto ids = wp.encode(line);
    for (size_t i = 0; i < ids.size(); ++i) o << (i ? " " : "") << ids[i];
    o << '\n';
  }
  COHORT_CHECK(o, Error, "cannot write ", out);
  return 0;
}

int bpe(const std::string& tokenizer, const std::string& texts, const std::string& out) {
  auto bpe = text::ByteLevelBpe::load(tokenizer);
  std::ifstream in(texts);
  COHORT_CHECK(in, DataError, "cannot read ", texts);
  std::ofstream o(out);
  std::string line;
  while (std::getline(in, line)) {
    auto ids = bpe.encode(nlohmann::json::parse(line).get<std::string>());
    for (size_t i = 0; i < ids.size(); ++i) o << (i ? " " : "") << ids[i];
    o << '\n';
  }
  COHORT_CHECK(o, Error, "cannot write ", out);
  return 0;
}

int bpe_train(const std::string& lines, int32_t vocab_size, const std::string& out) {
  text::BpeTrainOptions opts;
  opts.vocab_size = vocab_size;
  auto bpe = text::ByteLevelBpe::train(
      [&](const std::function<void(std::string_view)>& sink) {
        std::ifstream in(lines);
        COHORT_CHECK(in, DataError, "cannot read ", lines);
        for (std::string line; std::getline(in, line);) sink(line);
      },
      opts);
  std::ofstream(out) << bpe.to_json();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> a(argv + 1, argv + argc);
  try {
    if (a.size() == 6 && a[0] == "bert-logits") return bert_logits(a[1], a[2], a[3], std::stoll(a[4]), a[5]);
    if (a.size() == 6 && a[0] == "modernbert-logits")
      return modernbert_logits(a[1], a[2], a[3], std::stoll(a[4]), a[5]);
    if (a.size() == 8 && a[0] == "mask-draws")
      return mask_draws(a[1], a[2], std::stoll(a[3]), std::stod(a[4]), a[5] == "1", std::stoll(a[6]), a[7]);
    if (a.size() == 3 && a[0] == "gcide-lines") return gcide_lines(a[1], a[2]);
    if (a.size() == 4 && a[0] == "bpe") return bpe(a[1], a[2], a[3]);
    if (a.size() == 4 && a[0] == "bpe-train") return bpe_train(a[1], static_cast<int32_t>(std::stoll(a[2])), a[3]);
    if (a.size() == 5 && a[0] == "wordpiece") return wordpiece(a[1], a[2], a[3], a[4]);
  } catch (const std::exception& e) {
    std::cerr << "cohort_oracle_tool: error: " << e.what() << "\n";
    return 1;
  }
  std::cerr << "usage: see the comment at the top of tests/oracles/oracle_tool.cpp\n";
  return 2;
}
