// defines: ClassifyColumns, LabelSet, TextClassifyOptions, TextTokenizer, classify_file, TextClassification
//
// Sequence classification data: one file per split, DIR/<split>.tsv (GLUE
// style: tab-separated, a header row naming the columns) or
// DIR/<split>.jsonl (one object per line). The config names the columns:
// the text, optionally a second text (sentence pairs), and the label.
// Texts are tokenised at load (WordPiece with the model's vocab.txt, or a
// byte-level BPE's tokenizer.json) into
// [CLS] a [SEP] (b [SEP]), the longer segment truncated first to the
// maximum length. Batches are padded to their longest row (dynamic
// padding); length() serves data.bucket.
//
// Labels are strings. Their ids are the sorted distinct labels of the
// train split (LabelSet), so every rank and every split map them alike.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cohort/data/dataset.hpp"

namespace cohort {

namespace text {
class WordPiece;
}

struct ClassifyColumns {
  std::string text = "text";
  std::string text_pair;  // "": single sentences
  std::string label = "label";
  std::string id;  // predict: a column written beside each prediction instead of the text; "": none
};

// Label strings <-> ids.
class LabelSet {
 public:
  LabelSet() = default;
  explicit LabelSet(std::vector<std::string> names);  // sorted, distinct
  int64_t size() const { return static_cast<int64_t>(names_.size()); }
  const std::vector<std::string>& names() const { return names_; }
  const std::string& name(int64_t id) const { return names_.at(static_cast<size_t>(id)); }
  int64_t find(const std::string& name) const;  // -1 when absent
  // {"labels": [...]} as JSON text, and back (DataError naming `what`).
  std::string to_json() const;
  static LabelSet from_json(const std::string& text, const std::string& what);

 private:
  std::vector<std::string> names_;
};

struct TextClassifyOptions {
  ClassifyColumns columns;
  int64_t max_seq_length = 128;
  bool require_labels = true;  // false: predict input, labels optional
  bool keep_inputs = false;    // predict: keep each row's text (or id column) for inputs()
};

// DIR/<split>.tsv or DIR/<split>.jsonl (DataError listing what DIR holds
// when neither exists), or `path` itself when it is a file.
std::string classify_file(const std::string& dir, const std::string& split);

// What rows are tokenised with: a text's ids without special tokens, and
// the ids of [CLS] and [SEP].
struct TextTokenizer {
  std::function<std::vector<int32_t>(const std::string& text)> encode;
  int32_t cls = -1, sep = -1;
};

class TextClassification : public Dataset {
 public:
  // Reads and tokenises `path`. `labels` maps the label column; when it is
  // empty the file's own distinct labels become the set (the train split).
  // DataError naming the file and line: a missing column, a row with the
  // wrong number of fields, an empty file, an unknown label, or (train) a
  // label column with fewer than two classes.
  TextClassification(const std::string& path, const TextTokenizer& tokenizer, const TextClassifyOptions& opts,
                     LabelSet labels = {});
  // With WordPiece (DataError when its vocabulary lacks [CLS] or [SEP]).
  TextClassification(const std::string& path, const text::WordPiece& tokenizer, const TextClassifyOptions& opts,
                     LabelSet labels = {});

  int64_t size() const override { return static_cast<int64_t>(rows_.size()); }
  // input_ids, segment_ids, input_mask [L] (batch [B, Lmax]) and label []
  // ([B]; -1 where the input has no label).
  Example get(int64_t index) const override;
  Example get_batch(const std::vector<int64_t>& indices) const override;
  int64_t length(int64_t index) const override { return static_cast<int64_t>(rows_[index].ids.size()); }
  std::string describe() const override;

  const LabelSet& labels() const { return labels_; }
  // keep_inputs: row `index`'s {"text", "text_pair"} or {"id"} as read;
  // empty otherwise.
  std::vector<std::pair<std::string, std::string>> inputs(int64_t index) const {
    return inputs_.empty() ? std::vector<std::pair<std::string, std::string>>{} : inputs_.at(static_cast<size_t>(index));
  }
  const std::string& path() const { return path_; }

 private:
  struct Row {
    std::vector<int32_t> ids;
    int32_t pair_start = 0;  // first token of segment b; ids.size() when single
    int64_t label = -1;
  };
  std::string path_;
  LabelSet labels_;
  std::vector<Row> rows_;
  std::vector<std::vector<std::pair<std::string, std::string>>> inputs_;  // keep_inputs
  int64_t truncated_ = 0;
};

}  // namespace cohort
