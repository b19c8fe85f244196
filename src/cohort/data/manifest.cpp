#include "cohort/data/manifest.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "cohort/core/error.hpp"
#include "cohort/core/files.hpp"
#include "cohort/core/version.hpp"
#include "cohort/text/wordpiece.hpp"

namespace cohort {

namespace fs = std::filesystem;

void write_manifest(const std::string& dir, const ManifestRecord& m) {
  nlohmann::json splits = nlohmann::json::object();
  for (const auto& [name, s] : m.splits) {
    splits[name] = {{"documents", s.documents},
                    {"rows", s.rows},
                    {"shards", s.shards},
                    {"tokens", s.tokens},
                    {"text_tokens", s.text_tokens}};
  }
  nlohmann::json inputs = nlohmann::json::array();
  for (const auto& in : m.inputs) {
    inputs.push_back({{"path", in.path},
                      {"format", in.format},
                      {"bytes", in.bytes},
                      {"documents", in.documents},
                      {"text_bytes", in.text_bytes}});
  }
  nlohmann::json j = {
      {"created_by", std::string("cohort prepare ") + kVersion},
      {"cohort_version", kVersion},
      {"vocab", "vocab.txt"},
      {"vocab_size", m.vocab_size},
      {"vocab_source", m.vocab_source},
      {"tokenizer", m.tokenizer},
      {"lowercase", m.lowercase},
      {"max_seq_length", m.max_seq_length},
      {"max_predictions", m.max_predictions},
      {"masked_lm_prob", m.masked_lm_prob},
      {"short_seq_prob", m.short_seq_prob},
      {"dupe_factor", m.dupe_factor},
      {"whole_word_mask", m.whole_word_mask},
      {"masking", m.masked ? "static" : "none"},
      {"nsp", m.next_sentence},
      {"valid_fraction", m.valid_fraction},
      {"test_fraction", m.test_fraction},
      {"rows_per_shard", m.rows_per_shard},
      {"seed", m.seed},
      {"splits", splits},
      {"tokens", m.tokens},
      {"text_tokens", m.text_tokens},
      {"unk_fraction", m.unk_fraction},
      {"text_bytes", m.text_bytes},
      {"inputs", inputs},
      {"seconds", std::round(m.seconds * 10) / 10},
  };
  write_file_atomically((fs::path(dir) / "manifest.json").string(), j.dump(2) + "\n");
}

std::optional<DataManifest> read_manifest(const std::string& dir) {
  const std::string path = (fs::path(dir) / "manifest.json").string();
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  std::ifstream in(path);
  COHORT_CHECK(in.good(), DataError, path, ": cannot open");
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    throw DataError(detail::cat(path, ": not valid JSON (", detail::first_line(e.what()), ")"));
  }
  COHORT_CHECK(j.is_object(), DataError, path, ": expected a JSON object");
  DataManifest m;
  auto field = [&](const char* name, int64_t& out) {
    if (!j.contains(name)) return;
    const auto& v = j[name];
    COHORT_CHECK(v.is_number_integer() && v.get<int64_t>() >= 1, DataError, path, ": '", name,
                 "' must be a positive integer, got ", v.dump());
    out = v.get<int64_t>();
  };
  field("vocab_size", m.vocab_size);
  field("max_seq_length", m.max_seq_length);
  field("max_predictions", m.max_predictions);
  if (j.contains("lowercase")) {
    COHORT_CHECK(j["lowercase"].is_boolean(), DataError, path, ": 'lowercase' must be true or false, got ",
                 j["lowercase"].dump());
    m.lowercase = j["lowercase"].get<bool>();
  }
  if (j.contains("tokenizer")) {
    const auto& v = j["tokenizer"];
    COHORT_CHECK(v.is_string() && (v == "wordpiece" || v == "bpe"), DataError, path,
                 ": 'tokenizer' must be \"wordpiece\" or \"bpe\", got ", v.dump());
    m.tokenizer = v.get<std::string>();
  }
  if (j.contains("masking")) {
    const auto& v = j["masking"];
    COHORT_CHECK(v.is_string() && (v == "static" || v == "none"), DataError, path,
                 ": 'masking' must be \"static\" or \"none\", got ", v.dump());
    m.masked = v == "static";
  }
  if (j.contains("nsp")) {
    COHORT_CHECK(j["nsp"].is_boolean(), DataError, path, ": 'nsp' must be true or false, got ", j["nsp"].dump());
    m.next_sentence = j["nsp"].get<bool>();
  }
  return m;
}

int64_t data_vocab_size(const std::string& dir) {
  // vocab.txt is checked as `prepare --vocab` checks it (one token per line,
  // each once): a duplicate would make two ids one token.
  const std::string path = (fs::path(dir) / "vocab.txt").string();
  int64_t lines = fs::exists(path) ? text::Vocab::load(path).size() : 0;
  if (auto m = read_manifest(dir); m && m->vocab_size > 0) {
    COHORT_CHECK(lines == 0 || lines == m->vocab_size, DataError, path, " has ", lines, " tokens but ",
                 (fs::path(dir) / "manifest.json").string(), " says vocab_size ", m->vocab_size);
    return m->vocab_size;
  }
  return lines;
}

}  // namespace cohort
