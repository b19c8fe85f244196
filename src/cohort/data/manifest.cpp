#include "cohort/data/manifest.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "cohort/core/error.hpp"
#include "cohort/text/wordpiece.hpp"

namespace cohort {

namespace fs = std::filesystem;

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
