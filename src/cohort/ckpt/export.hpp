// defines: ExportSource, ExportResult, Exporter, register_exporter, export_model
//
// `cohort export`: a checkpoint -> a standalone model directory that the
// user's own tools load:
//   model.safetensors  the weights alone (no optimizer or trainer state)
//   config.json        bert-pretrain: BertForPreTraining's BertConfig
//                      (BertForMaskedLM's when trained with task.nsp false);
//                      bert-classify: BertForSequenceClassification's, with
//                      num_labels, id2label and label2id from labels.json;
//                      image-classify: Cohort's own description (no Hugging
//                      Face class exists for its models)
//   vocab.txt, tokenizer_config.json, special_tokens_map.json
//                      BERT: the tokenizer the run trained with
//                      (RUN_DIR/tokenizer/, text/hf_tokenizer.hpp), so that
//                      AutoTokenizer.from_pretrained(dir) cases as it did
// A task registered from outside exports once it registers an Exporter.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "cohort/ckpt/safetensors.hpp"
#include "cohort/config/config.hpp"

namespace cohort {

// A run's Hugging Face config.json, for a model whose architecture its
// model.* keys do not describe alone (ModernBERT from model.init's
// config.json): the task writes it into the run directory when the run
// starts (Task::run_files), and the exporter writes it beside the weights.
inline constexpr const char* kHfConfigFile = "hf-config.json";

// What an exporter reads: the verified checkpoint, its config and weights.
struct ExportSource {
  std::string checkpoint_dir;
  std::string run_dir;  // the run the checkpoint belongs to (its tokenizer/, labels.json)
  Config cfg;           // the checkpoint's own config.toml
  SafetensorsFile weights;
};

struct ExportResult {
  std::string dir;                 // the directory written
  std::string hf_class;            // the Hugging Face class that loads it; "" when none
  std::vector<std::string> files;  // the file names written, in order
  std::vector<std::string> warnings;  // newer checkpoints skipped as broken
  std::vector<std::string> notes;     // what the user should know (no tokenizer, no HF class)
  std::string run_dir;  // the checkpoint's run; "" for a checkpoint outside one
  std::string mlflow;   // the run's log.mlflow: where its MLflow run is
};

// Writes the export of one task into `out_dir` (which exists) and records
// it in `result`. Throws Error naming what is missing.
using Exporter = std::function<void(const ExportSource& source, const std::string& out_dir, ExportResult& result)>;

// Makes `cohort export` work for train.task `task` (built-in tasks are
// registered already; a task registered twice is a UsageError).
void register_exporter(const std::string& task, Exporter exporter);

// `path` is a run dir (its newest valid checkpoint) or a checkpoint dir;
// `out_dir` "" means RUN_DIR/export beside the checkpoints. DataError for a
// missing or corrupt checkpoint, naming the file; ConfigError for a task
// with no exporter, naming the tasks that have one.
ExportResult export_model(const std::string& path, const std::string& out_dir);

}  // namespace cohort
