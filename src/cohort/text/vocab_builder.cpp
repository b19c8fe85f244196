// defines: build_vocab (declared in wordpiece.hpp)
//
// WordPiece vocabulary learning, in three steps:
//
// 1. Count the words of the basic pass, in parallel over the texts. Counts are
//    sums, so the result does not depend on the thread count.
// 2. The alphabet: every character of every word (rare words included, so that
//    any text like the corpus tokenizes without [UNK]) as `c`, and as `##c`
//    when it occurs inside a word.
// 3. Merges over the words seen at least min_count times, each split into its
//    characters (`w ##o ##r ##d`): each step merges the adjacent pair (a, b)
//    seen most often, ties broken by the smaller (a, b) in string order;
//    `a` + `##b` becomes `ab` and `##a` + `##b` becomes `##ab`. Until the
//    vocabulary has opts.size tokens or no pair remains.
//
// The criterion is the pair count, as in BPE. That is what the HuggingFace
// `tokenizers` WordPieceTrainer does (it is its BpeTrainer with a "##"
// prefix). The score count(ab) / (count(a) * count(b)) that the HuggingFace
// course describes for WordPiece was tried and rejected: on GCIDE it spent the
// budget on digit strings and on every prefix of rare words (sphag, sphagn,
// sphagnu, ...), left out "and", and gave 2.2 tokens per word against 1.07.
//
// Pair counts are updated in place from the words that hold the merged pair
// (an index kept per pair), never recounted. A max-heap holds one valid entry
// per pair; a pair whose count changed gets a new entry with a new version
// stamp, and entries with an old stamp are skipped when popped.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <queue>
#include <thread>
#include <unordered_map>

#include "cohort/core/error.hpp"
#include "cohort/text/basic_pass.hpp"
#include "cohort/text/wordpiece.hpp"

namespace cohort::text {
namespace {

using WordCounts = std::unordered_map<std::string, int64_t>;

class CountSink final : public internal::WordSink {
 public:
  explicit CountSink(WordCounts& counts) : counts_(counts) {}
  void word(std::string_view bytes, const uint32_t*, size_t) override {
    key_.assign(bytes.data(), bytes.size());  // reuses key_'s buffer
    ++counts_[key_];
  }

 private:
  WordCounts& counts_;
  std::string key_;
};

WordCounts count_words(const std::vector<std::string>& texts, bool lowercase, int threads) {
  const size_t block = 64;  // texts per claim: balances uneven text sizes
  std::atomic<size_t> next{0};
  std::vector<WordCounts> partial(static_cast<size_t>(threads));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));
  auto work = [&](size_t t) {
    try {
      CountSink sink(partial[t]);
      for (size_t lo; (lo = next.fetch_add(block)) < texts.size();) {
        for (size_t i = lo; i < std::min(texts.size(), lo + block); ++i)
          internal::basic_pass(texts[i], lowercase, sink);
      }
    } catch (...) {
      errors[t] = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < partial.size(); ++t) pool.emplace_back(work, t);
  work(0);
  for (auto& th : pool) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  // Merge into the largest map.
  auto largest = std::max_element(partial.begin(), partial.end(),
                                  [](const WordCounts& x, const WordCounts& y) { return x.size() < y.size(); });
  WordCounts total = std::move(*largest);
  for (auto& p : partial) {
    for (auto& [w, c] : p) total[w] += c;
    WordCounts().swap(p);
  }
  return total;
}

// UTF-8 code points of `word`, as strings.
std::vector<std::string_view> chars_of(std::string_view word) {
  std::vector<std::string_view> out;
  for (size_t i = 0; i < word.size();) {
    size_t j = i + 1;
    while (j < word.size() && (static_cast<unsigned char>(word[j]) & 0xC0) == 0x80) ++j;
    out.push_back(word.substr(i, j - i));
    i = j;
  }
  return out;
}

class Merger {
 public:
  // `symbols`: the alphabet, every string a symbol id; `words`: the training
  // words as symbol ids, with their counts.
  Merger(std::vector<std::string> symbols, const std::vector<std::vector<int32_t>>& words,
         std::vector<int64_t> counts)
      : symbols_(std::move(symbols)), word_count_(std::move(counts)) {
    for (size_t i = 0; i < symbols_.size(); ++i) symbol_id_.emplace(symbols_[i], static_cast<int32_t>(i));
    for (uint32_t w = 0; w < words.size(); ++w) {
      word_begin_.push_back(static_cast<uint32_t>(flat_.size()));
      word_len_.push_back(static_cast<uint32_t>(words[w].size()));
      flat_.insert(flat_.end(), words[w].begin(), words[w].end());
      for (size_t k = 0; k + 1 < words[w].size(); ++k) add_pair(key(words[w][k], words[w][k + 1]), word_count_[w], w);
    }
    for (uint32_t p = 0; p < pair_count_.size(); ++p) push(p);
    changed_.clear();
  }

  // Merges the best pair; returns the merged symbol's id and whether its
  // string is new, or {-1, false} when no pair is left.
  std::pair<int32_t, bool> merge_best() {
    for (;;) {
      if (heap_.empty()) return {-1, false};
      Entry top = heap_.top();
      heap_.pop();
      if (top.version == pair_version_[top.pair] && pair_count_[top.pair] > 0) return merge(top.pair);
    }
  }

  const std::string& symbol(int32_t id) const { return symbols_[static_cast<size_t>(id)]; }

 private:
  struct Entry {
    int64_t count;
    uint32_t pair, version;
  };
  // Orders the heap: the highest count on top, then the smaller (a, b) strings.
  struct Worse {
    const Merger* m;
    bool operator()(const Entry& x, const Entry& y) const {
      if (x.count != y.count) return x.count < y.count;
      const std::string& xa = m->symbol(m->pair_a_[x.pair]);
      const std::string& ya = m->symbol(m->pair_a_[y.pair]);
      if (xa != ya) return xa > ya;
      return m->symbol(m->pair_b_[x.pair]) > m->symbol(m->pair_b_[y.pair]);
    }
  };
  using Heap = std::priority_queue<Entry, std::vector<Entry>, Worse>;

  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  // Adds `delta` to the count of pair `k` (creating it) and notes that word w
  // holds it and that its heap entry is out of date.
  void add_pair(uint64_t k, int64_t delta, uint32_t w) {
    auto [it, inserted] = pair_index_.emplace(k, static_cast<uint32_t>(pair_count_.size()));
    const uint32_t p = it->second;
    if (inserted) {
      pair_a_.push_back(static_cast<int32_t>(k >> 32));
      pair_b_.push_back(static_cast<int32_t>(k & 0xFFFFFFFFu));
      pair_count_.push_back(0);
      pair_version_.push_back(0);
      pair_words_.emplace_back();
    }
    pair_count_[p] += delta;
    if (delta > 0) {
      auto& ws = pair_words_[p];
      if (ws.empty() || ws.back() != w) ws.push_back(w);
    }
    changed_.push_back(p);
  }

  void push(uint32_t p) { heap_.push(Entry{pair_count_[p], p, ++pair_version_[p]}); }

  std::pair<int32_t, bool> merge(uint32_t p) {
    const int32_t a = pair_a_[p], b = pair_b_[p];
    // b never starts a word, so it is a "##" piece: a + ##b -> ab.
    std::string merged = symbols_[static_cast<size_t>(a)] + symbols_[static_cast<size_t>(b)].substr(2);
    auto [it, is_new] = symbol_id_.emplace(merged, static_cast<int32_t>(symbols_.size()));
    const int32_t s = it->second;
    if (is_new) symbols_.push_back(std::move(merged));

    std::vector<uint32_t> words = std::move(pair_words_[p]);
    pair_words_[p] = {};
    std::sort(words.begin(), words.end());
    words.erase(std::unique(words.begin(), words.end()), words.end());
    for (uint32_t w : words) merge_in_word(w, a, b, s);

    std::sort(changed_.begin(), changed_.end());
    changed_.erase(std::unique(changed_.begin(), changed_.end()), changed_.end());
    for (uint32_t c : changed_)
      if (pair_count_[c] > 0) push(c);
    changed_.clear();
    // Stale entries pile up; rebuild from the live pairs when they dominate.
    if (heap_.size() > 4 * pair_count_.size() + (1u << 20)) {
      heap_ = Heap(Worse{this});
      for (uint32_t q = 0; q < pair_count_.size(); ++q)
        if (pair_count_[q] > 0) push(q);
    }
    return {s, is_new};
  }

  // Replaces each (a, b) in word w by s, left to right, and updates the pair
  // counts by the difference between the word's old and new pairs.
  void merge_in_word(uint32_t w, int32_t a, int32_t b, int32_t s) {
    int32_t* sym = flat_.data() + word_begin_[w];
    const uint32_t n = word_len_[w];
    old_pairs_.clear();
    for (uint32_t k = 0; k + 1 < n; ++k) old_pairs_.push_back(key(sym[k], sym[k + 1]));
    uint32_t out = 0;
    for (uint32_t k = 0; k < n;) {
      if (k + 1 < n && sym[k] == a && sym[k + 1] == b) {
        sym[out++] = s;
        k += 2;
      } else {
        sym[out++] = sym[k++];
      }
    }
    if (out == n) return;  // a stale entry in the pair's word list
    word_len_[w] = out;
    new_pairs_.clear();
    for (uint32_t k = 0; k + 1 < out; ++k) new_pairs_.push_back(key(sym[k], sym[k + 1]));
    std::sort(old_pairs_.begin(), old_pairs_.end());
    std::sort(new_pairs_.begin(), new_pairs_.end());
    const int64_t c = word_count_[w];
    size_t i = 0, j = 0;
    while (i < old_pairs_.size() || j < new_pairs_.size()) {
      if (j == new_pairs_.size() || (i < old_pairs_.size() && old_pairs_[i] < new_pairs_[j])) {
        add_pair(old_pairs_[i++], -c, w);
      } else if (i == old_pairs_.size() || new_pairs_[j] < old_pairs_[i]) {
        add_pair(new_pairs_[j++], c, w);
      } else {
        ++i;
        ++j;
      }
    }
  }

  std::vector<std::string> symbols_;
  std::unordered_map<std::string, int32_t> symbol_id_;

  std::vector<int32_t> flat_;  // all words' symbols; merges shrink words in place
  std::vector<uint32_t> word_begin_, word_len_;
  std::vector<int64_t> word_count_;

  std::unordered_map<uint64_t, uint32_t> pair_index_;
  std::vector<int32_t> pair_a_, pair_b_;
  std::vector<int64_t> pair_count_;
  std::vector<uint32_t> pair_version_;             // of the pair's one valid heap entry
  std::vector<std::vector<uint32_t>> pair_words_;  // words that held the pair (some stale)

  std::vector<uint32_t> changed_;                // pairs whose count changed in this merge
  std::vector<uint64_t> old_pairs_, new_pairs_;  // scratch
  Heap heap_{Worse{this}};
};

}  // namespace

Vocab build_vocab(const std::vector<std::string>& texts, const VocabBuildOptions& opts) {
  const auto& specials = special_tokens();
  COHORT_CHECK(opts.size >= static_cast<int32_t>(specials.size()), UsageError, "vocabulary size must be at least ",
               specials.size(), " (the special tokens), got ", opts.size);
  COHORT_CHECK(opts.min_count >= 1, UsageError, "vocabulary min_count must be at least 1, got ", opts.min_count);
  COHORT_CHECK(opts.threads >= 0, UsageError, "vocabulary threads must be 0 (every core) or more, got ",
               opts.threads);
  const auto start_time = std::chrono::steady_clock::now();
  auto say = [&](const std::string& line) {
    if (!opts.progress) return;
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time).count();
    char stamp[32];
    std::snprintf(stamp, sizeof stamp, " (%.1f s)", s);
    opts.progress(line + stamp);
  };

  int threads = opts.threads > 0 ? opts.threads : static_cast<int>(std::thread::hardware_concurrency());
  threads = std::max(1, std::min<int>(threads, static_cast<int>((texts.size() + 63) / 64)));
  WordCounts counted = count_words(texts, opts.lowercase, threads);

  // Deterministic order for everything below.
  std::vector<std::pair<std::string, int64_t>> words(counted.begin(), counted.end());
  WordCounts().swap(counted);
  std::sort(words.begin(), words.end());
  int64_t total = 0;
  for (const auto& w : words) total += w.second;
  say(cohort::detail::cat("vocab: ", total, " words, ", words.size(), " distinct"));

  // The alphabet, from every word.
  std::unordered_map<std::string, int64_t> alphabet;  // "c" and "##c" -> occurrences
  for (const auto& [word, count] : words) {
    auto chars = chars_of(word);
    for (size_t k = 0; k < chars.size(); ++k) {
      alphabet[std::string(chars[k])] += count;
      if (k > 0) alphabet["##" + std::string(chars[k])] += count;
    }
  }
  std::vector<std::pair<std::string, int64_t>> letters(alphabet.begin(), alphabet.end());
  const size_t room = static_cast<size_t>(opts.size) - specials.size();
  if (letters.size() > room) {  // keep the most frequent
    std::sort(letters.begin(), letters.end(), [](const auto& x, const auto& y) {
      return x.second != y.second ? x.second > y.second : x.first < y.first;
    });
    say(cohort::detail::cat("vocab: the alphabet has ", letters.size(), " characters; keeping the ", room,
                    " most frequent"));
    letters.resize(room);
  }
  // Plain characters first, then ## ones, each in string order.
  std::sort(letters.begin(), letters.end(), [](const auto& x, const auto& y) {
    bool xc = x.first.compare(0, 2, "##") == 0, yc = y.first.compare(0, 2, "##") == 0;
    return xc != yc ? yc : x.first < y.first;
  });
  std::vector<std::string> symbols;
  for (auto& l : letters) symbols.push_back(std::move(l.first));
  std::unordered_map<std::string, int32_t> symbol_id;
  for (size_t i = 0; i < symbols.size(); ++i) symbol_id.emplace(symbols[i], static_cast<int32_t>(i));

  // The training words as symbols.
  std::vector<std::vector<int32_t>> train;
  std::vector<int64_t> train_count;
  for (const auto& [word, count] : words) {
    if (count < opts.min_count) continue;
    std::vector<int32_t> syms;
    auto chars = chars_of(word);
    for (size_t k = 0; k < chars.size(); ++k) {
      auto it = symbol_id.find(k == 0 ? std::string(chars[k]) : "##" + std::string(chars[k]));
      if (it == symbol_id.end()) break;  // a character cut from a too-large alphabet
      syms.push_back(it->second);
    }
    if (syms.size() != chars.size()) continue;
    train.push_back(std::move(syms));
    train_count.push_back(count);
  }
  say(cohort::detail::cat("vocab: ", specials.size() + symbols.size(), " tokens from the alphabet, merging over ",
                  train.size(), " words seen at least ", opts.min_count, " times"));
  std::vector<std::pair<std::string, int64_t>>().swap(words);

  std::vector<std::string> tokens = specials;
  for (const auto& s : symbols) {
    // A special token's string can only come back as an alphabet letter if
    // the text held it as one character, which the basic pass never makes.
    if (std::find(specials.begin(), specials.end(), s) == specials.end()) tokens.push_back(s);
  }
  Merger merger(std::move(symbols), train, std::move(train_count));
  std::vector<std::vector<int32_t>>().swap(train);
  size_t merges = 0;
  while (tokens.size() < static_cast<size_t>(opts.size)) {
    auto [id, is_new] = merger.merge_best();
    if (id < 0) break;
    ++merges;
    if (is_new) tokens.push_back(merger.symbol(id));
    if (merges % 2000 == 0) say(cohort::detail::cat("vocab: ", tokens.size(), "/", opts.size, " tokens, ", merges, " merges"));
  }
  say(cohort::detail::cat("vocab: ", tokens.size(), " tokens after ", merges, " merges",
                  tokens.size() < static_cast<size_t>(opts.size) ? " (no pairs left)" : ""));
  return Vocab(std::move(tokens));
}

}  // namespace cohort::text
