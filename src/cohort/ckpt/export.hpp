// defines: export_model
//
// `cohort export`: a checkpoint -> a standalone model directory:
//   model.safetensors  the weights alone (no optimizer or trainer state)
//   config.json        for BERT, Hugging Face's BertConfig, so the directory
//                      loads with BertForPreTraining.from_pretrained(dir)
//   vocab.txt          copied from the data directory when it has one
#pragma once

#include <string>

namespace cohort {

// `path` is a run dir (its newest valid checkpoint) or a checkpoint dir;
// `out_dir` "" means RUN_DIR/export beside the checkpoints. Returns the path
// of the model.safetensors written. Throws DataError for a
// missing or corrupt checkpoint, naming the file.
std::string export_model(const std::string& path, const std::string& out_dir);

}  // namespace cohort
