#include "cohort/data/text_classify.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "cohort/core/error.hpp"
#include "cohort/text/wordpiece.hpp"

namespace cohort {

namespace fs = std::filesystem;

LabelSet::LabelSet(std::vector<std::string> names) : names_(std::move(names)) {
  std::sort(names_.begin(), names_.end());
  names_.erase(std::unique(names_.begin(), names_.end()), names_.end());
}

int64_t LabelSet::find(const std::string& name) const {
  auto it = std::lower_bound(names_.begin(), names_.end(), name);
  return it != names_.end() && *it == name ? it - names_.begin() : -1;
}

std::string LabelSet::to_json() const { return nlohmann::json({{"labels", names_}}).dump(2) + "\n"; }

LabelSet LabelSet::from_json(const std::string& text, const std::string& what) {
  try {
    return LabelSet(nlohmann::json::parse(text).at("labels").get<std::vector<std::string>>());
  } catch (const nlohmann::json::exception& e) {
    throw DataError(detail::cat(what, ": not a label list (", e.what(), ")"));
  }
}

std::string classify_file(const std::string& dir, const std::string& split) {
  if (fs::is_regular_file(split)) return split;
  for (const char* ext : {".tsv", ".jsonl"}) {
    auto p = fs::path(dir) / (split + ext);
    if (fs::exists(p)) return p.string();
  }
  std::string holds;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) holds += (holds.empty() ? "" : ", ") + e.path().filename().string();
  throw DataError(detail::cat(dir, " has no ", split, ".tsv or ", split, ".jsonl (it holds: ",
                              holds.empty() ? "nothing" : holds, ")"));
}

namespace {

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> out(1);
  for (char c : line) {
    if (c == '\t') out.emplace_back();
    else out.back() += c;
  }
  return out;
}

// What a row gives: text, text_pair (or ""), label (or "" when absent and
// not required), and the id column's value (or "" when none is named).
struct RowFields {
  std::string text, pair, label, id;
  bool has_label = false;
};

// A file's rows, in order. `at` names file:line for errors.
class RowReader {
 public:
  RowReader(const std::string& path, const ClassifyColumns& cols, bool require_label)
      : path_(path), cols_(cols), require_label_(require_label), jsonl_(path.size() > 6 && path.rfind(".jsonl") == path.size() - 6),
        in_(path) {
    std::error_code ec;
    COHORT_CHECK(!std::filesystem::is_directory(path, ec), DataError, path,
                 ": is a directory; expected a .tsv or .jsonl file");
    COHORT_CHECK(in_.good(), DataError, path, ": cannot read file");
    if (jsonl_) return;
    std::string header;
    COHORT_CHECK(static_cast<bool>(std::getline(in_, header)), DataError, path, ": empty file (a TSV needs a header row)");
    ++line_;
    strip_cr(header);
    if (header.rfind("\xEF\xBB\xBF", 0) == 0) header.erase(0, 3);  // a UTF-8 byte-order mark
    header_ = split_tabs(header);
    text_ = column(cols_.text, true);
    pair_ = cols_.text_pair.empty() ? -1 : column(cols_.text_pair, true);
    label_ = column(cols_.label, require_label_);
    id_ = cols_.id.empty() ? -1 : column(cols_.id, true);
  }

  // False at the end of the file.
  bool next(RowFields& row) {
    std::string line;
    while (std::getline(in_, line)) {
      ++line_;
      strip_cr(line);
      if (line.empty()) continue;
      if (jsonl_) return parse_json(line, row);
      auto fields = split_tabs(line);
      COHORT_CHECK(fields.size() == header_.size(), DataError, at(), ": ", fields.size(), " field(s), but the header has ",
                   header_.size(), " (a tab inside a text?)");
      row.text = fields[static_cast<size_t>(text_)];
      row.pair = pair_ >= 0 ? fields[static_cast<size_t>(pair_)] : "";
      row.has_label = label_ >= 0;
      row.label = row.has_label ? fields[static_cast<size_t>(label_)] : "";
      row.id = id_ >= 0 ? fields[static_cast<size_t>(id_)] : "";
      return true;
    }
    return false;
  }

  std::string at() const { return path_ + ":" + std::to_string(line_); }

 private:
  static void strip_cr(std::string& s) {
    if (!s.empty() && s.back() == '\r') s.pop_back();
  }

  int column(const std::string& name, bool required) {
    for (size_t i = 0; i < header_.size(); ++i) {
      if (header_[i] == name) return static_cast<int>(i);
    }
    std::string have;
    for (const auto& h : header_) have += (have.empty() ? "" : ", ") + h;
    COHORT_CHECK(!required, DataError, path_, ":1: no column '", name, "' in the header (it has: ", have,
                 "); set data.text-column, data.text-pair-column, data.label-column or data.id-column");
    return -1;
  }

  bool parse_json(const std::string& line, RowFields& row) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw DataError(detail::cat(at(), ": not JSON (", e.what(), ")"));
    }
    auto field = [&](const std::string& name, bool required, std::string& out) {
      auto it = j.find(name);
      if (it == j.end() || it->is_null()) {
        COHORT_CHECK(!required, DataError, at(), ": no field '", name, "'; set data.text-column, data.text-pair-column, data.label-column or data.id-column");
        out.clear();
        return false;
      }
      out = it->is_string() ? it->get<std::string>() : it->dump();  // numbers and booleans as labels
      return true;
    };
    field(cols_.text, true, row.text);
    if (!cols_.text_pair.empty()) field(cols_.text_pair, true, row.pair);
    else row.pair.clear();
    row.has_label = field(cols_.label, require_label_, row.label);
    if (!cols_.id.empty()) field(cols_.id, true, row.id);
    else row.id.clear();
    return true;
  }

  std::string path_;
  ClassifyColumns cols_;
  bool require_label_, jsonl_;
  std::ifstream in_;
  std::vector<std::string> header_;
  int text_ = -1, pair_ = -1, label_ = -1, id_ = -1;
  int64_t line_ = 0;
};

}  // namespace

namespace {

TextTokenizer wordpiece_tokenizer(const text::WordPiece& wp) {
  return {[&wp](const std::string& t) { return wp.encode(t); }, wp.vocab().require("[CLS]"), wp.vocab().require("[SEP]")};
}

}  // namespace

TextClassification::TextClassification(const std::string& path, const text::WordPiece& tokenizer,
                                       const TextClassifyOptions& opts, LabelSet labels)
    : TextClassification(path, wordpiece_tokenizer(tokenizer), opts, std::move(labels)) {}

TextClassification::TextClassification(const std::string& path, const TextTokenizer& tokenizer,
                                       const TextClassifyOptions& opts, LabelSet labels)
    : path_(path), labels_(std::move(labels)) {
  const bool fixed_labels = labels_.size() > 0;
  const bool pairs = !opts.columns.text_pair.empty();
  const int64_t budget = opts.max_seq_length - (pairs ? 3 : 2);
  COHORT_CHECK(budget >= 1, ConfigError, "data.max-seq-length ", opts.max_seq_length, " leaves no room for text");
  const int32_t cls = tokenizer.cls, sep = tokenizer.sep;
  RowReader reader(path, opts.columns, opts.require_labels);
  std::vector<std::string> label_text;
  std::vector<std::string> where;  // file:line of each row, for label errors
  RowFields f;
  while (reader.next(f)) {
    auto a = tokenizer.encode(f.text);
    std::vector<int32_t> b = pairs ? tokenizer.encode(f.pair) : std::vector<int32_t>{};
    // Longest first: drop the last token of the longer segment until both fit.
    bool cut = false;
    while (static_cast<int64_t>(a.size() + b.size()) > budget) {
      (a.size() > b.size() ? a : b).pop_back();  // a tie cuts the second, as BERT's _truncate_seq_pair
      cut = true;
    }
    truncated_ += cut;
    Row row;
    row.ids.reserve(a.size() + b.size() + 3);
    row.ids.push_back(cls);
    row.ids.insert(row.ids.end(), a.begin(), a.end());
    row.ids.push_back(sep);
    row.pair_start = static_cast<int32_t>(row.ids.size());
    if (pairs) {
      row.ids.insert(row.ids.end(), b.begin(), b.end());
      row.ids.push_back(sep);
    }
    if (!opts.require_labels && f.label.empty()) f.has_label = false;  // predict input: a blank label is none
    COHORT_CHECK(!f.has_label || !f.label.empty(), DataError, reader.at(), ": empty label");
    label_text.push_back(f.has_label ? f.label : std::string());
    if (opts.keep_inputs) {
      if (!opts.columns.id.empty()) inputs_.push_back({{"id", f.id}});
      else if (pairs) inputs_.push_back({{"text", f.text}, {"text_pair", f.pair}});
      else inputs_.push_back({{"text", f.text}});
    }
    where.push_back(reader.at());
    rows_.push_back(std::move(row));
  }
  COHORT_CHECK(!rows_.empty(), DataError, path, ": no rows", opts.require_labels ? " (a header and nothing else)" : "");
  if (!fixed_labels && opts.require_labels) {
    labels_ = LabelSet(label_text);
    COHORT_CHECK(labels_.size() >= 2, DataError, path, ": the label column '", opts.columns.label,
                 "' has only one class ('", labels_.size() ? labels_.name(0) : "", "'): nothing to learn");
  }
  for (size_t i = 0; i < rows_.size(); ++i) {
    if (label_text[i].empty()) continue;
    rows_[i].label = labels_.find(label_text[i]);
    COHORT_CHECK(rows_[i].label >= 0, DataError, where[i], ": label '", label_text[i],
                 "' is not one of the train split's ", labels_.size(), " labels");
  }
}

Example TextClassification::get(int64_t index) const {
  auto b = get_batch({index});
  for (auto& [name, t] : b) t = t.squeeze(0);
  return b;
}

Example TextClassification::get_batch(const std::vector<int64_t>& indices) const {
  int64_t longest = 1;
  for (int64_t i : indices) {
    COHORT_CHECK(i >= 0 && i < size(), Error, path_, ": row ", i, " out of range");
    longest = std::max(longest, length(i));
  }
  const auto n = static_cast<int64_t>(indices.size());
  auto ids = torch::zeros({n, longest}, torch::kInt64);
  auto seg = torch::zeros({n, longest}, torch::kInt64);
  auto mask = torch::zeros({n, longest}, torch::kInt64);
  auto label = torch::empty({n}, torch::kInt64);
  auto* pi = ids.data_ptr<int64_t>();
  auto* ps = seg.data_ptr<int64_t>();
  auto* pm = mask.data_ptr<int64_t>();
  for (int64_t r = 0; r < n; ++r) {
    const Row& row = rows_[static_cast<size_t>(indices[static_cast<size_t>(r)])];
    for (size_t t = 0; t < row.ids.size(); ++t) {
      pi[r * longest + static_cast<int64_t>(t)] = row.ids[t];
      ps[r * longest + static_cast<int64_t>(t)] = static_cast<int64_t>(t) >= row.pair_start ? 1 : 0;
      pm[r * longest + static_cast<int64_t>(t)] = 1;
    }
    label[r] = row.label;
  }
  return {{"input_ids", ids}, {"segment_ids", seg}, {"input_mask", mask}, {"label", label}};
}

std::string TextClassification::describe() const {
  int64_t tokens = 0;
  for (const auto& r : rows_) tokens += static_cast<int64_t>(r.ids.size());
  return detail::cat(path_, ": ", size(), " rows, ", labels_.size(), " labels, mean length ",
                     size() ? tokens / size() : 0, ", ", truncated_, " truncated");
}

}  // namespace cohort
