#include "cohort/prep/prepare.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <system_error>

#include "cohort/core/error.hpp"
#include "cohort/core/files.hpp"
#include "cohort/data/bert_rows.hpp"
#include "cohort/data/manifest.hpp"
#include "cohort/prep/instances.hpp"
#include "cohort/text/bpe.hpp"
#include "cohort/text/wordpiece.hpp"

namespace cohort::prep {

namespace fs = std::filesystem;
using text::build_vocab;
using text::special_tokens;
using text::TokenizerOptions;
using text::VocabBuildOptions;

namespace {

constexpr const char* kSplitNames[3] = {"train", "valid", "test"};

void validate(const PrepareOptions& o) {
  COHORT_CHECK(!o.inputs.empty(), UsageError, "--input is required: a text file or the GCIDE .dict(.dz)");
  COHORT_CHECK(!o.out.empty(), UsageError, "--out is required: the output directory");
  COHORT_CHECK(o.tokenizer == "wordpiece" || o.tokenizer == "bpe", UsageError,
               "--tokenizer must be wordpiece or bpe, got ", o.tokenizer);
  if (o.tokenizer == "bpe") {
    COHORT_CHECK(!o.instances.whole_word_mask, UsageError, "--whole-word-mask finds words by WordPiece's ## "
                 "continuations; byte-level BPE has none: drop it with --tokenizer bpe");
    COHORT_CHECK(o.lowercase, UsageError, "--cased is WordPiece's: byte-level BPE keeps case and accents always");
    const auto least = static_cast<int32_t>(special_tokens().size()) + 256;
    COHORT_CHECK(!o.vocab.empty() || o.vocab_size >= least, UsageError, "--vocab-size must be at least ", least,
                 " with --tokenizer bpe (the special tokens and 256 bytes), got ", o.vocab_size);
  } else if (o.vocab.empty()) {
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
  COHORT_CHECK(o.instances.mask || o.instances.next_sentence || o.instances.dupe_factor == 1, UsageError,
               "--dupe-factor ", o.instances.dupe_factor, " with --masking none --nsp false would write the same rows ",
               o.instances.dupe_factor, " times; dynamic masking (task.masking dynamic) varies them: use --dupe-factor 1");
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

// "3.2 MB", or "12.5 kB" / "900 bytes" for what would print as 0.0 MB.
std::string megabytes(int64_t bytes) {
  if (bytes >= 50'000) return fixed(static_cast<double>(bytes) / 1e6, 1) + " MB";
  if (bytes >= 1'000) return fixed(static_cast<double>(bytes) / 1e3, 1) + " kB";
  return std::to_string(bytes) + " bytes";
}

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

// The documents of every input, in order: a document's index is its place
// overall. Each input's sizes go into the manifest.
std::vector<Document> read_inputs(const PrepareOptions& o, const Reporter& report, ManifestRecord& m) {
  std::vector<Document> docs;
  for (const std::string& path : o.inputs) {
    bool gcide = is_gcide(path);
    report.line("reading ", path, gcide ? " (GCIDE dictionary)" : " (text)");
    std::vector<Document> part = gcide ? read_gcide_documents(path) : read_text_documents(path);
    int64_t part_bytes = 0;
    for (const Document& d : part)
      for (const std::string& s : d) part_bytes += static_cast<int64_t>(s.size());
    std::error_code ec;
    auto file_bytes = fs::file_size(path, ec);
    m.inputs.push_back({path, gcide ? "gcide" : "text", ec ? 0 : static_cast<int64_t>(file_bytes),
                        static_cast<int64_t>(part.size()), part_bytes});
    report.line(path, ": ", part.size(), " documents, ", megabytes(part_bytes), " of text");
    m.text_bytes += part_bytes;
    for (Document& d : part) docs.push_back(std::move(d));
  }
  COHORT_CHECK(!docs.empty(), DataError, detail::join(o.inputs, ", "), ": no documents (no non-blank lines)");
  return docs;
}

// A vocabulary built from the training split's sentences only.
Vocab build_training_vocab(const PrepareOptions& o, const std::vector<Document>& docs,
                           const std::vector<int8_t>& split_of, const Reporter& report) {
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
  Vocab vocab = build_vocab(texts, vo);
  report.line("vocabulary: ", vocab.size(), " tokens (", fixed(report.elapsed(), 1), " s)");
  return vocab;
}

// A byte-level BPE's tokens by id, as the vocabulary the shards and masking
// read: it must hold BERT's special tokens ([CLS], [SEP], [MASK], [PAD]).
Vocab bpe_vocab(const text::ByteLevelBpe& bpe, const std::string& what) {
  std::vector<std::string> tokens = bpe.tokens();
  for (size_t i = 0; i < tokens.size(); ++i) {
    COHORT_CHECK(!tokens[i].empty() && tokens[i].find('\n') == std::string::npos, DataError, what, ": token ", i,
                 tokens[i].empty() ? " is missing (the ids have a gap)" : " holds a newline");
  }
  for (const auto& special : special_tokens())
    COHORT_CHECK(bpe.find(special) >= 0, DataError, what, " has no ", special,
                 " token, which BERT's rows and masks need (cohort prepare --tokenizer bpe trains a tokenizer with them)");
  return Vocab(std::move(tokens));
}

// A byte-level BPE trained on the training split's sentences only.
text::ByteLevelBpe train_bpe(const PrepareOptions& o, const std::vector<Document>& docs,
                             const std::vector<int8_t>& split_of, const Reporter& report) {
  report.line("training a byte-level BPE of ", o.vocab_size, " tokens on the training split");
  text::BpeTrainOptions bo;
  bo.vocab_size = o.vocab_size;
  bo.special_tokens = special_tokens();
  bo.max_length = o.instances.max_seq_length;
  auto bpe = text::ByteLevelBpe::train(
      [&](const std::function<void(std::string_view)>& sink) {
        for (size_t i = 0; i < docs.size(); ++i) {
          if (split_of[i] != 0) continue;
          for (const auto& sentence : docs[i]) sink(sentence);
        }
      },
      bo);
  report.line("byte-level BPE: ", bpe.size(), " tokens (", fixed(report.elapsed(), 1), " s)");
  return bpe;
}

// Every document at once: the heavy part, parallel.
std::vector<TokenDocument> tokenize_all(const PrepareOptions& o, const std::vector<Document>& docs,
                                        const SentenceEncoder& encode, const Reporter& report) {
  report.line("tokenizing ", docs.size(), " documents");
  std::atomic<int64_t> done{0}, bytes{0};
  const double t0 = report.elapsed();
  auto tick = [&] {
    double dt = std::max(1e-9, report.elapsed() - t0);
    report.line("tokenized ", done.load(), "/", docs.size(), " documents, ",
                fixed(static_cast<double>(bytes.load()) / 1e6 / dt, 2), " MB/s, ", fixed(report.elapsed(), 1), " s");
  };
  std::vector<TokenDocument> tokenized = tokenize_documents(docs, encode, o.instances.threads, &done, &bytes, tick);
  tick();
  return tokenized;
}

// Rows [first, last) of the split's shuffled instances as one shard.
BertRows shard_rows(const PrepareOptions& o, const std::vector<Instance>& instances, const std::vector<size_t>& order,
                    int64_t first, int64_t last) {
  BertRows rows;
  rows.seq_len = o.instances.max_seq_length;
  // --masking none: one column of no targets (the layout needs the keys).
  rows.max_predictions = o.instances.mask ? o.instances.max_predictions : 1;
  const auto n = static_cast<size_t>(last - first);
  rows.input_ids.reserve(n * static_cast<size_t>(rows.seq_len));
  rows.input_mask.reserve(n * static_cast<size_t>(rows.seq_len));
  rows.segment_ids.reserve(n * static_cast<size_t>(rows.seq_len));
  rows.masked_lm_positions.reserve(n * static_cast<size_t>(rows.max_predictions));
  rows.masked_lm_ids.reserve(n * static_cast<size_t>(rows.max_predictions));
  rows.next_sentence_labels.reserve(n);
  for (int64_t i = first; i < last; ++i) append_row(rows, instances[order[static_cast<size_t>(i)]]);
  return rows;
}

// Split `s`'s documents (taken from `tokenized`) as instances in shards
// under OUT/<name>/. Counts its [UNK] tokens into `unk_tokens`.
ManifestRecord::Split write_split(const PrepareOptions& o, int s, std::vector<TokenDocument>& tokenized,
                                  const std::vector<int8_t>& split_of, const MaskingVocab& masking, int32_t unk,
                                  const Reporter& report, int64_t& unk_tokens) {
  const char* name = kSplitNames[s];
  const fs::path out(o.out);
  ManifestRecord::Split r;
  std::vector<TokenDocument> split_docs;
  for (size_t i = 0; i < tokenized.size(); ++i) {
    if (split_of[i] != s || tokenized[i].empty()) continue;
    for (const auto& segment : tokenized[i]) {
      r.text_tokens += static_cast<int64_t>(segment.size());
      for (int32_t id : segment) unk_tokens += id == unk;
    }
    split_docs.push_back(std::move(tokenized[i]));
  }
  r.documents = static_cast<int64_t>(split_docs.size());
  if (split_docs.empty()) {
    report.line(name, ": no documents");
    return r;
  }

  // Each split draws from its own streams; instances are shuffled within
  // the split, as the reference shuffles all of its instances.
  InstanceOptions io = o.instances;
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
    BertRows rows = shard_rows(o, instances, order, first, std::min(r.rows, first + o.rows_per_shard));
    for (auto m : rows.input_mask) r.tokens += m;
    char file[32];
    std::snprintf(file, sizeof file, "part-%05lld.hdf5", static_cast<long long>(r.shards));
    write_bert_shard((out / name / file).string(), rows);
    report.line("wrote ", name, "/", file, " (", rows.rows(), " rows)");
  }
  return r;
}

// The manifest's record of the options.
ManifestRecord options_record(const PrepareOptions& o) {
  ManifestRecord m;
  m.vocab_source = o.vocab.empty() ? std::string("built") : o.vocab;
  m.tokenizer = o.tokenizer;
  m.lowercase = o.tokenizer == "bpe" ? false : o.lowercase;  // byte-level BPE keeps case
  m.max_seq_length = o.instances.max_seq_length;
  m.max_predictions = o.instances.mask ? o.instances.max_predictions : 1;
  m.masked_lm_prob = o.instances.masked_lm_prob;
  m.short_seq_prob = o.instances.short_seq_prob;
  m.dupe_factor = o.instances.dupe_factor;
  m.whole_word_mask = o.instances.whole_word_mask;
  m.masked = o.instances.mask;
  m.next_sentence = o.instances.next_sentence;
  m.valid_fraction = o.valid_fraction;
  m.test_fraction = o.test_fraction;
  m.rows_per_shard = o.rows_per_shard;
  m.seed = o.instances.seed;
  return m;
}

void print_summary(const PrepareOptions& o, const ManifestRecord& m) {
  const auto& tr = m.splits.at("train");
  const auto& va = m.splits.at("valid");
  const auto& te = m.splits.at("test");
  std::printf("cohort prepare: wrote %s\n", o.out.c_str());
  std::printf("  documents  %lld (train %lld, valid %lld, test %lld)\n",
              static_cast<long long>(tr.documents + va.documents + te.documents),
              static_cast<long long>(tr.documents), static_cast<long long>(va.documents),
              static_cast<long long>(te.documents));
  const std::string targets = o.instances.mask ? std::to_string(o.instances.max_predictions) + " predictions"
                                               : std::string("unmasked: train with task.masking dynamic");
  std::printf("  instances  train %lld, valid %lld, test %lld (%s, length %lld, %s)\n",
              static_cast<long long>(tr.rows), static_cast<long long>(va.rows), static_cast<long long>(te.rows),
              o.instances.next_sentence ? "sentence pairs" : "full sentences",
              static_cast<long long>(o.instances.max_seq_length), targets.c_str());
  std::printf("  tokens     %lld in the rows (%lld of text), [UNK] %s%% (vocabulary %d)\n",
              static_cast<long long>(m.tokens), static_cast<long long>(m.text_tokens),
              fixed(m.unk_fraction * 100, 3).c_str(), static_cast<int>(m.vocab_size));
  std::printf("  time       %s s, %s of text, %s MB/s\n", fixed(m.seconds, 1).c_str(), megabytes(m.text_bytes).c_str(),
              fixed(static_cast<double>(m.text_bytes) / 1e6 / std::max(m.seconds, 1e-9), 2).c_str());
  std::fflush(stdout);
}

}  // namespace

void run_prepare(const PrepareOptions& o) {
  validate(o);
  check_out_dir(o);
  Reporter report(o.quiet);
  ManifestRecord m = options_record(o);

  const bool bpe = o.tokenizer == "bpe";
  Vocab vocab;
  std::optional<text::ByteLevelBpe> byte_level;
  if (!o.vocab.empty()) {
    if (bpe) {
      byte_level = text::ByteLevelBpe::load(o.vocab);
      vocab = bpe_vocab(*byte_level, o.vocab);
    } else {
      vocab = Vocab::load(o.vocab);
    }
    report.line(bpe ? "tokenizer " : "vocabulary ", o.vocab, ": ", vocab.size(), " tokens");
  }
  std::vector<Document> docs = read_inputs(o, report, m);
  const std::vector<int8_t> split_of = assign_splits(docs.size(), o.valid_fraction, o.test_fraction, o.instances.seed);
  if (o.vocab.empty() && bpe) {
    byte_level = train_bpe(o, docs, split_of, report);
    vocab = bpe_vocab(*byte_level, "the trained tokenizer");
  } else if (o.vocab.empty()) {
    vocab = build_training_vocab(o, docs, split_of, report);
  }
  m.vocab_size = vocab.size();
  const MaskingVocab masking = MaskingVocab::from(vocab);  // before anything in OUT is touched

  reset_out_dir(o.out);
  vocab.save((fs::path(o.out) / "vocab.txt").string());
  SentenceEncoder encode;
  std::optional<WordPiece> wordpiece;
  if (bpe) {
    write_file_atomically((fs::path(o.out) / "tokenizer.json").string(), byte_level->to_json());
    encode = [&](const std::string& sentence) { return byte_level->encode(sentence, /*add_special_tokens=*/false); };
  } else {
    TokenizerOptions to;
    to.lowercase = o.lowercase;
    wordpiece.emplace(vocab, to);
    encode = [&](const std::string& sentence) { return wordpiece->encode(sentence); };
  }
  std::vector<TokenDocument> tokenized = tokenize_all(o, docs, encode, report);
  std::vector<Document>().swap(docs);

  int64_t unk_tokens = 0;
  for (int s = 0; s < 3; ++s) {
    ManifestRecord::Split r = write_split(o, s, tokenized, split_of, masking, vocab.find("[UNK]"), report, unk_tokens);
    m.text_tokens += r.text_tokens;
    m.tokens += r.tokens;
    m.splits[kSplitNames[s]] = r;
  }
  m.seconds = report.elapsed();
  m.unk_fraction = m.text_tokens > 0 ? static_cast<double>(unk_tokens) / static_cast<double>(m.text_tokens) : 0;
  write_manifest(o.out, m);
  if (!o.quiet) print_summary(o, m);
}

}  // namespace cohort::prep
