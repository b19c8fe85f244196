// defines: stream_seed, parallel_for, assign_splits, TokenDocument,
//          tokenize_documents, MaskingVocab, InstanceOptions, Instance,
//          num_to_predict, document_instances, make_instances, append_row
//
// BERT pretraining instances from tokenized documents, in the manner of
// Google BERT's create_pretraining_data.py: sentence pairs A/B for next
// sentence prediction (B is the real continuation or, half the time, a span
// of another document) and masked-LM targets (80% [MASK], 10% kept, 10% a
// random token).
//
// Where this differs from the reference, on purpose: the random document
// is drawn uniformly from the others (not ten tries at avoiding itself); a
// random replacement token is never a bracketed one ([PAD], [CLS],
// [unused0], ...); and with whole-word masking a "##" piece that opens
// sentence B does not join the last word of A across the [SEP].
//
// Determinism contract: every random draw for document d in dupe round r
// comes from its own generator, seeded from (seed, r, d). Documents are
// processed in parallel but results are collected in (round, document)
// order, so the output depends on the seed and the input only, never on the
// thread count. Rng (core/random.hpp) defines its draws itself, not the standard library's
// distributions, so they are the same on every platform.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cohort/data/bert_rows.hpp"
#include "cohort/data/masking.hpp"
#include "cohort/text/wordpiece.hpp"

#include "cohort/core/random.hpp"

namespace cohort::prep {

// The tokenizer the offline pipelines run (text/wordpiece.hpp).
using text::Vocab;
using text::WordPiece;

using cohort::Rng;

// One document: its sentences (or lines), in order.
using Document = std::vector<std::string>;

// A seed for one independent stream, mixed from (seed, a, b) with splitmix64.
uint64_t stream_seed(uint64_t seed, uint64_t a, uint64_t b);

// Calls fn(i) once for every i in [0, n) on `threads` threads (0: every
// core). Rethrows the first exception after all threads stop. While the work
// runs, the calling thread calls `tick` (when set) about every `tick_seconds`.
void parallel_for(int64_t n, int threads, const std::function<void(int64_t)>& fn,
                  const std::function<void()>& tick = {}, double tick_seconds = 2.0);

// The split of each of n documents: 0 train, 1 valid, 2 test. A seeded
// permutation puts round(n * fraction) documents in valid and in test, at
// least one each when n >= 3 and the fraction is not 0, and always leaves
// one for train.
std::vector<int8_t> assign_splits(size_t n, double valid_fraction, double test_fraction, uint64_t seed);

// A document as token ids: one segment per sentence, none empty.
using TokenDocument = std::vector<std::vector<int32_t>>;

// A sentence's token ids, without special tokens (WordPiece's or byte-level
// BPE's encode); called from several threads at once.
using SentenceEncoder = std::function<std::vector<int32_t>(const std::string& sentence)>;

// Encodes each document's sentences with `encode`, dropping sentences with no
// tokens (a document may end up empty). Parallel; the result is in input
// order. `done`, when given, counts finished documents and `bytes` their
// text bytes, for progress lines.
std::vector<TokenDocument> tokenize_documents(const std::vector<Document>& docs, const SentenceEncoder& encode,
                                              int threads,
                                              std::atomic<int64_t>* done = nullptr,
                                              std::atomic<int64_t>* bytes = nullptr,
                                              const std::function<void()>& tick = {});

// What masking needs to know about the vocabulary (data/masking.hpp).
using cohort::MaskingVocab;

struct InstanceOptions {
  int64_t max_seq_length = 128;
  int64_t max_predictions = 20;
  double masked_lm_prob = 0.15;
  double short_seq_prob = 0.1;
  int64_t dupe_factor = 5;
  bool whole_word_mask = false;
  // false (--masking none): rows keep their tokens and carry no targets;
  // the instances are those masking would have made (the same draws).
  bool mask = true;
  // false (--nsp false): RoBERTa's FULL-SENTENCES rows instead of pairs.
  bool next_sentence = true;
  uint64_t seed = 12345;
  int threads = 0;  // 0: every core
};

// One training example before padding.
struct Instance {
  std::vector<int32_t> tokens;     // [CLS] A [SEP] B [SEP], masked positions replaced
  int32_t segment_a = 0;           // tokens with segment id 0: |A| + 2
  std::vector<int32_t> positions;  // masked positions, ascending
  std::vector<int32_t> labels;     // the original ids there
  bool random_next = false;        // B is from another document
};

// Masked-LM targets for a sequence of `length` tokens (specials included):
// min(max_predictions, max(1, round(length * masked_lm_prob))), rounding
// half to even like the reference's Python round().
int64_t num_to_predict(int64_t length, const InstanceOptions& opts);

// The instances of docs[index] for one round, drawing from `rng`. Random
// next segments come from other documents of `docs`.
std::vector<Instance> document_instances(const std::vector<TokenDocument>& docs, size_t index,
                                         const MaskingVocab& vocab, const InstanceOptions& opts, Rng& rng);

// Every document's instances for dupe_factor rounds, in (round, document)
// order; document d of round r draws from Rng(stream_seed(seed, r, d)).
// Without next_sentence, full_sentence_rows once, masked in every round.
// Every document must have a sentence (Error otherwise). `done`, when
// given, counts finished (round, document) pairs.
std::vector<Instance> make_instances(const std::vector<TokenDocument>& docs, const MaskingVocab& vocab,
                                     const InstanceOptions& opts, std::atomic<int64_t>* done = nullptr,
                                     const std::function<void()>& tick = {});

// --nsp false: RoBERTa's FULL-SENTENCES rows. Each row is [CLS], then whole
// sentences taken in order, across document boundaries with an extra [SEP]
// between documents, up to max_seq_length with the closing [SEP]; one
// segment, next_sentence_labels 0. A sentence longer than a row is cut.
// Not masked.
std::vector<Instance> full_sentence_rows(const std::vector<TokenDocument>& docs, const MaskingVocab& vocab,
                                         const InstanceOptions& opts);

// Appends one row, 0-padded to rows.seq_len and rows.max_predictions
// (which must be set and fit the instance).
void append_row(BertRows& rows, const Instance& instance);

}  // namespace cohort::prep
