#include "cohort/text/hf_tokenizer.hpp"

#include <nlohmann/json.hpp>

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

}  // namespace cohort::text
