// defines: CheckpointState, Checkpoints
//
// RUN_DIR/checkpoints/step-N/ holds:
//   model.safetensors  parameters and buffers, by module name
//   optimizer.pt       optimizer state (libtorch archive)
//   rng.safetensors    every rank's CPU generator state ("rank.R"), and the
//                      fp16 loss scaler's state ("loss_scaler") when enabled
//   config.toml        the resolved config of the run that wrote it
//   state.json         format version, step, cursor, world size, and the
//                      sha256 of every other file; written last
// A checkpoint is written into a temporary directory, fsync'd, and renamed;
// RUN_DIR/checkpoints/latest (a one-line file naming the directory) is
// replaced atomically after that. A reader verifies every checksum and falls
// back to the previous checkpoint, with a warning, when one is incomplete or
// corrupt.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cohort/ckpt/safetensors.hpp"
#include "cohort/data/order.hpp"

namespace cohort {

struct CheckpointState {
  static constexpr int kFormatVersion = 1;
  int64_t step = 0;
  Cursor cursor;
  int64_t samples_seen = 0;
  int world_size = 1;
};

class Checkpoints {
 public:
  Checkpoints(std::string run_dir, int keep);

  // Writes step-N atomically and prunes to the newest `keep`. Rank 0 only.
  // Returns the directory written.
  std::string write(const CheckpointState& state, const NamedTensors& model, torch::optim::Optimizer& optimizer,
                    const NamedTensors& rng, const std::string& config_toml);

  // `path` is a run dir (its newest valid checkpoint) or a checkpoint dir.
  // Returns the checkpoint dir to load; appends a line to `warnings` for every
  // newer checkpoint skipped as broken. Throws DataError when there is none.
  static std::string resolve(const std::string& path, std::vector<std::string>* warnings);

  // Verifies every checksum of `dir`; throws DataError naming the file.
  static CheckpointState verify(const std::string& dir);

  static std::string dir_name(int64_t step);
  // The step of a "step-N" directory name, or -1 for any other name.
  static int64_t step_of(const std::string& name);
  // The run dir a checkpoint dir belongs to (RUN_DIR/checkpoints/step-N ->
  // RUN_DIR), absolute.
  static std::string run_dir_of(const std::string& checkpoint_dir);

 private:
  std::string root_;  // RUN_DIR/checkpoints
  int keep_;
};

// Copies every parameter and buffer of `module` from a safetensors file, by
// name. A missing, extra or differently shaped tensor is a ConfigError naming
// the file and tensor.
void load_model_weights(torch::nn::Module& module, const std::string& safetensors_path);

// The model.safetensors that `path` names: the file itself, a directory
// holding one (an export or a checkpoint), or a run dir (its newest valid
// checkpoint). Throws DataError when there is none.
std::string model_weights_file(const std::string& path);

// Reads a resolved config.toml into key -> literal value ("optim.lr" -> "0.001").
std::vector<std::pair<std::string, std::string>> read_config_values(const std::string& toml_text);
// read_config_values of a file. Throws DataError naming it when unreadable.
std::vector<std::pair<std::string, std::string>> read_config_file(const std::string& path);
// The value of `key` in such a list, a string's quotes removed. Throws
// DataError naming the key when it is absent.
std::string config_value(const std::vector<std::pair<std::string, std::string>>& values, const std::string& key);

// Compares the config a checkpoint was written with to the one resuming it.
// A change that breaks the resume (model shape, task, data, seed, order) is a
// ConfigError naming the key and both values; other changes are returned as
// lines to report ("optim.lr: 0.001 -> 0.0005").
std::vector<std::string> check_resume_config(const std::string& saved_toml, const std::string& current_toml);

}  // namespace cohort
