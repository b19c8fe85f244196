#include "cohort/text/hf_tokenizer.hpp"

#include <nlohmann/json.hpp>

#include <sstream>

#include "cohort/core/error.hpp"

namespace cohort::text {

std::vector<std::pair<std::string, std::string>> hf_tokenizer_files(const std::string& vocab_text, bool lowercase,
                                                                     int64_t model_max_length) {
  const nlohmann::json specials = {{"unk_token", "[UNK]"}, {"sep_token", "[SEP]"}, {"pad_token", "[PAD]"},
                                   {"cls_token", "[CLS]"}, {"mask_token", "[MASK]"}};
  nlohmann::json config = specials;
  config["tokenizer_class"] = "BertTokenizer";
  config["do_lower_case"] = lowercase;
  config["strip_accents"] = nullptr;  // follows do_lower_case, as Cohort's WordPiece does
  config["tokenize_chinese_chars"] = true;
  config["do_basic_tokenize"] = true;
  config["model_max_length"] = model_max_length;
  config["clean_up_tokenization_spaces"] = true;
  std::string vocab = vocab_text;
  if (!vocab.empty() && vocab.back() != '\n') vocab += '\n';
  return {{"vocab.txt", vocab},
          {"tokenizer_config.json", config.dump(2) + "\n"},
          {"special_tokens_map.json", specials.dump(2) + "\n"}};
}

std::string hf_wordpiece_json(const std::string& vocab_text, bool lowercase) {
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  std::istringstream in(vocab_text);
  int64_t id = 0;
  for (std::string token; std::getline(in, token); ++id) {
    if (!token.empty() && token.back() == '\r') token.pop_back();
    vocab[token] = id;
  }
  auto id_of = [&](const char* token) {
    COHORT_CHECK(vocab.contains(token), DataError, "the vocabulary has no ", token, " token");
    return vocab.at(token).get<int64_t>();
  };
  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  for (const char* t : {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}) {
    if (!vocab.contains(t)) continue;
    added.push_back({{"id", vocab.at(t)}, {"content", t}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  }
  auto special = [](const char* t, int type) { return nlohmann::ordered_json{{"SpecialToken", {{"id", t}, {"type_id", type}}}}; };
  auto sequence = [](const char* s, int type) { return nlohmann::ordered_json{{"Sequence", {{"id", s}, {"type_id", type}}}}; };
  nlohmann::ordered_json j = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer",
       {{"type", "BertNormalizer"}, {"clean_text", true}, {"handle_chinese_chars", true}, {"strip_accents", nullptr},
        {"lowercase", lowercase}}},
      {"pre_tokenizer", {{"type", "BertPreTokenizer"}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", {special("[CLS]", 0), sequence("A", 0), special("[SEP]", 0)}},
        {"pair", {special("[CLS]", 0), sequence("A", 0), special("[SEP]", 0), sequence("B", 1), special("[SEP]", 1)}},
        {"special_tokens",
         {{"[CLS]", {{"id", "[CLS]"}, {"ids", {id_of("[CLS]")}}, {"tokens", {"[CLS]"}}}},
          {"[SEP]", {{"id", "[SEP]"}, {"ids", {id_of("[SEP]")}}, {"tokens", {"[SEP]"}}}}}}}},
      {"decoder", {{"type", "WordPiece"}, {"prefix", "##"}, {"cleanup", true}}},
      {"model",
       {{"type", "WordPiece"}, {"unk_token", "[UNK]"}, {"continuing_subword_prefix", "##"},
        {"max_input_chars_per_word", 100}, {"vocab", vocab}}},
  };
  return j.dump(2) + "\n";
}

std::vector<std::pair<std::string, std::string>> hf_bpe_tokenizer_files(const std::string& tokenizer_json,
                                                                         int64_t model_max_length) {
  const nlohmann::json specials = {{"unk_token", "[UNK]"}, {"sep_token", "[SEP]"}, {"pad_token", "[PAD]"},
                                   {"cls_token", "[CLS]"}, {"mask_token", "[MASK]"}};
  nlohmann::json config = specials;
  config["tokenizer_class"] = "PreTrainedTokenizerFast";
  config["model_max_length"] = model_max_length;
  config["clean_up_tokenization_spaces"] = false;
  config["model_input_names"] = {"input_ids", "attention_mask"};
  return {{"tokenizer.json", tokenizer_json},
          {"tokenizer_config.json", config.dump(2) + "\n"},
          {"special_tokens_map.json", specials.dump(2) + "\n"}};
}

}  // namespace cohort::text
