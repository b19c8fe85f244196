// defines: TrainOptions ... ModelOptions, TaskValue, Config, KeyScope, TaskKey, declare_task_keys,
//          declared_task_keys, ConfigBinding, validate,
//          read_config_values, shared_config, check_resume_config, load_config
//
// One typed options struct per subsystem, defaults inline. Every field is a
// config key `section.key`: settable as `--section.key VALUE` on the command
// line or as `key = VALUE` under `[section]` in a TOML file. The command line
// wins over the file; unknown keys are errors in both. validate() is the one
// place that checks ranges, and names the key and the value it rejects.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "cohort/config/choice.hpp"
#include "cohort/core/error.hpp"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace cohort {

struct TrainOptions {
  std::string task = "image-classify";
  int64_t max_steps = -1;    // -1: run `epochs` full epochs
  int64_t epochs = 1;
  uint64_t seed = 1;
  DeviceKind device = DeviceKind::kAuto;
  int threads = 0;           // intra-op threads per rank; 0: cores / local ranks
  Precision precision = Precision::kFp32;  // fp16: CUDA only
  int64_t early_stop_patience = 0;  // stop after N evaluations without a better ckpt.best-metric; 0: off
  bool activation_checkpointing = false;  // modernbert: recompute each layer in backward instead of keeping it
};

struct DataOptions {
  std::string path = "/usr/share/datasets/fashion-mnist";
  int64_t global_batch = 64;  // samples per optimizer step, over all ranks
  int64_t micro_batch = 0;    // most samples in one forward and backward, on every rank; 0: auto
  int workers = 1;            // background loader threads; 0: load inline
  int prefetch = 4;           // micro-batches prepared ahead per rank
  bool drop_last = false;     // drop the epoch's last, short global batch
  int64_t bucket = 0;         // length bucketing window, in global batches; 0: off
  bool pack = false;          // bert-pretrain: several instances per row, no padding computed
  Balance balance = Balance::kEqual;   // each rank's share of the global batch
  std::vector<double> balance_weights;  // balance = weights: one per rank
  int64_t balance_every = 5;   // balance = auto: re-measure every N steps
  // The BERT tasks' WordPiece (bert-classify declares its columns itself: TaskKey)
  std::string vocab;                   // vocab.txt; "": data.path's, else model.init's
  bool lowercase = true;               // uncased WordPiece
  std::string labels;                  // labels.json; "": the train split's labels
};

struct OptimOptions {
  OptimizerKind name = OptimizerKind::kAdamW;
  double lr = 1e-3;
  double weight_decay = 0.01;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double momentum = 0.9;       // sgd only
  Schedule schedule = Schedule::kLinear;
  double poly_power = 1.0;     // poly: (1 - progress)^power
  double warmup_ratio = 0.0;   // fraction of total steps spent warming up
  double min_lr_ratio = 0.0;   // final lr as a fraction of lr (linear, cosine)
  double clip_norm = 0.0;      // 0: no clipping
  double outer_lr = 1.0;        // dist.sync = local: the outer Nesterov step's learning rate
  double outer_momentum = 0.0;  // dist.sync = local: its momentum (DiLoCo's 0.7 and 0.9 suit hundreds of local steps)
  double outer_mix = 0.5;       // dist.outer-delay > 0: the local parameters' weight when a fragment lands
};

struct EvalOptions {
  int64_t every_steps = 0;    // 0: at the end of each epoch only
  std::string split = "test";
  int64_t batch = 512;
  int64_t max_samples = 0;    // 0: the whole split
};

struct LogOptions {
  int64_t every_steps = 50;
  bool sample_ids = false;    // RUN_DIR/sample-ids/rank-R.jsonl: ids per step
  bool tensorboard = true;    // RUN_DIR/tensorboard/events.out.tfevents.*
  bool progress_bar = true;   // redraw a bar on a terminal (never under mpirun); false: plain lines
  // MLflow tracking from rank 0: "" off, else the server ("http://host:5000").
  std::string mlflow;
  std::string mlflow_experiment = "Default";  // created when missing
  std::string mlflow_run_name;                // "": the run directory's name
};

struct CkptOptions {
  int64_t every_steps = 0;    // 0: only at the end
  int keep = 3;
  std::string best_metric;  // also keep the checkpoint with the best eval value of this; "": off
};

struct DistOptions {
  double timeout = 300.0;     // seconds any collective may take
  double bucket_cap_mb = 25.0;
  Compression grad_compression = Compression::kNone;  // dtype on the wire, or powersgd
  int64_t powersgd_rank = 4;          // powersgd: rank of each gradient matrix's approximation
  SyncMode sync = SyncMode::kStep;    // step: exact all-reduce every step; local: DiLoCo-style
  int64_t local_steps = 8;            // local: inner steps between outer syncs
  std::string islands = "auto";       // local: ranks that step exactly together (auto, node, rank, sizes "2,2")
  Compression island_compression = Compression::kNone;  // local: the gradients' dtype inside an island
  int64_t outer_fragments = 1;        // local: the change sent in fragments, one every local-steps / fragments
  int64_t outer_delay = 0;            // local: steps a fragment's sum travels while training goes on
  bool outer_error_feedback = false;  // local, a narrow wire: what rounding left out goes with the next sync
  BackendKind backend = BackendKind::kAuto;  // CUDA tensors: auto = NCCL when built with it
  ShardMode shard = ShardMode::kNone;  // optimizer state (and gradients) split over ranks
  std::string shard_weights = "auto";  // "auto" (free memory) or one weight per rank: "2,1"
  double max_memory_gb = 0;            // auto on the CPU: this node's memory for the job; 0 = what is available
  int64_t shard_replicas = 1;          // ranks holding each range: 2 survives a lost rank in memory
};

// dist.shard-weights as numbers: one per rank, or empty for auto. Throws
// ConfigError naming the key for anything else.
std::vector<double> shard_weights(const DistOptions& dist);

// dist.islands as island sizes ("2" or "2,2"); empty for auto, node and
// rank. Throws ConfigError naming the key for anything else.
std::vector<int64_t> island_sizes(const std::string& islands);

struct ModelOptions {
  std::string name = "cnn";   // mlp | cnn | bert | modernbert
  int64_t hidden = 256;
  double dropout = 0.1;       // bert: hidden dropout
  // bert only
  int64_t layers = 2;
  int64_t heads = 2;
  int64_t intermediate = 0;   // 0: 4 * hidden
  int64_t max_positions = 512;
  int64_t type_vocab = 2;
  int64_t vocab_size = 0;     // 0: the data's vocabulary (manifest.json or vocab.txt)
  double attention_dropout = 0.1;
  // modernbert only
  int64_t local_attention = 128;       // the sliding window's width (tokens see +- half of it)
  int64_t global_every = 3;            // layer i has global attention when i % global_every == 0
  double global_rope_theta = 160000.0; // rotary base of the global layers
  double local_rope_theta = 10000.0;   // rotary base of the sliding-window layers
  DropoutRng dropout_rng = DropoutRng::kSample;  // masks per sample, or from each rank's generator
  std::string init;           // start from these weights: a model.safetensors, an
                              // export dir, a checkpoint dir or a run dir
};

// The value of a key a task declares for itself (TaskKey): text, an
// integer, a flag or a number.
using TaskValue = std::variant<std::string, int64_t, bool, double>;

struct Config {
  TrainOptions train;
  DataOptions data;
  OptimOptions optim;
  EvalOptions eval;
  LogOptions log;
  CkptOptions ckpt;
  DistOptions dist;
  ModelOptions model;
  // The keys tasks declared for themselves (TaskKey), by name; a key not
  // set here has its declared default. Read them with task_key<T>(name).
  std::map<std::string, TaskValue> task;

  template <class T>
  T task_key(const std::string& name) const;
};

// Checks every range and cross-key constraint. Throws ConfigError naming the
// key and the rejected value.
void validate(const Config& cfg);
// Keys whose value would have no effect in this configuration (a mode's
// key with the mode off, another task's key), each with the error that
// names it: validate() refuses the first.
std::vector<std::pair<std::string, std::string>> inert_keys(const Config& cfg);
// A resume: the checkpoint's keys (not in `given`) that the new
// configuration leaves without effect go back to their defaults; one note
// each.
std::vector<std::string> reset_inert_keys(Config& cfg, const std::set<std::string>& given);

// What needs the world's size as well (once it is known: by the launcher
// before it starts ranks, by each rank of a fixed world): one shard weight
// per rank, a world that the shard replicas divide, islands of several ranks
// for dist.shard under local steps (`one_node`: every rank on one node, so
// dist.islands = auto means one rank each). ConfigError naming the key.
void validate_world(const Config& cfg, int world_size, bool one_node = false);

// Why dist.shard cannot shard islands of one rank under dist.sync = local.
std::string shard_needs_islands(const DistOptions& dist);

// Where a key's value must agree. kShared: the same on every rank (checked
// at start-up), free to change on resume. kPerNode: may differ between
// ranks and on resume (threads, device, loader, data location, timeouts,
// output files). kFixed: the same on every rank and refused on resume: it
// defines what is trained, on which samples, in which order.
enum class KeyScope { kShared, kPerNode, kFixed };

// A config key a task declares for itself, named like the built-in keys
// (`section.name`): bound on the command line and in --config files,
// written to config.toml, checked at start-up and on resume by its scope,
// and kept in Config::task. bert-classify declares its columns this way;
// a program declares its task's keys with register_task.
//
// A task's keys exist in a program that holds the task: declared by
// register_task, or (a built-in task) when its file is linked in.
struct TaskKey {
  std::string name;  // "data.text-column"
  TaskValue value;   // its default, and so its type
  std::string help;
  KeyScope scope = KeyScope::kFixed;
  // What validate() finds wrong with a value ("must be >= 4"); "" when
  // nothing. Null: any value of the type.
  std::function<std::string(const TaskValue&)> problem = nullptr;
  // The train.task that reads it ("" = any): another task's run refuses a
  // value other than the default (it would be ignored). register_task
  // fills it with the task's name.
  std::string task = "";
};

// Declares keys (before a ConfigBinding is made: at start-up, or in main
// before cli_main). UsageError when a name is declared twice.
void declare_task_keys(const std::vector<TaskKey>& keys);
// `keys`, each read by train.task `task` alone (TaskKey::task).
std::vector<TaskKey> keys_of_task(const std::string& task, std::vector<TaskKey> keys);
const std::vector<TaskKey>& declared_task_keys();

template <class T>
T Config::task_key(const std::string& name) const {
  if (auto it = task.find(name); it != task.end()) return std::get<T>(it->second);
  for (const auto& k : declared_task_keys()) {
    if (k.name == name) return std::get<T>(k.value);
  }
  throw Error(detail::cat("config key ", name, " was read but no task declared it"));
}

// Declares one CLI11 option per config key on `app`, bound to `cfg`'s fields.
// Both `app` and `cfg` must outlive the binding.
class ConfigBinding {
 public:
  ConfigBinding(CLI::App& app, Config& cfg);
  ~ConfigBinding();

  // After app.parse(): applies a TOML file's values to keys the command line
  // did not set. Throws UsageError for an unreadable file, an unknown key or a
  // value of the wrong type, naming the file and key.
  void apply_file(const std::string& path);

  // The fully resolved config as TOML, every key present.
  std::string to_toml() const;

  // The keys set so far (on the command line, by apply_file).
  std::set<std::string> given() const;

  // Every key, `section.key`, in declaration order.
  std::vector<std::string> keys() const;
  KeyScope scope(const std::string& key) const;

 private:
  struct Key;
  std::vector<std::unique_ptr<Key>> keys_;
};

// A resolved config.toml (as to_toml writes it) as key -> TOML literal,
// e.g. "optim.lr" -> "0.001".
std::vector<std::pair<std::string, std::string>> read_config_values(const std::string& toml_text);

// The lines of a resolved config that every rank must share (all but the
// kPerNode keys): what the start-up check hashes.
std::string shared_config(const std::string& toml_text);

// Compares the config a checkpoint was written with to the one resuming it.
// Changing a kFixed key is a ConfigError naming the key and both values;
// other changes are returned as lines to report ("optim.lr: 0.001 -> 0.0005").
std::vector<std::string> check_resume_config(const std::string& saved_toml, const std::string& current_toml);

// A config file (a run's config.toml, or any --config file) over the
// defaults, validated. Throws UsageError or ConfigError naming the file.
Config load_config(const std::string& path);

// The config key nearest to `name` (an edit distance under 4), for "did you
// mean" hints; "" when none is near.
std::string closest_key(const std::string& name);

}  // namespace cohort
