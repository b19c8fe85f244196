// defines: MaskingVocab, MaskOptions, mask_key, DynamicMasking
//
// Masked-LM targets drawn afresh each time a sample is dealt
// (task.masking = dynamic), RoBERTa's dynamic masking with one difference:
// every draw is a counter-based hash of (train.seed, epoch, sample id,
// position), not a generator's stream. The masks a sample gets in an epoch
// are therefore the same on any rank, world size, split of the global batch,
// loader-worker count, packing and resume, and new in every epoch.
//
// Per row: each candidate token (a real token that is not [CLS], [SEP],
// [PAD], [UNK] or [MASK]; with whole-word masking, each word: a piece and
// the "##" pieces right after it) is picked with probability `prob`, as
// Hugging Face's DataCollatorForLanguageModeling does. With a cap
// (max_predictions), the picked words with the smallest draws that fit are
// kept. Each picked token becomes [MASK] (replace_mask), a random token
// (replace_random; drawn from the non-bracketed tokens) or stays (the rest).
#pragma once

#include <cstdint>
#include <vector>

#include "cohort/data/dataset.hpp"

namespace cohort {

namespace text {
class Vocab;
}

// What masking needs to know about the vocabulary.
struct MaskingVocab {
  int32_t cls = -1, sep = -1, mask = -1, pad = -1, unk = -1;  // -1: absent
  std::vector<uint8_t> continuation;  // by id: 1 for "##" pieces
  std::vector<int32_t> random_pool;   // ids a random replacement draws from:
                                      // all but bracketed tokens ([PAD], [unused0], ...)
  // DataError when [CLS], [SEP] or [MASK] is missing.
  static MaskingVocab from(const text::Vocab& vocab);

  bool is_continuation(int64_t id) const {
    return id >= 0 && static_cast<size_t>(id) < continuation.size() && continuation[static_cast<size_t>(id)];
  }
  // Never masked: [CLS], [SEP], [PAD], [UNK], [MASK].
  bool is_special(int64_t id) const { return id == cls || id == sep || id == pad || id == unk || id == mask; }
};

struct MaskOptions {
  double prob = 0.15;            // task.mask-prob
  double replace_mask = 0.8;     // task.mask-replace: [MASK], random, unchanged
  double replace_random = 0.1;   //   (unchanged: the rest)
  int64_t max_predictions = 0;   // per row; 0: no cap
  bool whole_word = false;
  uint64_t seed = 0;             // train.seed
};

// The key of sample `sample_id`'s masks in `epoch`.
uint64_t mask_key(uint64_t seed, int64_t epoch, int64_t sample_id);

class DynamicMasking {
 public:
  DynamicMasking(MaskingVocab vocab, MaskOptions opts);

  // Masks one row of `length` tokens in place under `key`; returns the
  // picked positions (ascending) and their original ids in `positions` and
  // `labels` (cleared first).
  void mask_row(int64_t* tokens, int64_t length, uint64_t key, std::vector<int64_t>& positions,
                std::vector<int64_t>& labels) const;

  // A collated BERT batch of unmasked rows (input_ids, input_mask [B,L]):
  // replaces input_ids with the masked rows and sets masked_lm_positions (0-padded) and
  // masked_lm_ids (-1-padded), [B,P] with P the most predictions of a row
  // (at least 1). Row b is sample sample_ids[b] of `epoch`.
  void apply(Example& batch, const std::vector<int64_t>& sample_ids, int64_t epoch) const;
  // The same with fixed keys that no training draw uses and no train.seed
  // changes (epoch -1, seed 0): evaluation's targets on unmasked shards.
  void apply_for_evaluation(Example& batch, const std::vector<int64_t>& sample_ids) const;

  const MaskOptions& options() const { return opts_; }
  const MaskingVocab& vocab() const { return vocab_; }

 private:
  void apply_keyed(Example& batch, const std::vector<int64_t>& sample_ids, uint64_t seed, int64_t epoch) const;

  MaskingVocab vocab_;
  MaskOptions opts_;
};

}  // namespace cohort
