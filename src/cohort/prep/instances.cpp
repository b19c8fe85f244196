#include "cohort/prep/instances.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <numeric>
#include <thread>
#include <utility>

#include "cohort/core/error.hpp"

namespace cohort::prep {

uint64_t stream_seed(uint64_t seed, uint64_t a, uint64_t b) {
  return splitmix64(splitmix64(splitmix64(seed) ^ a) ^ b);
}

void parallel_for(int64_t n, int threads, const std::function<void(int64_t)>& fn, const std::function<void()>& tick,
                  double tick_seconds) {
  if (n <= 0) return;
  int64_t workers = threads > 0 ? threads : std::max(1u, std::thread::hardware_concurrency());
  workers = std::min(workers, n);
  // Blocks of indices keep the shared counter cold; small enough to balance.
  const int64_t block = std::clamp<int64_t>(n / (workers * 16), 1, 64);

  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  std::condition_variable cv;
  std::exception_ptr error;
  int64_t running = 0;

  auto work = [&] {
    try {
      while (!failed.load(std::memory_order_relaxed)) {
        int64_t begin = next.fetch_add(block);
        if (begin >= n) break;
        for (int64_t i = begin, end = std::min(n, begin + block); i < end; ++i) fn(i);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!error) error = std::current_exception();
      failed = true;
    }
    std::lock_guard<std::mutex> lock(mu);
    --running;
    cv.notify_all();
  };

  if (workers == 1 && !tick) {
    running = 1;
    work();
  } else {
    std::vector<std::thread> pool;
    try {
      for (int64_t t = 0; t < workers; ++t) {
        {
          std::lock_guard<std::mutex> lock(mu);
          ++running;
        }
        pool.emplace_back(work);
      }
    } catch (...) {
      // Could not start a thread: let the ones started finish, then report.
      std::lock_guard<std::mutex> lock(mu);
      --running;
      failed = true;
      if (!error) error = std::current_exception();
    }
    {
      std::unique_lock<std::mutex> lock(mu);
      const auto period = std::chrono::duration<double>(tick_seconds);
      while (running > 0) {
        if (!tick) {
          cv.wait(lock, [&] { return running == 0; });
        } else if (!cv.wait_for(lock, period, [&] { return running == 0; })) {
          lock.unlock();
          tick();
          lock.lock();
        }
      }
    }
    for (auto& t : pool) t.join();
  }
  if (error) std::rethrow_exception(error);
}

std::vector<int8_t> assign_splits(size_t n, double valid_fraction, double test_fraction, uint64_t seed) {
  auto count = [n](double fraction) {
    auto k = static_cast<size_t>(std::llround(static_cast<double>(n) * fraction));
    return n >= 3 && fraction > 0 ? std::max<size_t>(k, 1) : k;
  };
  size_t valid = count(valid_fraction), test = count(test_fraction);
  while (n > 0 && valid + test > n - 1) {
    if (valid >= test) --valid;
    else --test;
  }
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  Rng rng(stream_seed(seed, 0x5d1175ull, 0));
  rng.shuffle(order);
  std::vector<int8_t> split(n, 0);
  for (size_t i = 0; i < valid + test; ++i) split[order[i]] = i < valid ? 1 : 2;
  return split;
}

std::vector<TokenDocument> tokenize_documents(const std::vector<Document>& docs, const SentenceEncoder& encode,
                                              int threads,
                                              std::atomic<int64_t>* done, std::atomic<int64_t>* bytes,
                                              const std::function<void()>& tick) {
  std::vector<TokenDocument> out(docs.size());
  parallel_for(
      static_cast<int64_t>(docs.size()), threads,
      [&](int64_t i) {
        const Document& doc = docs[static_cast<size_t>(i)];
        TokenDocument td;
        td.reserve(doc.size());
        int64_t text_bytes = 0;
        for (const std::string& sentence : doc) {
          text_bytes += static_cast<int64_t>(sentence.size());
          std::vector<int32_t> ids = encode(sentence);
          if (!ids.empty()) td.push_back(std::move(ids));
        }
        out[static_cast<size_t>(i)] = std::move(td);
        if (bytes) bytes->fetch_add(text_bytes, std::memory_order_relaxed);
        if (done) done->fetch_add(1, std::memory_order_relaxed);
      },
      tick);
  return out;
}

int64_t num_to_predict(int64_t length, const InstanceOptions& opts) {
  // nearbyint rounds half to even in the default rounding mode, as Python's
  // round() does.
  auto rounded = static_cast<int64_t>(std::nearbyint(static_cast<double>(length) * opts.masked_lm_prob));
  return std::min(opts.max_predictions, std::max<int64_t>(1, rounded));
}

namespace {

// Picks the masked-LM targets of `inst` (tokens and segment_a already set)
// and replaces their tokens: 80% [MASK], 10% unchanged, 10% a random token.
void mask_tokens(Instance& inst, const MaskingVocab& v, const InstanceOptions& opts, Rng& rng) {
  std::vector<int32_t>& tokens = inst.tokens;
  const auto len = static_cast<int32_t>(tokens.size());
  const int32_t first_sep = inst.segment_a - 1;

  // Scratch reused across calls on this thread: this runs once per instance.
  thread_local std::vector<int32_t> cand;
  thread_local std::vector<size_t> starts, order;
  thread_local std::vector<std::pair<int32_t, int32_t>> picked;  // (position, original id)
  cand.clear();
  starts.clear();
  picked.clear();

  // Candidate positions (all but the [CLS] and the two [SEP]s), grouped:
  // group k is cand[starts[k] .. starts[k+1]). With whole-word masking a
  // "##" piece joins the group of the piece right before it, so a word is
  // masked entirely or not at all.
  for (int32_t i = 1; i < len - 1; ++i) {
    if (i == first_sep || tokens[static_cast<size_t>(i)] == v.sep) continue;  // full sentences: every [SEP]
    bool joins = opts.whole_word_mask && !cand.empty() && cand.back() == i - 1 &&
                 v.is_continuation(tokens[static_cast<size_t>(i)]);
    if (!joins) starts.push_back(cand.size());
    cand.push_back(i);
  }
  order.resize(starts.size());
  std::iota(order.begin(), order.end(), size_t{0});
  rng.shuffle(order);

  const auto target = static_cast<size_t>(num_to_predict(len, opts));
  for (size_t k : order) {
    if (picked.size() >= target) break;
    size_t lo = starts[k], hi = k + 1 < starts.size() ? starts[k + 1] : cand.size();
    // A whole word that would overshoot the target is skipped, as in the reference.
    if (picked.size() + (hi - lo) > target) continue;
    for (size_t j = lo; j < hi; ++j) {
      const auto pos = static_cast<size_t>(cand[j]);
      const int32_t original = tokens[pos];
      int32_t replacement = v.mask;
      if (rng.uniform() >= 0.8) {
        if (rng.uniform() < 0.5 || v.random_pool.empty()) replacement = original;
        else replacement = v.random_pool[rng.below(v.random_pool.size())];
      }
      tokens[pos] = replacement;
      picked.emplace_back(cand[j], original);
    }
  }
  std::sort(picked.begin(), picked.end());
  inst.positions.clear();
  inst.labels.clear();
  inst.positions.reserve(picked.size());
  inst.labels.reserve(picked.size());
  for (const auto& [pos, label] : picked) {
    inst.positions.push_back(pos);
    inst.labels.push_back(label);
  }
}

// --masking none: the instance as it was before mask_tokens picked targets.
void unmask(Instance& inst) {
  for (size_t j = 0; j < inst.positions.size(); ++j)
    inst.tokens[static_cast<size_t>(inst.positions[j])] = inst.labels[j];
  inst.positions.clear();
  inst.labels.clear();
}

// Another document than `index`, uniformly (itself only when it is alone).
size_t other_document(size_t n, size_t index, Rng& rng) {
  if (n <= 1) return index;
  auto r = static_cast<size_t>(rng.below(n - 1));
  return r >= index ? r + 1 : r;
}

}  // namespace

std::vector<Instance> document_instances(const std::vector<TokenDocument>& docs, size_t index,
                                         const MaskingVocab& vocab, const InstanceOptions& opts, Rng& rng) {
  const TokenDocument& doc = docs[index];
  std::vector<Instance> out;
  if (doc.empty()) return out;

  // Room for [CLS], [SEP], [SEP]. Usually fill the whole sequence; with
  // short_seq_prob aim shorter, to resemble fine-tuning inputs. The target
  // is chosen once per document and round, like the reference.
  const int64_t max_tokens = opts.max_seq_length - 3;
  int64_t target = max_tokens;
  if (rng.uniform() < opts.short_seq_prob) target = rng.between(2, max_tokens);

  const auto n = static_cast<int64_t>(doc.size());
  std::vector<int64_t> chunk;  // indexes of the sentences gathered so far
  int64_t chunk_tokens = 0;
  std::vector<int32_t> a, b;
  for (int64_t i = 0; i < n; ++i) {
    chunk.push_back(i);
    chunk_tokens += static_cast<int64_t>(doc[static_cast<size_t>(i)].size());
    if (i != n - 1 && chunk_tokens < target) continue;

    // A: the first a_end sentences of the chunk; B: the rest, or a random span.
    const auto chunk_size = static_cast<int64_t>(chunk.size());
    const int64_t a_end = chunk_size >= 2 ? rng.between(1, chunk_size - 1) : 1;
    a.clear();
    b.clear();
    for (int64_t j = 0; j < a_end; ++j) {
      const auto& s = doc[static_cast<size_t>(chunk[static_cast<size_t>(j)])];
      a.insert(a.end(), s.begin(), s.end());
    }
    const bool random_next = chunk_size == 1 || rng.uniform() < 0.5;
    if (random_next) {
      const int64_t target_b = target - static_cast<int64_t>(a.size());
      const TokenDocument& other = docs[other_document(docs.size(), index, rng)];
      for (size_t j = rng.below(other.size()); j < other.size(); ++j) {
        b.insert(b.end(), other[j].begin(), other[j].end());
        if (static_cast<int64_t>(b.size()) >= target_b) break;
      }
      // The chunk's sentences after A were not used: put them back.
      i -= chunk_size - a_end;
    } else {
      for (int64_t j = a_end; j < chunk_size; ++j) {
        const auto& s = doc[static_cast<size_t>(chunk[static_cast<size_t>(j)])];
        b.insert(b.end(), s.begin(), s.end());
      }
    }

    // Trim the longer of A and B, from the front or the back at random,
    // until the pair fits.
    size_t a_lo = 0, a_hi = a.size(), b_lo = 0, b_hi = b.size();
    while (static_cast<int64_t>((a_hi - a_lo) + (b_hi - b_lo)) > max_tokens) {
      bool trim_a = a_hi - a_lo > b_hi - b_lo;
      size_t& lo = trim_a ? a_lo : b_lo;
      size_t& hi = trim_a ? a_hi : b_hi;
      if (rng.uniform() < 0.5) ++lo;
      else --hi;
    }

    Instance inst;
    inst.tokens.reserve((a_hi - a_lo) + (b_hi - b_lo) + 3);
    inst.tokens.push_back(vocab.cls);
    inst.tokens.insert(inst.tokens.end(), a.begin() + static_cast<std::ptrdiff_t>(a_lo),
                       a.begin() + static_cast<std::ptrdiff_t>(a_hi));
    inst.tokens.push_back(vocab.sep);
    inst.segment_a = static_cast<int32_t>(inst.tokens.size());
    inst.tokens.insert(inst.tokens.end(), b.begin() + static_cast<std::ptrdiff_t>(b_lo),
                       b.begin() + static_cast<std::ptrdiff_t>(b_hi));
    inst.tokens.push_back(vocab.sep);
    inst.random_next = random_next;
    mask_tokens(inst, vocab, opts, rng);
    if (!opts.mask) unmask(inst);  // the same draws either way: the same instances
    out.push_back(std::move(inst));

    chunk.clear();
    chunk_tokens = 0;
  }
  return out;
}

std::vector<Instance> full_sentence_rows(const std::vector<TokenDocument>& docs, const MaskingVocab& vocab,
                                         const InstanceOptions& opts) {
  COHORT_CHECK(opts.max_seq_length >= 3, UsageError, "max_seq_length must be at least 3, got ", opts.max_seq_length);
  const auto max_tokens = static_cast<size_t>(opts.max_seq_length - 2);  // room for [CLS] and the last [SEP]
  std::vector<Instance> out;
  Instance cur;
  auto flush = [&] {
    if (cur.tokens.size() <= 1) return;
    if (cur.tokens.back() != vocab.sep) cur.tokens.push_back(vocab.sep);
    cur.segment_a = static_cast<int32_t>(cur.tokens.size());  // one segment
    out.push_back(std::move(cur));
    cur = Instance{};
  };
  for (const TokenDocument& doc : docs) {
    for (const auto& sentence : doc) {
      // A sentence longer than a row is cut into row-sized pieces.
      for (size_t lo = 0; lo < sentence.size(); lo += max_tokens) {
        const size_t n = std::min(max_tokens, sentence.size() - lo);
        if (cur.tokens.empty()) cur.tokens.push_back(vocab.cls);
        if (cur.tokens.size() - 1 + n > max_tokens) {
          flush();
          cur.tokens.push_back(vocab.cls);
        }
        cur.tokens.insert(cur.tokens.end(), sentence.begin() + static_cast<std::ptrdiff_t>(lo),
                          sentence.begin() + static_cast<std::ptrdiff_t>(lo + n));
      }
    }
    // Between documents, an extra [SEP] (RoBERTa's FULL-SENTENCES), when it fits.
    if (cur.tokens.size() > 1 && cur.tokens.size() - 1 < max_tokens) cur.tokens.push_back(vocab.sep);
    else flush();
  }
  flush();
  return out;
}

std::vector<Instance> make_instances(const std::vector<TokenDocument>& docs, const MaskingVocab& vocab,
                                     const InstanceOptions& opts, std::atomic<int64_t>* done,
                                     const std::function<void()>& tick) {
  COHORT_CHECK(opts.max_seq_length >= 5, UsageError, "max_seq_length must be at least 5, got ", opts.max_seq_length);
  COHORT_CHECK(opts.max_predictions >= 1, UsageError, "max_predictions must be at least 1, got ",
               opts.max_predictions);
  for (size_t d = 0; d < docs.size(); ++d) {
    // Random-next spans are drawn from any document, so none may be empty.
    COHORT_CHECK(!docs[d].empty(), Error, "make_instances: document ", d, " has no tokens");
  }
  const auto n = static_cast<int64_t>(docs.size());
  if (!opts.next_sentence) {
    // The rows are the same in every round; only their masks differ. Row i
    // of round r masks from Rng(stream_seed(seed, r, i)).
    const std::vector<Instance> rows = full_sentence_rows(docs, vocab, opts);
    const auto per_round = static_cast<int64_t>(rows.size());
    std::vector<Instance> out(static_cast<size_t>(per_round * std::max<int64_t>(0, opts.dupe_factor)));
    for (int64_t round = 0; round < opts.dupe_factor; ++round) {
      parallel_for(
          per_round, opts.threads,
          [&](int64_t i) {
            Instance inst = rows[static_cast<size_t>(i)];
            if (opts.mask) {
              Rng rng(stream_seed(opts.seed, static_cast<uint64_t>(round), static_cast<uint64_t>(i)));
              mask_tokens(inst, vocab, opts, rng);
            }
            out[static_cast<size_t>(round * per_round + i)] = std::move(inst);
          },
          tick);
      if (done) done->fetch_add(n, std::memory_order_relaxed);
    }
    return out;
  }
  const int64_t tasks = n * std::max<int64_t>(0, opts.dupe_factor);
  std::vector<std::vector<Instance>> parts(static_cast<size_t>(tasks));
  parallel_for(
      tasks, opts.threads,
      [&](int64_t t) {
        const int64_t round = t / n, d = t % n;
        Rng rng(stream_seed(opts.seed, static_cast<uint64_t>(round), static_cast<uint64_t>(d)));
        parts[static_cast<size_t>(t)] = document_instances(docs, static_cast<size_t>(d), vocab, opts, rng);
        if (done) done->fetch_add(1, std::memory_order_relaxed);
      },
      tick);
  size_t total = 0;
  for (const auto& p : parts) total += p.size();
  std::vector<Instance> out;
  out.reserve(total);
  for (auto& p : parts) {
    for (auto& inst : p) out.push_back(std::move(inst));
    std::vector<Instance>().swap(p);
  }
  return out;
}

void append_row(BertRows& rows, const Instance& inst) {
  const auto L = static_cast<size_t>(rows.seq_len);
  const auto P = static_cast<size_t>(rows.max_predictions);
  COHORT_CHECK(inst.tokens.size() <= L && inst.positions.size() <= P && inst.labels.size() == inst.positions.size(),
               Error, "append_row: an instance of ", inst.tokens.size(), " tokens and ", inst.positions.size(),
               " predictions does not fit rows of ", L, " and ", P);
  for (size_t i = 0; i < L; ++i) {
    const bool real = i < inst.tokens.size();
    rows.input_ids.push_back(real ? inst.tokens[i] : 0);
    rows.input_mask.push_back(real ? 1 : 0);
    rows.segment_ids.push_back(real && i >= static_cast<size_t>(inst.segment_a) ? 1 : 0);
  }
  for (size_t i = 0; i < P; ++i) {
    const bool real = i < inst.positions.size();
    rows.masked_lm_positions.push_back(real ? inst.positions[i] : 0);
    rows.masked_lm_ids.push_back(real ? inst.labels[i] : 0);
  }
  rows.next_sentence_labels.push_back(inst.random_next ? 1 : 0);
}

}  // namespace cohort::prep
