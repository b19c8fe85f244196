// `cohort prepare`: instance generation (structure, masking statistics,
// next-sentence pairs, whole-word masking, determinism), the document
// readers (text, gzip, GCIDE), and the pipeline end to end.
#include <gtest/gtest.h>

#include <random>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "cohort/core/error.hpp"
#include "cohort/data/bert_shards.hpp"
#include "cohort/prep/instances.hpp"
#include "cohort/prep/prepare.hpp"
#include "helpers.hpp"

using namespace cohort::text;
using namespace cohort::prep;
using cohort::test::error_of;
using cohort::test::TempDir;
using cohort::test::write_file;

namespace {

// Specials, then words w0..w(n-1), then continuations ##c0..##c(m-1).
Vocab tiny_vocab(int words = 40, int pieces = 10) {
  std::vector<std::string> tokens = special_tokens();
  for (int i = 0; i < words; ++i) tokens.push_back("w" + std::to_string(i));
  for (int i = 0; i < pieces; ++i) tokens.push_back("##c" + std::to_string(i));
  return Vocab(tokens);
}

// Documents of 3..12 sentences of 2..14 tokens: word starts, a third of
// them followed by one or two ## pieces. Every token of document d is drawn
// from its own band of words, w[band*10 .. band*10+9] with band = d % bands,
// so a test can tell which document a token came from.
std::vector<TokenDocument> synthetic_corpus(const Vocab& vocab, int docs, int bands, uint64_t seed) {
  const int32_t first_word = vocab.find("w0"), first_piece = vocab.find("##c0");
  Rng rng(seed);
  std::vector<TokenDocument> out(static_cast<size_t>(docs));
  for (int d = 0; d < docs; ++d) {
    const int band = d % bands;
    auto sentences = rng.between(3, 12);
    for (int64_t s = 0; s < sentences; ++s) {
      std::vector<int32_t> sentence;
      auto length = rng.between(2, 14);
      while (static_cast<int64_t>(sentence.size()) < length) {
        sentence.push_back(first_word + band * 10 + static_cast<int32_t>(rng.below(10)));
        if (rng.below(3) == 0) {
          auto n = rng.between(1, 2);
          for (int64_t k = 0; k < n; ++k) sentence.push_back(first_piece + static_cast<int32_t>(rng.below(10)));
        }
      }
      out[static_cast<size_t>(d)].push_back(sentence);
    }
  }
  return out;
}

InstanceOptions small_options() {
  InstanceOptions o;
  o.max_seq_length = 48;
  o.max_predictions = 8;
  o.masked_lm_prob = 0.15;
  o.short_seq_prob = 0.1;
  o.dupe_factor = 3;
  o.seed = 7;
  o.threads = 2;
  return o;
}

// The instance's tokens with the masked positions put back.
std::vector<int32_t> original_tokens(const Instance& inst) {
  std::vector<int32_t> t = inst.tokens;
  for (size_t k = 0; k < inst.positions.size(); ++k) t[static_cast<size_t>(inst.positions[k])] = inst.labels[k];
  return t;
}

bool is_special(const Instance& inst, int32_t pos) {
  return pos == 0 || pos == inst.segment_a - 1 || pos == static_cast<int32_t>(inst.tokens.size()) - 1;
}

// dictd's base64 for index offsets and lengths.
std::string b64(uint64_t v) {
  static const char* digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string s;
  do {
    s.insert(s.begin(), digits[v % 64]);
    v /= 64;
  } while (v);
  return s;
}

void write_gzip(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  gzclose(f);
}

}  // namespace

// ---- random streams ---------------------------------------------------------

TEST(PrepareRng, BoundedDrawsAndStreamsAreWellBehaved) {
  Rng rng(1);
  std::vector<int> counts(7, 0);
  for (int i = 0; i < 70000; ++i) ++counts[rng.below(7)];
  for (int c : counts) EXPECT_NEAR(c, 10000, 500);
  for (int i = 0; i < 1000; ++i) {
    auto v = rng.between(2, 5);
    EXPECT_GE(v, 2);
    EXPECT_LE(v, 5);
    double u = rng.uniform();
    EXPECT_GE(u, 0.0);
    EXPECT_LT(u, 1.0);
  }
  EXPECT_EQ(rng.below(1), 0u);
  // mt19937_64 is specified by the standard: the 10000th draw of the default seed.
  std::mt19937_64 reference;
  reference.discard(9999);
  EXPECT_EQ(reference(), 9981545732273789042ull);
  EXPECT_NE(stream_seed(1, 0, 0), stream_seed(1, 0, 1));
  EXPECT_NE(stream_seed(1, 0, 1), stream_seed(1, 1, 0));
  EXPECT_EQ(stream_seed(5, 2, 3), stream_seed(5, 2, 3));
}

TEST(PrepareSplits, DeterministicWithAtLeastOneEach) {
  auto count = [](const std::vector<int8_t>& s, int k) { return std::count(s.begin(), s.end(), k); };
  auto three = assign_splits(3, 0.01, 0.01, 1);
  EXPECT_EQ(count(three, 0), 1);
  EXPECT_EQ(count(three, 1), 1);
  EXPECT_EQ(count(three, 2), 1);
  auto many = assign_splits(1000, 0.1, 0.05, 9);
  EXPECT_EQ(count(many, 1), 100);
  EXPECT_EQ(count(many, 2), 50);
  EXPECT_EQ(many, assign_splits(1000, 0.1, 0.05, 9));
  EXPECT_NE(many, assign_splits(1000, 0.1, 0.05, 10));
  EXPECT_EQ(count(assign_splits(1000, 0, 0, 1), 0), 1000);
  EXPECT_EQ(count(assign_splits(2, 0.01, 0.01, 1), 0), 2);
  EXPECT_EQ(count(assign_splits(1, 0.5, 0.4, 1), 0), 1);
  EXPECT_EQ(count(assign_splits(4, 0.45, 0.45, 1), 0), 1);  // train keeps one
}

// ---- instances ----------------------------------------------------------------

TEST(PrepareInstances, NumToPredictFollowsTheReferenceFormula) {
  InstanceOptions o;
  o.max_predictions = 20;
  o.masked_lm_prob = 0.15;
  EXPECT_EQ(num_to_predict(3, o), 1);     // round(0.45) = 0, at least 1
  EXPECT_EQ(num_to_predict(10, o), 2);    // round(1.5) = 2, half to even
  EXPECT_EQ(num_to_predict(30, o), 4);    // round(4.5) = 4, half to even
  EXPECT_EQ(num_to_predict(40, o), 6);
  EXPECT_EQ(num_to_predict(128, o), 19);  // round(19.2)
  EXPECT_EQ(num_to_predict(512, o), 20);  // capped
  o.masked_lm_prob = 0;
  EXPECT_EQ(num_to_predict(100, o), 1);
}

TEST(PrepareInstances, RowsHaveTheBertLayout) {
  Vocab vocab = tiny_vocab(200);
  MaskingVocab mv = MaskingVocab::from(vocab);
  auto docs = synthetic_corpus(vocab, 60, 20, 1);
  InstanceOptions o = small_options();
  auto instances = make_instances(docs, mv, o);
  ASSERT_GT(instances.size(), 100u);

  cohort::BertRows rows;
  rows.seq_len = o.max_seq_length;
  rows.max_predictions = o.max_predictions;
  for (const Instance& inst : instances) append_row(rows, inst);
  ASSERT_EQ(rows.rows(), static_cast<int64_t>(instances.size()));
  ASSERT_EQ(rows.input_ids.size(), instances.size() * 48);
  ASSERT_EQ(rows.masked_lm_positions.size(), instances.size() * 8);

  for (size_t r = 0; r < instances.size(); ++r) {
    const Instance& inst = instances[r];
    const auto len = static_cast<int32_t>(inst.tokens.size());
    SCOPED_TRACE("instance " + std::to_string(r));
    ASSERT_LE(len, 48);
    ASSERT_GE(inst.segment_a, 3);       // [CLS] A [SEP], |A| >= 1
    ASSERT_GE(len - inst.segment_a, 2);  // B [SEP], |B| >= 1
    EXPECT_EQ(inst.tokens[0], mv.cls);
    EXPECT_EQ(inst.tokens[static_cast<size_t>(inst.segment_a - 1)], mv.sep);
    EXPECT_EQ(inst.tokens.back(), mv.sep);
    EXPECT_EQ(std::count(inst.tokens.begin(), inst.tokens.end(), mv.sep), 2);
    EXPECT_EQ(std::count(inst.tokens.begin(), inst.tokens.end(), mv.cls), 1);

    const int32_t* ids = &rows.input_ids[r * 48];
    const int8_t* mask = &rows.input_mask[r * 48];
    const int8_t* seg = &rows.segment_ids[r * 48];
    for (int32_t i = 0; i < 48; ++i) {
      if (i < len) {
        EXPECT_EQ(ids[i], inst.tokens[static_cast<size_t>(i)]);
        EXPECT_EQ(mask[i], 1);
        EXPECT_EQ(seg[i], i < inst.segment_a ? 0 : 1);
      } else {
        EXPECT_EQ(ids[i], 0);
        EXPECT_EQ(mask[i], 0);
        EXPECT_EQ(seg[i], 0);
      }
    }
    const int32_t* pos = &rows.masked_lm_positions[r * 8];
    const int32_t* lab = &rows.masked_lm_ids[r * 8];
    for (size_t k = 0; k < 8; ++k) {
      if (k < inst.positions.size()) {
        EXPECT_EQ(pos[k], inst.positions[k]);
        EXPECT_EQ(lab[k], inst.labels[k]);
      } else {
        EXPECT_EQ(pos[k], 0);
        EXPECT_EQ(lab[k], 0);
      }
    }
    EXPECT_EQ(rows.next_sentence_labels[r], inst.random_next ? 1 : 0);
  }
}

TEST(PrepareInstances, MaskedPositionsAreSortedUniqueAndNeverSpecial) {
  Vocab vocab = tiny_vocab(200);
  MaskingVocab mv = MaskingVocab::from(vocab);
  auto docs = synthetic_corpus(vocab, 60, 20, 2);
  InstanceOptions o = small_options();
  for (const Instance& inst : make_instances(docs, mv, o)) {
    const auto len = static_cast<int64_t>(inst.tokens.size());
    ASSERT_EQ(static_cast<int64_t>(inst.positions.size()), num_to_predict(len, o));
    ASSERT_EQ(inst.labels.size(), inst.positions.size());
    for (size_t k = 0; k < inst.positions.size(); ++k) {
      int32_t p = inst.positions[k];
      EXPECT_GT(p, 0);
      EXPECT_LT(p, len);
      EXPECT_FALSE(is_special(inst, p)) << p;
      if (k > 0) {
        EXPECT_LT(inst.positions[k - 1], p);
      }
      // Labels are real tokens, never specials.
      EXPECT_NE(inst.labels[k], mv.cls);
      EXPECT_NE(inst.labels[k], mv.sep);
      EXPECT_NE(inst.labels[k], mv.mask);
    }
  }
}

TEST(PrepareInstances, MaskingRatesMatchBert) {
  Vocab vocab = tiny_vocab(200, 10);
  MaskingVocab mv = MaskingVocab::from(vocab);
  auto docs = synthetic_corpus(vocab, 400, 20, 3);
  InstanceOptions o = small_options();
  o.max_seq_length = 64;
  o.max_predictions = 20;
  o.dupe_factor = 5;
  auto instances = make_instances(docs, mv, o);
  int64_t tokens = 0, masked = 0, as_mask = 0, kept = 0, random = 0;
  for (const Instance& inst : instances) {
    tokens += static_cast<int64_t>(inst.tokens.size());
    for (size_t k = 0; k < inst.positions.size(); ++k) {
      int32_t now = inst.tokens[static_cast<size_t>(inst.positions[k])];
      ++masked;
      if (now == mv.mask) ++as_mask;
      else if (now == inst.labels[k]) ++kept;
      else ++random;
    }
  }
  ASSERT_GT(masked, 20000);
  double rate = static_cast<double>(masked) / static_cast<double>(tokens);
  EXPECT_NEAR(rate, 0.15, 0.02);
  EXPECT_NEAR(static_cast<double>(as_mask) / static_cast<double>(masked), 0.80, 0.02);
  EXPECT_NEAR(static_cast<double>(kept) / static_cast<double>(masked), 0.10, 0.02);
  EXPECT_NEAR(static_cast<double>(random) / static_cast<double>(masked), 0.10, 0.02);
}

TEST(PrepareInstances, NextSentenceIsHalfRandomAndRandomSpansComeFromAnotherDocument) {
  Vocab vocab = tiny_vocab(200);
  MaskingVocab mv = MaskingVocab::from(vocab);
  const int32_t first_word = vocab.find("w0");
  // 20 documents, each with its own band of words.
  auto docs = synthetic_corpus(vocab, 20, 20, 4);
  InstanceOptions o = small_options();
  o.dupe_factor = 40;
  auto instances = make_instances(docs, mv, o);
  int64_t random_next = 0;
  for (const Instance& inst : instances) {
    random_next += inst.random_next;
    std::vector<int32_t> t = original_tokens(inst);
    std::set<int32_t> bands_a, bands_b;
    for (int32_t i = 1; i + 1 < static_cast<int32_t>(t.size()); ++i) {
      int32_t id = t[static_cast<size_t>(i)];
      if (is_special(inst, i) || id < first_word || id >= first_word + 200) continue;  // pieces carry no band
      (i < inst.segment_a ? bands_a : bands_b).insert((id - first_word) / 10);
    }
    ASSERT_EQ(bands_a.size(), 1u);
    ASSERT_LE(bands_b.size(), 1u);
    if (bands_b.empty()) continue;  // B was only ## pieces after truncation
    if (inst.random_next) {
      EXPECT_NE(*bands_a.begin(), *bands_b.begin());
    } else {
      EXPECT_EQ(*bands_a.begin(), *bands_b.begin());
    }
  }
  double fraction = static_cast<double>(random_next) / static_cast<double>(instances.size());
  // 0.5, plus the single-sentence chunks at document ends that must be random.
  EXPECT_GT(fraction, 0.45);
  EXPECT_LT(fraction, 0.65);
}

TEST(PrepareInstances, WholeWordMaskingNeverSplitsAWord) {
  Vocab vocab = tiny_vocab(200);
  MaskingVocab mv = MaskingVocab::from(vocab);
  auto docs = synthetic_corpus(vocab, 200, 20, 5);
  InstanceOptions o = small_options();
  // Counts words cut by masking: a ## piece masked while the piece before it
  // is not, or the other way round.
  auto split_words = [&](const std::vector<Instance>& instances) {
    int64_t splits = 0;
    for (const Instance& inst : instances) {
      std::vector<int32_t> t = original_tokens(inst);
      std::set<int32_t> masked(inst.positions.begin(), inst.positions.end());
      for (int32_t i = 2; i < static_cast<int32_t>(t.size()); ++i) {
        if (is_special(inst, i) || is_special(inst, i - 1)) continue;
        if (!mv.continuation[static_cast<size_t>(t[static_cast<size_t>(i)])]) continue;
        splits += masked.count(i) != masked.count(i - 1);
      }
      EXPECT_LE(static_cast<int64_t>(inst.positions.size()), num_to_predict(static_cast<int64_t>(t.size()), o));
    }
    return splits;
  };
  EXPECT_GT(split_words(make_instances(docs, mv, o)), 100);  // the check can fail
  o.whole_word_mask = true;
  auto whole = make_instances(docs, mv, o);
  EXPECT_EQ(split_words(whole), 0);
  int64_t masked = 0, tokens = 0;
  for (const Instance& inst : whole) {
    masked += static_cast<int64_t>(inst.positions.size());
    tokens += static_cast<int64_t>(inst.tokens.size());
  }
  EXPECT_NEAR(static_cast<double>(masked) / static_cast<double>(tokens), 0.15, 0.03);
}

TEST(PrepareInstances, SameSeedSameInstancesOnAnyThreadCount) {
  Vocab vocab = tiny_vocab(200);
  MaskingVocab mv = MaskingVocab::from(vocab);
  auto docs = synthetic_corpus(vocab, 150, 20, 6);
  InstanceOptions o = small_options();
  o.whole_word_mask = true;
  o.threads = 1;
  auto one = make_instances(docs, mv, o);
  o.threads = 3;
  auto three = make_instances(docs, mv, o);
  ASSERT_EQ(one.size(), three.size());
  for (size_t i = 0; i < one.size(); ++i) {
    ASSERT_EQ(one[i].tokens, three[i].tokens) << i;
    ASSERT_EQ(one[i].segment_a, three[i].segment_a) << i;
    ASSERT_EQ(one[i].positions, three[i].positions) << i;
    ASSERT_EQ(one[i].labels, three[i].labels) << i;
    ASSERT_EQ(one[i].random_next, three[i].random_next) << i;
  }
  o.seed = 8;
  auto other = make_instances(docs, mv, o);
  bool differs = other.size() != one.size();
  for (size_t i = 0; !differs && i < one.size(); ++i) differs = other[i].tokens != one[i].tokens;
  EXPECT_TRUE(differs);
}

TEST(PrepareInstances, ShortSequencesAndTruncationStayInBounds) {
  Vocab vocab = tiny_vocab(200);
  MaskingVocab mv = MaskingVocab::from(vocab);
  auto docs = synthetic_corpus(vocab, 50, 20, 7);
  docs.push_back({std::vector<int32_t>(100, vocab.find("w5"))});  // one sentence longer than a sequence
  InstanceOptions o = small_options();
  o.max_seq_length = 8;
  o.max_predictions = 2;
  o.short_seq_prob = 1.0;
  for (const Instance& inst : make_instances(docs, mv, o)) {
    ASSERT_LE(inst.tokens.size(), 8u);
    ASSERT_GE(inst.segment_a, 3);
    ASSERT_GE(static_cast<int32_t>(inst.tokens.size()) - inst.segment_a, 2);
  }
}

// ---- readers --------------------------------------------------------------------

TEST(PrepareReaders, TextDocumentsAreSeparatedByBlankLines) {
  TempDir tmp;
  const std::string text = "First sentence.\nSecond one.\n\n\n   \nThird\r\n\nFourth\n  Fifth  ";
  write_file(tmp / "a.txt", text);
  std::vector<Document> expected = {{"First sentence.", "Second one."}, {"Third"}, {"Fourth", "Fifth"}};
  EXPECT_EQ(read_text_documents(tmp / "a.txt"), expected);
  write_gzip(tmp / "a.txt.gz", text);
  EXPECT_EQ(read_text_documents(tmp / "a.txt.gz"), expected);
  write_file(tmp / "empty.txt", "\n\n");
  EXPECT_TRUE(read_text_documents(tmp / "empty.txt").empty());

  std::string missing = tmp / "missing.txt";
  EXPECT_THROW(read_text_documents(missing), cohort::DataError);
  EXPECT_NE(error_of([&] { read_text_documents(missing); }).find(missing), std::string::npos);
  EXPECT_NE(error_of([&] { read_text_documents(tmp.path()); }).find("directory"), std::string::npos);
  write_file(tmp / "bad.gz", std::string("\x1f\x8b\x08\x00garbage that is not deflate", 31));
  EXPECT_NE(error_of([&] { read_text_documents(tmp / "bad.gz"); }).find("bad.gz"), std::string::npos);

  // Hardening: random bytes were read as text and written as shards. A
  // stray byte in real text is kept; "é" and "日本" are text.
  std::string noise;
  std::mt19937 rng(7);
  for (int i = 0; i < 4096; ++i) noise += static_cast<char>(rng() & 0xFF);
  write_file(tmp / "noise.bin", noise);
  EXPECT_NE(error_of([&] { read_text_documents(tmp / "noise.bin"); }).find("is not UTF-8 text"), std::string::npos);
  std::string fine = "Caf\xC3\xA9 au lait.\n\xE6\x97\xA5\xE6\x9C\xAC\n";
  for (int i = 0; i < 20; ++i) fine += "A plain English sentence of some length.\n";
  fine += "One stray \xFF byte.\n";
  write_file(tmp / "fine.txt", fine);
  EXPECT_EQ(read_text_documents(tmp / "fine.txt").size(), 1u);
  write_file(tmp / "overlong.txt", std::string("\xC0\xAF\xED\xA0\x80\xF4\x90\x80\x80\0x", 12));
  EXPECT_NE(error_of([&] { read_text_documents(tmp / "overlong.txt"); }).find("11 of 13 bytes"), std::string::npos)
      << error_of([&] { read_text_documents(tmp / "overlong.txt"); });
}

namespace {

// Three entries in the dictd layout of /usr/share/dictd/gcide.dict.dz.
const char* kHeader =
    "00-database-short\n"
    "   The Collaborative International Dictionary of English v.0.48\n";
const char* kAffect =
    "Affect \\Af*fect\"\\, v. t. [imp. & p. p. {Affected}; p. pr. & vb.\n"
    "   n. {Affecting}.] [L. affectus, p. p. of afficere.]\n"
    "   1. To act upon; to produce an effect or change upon.\n"
    "      [1913 Webster]\n"
    "\n"
    "            As might affect the earth with cold heat. --Milton.\n"
    "      [1913 Webster]\n"
    "\n"
    "   2. To love; to regard with affection. [Obs.]\n"
    "      [1913 Webster]\n";
const char* kCafe =
    "Cafe \\Ca*fe\"\\ (k[.a]`f[=a]\"), n. A coffee house; a r['e]gime of {coffee}. It\n"
    "   costs 5[pounds]. See <i>Coffee</i>. Used in Gr. ? texts.\n"
    "   [1913 Webster]\n"
    "\n"
    "   Syn: coffeehouse, coffee shop.\n"
    "        [WordNet 1.5]\n";

const std::vector<Document> kExpected = {
    {"Affect, v. t.", "To act upon; to produce an effect or change upon.", "As might affect the earth with cold heat.",
     "To love; to regard with affection."},
    {"Cafe, n. A coffee house; a regime of coffee.", "It costs 5\u00a3.", "See Coffee.", "Used in Gr. texts.",
     "Syn: coffeehouse, coffee shop."},
};

}  // namespace

TEST(PrepareReaders, GcideEntriesLoseTheirMarkup) {
  EXPECT_EQ(gcide_sentences(kAffect), kExpected[0]);
  EXPECT_EQ(gcide_sentences(kCafe), kExpected[1]);
  EXPECT_EQ(gcide_sentences("Abb \\Abb\\, n. Wool. --Shak.\n   [1913 Webster]\n"),
            std::vector<std::string>{"Abb, n. Wool."});
  EXPECT_TRUE(gcide_sentences("   [1913 Webster]\n").empty());
}

TEST(PrepareReaders, GcideDictionaryWithAndWithoutIndex) {
  TempDir tmp;
  const std::string header = kHeader, affect = kAffect, cafe = kCafe;
  const std::string dict = "\n" + header + "\n" + affect + "\n" + cafe + "\n";
  // Without an index, entries are found by layout.
  write_file(tmp / "plain.dict", dict);
  EXPECT_EQ(read_gcide_documents(tmp / "plain.dict"), kExpected);

  // With one: several headwords may share an entry; 00-database-* and its
  // aliases are skipped.
  const size_t h = 1, a = h + header.size() + 1, c = a + affect.size() + 1;
  std::string index;
  auto line = [&](const std::string& word, size_t off, size_t len) { index += word + "\t" + b64(off) + "\t" + b64(len) + "\n"; };
  line("00-database-short", h, header.size());
  line("00-gcide-short", h, header.size());
  line("Affect", a, affect.size());
  line("affect", a, affect.size());
  line("Cafe", c, cafe.size());
  write_gzip(tmp / "dict.dict.dz", dict);
  write_file(tmp / "dict.index", index);
  EXPECT_EQ(read_gcide_documents(tmp / "dict.dict.dz"), kExpected);

  write_file(tmp / "dict.index", index + "Beyond\t" + b64(dict.size()) + "\tB\n");
  EXPECT_NE(error_of([&] { read_gcide_documents(tmp / "dict.dict.dz"); }).find("dict.index:6"), std::string::npos);
  EXPECT_NE(error_of([&] { read_gcide_documents(tmp / "none.dict.dz"); }).find("none.dict.dz"), std::string::npos);
}

TEST(PrepareReaders, TheInstalledGcide) {
  const std::string path = "/usr/share/dictd/gcide.dict.dz";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is not installed (apt-get install dict-gcide)";
  auto docs = read_gcide_documents(path);
  EXPECT_GT(docs.size(), 100000u);
  for (size_t i = 0; i < docs.size(); i += 997) {
    for (const std::string& s : docs[i]) {
      EXPECT_EQ(s.find('{'), std::string::npos) << s;
      EXPECT_EQ(s.find('\\'), std::string::npos) << s;
      EXPECT_EQ(s.find("[1913 Webster]"), std::string::npos) << s;
      EXPECT_EQ(s.find("00-database"), std::string::npos) << s;
    }
  }
}

// ---- the pipeline -----------------------------------------------------------------

namespace {

// A corpus of n documents over a few words, and a vocabulary covering them.
void write_corpus(const TempDir& tmp, int n) {
  static const char* words[] = {"the", "cat", "dog", "sat", "on", "a", "mat", "ran", "far", "away", "big", "small"};
  Rng rng(11);
  std::string text;
  for (int d = 0; d < n; ++d) {
    for (int64_t s = rng.between(2, 6); s > 0; --s) {
      for (int64_t w = rng.between(3, 9); w > 0; --w) text += std::string(words[rng.below(12)]) + " ";
      text += ".\n";
    }
    text += "\n";
  }
  write_file(tmp / "corpus.txt", text);
  std::string vocab;
  for (const auto& t : special_tokens()) vocab += t + "\n";
  for (const char* w : words) vocab += std::string(w) + "\n";
  vocab += ".\n";
  write_file(tmp / "vocab.txt", vocab);
}

}  // namespace

TEST(PreparePipeline, WritesVocabShardsAndManifest) {
  TempDir tmp;
  write_corpus(tmp, 40);
  PrepareOptions o;
  o.inputs = {tmp / "corpus.txt"};
  o.out = tmp / "out";
  o.vocab = tmp / "vocab.txt";
  o.instances.max_seq_length = 32;
  o.instances.max_predictions = 5;
  o.instances.dupe_factor = 2;
  o.valid_fraction = 0.1;
  o.test_fraction = 0.1;
  o.rows_per_shard = 16;
  o.instances.threads = 2;
  o.quiet = true;
  run_prepare(o);

  EXPECT_EQ(cohort::test::read_file(tmp / "out/vocab.txt"), cohort::test::read_file(tmp / "vocab.txt"));
  auto m = nlohmann::json::parse(cohort::test::read_file(tmp / "out/manifest.json"));
  EXPECT_EQ(m["vocab_size"], 18);
  EXPECT_EQ(m["max_seq_length"], 32);
  EXPECT_EQ(m["max_predictions"], 5);
  EXPECT_EQ(m["dupe_factor"], 2);
  EXPECT_EQ(m["seed"], 12345);
  EXPECT_EQ(m["lowercase"], true);
  EXPECT_EQ(m["unk_fraction"], 0.0);
  EXPECT_EQ(m["inputs"][0]["path"], tmp / "corpus.txt");
  EXPECT_EQ(m["splits"]["train"]["documents"], 32);
  EXPECT_EQ(m["splits"]["valid"]["documents"], 4);
  EXPECT_EQ(m["splits"]["test"]["documents"], 4);
  for (const char* split : {"train", "valid", "test"}) {
    int64_t rows = m["splits"][split]["rows"], shards = m["splits"][split]["shards"];
    EXPECT_GE(rows, 2 * m["splits"][split]["documents"].get<int64_t>()) << split;
    EXPECT_EQ(shards, (rows + 15) / 16) << split;
    for (int64_t s = 0; s < shards; ++s) {
      char name[64];
      std::snprintf(name, sizeof name, "out/%s/part-%05lld.hdf5", split, static_cast<long long>(s));
      EXPECT_TRUE(std::filesystem::exists(tmp / name)) << name;
    }
  }
  // `tokens` counts the real tokens of the rows (what training sees), and
  // `text_tokens` those of the documents.
  int64_t in_rows = 0;
  for (const char* split : {"train", "valid", "test"}) {
    cohort::BertShards shards(tmp / "out", split, {});
    std::vector<int64_t> all(static_cast<size_t>(shards.size()));
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
    const int64_t n = shards.get_batch(all).at("input_mask").sum().item<int64_t>();
    EXPECT_EQ(m["splits"][split]["tokens"], n) << split;
    in_rows += n;
  }
  EXPECT_EQ(m["tokens"], in_rows);
  EXPECT_GT(m["text_tokens"].get<int64_t>(), 0);

  // Not over an earlier run, unless asked.
  std::string err = error_of([&] { run_prepare(o); });
  EXPECT_NE(err.find("--overwrite"), std::string::npos) << err;
  EXPECT_THROW(run_prepare(o), cohort::UsageError);
  o.overwrite = true;
  o.rows_per_shard = 1000;
  run_prepare(o);
  EXPECT_FALSE(std::filesystem::exists(tmp / "out/train/part-00001.hdf5"));
  EXPECT_TRUE(std::filesystem::exists(tmp / "out/train/part-00000.hdf5"));
}

TEST(PreparePipeline, BuildsAVocabularyFromTheTrainingSplit) {
  TempDir tmp;
  write_corpus(tmp, 20);
  PrepareOptions o;
  o.inputs = {tmp / "corpus.txt"};
  o.out = tmp / "out";
  o.vocab_size = 100;
  o.instances.max_seq_length = 32;
  o.instances.max_predictions = 5;
  o.instances.dupe_factor = 1;
  o.quiet = true;
  run_prepare(o);
  auto lines = cohort::test::lines_of(cohort::test::read_file(tmp / "out/vocab.txt"));
  ASSERT_GE(lines.size(), special_tokens().size());
  EXPECT_TRUE(std::equal(special_tokens().begin(), special_tokens().end(), lines.begin()));
  auto m = nlohmann::json::parse(cohort::test::read_file(tmp / "out/manifest.json"));
  EXPECT_EQ(m["vocab_size"], lines.size());
  EXPECT_EQ(m["vocab_source"], "built");
}

TEST(PreparePipeline, BadOptionsAreUsageErrorsNamingTheFlag) {
  TempDir tmp;
  write_corpus(tmp, 5);
  auto err = [&](const std::function<void(PrepareOptions&)>& change) {
    PrepareOptions o;
    o.inputs = {tmp / "corpus.txt"};
    o.out = tmp / "out";
    o.quiet = true;
    change(o);
    try {
      run_prepare(o);
    } catch (const cohort::UsageError& e) {
      return std::string(e.what());
    }
    return std::string("(no usage error)");
  };
  EXPECT_NE(err([](auto& o) { o.instances.max_seq_length = 4; }).find("--max-seq-length"), std::string::npos);
  EXPECT_NE(err([](auto& o) { o.instances.max_predictions = 0; }).find("--max-predictions"), std::string::npos);
  EXPECT_NE(err([](auto& o) { o.instances.max_predictions = 128; }).find("--max-predictions"), std::string::npos);
  EXPECT_NE(err([](auto& o) { o.instances.masked_lm_prob = 1.5; }).find("--masked-lm-prob"), std::string::npos);
  EXPECT_NE(err([](auto& o) { o.instances.short_seq_prob = -0.1; }).find("--short-seq-prob"), std::string::npos);
  EXPECT_NE(err([](auto& o) { o.instances.dupe_factor = 0; }).find("--dupe-factor"), std::string::npos);
  EXPECT_NE(err([](auto& o) { o.valid_fraction = 0.6; o.test_fraction = 0.5; }).find("--test-fraction"),
            std::string::npos);
  EXPECT_NE(err([](auto& o) { o.rows_per_shard = 0; }).find("--rows-per-shard"), std::string::npos);
  EXPECT_NE(err([](auto& o) { o.instances.threads = -1; }).find("--threads"), std::string::npos);
  EXPECT_NE(err([](auto& o) { o.inputs.clear(); }).find("--input"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(tmp / "out"));

  std::string missing = tmp / "missing.txt";
  PrepareOptions o;
  o.inputs = {missing};
  o.out = tmp / "out";
  o.quiet = true;
  EXPECT_NE(error_of([&] { run_prepare(o); }).find(missing), std::string::npos);
  EXPECT_THROW(run_prepare(o), cohort::DataError);
}

// ---- the command line ----------------------------------------------------------------

TEST(PrepareCli, HelpShowsDefaultsAndErrorsAreOneLine) {
  using cohort::test::run_cohort;
  auto help = run_cohort("prepare --help");
  ASSERT_EQ(help.code, 0) << help.err;
  for (const char* flag : {"--max-seq-length INT=128", "--max-predictions INT=20", "--masked-lm-prob FLOAT=0.15",
                           "--dupe-factor INT=5", "--vocab-size INT=30522", "--seed UINT=12345"}) {
    EXPECT_NE(help.out.find(flag), std::string::npos) << flag << "\n" << help.out;
  }
  TempDir tmp;
  write_corpus(tmp, 12);
  auto missing_input = run_cohort("prepare --out " + (tmp / "out"));
  EXPECT_EQ(missing_input.code, 2);
  EXPECT_NE(missing_input.err.find("cohort: error: --input"), std::string::npos) << missing_input.err;
  auto bad = run_cohort("prepare --input " + (tmp / "corpus.txt") + " --out " + (tmp / "out") + " --masked-lm-prob 2");
  EXPECT_EQ(bad.code, 2);
  EXPECT_EQ(cohort::test::lines_of(bad.err).size(), 1u) << bad.err;
  EXPECT_NE(bad.err.find("--masked-lm-prob"), std::string::npos) << bad.err;
  auto gone = run_cohort("prepare --input " + (tmp / "gone.txt") + " --out " + (tmp / "out"));
  EXPECT_EQ(gone.code, 1);
  EXPECT_NE(gone.err.find("gone.txt"), std::string::npos) << gone.err;

  auto ok = run_cohort("prepare --input " + (tmp / "corpus.txt") + " --out " + (tmp / "out") + " --vocab " +
                       (tmp / "vocab.txt") + " --max-seq-length 32 --max-predictions 4 --dupe-factor 1 --threads 2");
  ASSERT_EQ(ok.code, 0) << ok.err;
  EXPECT_NE(ok.out.find("[UNK]"), std::string::npos) << ok.out;
  EXPECT_NE(ok.err.find("MB/s"), std::string::npos) << ok.err;
  // A small corpus is counted in kB or bytes, not as "0.0 MB".
  EXPECT_EQ(ok.err.find("0.0 MB"), std::string::npos) << ok.err;
  EXPECT_TRUE(ok.err.find(" kB of text") != std::string::npos || ok.err.find(" bytes of text") != std::string::npos)
      << ok.err;
  EXPECT_TRUE(std::filesystem::exists(tmp / "out/manifest.json"));
  auto again = run_cohort("prepare --input " + (tmp / "corpus.txt") + " --out " + (tmp / "out") + " --quiet");
  EXPECT_EQ(again.code, 2);
  EXPECT_NE(again.err.find("--overwrite"), std::string::npos) << again.err;
}
