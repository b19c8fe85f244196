// defines: CheckpointState, Checkpoints
//
// RUN_DIR/checkpoints/step-N/ holds:
//   model.safetensors  parameters and buffers, by module name
//   optimizer.pt       optimizer state (libtorch archive)
//   rng.safetensors    every rank's CPU generator state ("rank.R"), and the
//                      fp16 loss scaler's state ("loss_scaler") when enabled
//   config.toml        the resolved config of the run that wrote it
//   optimizer.shard-G.safetensors  dist.shard: range G's optimizer moments,
//                      written by that range's rank (optimizer.pt then
//                      holds only the options); state.json's "shard" says
//                      which ranges of the flat parameters the files hold
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
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cohort/ckpt/safetensors.hpp"
#include "cohort/core/error.hpp"
#include "cohort/data/order.hpp"

namespace cohort {

// dist.shard's layout in a checkpoint: range g of the trainable parameters
// laid end to end is [bounds[g], bounds[g+1]), in file ShardRecord::file(g).
struct ShardRecord {
  std::string mode;  // "" when the optimizer state is whole (optimizer.pt)
  int replicas = 1;
  std::vector<int64_t> bounds;
  std::vector<double> weights;  // per rank of the world that wrote it
  bool sharded() const { return !mode.empty(); }
  int groups() const { return static_cast<int>(bounds.size()) - 1; }
  static std::string file(int group) { return "optimizer.shard-" + std::to_string(group) + ".safetensors"; }
};

struct CheckpointState {
  static constexpr int kFormatVersion = 2;  // 2: state.json carries its own checksum
  // 3: the optimizer state is in ranges (dist.shard), which an older cohort
  // would not see: it refuses the version instead.
  static constexpr int kShardedFormatVersion = 3;
  int64_t step = 0;
  Cursor cursor;
  int64_t samples_seen = 0;
  int world_size = 1;
  int64_t train_samples = -1;  // the training set's size; -1: not recorded (older checkpoints)
  std::vector<int64_t> balance_shares;  // data.balance: per rank, of a full global batch
  ShardRecord shard;
};

// A checkpoint's files, held open from before they were verified: the job
// that writes the run may remove the directory (its ckpt.keep rotation)
// while a reader (eval, predict, export, model.init, a resume) still reads
// it, and an open file stays readable until it is closed.
class HeldFiles {
 public:
  HeldFiles() = default;
  HeldFiles(const HeldFiles&) = delete;
  HeldFiles& operator=(const HeldFiles&) = delete;
  ~HeldFiles();
  // Opens every file of `dir`; false (nothing held) when one is gone.
  bool open(const std::string& dir);
  // "/proc/self/fd/N" for a held file; "" when `name` is not held. An
  // error naming it names the file's path instead (HeldPathName).
  std::string path(const std::string& name) const;

 private:
  std::map<std::string, int> fds_;
  std::vector<std::unique_ptr<HeldPathName>> names_;
};

// A checkpoint directory whose checksums were verified, and what it holds.
struct ResolvedCheckpoint {
  std::string dir;
  CheckpointState state;
  std::shared_ptr<const HeldFiles> held;  // null: read by name

  // Where to read the checkpoint's file `name`: the verified file itself,
  // even after the directory is gone.
  std::string file(const std::string& name) const;
};

class Checkpoints {
 public:
  Checkpoints(std::string run_dir, int keep);

  // Writes step-N atomically and prunes to the newest `keep`. Rank 0 only.
  // Returns the directory written. A failed write (a full disk) throws one
  // Error naming the file and the reason; the partial step-N is removed and
  // the previous checkpoint, and `latest` naming it, are untouched.
  // dist.shard: the ranks first write state.shard's files into
  // temp_dir(step), which begin() creates (rank 0); write() adds the rest.
  std::string write(const CheckpointState& state, const NamedTensors& model, torch::optim::Optimizer& optimizer,
                    const NamedTensors& rng, const std::string& config_toml);
  std::string begin(int64_t step);
  std::string temp_dir(int64_t step) const;
  // Removes temp_dir(step) after a failed begin()..write().
  void abandon(int64_t step) const;
  // What a failed write of step-N leaves: "checkpoint step-N was not
  // written; step-M is intact and still the latest".
  std::string not_written(int64_t step) const;

  // Removes the partial checkpoints of `run_dir` (checkpoints/.tmp-step-N/
  // and *.tmp files: writes a crash or a full disk interrupted). Returns
  // their names. Rank 0, holding the run directory.
  static std::vector<std::string> remove_partial(const std::string& run_dir);

  // ckpt.best-metric: records step-N as the best so far (checkpoints/
  // best.json: step, metric, value); pruning keeps it. Rank 0 only.
  void mark_best(int64_t step, const std::string& metric, double value);
  struct Best {
    int64_t step = -1;
    std::string metric;
    double value = 0;
  };
  // The run's best.json; step -1 when there is none.
  static Best best(const std::string& run_dir);

  // `path` is a run dir (its newest valid checkpoint) or a checkpoint dir.
  // Returns the checkpoint to load, verified (once: nothing needs to check it
  // again); appends a line to `warnings` for every newer checkpoint skipped
  // as broken. Throws DataError when there is none.
  static ResolvedCheckpoint resolve(const std::string& path, std::vector<std::string>* warnings);

  // Verifies every checksum of `dir` (its files read from `held`, when
  // given); throws DataError naming the file.
  static CheckpointState verify(const std::string& dir, const HeldFiles* held = nullptr);

  static std::string dir_name(int64_t step);
  // The step of a "step-N" directory name, or -1 for any other name.
  static int64_t step_of(const std::string& name);
  // The run dir a checkpoint dir belongs to (RUN_DIR/checkpoints/step-N ->
  // RUN_DIR), absolute.
  static std::string run_dir_of(const std::string& checkpoint_dir);

 private:
  void prune() const;

  std::string root_;  // RUN_DIR/checkpoints
  int keep_;
};

// Copies every parameter and buffer of `module` from a safetensors file, by
// name. A missing, extra or differently shaped tensor is a ConfigError naming
// the file and tensor.
void load_model_weights(torch::nn::Module& module, const std::string& safetensors_path);
// The same, except that a tensor for which `may_skip(name)` holds may be
// missing from the file (left as initialised) or extra in it (left out).
// Returns those names.
std::vector<std::string> load_model_weights(torch::nn::Module& module, const std::string& safetensors_path,
                                            const std::function<bool(const std::string&)>& may_skip);

// A module's parameters and buffers by name (shared with the module: no copy).
NamedTensors module_tensors(torch::nn::Module& module);

// What load_model_weights_partial did.
struct WeightsLoad {
  int64_t loaded = 0;
  std::vector<std::string> initialised;  // the model's, absent from the file: left as initialised
  std::vector<std::string> ignored;      // the file's, absent from the model
};

// Fine-tuning's load: every tensor the model and the file share is copied;
// the model's others keep their initialisation (a new head) and the file's
// others are ignored (pretraining heads). A shape mismatch is a ConfigError
// naming the tensor, and so is a file sharing no tensor at all; nothing is
// copied then. A file of Hugging Face's BertModel (names without "bert.")
// matches the model's bert.* tensors.
WeightsLoad load_model_weights_partial(torch::nn::Module& module, const std::string& safetensors_path);

// The model.safetensors that `path` names: the file itself, a directory
// holding one (an export or a checkpoint), or a run dir (its newest valid
// checkpoint). Throws DataError when there is none.
std::string model_weights_file(const std::string& path);

}  // namespace cohort
