#include "cohort/text/prepare.hpp"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "cohort/core/error.hpp"
#include "cohort/core/files.hpp"
#include "cohort/core/version.hpp"
#include "cohort/data/bert_rows.hpp"
#include "cohort/text/instances.hpp"
#include "cohort/text/wordpiece.hpp"

namespace cohort::text {

namespace fs = std::filesystem;

namespace {

constexpr const char* kSplitNames[3] = {"train", "valid", "test"};

void validate(const PrepareOptions& o) {
  COHORT_CHECK(!o.inputs.empty(), UsageError, "--input is required: a text file or the GCIDE .dict(.dz)");
  COHORT_CHECK(!o.out.empty(), UsageError, "--out is required: the output directory");
  if (o.vocab.empty()) {
    auto specials = static_cast<int32_t>(special_tokens().size());
    COHORT_CHECK(o.vocab_size > specials, UsageError, "--vocab-size must be more than the ", specials,
                 " special tokens, got ", o.vocab_size);
  }
  COHORT_CHECK(o.instances.max_seq_length >= 8 && o.instances.max_seq_length <= 65536, UsageError,
               "--max-seq-length must be in [8, 65536], got ", o.instances.max_seq_length);
  COHORT_CHECK(o.instances.max_predictions >= 1 && o.instances.max_predictions < o.instances.max_seq_length, UsageError,
               "--max-predictions must be at least 1 and less than --max-seq-length (", o.instances.max_seq_length, "), got ",
               o.instances.max_predictions);
  COHORT_CHECK(o.instances.masked_lm_prob >= 0 && o.instances.masked_lm_prob <= 1, UsageError,
               "--masked-lm-prob must be in [0, 1], got ", o.instances.masked_lm_prob);
  COHORT_CHECK(o.instances.short_seq_prob >= 0 && o.instances.short_seq_prob <= 1, UsageError,
               "--short-seq-prob must be in [0, 1], got ", o.instances.short_seq_prob);
  COHORT_CHECK(o.instances.dupe_factor >= 1, UsageError, "--dupe-factor must be at least 1, got ", o.instances.dupe_factor);
  COHORT_CHECK(o.valid_fraction >= 0 && o.valid_fraction < 1, UsageError, "--valid-fraction must be in [0, 1), got ",
               o.valid_fraction);
  COHORT_CHECK(o.test_fraction >= 0 && o.test_fraction < 1, UsageError, "--test-fraction must be in [0, 1), got ",
               o.test_fraction);
  COHORT_CHECK(o.valid_fraction + o.test_fraction < 1, UsageError,
               "--valid-fraction plus --test-fraction must be less than 1 (train needs documents), got ",
               o.valid_fraction + o.test_fraction);
  COHORT_CHECK(o.rows_per_shard >= 1, UsageError, "--rows-per-shard must be at least 1, got ", o.rows_per_shard);
  COHORT_CHECK(o.instances.threads >= 0, UsageError, "--threads must be 0 (every core) or more, got ", o.instances.threads);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_gcide(const std::string& path) { return ends_with(path, ".dict") || ends_with(path, ".dict.dz"); }

// Stage lines and periodic progress on stderr, quiet or not.
class Reporter {
 public:
  explicit Reporter(bool quiet) : quiet_(quiet), start_(std::chrono::steady_clock::now()) {}
  double elapsed() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }
  template <class... Parts>
  void line(Parts&&... parts) const {
    if (quiet_) return;
    std::string s = detail::cat("cohort prepare: ", std::forward<Parts>(parts)...);
    std::fprintf(stderr, "%s\n", s.c_str());
    std::fflush(stderr);
  }

 private:
  bool quiet_;
  std::chrono::steady_clock::time_point start_;
};

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string megabytes(int64_t bytes) { return fixed(static_cast<double>(bytes) / 1e6, 1) + " MB"; }

// Refuses a non-empty `out` unless overwrite; nothing is changed here.
void check_out_dir(const PrepareOptions& o) {
  std::error_code ec;
  fs::path out(o.out);
  if (!fs::exists(out, ec)) return;
  COHORT_CHECK(fs::is_directory(out, ec), UsageError, "--out ", o.out, " is a file, expected a directory");
  bool empty = fs::directory_iterator(out, ec) == fs::directory_iterator();
  COHORT_CHECK(!ec, DataError, o.out, ": cannot list (", ec.message(), ")");
  COHORT_CHECK(empty || o.overwrite, UsageError, "--out ", o.out,
               " is not empty; pass --overwrite to replace what an earlier run wrote there");
}

// Removes what an earlier run wrote (the manifest first, so an interrupted
// run never looks complete) and creates the directory.
void reset_out_dir(const std::string& dir) {
  fs::path out(dir);
  std::error_code ec;
  for (const char* name : {"manifest.json", "vocab.txt", "train", "valid", "test"}) {
    fs::remove_all(out / name, ec);
    COHORT_CHECK(!ec, DataError, (out / name).string(), ": cannot remove (", ec.message(), ")");
  }
  fs::create_directories(out, ec);
  COHORT_CHECK(!ec, DataError, dir, ": cannot create (", ec.message(), ")");
}

struct SplitResult {
  int64_t documents = 0;
  int64_t rows = 0;
  int64_t shards = 0;
  int64_t text_tokens = 0;  // WordPiece tokens of the split's documents
  int64_t tokens = 0;       // real tokens in its rows (input_mask's sum: [CLS]/[SEP], dupes, random B segments)
};

}  // namespace

void run_prepare(const PrepareOptions& o) {
  validate(o);
  check_out_dir(o);
  Reporter report(o.quiet);

  Vocab vocab;
  if (!o.vocab.empty()) {
    vocab = Vocab::load(o.vocab);
    report.line("vocabulary ", o.vocab, ": ", vocab.size(), " tokens");
  }

  // Read every input, in order; a document's index is its place overall.
  std::vector<Document> docs;
  nlohmann::json inputs = nlohmann::json::array();
  int64_t text_bytes = 0;
  for (const std::string& path : o.inputs) {
    bool gcide = is_gcide(path);
    report.line("reading ", path, gcide ? " (GCIDE dictionary)" : " (text)");
    std::vector<Document> part = gcide ? read_gcide_documents(path) : read_text_documents(path);
    int64_t part_bytes = 0;
    for (const Document& d : part)
      for (const std::string& s : d) part_bytes += static_cast<int64_t>(s.size());
    std::error_code ec;
    auto file_bytes = fs::file_size(path, ec);
    inputs.push_back({{"path", path},
                      {"format", gcide ? "gcide" : "text"},
                      {"bytes", ec ? 0 : static_cast<int64_t>(file_bytes)},
                      {"documents", part.size()},
                      {"text_bytes", part_bytes}});
    report.line(path, ": ", part.size(), " documents, ", megabytes(part_bytes), " of text");
    text_bytes += part_bytes;
    for (Document& d : part) docs.push_back(std::move(d));
  }
  COHORT_CHECK(!docs.empty(), DataError, detail::join(o.inputs, ", "), ": no documents (no non-blank lines)");

  const std::vector<int8_t> split_of = assign_splits(docs.size(), o.valid_fraction, o.test_fraction, o.instances.seed);

  if (o.vocab.empty()) {
    std::vector<std::string> texts;
    for (size_t i = 0; i < docs.size(); ++i) {
      if (split_of[i] == 0) texts.insert(texts.end(), docs[i].begin(), docs[i].end());
    }
    report.line("building a vocabulary of ", o.vocab_size, " from ", texts.size(), " training sentences");
    VocabBuildOptions vo;
    vo.size = o.vocab_size;
    vo.lowercase = o.lowercase;
    vo.threads = o.instances.threads;
    if (!o.quiet) vo.progress = [&report](const std::string& msg) { report.line(msg); };
    vocab = build_vocab(texts, vo);
    report.line("vocabulary: ", vocab.size(), " tokens (", fixed(report.elapsed(), 1), " s)");
  }
  const MaskingVocab masking = MaskingVocab::from(vocab);
  const int32_t unk = vocab.find("[UNK]");

  reset_out_dir(o.out);
  const fs::path out(o.out);
  vocab.save((out / "vocab.txt").string());

  // Tokenize every document at once: the heavy part, parallel.
  TokenizerOptions to;
  to.lowercase = o.lowercase;
  WordPiece wp(vocab, to);
  std::vector<TokenDocument> tokenized;
  {
    report.line("tokenizing ", docs.size(), " documents");
    std::atomic<int64_t> done{0}, bytes{0};
    const double t0 = report.elapsed();
    auto tick = [&] {
      double dt = std::max(1e-9, report.elapsed() - t0);
      report.line("tokenized ", done.load(), "/", docs.size(), " documents, ",
                  fixed(static_cast<double>(bytes.load()) / 1e6 / dt, 2), " MB/s, ", fixed(report.elapsed(), 1), " s");
    };
    tokenized = tokenize_documents(docs, wp, o.instances.threads, &done, &bytes, tick);
    tick();
  }
  std::vector<Document>().swap(docs);

  InstanceOptions io = o.instances;

  SplitResult results[3];
  int64_t text_tokens = 0, row_tokens = 0, unk_tokens = 0;
  for (int s = 0; s < 3; ++s) {
    const char* name = kSplitNames[s];
    SplitResult& r = results[s];
    std::vector<TokenDocument> split_docs;
    for (size_t i = 0; i < tokenized.size(); ++i) {
      if (split_of[i] != s || tokenized[i].empty()) continue;
      for (const auto& segment : tokenized[i]) {
        r.text_tokens += static_cast<int64_t>(segment.size());
        for (int32_t id : segment) unk_tokens += id == unk;
      }
      split_docs.push_back(std::move(tokenized[i]));
    }
    text_tokens += r.text_tokens;
    r.documents = static_cast<int64_t>(split_docs.size());
    if (split_docs.empty()) {
      report.line(name, ": no documents");
      continue;
    }

    // Each split draws from its own streams; instances are shuffled within
    // the split, as the reference shuffles all of its instances.
    io.seed = stream_seed(o.instances.seed, 0x1257a7ull, static_cast<uint64_t>(s));
    std::atomic<int64_t> done{0};
    const int64_t tasks = r.documents * o.instances.dupe_factor;
    report.line(name, ": making instances from ", r.documents, " documents x ", o.instances.dupe_factor, " rounds");
    std::vector<Instance> instances = make_instances(split_docs, masking, io, &done, [&] {
      report.line(name, ": ", done.load(), "/", tasks, " document rounds, ", fixed(report.elapsed(), 1), " s");
    });
    std::vector<TokenDocument>().swap(split_docs);
    std::vector<size_t> order(instances.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    Rng(stream_seed(o.instances.seed, 0x5f0ff1eull, static_cast<uint64_t>(s))).shuffle(order);
    r.rows = static_cast<int64_t>(instances.size());

    std::error_code ec;
    fs::create_directories(out / name, ec);
    COHORT_CHECK(!ec, DataError, (out / name).string(), ": cannot create (", ec.message(), ")");
    for (int64_t first = 0; first < r.rows; first += o.rows_per_shard, ++r.shards) {
      const int64_t last = std::min(r.rows, first + o.rows_per_shard);
      BertRows rows;
      rows.seq_len = o.instances.max_seq_length;
      rows.max_predictions = o.instances.max_predictions;
      const auto n = static_cast<size_t>(last - first);
      rows.input_ids.reserve(n * static_cast<size_t>(rows.seq_len));
      rows.input_mask.reserve(n * static_cast<size_t>(rows.seq_len));
      rows.segment_ids.reserve(n * static_cast<size_t>(rows.seq_len));
      rows.masked_lm_positions.reserve(n * static_cast<size_t>(rows.max_predictions));
      rows.masked_lm_ids.reserve(n * static_cast<size_t>(rows.max_predictions));
      rows.next_sentence_labels.reserve(n);
      for (int64_t i = first; i < last; ++i) append_row(rows, instances[order[static_cast<size_t>(i)]]);
      for (auto m : rows.input_mask) r.tokens += m;
      char file[32];
      std::snprintf(file, sizeof file, "part-%05lld.hdf5", static_cast<long long>(r.shards));
      write_bert_shard((out / name / file).string(), rows);
      report.line("wrote ", name, "/", file, " (", rows.rows(), " rows)");
    }
    row_tokens += r.tokens;
  }

  const double seconds = report.elapsed();
  const double unk_fraction = text_tokens > 0 ? static_cast<double>(unk_tokens) / static_cast<double>(text_tokens) : 0;
  nlohmann::json splits = nlohmann::json::object();
  for (int s = 0; s < 3; ++s) {
    splits[kSplitNames[s]] = {{"documents", results[s].documents},
                              {"rows", results[s].rows},
                              {"shards", results[s].shards},
                              {"tokens", results[s].tokens},
                              {"text_tokens", results[s].text_tokens}};
  }
  nlohmann::json manifest = {
      {"created_by", std::string("cohort prepare ") + kVersion},
      {"cohort_version", kVersion},
      {"vocab", "vocab.txt"},
      {"vocab_size", vocab.size()},
      {"vocab_source", o.vocab.empty() ? std::string("built") : o.vocab},
      {"lowercase", o.lowercase},
      {"max_seq_length", o.instances.max_seq_length},
      {"max_predictions", o.instances.max_predictions},
      {"masked_lm_prob", o.instances.masked_lm_prob},
      {"short_seq_prob", o.instances.short_seq_prob},
      {"dupe_factor", o.instances.dupe_factor},
      {"whole_word_mask", o.instances.whole_word_mask},
      {"valid_fraction", o.valid_fraction},
      {"test_fraction", o.test_fraction},
      {"rows_per_shard", o.rows_per_shard},
      {"seed", o.instances.seed},
      {"splits", splits},
      {"tokens", row_tokens},            // real tokens in the rows (input_mask's sum)
      {"text_tokens", text_tokens},      // WordPiece tokens of the documents
      {"unk_fraction", unk_fraction},
      {"text_bytes", text_bytes},
      {"inputs", inputs},
      {"seconds", std::round(seconds * 10) / 10},
  };
  write_file_atomically((out / "manifest.json").string(), manifest.dump(2) + "\n");

  if (!o.quiet) {
    const int64_t docs_total = results[0].documents + results[1].documents + results[2].documents;
    std::printf("cohort prepare: wrote %s\n", o.out.c_str());
    std::printf("  documents  %lld (train %lld, valid %lld, test %lld)\n", static_cast<long long>(docs_total),
                static_cast<long long>(results[0].documents), static_cast<long long>(results[1].documents),
                static_cast<long long>(results[2].documents));
    std::printf("  instances  train %lld, valid %lld, test %lld (length %lld, %lld predictions)\n",
                static_cast<long long>(results[0].rows), static_cast<long long>(results[1].rows),
                static_cast<long long>(results[2].rows), static_cast<long long>(o.instances.max_seq_length),
                static_cast<long long>(o.instances.max_predictions));
    std::printf("  tokens     %lld in the rows (%lld of text), [UNK] %s%% (vocabulary %d)\n",
                static_cast<long long>(row_tokens), static_cast<long long>(text_tokens),
                fixed(unk_fraction * 100, 3).c_str(), vocab.size());
    std::printf("  time       %s s, %s of text, %s MB/s\n", fixed(seconds, 1).c_str(), megabytes(text_bytes).c_str(),
                fixed(static_cast<double>(text_bytes) / 1e6 / std::max(seconds, 1e-9), 2).c_str());
    std::fflush(stdout);
  }
}

}  // namespace cohort::text
