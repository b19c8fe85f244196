#include "cohort/prep/wordnet.hpp"

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/core/files.hpp"
#include "cohort/core/random.hpp"

namespace cohort::prep {

namespace {

namespace fs = std::filesystem;

// WordNet 3.0's lexicographer files, by number (the lex_filenum field).
constexpr std::array<const char*, 45> kLexnames = {
    "adj.all",          "adj.pert",          "adv.all",          "noun.Tops",        "noun.act",
    "noun.animal",      "noun.artifact",     "noun.attribute",   "noun.body",        "noun.cognition",
    "noun.communication", "noun.event",      "noun.feeling",     "noun.food",        "noun.group",
    "noun.location",    "noun.motive",       "noun.object",      "noun.person",      "noun.phenomenon",
    "noun.plant",       "noun.possession",   "noun.process",     "noun.quantity",    "noun.relation",
    "noun.shape",       "noun.state",        "noun.substance",   "noun.time",        "verb.body",
    "verb.change",      "verb.cognition",    "verb.communication", "verb.competition", "verb.consumption",
    "verb.contact",     "verb.creation",     "verb.emotion",     "verb.motion",      "verb.perception",
    "verb.possession",  "verb.social",       "verb.stative",     "verb.weather",     "adj.ppl"};

std::string pos_name(const std::string& ss_type) {
  if (ss_type == "n") return "noun";
  if (ss_type == "v") return "verb";
  if (ss_type == "a" || ss_type == "s") return "adj";
  if (ss_type == "r") return "adv";
  return "";
}

std::string clean(std::string s) {  // no tabs or newlines inside a TSV field
  for (char& c : s) {
    if (c == '\t' || c == '\n' || c == '\r') c = ' ';
  }
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

}  // namespace

WordnetCounts prepare_wordnet(const WordnetOptions& opts) {
  COHORT_CHECK(!opts.out.empty(), UsageError, "prepare-classify: --out DIR is required");
  COHORT_CHECK(opts.valid_fraction >= 0 && opts.test_fraction >= 0 && opts.valid_fraction + opts.test_fraction < 1,
               UsageError, "prepare-classify: --valid-fraction and --test-fraction must be >= 0 and sum to < 1");
  const char* names[3] = {"train.tsv", "valid.tsv", "test.tsv"};
  for (const char* n : names) {
    COHORT_CHECK(opts.overwrite || !fs::exists(fs::path(opts.out) / n), UsageError, (fs::path(opts.out) / n).string(),
                 " exists; pass --overwrite to replace it");
  }
  std::array<std::vector<std::pair<double, std::string>>, 3> rows;  // (hash, line) per split
  WordnetCounts counts;
  for (const char* part : {"noun", "verb", "adj", "adv"}) {
    const std::string path = (fs::path(opts.dir) / (std::string("data.") + part)).string();
    std::ifstream in(path);
    COHORT_CHECK(in.good(), DataError, path, ": cannot read file (is wordnet-base installed?)");
    int64_t line_no = 0;
    for (std::string line; std::getline(in, line);) {
      ++line_no;
      if (line.rfind("  ", 0) == 0 || line.empty()) continue;  // the licence header
      auto bar = line.find(" | ");
      COHORT_CHECK(bar != std::string::npos, DataError, path, ":", line_no, ": no ' | ' before the gloss");
      std::istringstream fields(line.substr(0, bar));
      std::string offset, ss_type, count_hex;
      int lex = -1;
      fields >> offset >> lex >> ss_type >> count_hex;
      COHORT_CHECK(fields && lex >= 0 && lex < static_cast<int>(kLexnames.size()) && !pos_name(ss_type).empty(),
                   DataError, path, ":", line_no, ": malformed synset line");
      int64_t words = 0;
      uint64_t offset_number = 0;
      try {
        words = std::stoll(count_hex, nullptr, 16);
        offset_number = std::stoull(offset);
      } catch (const std::exception&) {
        throw DataError(detail::cat(path, ":", line_no, ": malformed offset or word count"));
      }
      std::string lemmas;
      for (int64_t w = 0; w < words; ++w) {
        std::string word, lex_id;
        fields >> word >> lex_id;
        COHORT_CHECK(static_cast<bool>(fields), DataError, path, ":", line_no, ": fewer words than its count");
        if (auto paren = word.find('('); paren != std::string::npos) word.resize(paren);  // adj markers: "(a)"
        for (char& c : word) c = c == '_' ? ' ' : c;
        lemmas += (lemmas.empty() ? "" : ", ") + word;
      }
      const std::string synset = ss_type.substr(0, 1) + "." + offset;
      // The split: a hash of (seed, offset, part of speech), uniform in [0, 1).
      const uint64_t key = offset_number * 8 + static_cast<uint64_t>(ss_type[0]);
      const double u = static_cast<double>(splitmix64(opts.seed ^ splitmix64(key)) >> 11) * 0x1.0p-53;
      int split = u < opts.test_fraction ? 2 : u < opts.test_fraction + opts.valid_fraction ? 1 : 0;
      rows[static_cast<size_t>(split)].emplace_back(u, synset + "\t" + pos_name(ss_type) + "\t" +
                                                           kLexnames[static_cast<size_t>(lex)] + "\t" + clean(lemmas) +
                                                           "\t" + clean(line.substr(bar + 3)) + "\n");
      (split == 0 ? counts.train : split == 1 ? counts.valid : counts.test) += 1;
    }
  }
  // Each file in hash order, a shuffle: the first N rows (eval.max-samples)
  // are a sample of every part of speech, not the first nouns.
  fs::create_directories(opts.out);
  for (size_t s = 0; s < 3; ++s) {
    std::sort(rows[s].begin(), rows[s].end());
    std::string text = "synset\tpos\tlexname\twords\tgloss\n";
    for (const auto& [u, line] : rows[s]) text += line;
    write_file_atomically((fs::path(opts.out) / names[s]).string(), text);
  }
  return counts;
}

}  // namespace cohort::prep
