#include "cohort/config/config.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string_view>
#include <type_traits>
#include <utility>

#include "cohort/core/error.hpp"

namespace cohort {

struct ConfigBinding::Key {
  std::string name;  // section.key
  KeyScope scope = KeyScope::kShared;
  CLI::Option* option = nullptr;
  std::function<std::string()> to_toml;  // current value as a TOML literal
  bool boolean = false;                   // a flag: a file must say true or false
  bool list = false;                      // several numbers: "2,1" or [2.0, 1.0]
  // A number (or list of numbers): what is wrong with a value's text, or ""
  // (the CLI's validator and the file's check). Empty for other keys.
  std::function<std::string(const std::string&)> number_problem;
};

namespace {

// The first line of a config.toml Cohort writes (ConfigBinding::to_toml).
constexpr const char* kResolvedHeader = "# Fully resolved Cohort config: every key, defaults included.\n";

std::string toml_value(const std::string& v) {
  std::string out = "\"";
  for (char c : v) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}
std::string toml_value(bool v) { return v ? "true" : "false"; }
std::string toml_value(double v) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, res.ptr);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // stay a float
  return s;
}
template <class Int>
std::string toml_value(Int v) {
  return std::to_string(v);
}
std::string toml_value(const std::vector<double>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + toml_value(v[i]);
  return out + "]";
}

// What is wrong with `text` as a value of type T, or "" when nothing is.
// CLI11 alone would wrap 99999999999999999999 to INT64_MAX and -1 to
// UINT64_MAX, read "" as 0 and "010" as octal 8.
template <class T>
std::string number_problem(const std::string& text) {
  std::string_view s(text);
  if (!s.empty() && s[0] == '+') s.remove_prefix(1);
  if (s.empty()) return detail::cat("must be a number (got '", text, "')");
  const char* end = s.data() + s.size();
  if constexpr (std::is_integral_v<T>) {
    if (std::is_unsigned_v<T> && s[0] == '-') return detail::cat("must be >= 0 (got ", text, ")");
    size_t sign = s[0] == '-' ? 1 : 0;
    T v{};
    auto [ptr, ec] = std::from_chars(s.data(), end, v);
    if (ec == std::errc::result_out_of_range) {
      return detail::cat("is out of range (got ", text, "; the most is ", std::numeric_limits<T>::max(), ")");
    }
    if (ec != std::errc() || ptr != end) return detail::cat("must be an integer (got '", text, "')");
    if (s.size() > sign + 1 && s[sign] == '0') {
      return detail::cat("must be a decimal integer without leading zeros (got '", text, "')");
    }
  } else {
    double v = 0;
    auto [ptr, ec] = std::from_chars(s.data(), end, v);
    if (ec == std::errc::result_out_of_range) return detail::cat("is out of range (got ", text, ")");
    if (ec != std::errc() || ptr != end) return detail::cat("must be a number (got '", text, "')");
  }
  return "";
}

// "2,1" or "[2.0, 1.0]": the numbers of a list key.
std::vector<std::string> list_items(std::string text) {
  auto trim = [](std::string v) {
    v.erase(0, v.find_first_not_of(" \t"));
    return v.substr(0, v.find_last_not_of(" \t") + 1);
  };
  text = trim(text);
  if (text.size() >= 2 && text.front() == '[' && text.back() == ']') text = trim(text.substr(1, text.size() - 2));
  std::vector<std::string> items;
  if (text.empty()) return items;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) items.push_back(trim(item));
  if (text.back() == ',') items.push_back("");
  return items;
}

// Levenshtein distance, for "did you mean" hints on unknown keys.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1] ? 1u : 0u)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

ConfigBinding::ConfigBinding(CLI::App& app, Config& c) {
  const std::string group = "Config keys (also [section] key = value in --config)";
  auto bind = [&](const std::string& name, auto& field, const std::string& help, KeyScope scope = KeyScope::kShared,
                  const std::string& alias = "") {
    auto key = std::make_unique<Key>();
    key->name = name;
    key->scope = scope;
    std::string flags = "--" + name + (alias.empty() ? "" : "," + alias);
    using T = std::decay_t<decltype(field)>;
    if constexpr (std::is_same_v<T, bool>) {
      key->option = app.add_flag(flags, field, help);
      key->option->expected(0, 1);  // --task.nsp, --task.nsp=false and --task.nsp false
      key->boolean = true;
      key->option->default_str(field ? "true" : "false");
      key->to_toml = [&field] { return toml_value(field); };
    } else if constexpr (std::is_enum_v<T>) {
      key->option = app.add_option_function<std::string>(
          flags, [&field, name](const std::string& text) { field = parse_choice<T>(name, text); }, help);
      key->option->default_str(name_of(field))->type_name(choice_list<T>());
      key->to_toml = [&field] { return toml_value(std::string(name_of(field))); };
    } else if constexpr (std::is_same_v<T, std::vector<double>>) {
      // One token per occurrence (2,1), so that a key given twice is seen.
      key->list = true;
      key->number_problem = [](const std::string& text) {
        std::vector<std::string> items = list_items(text);
        for (const auto& item : items) {
          if (std::string p = number_problem<double>(item); !p.empty()) return "each value " + p;
        }
        return std::string();
      };
      key->option = app.add_option_function<std::string>(
          flags,
          [&field](const std::string& text) {
            field.clear();
            for (const auto& item : list_items(text)) field.push_back(std::stod(item));
          },
          help);
      key->option->type_name("X,Y,...")->default_str("[]");
      key->to_toml = [&field] { return toml_value(field); };
    } else {
      key->option = app.add_option(flags, field, help)->capture_default_str();
      if constexpr (std::is_same_v<T, std::string>) {
        if (field.empty()) key->option->default_str("''");
      } else {
        key->number_problem = &number_problem<T>;
      }
      key->to_toml = [&field] { return toml_value(field); };
    }
    if (key->number_problem) {
      auto problem = key->number_problem;
      key->option->check(CLI::Validator([problem](std::string& text) { return problem(text); }, "", ""));
    }
    key->option->group(group)->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    keys_.push_back(std::move(key));
  };
  // Each key is declared exactly once, here, with its scope: kPerNode keys
  // may differ between ranks (they are not in the start-up config check);
  // kFixed keys define what is trained and on which samples in which order,
  // so a resume refuses to change them. The rest must match on every rank
  // and may change on resume.
  const KeyScope node = KeyScope::kPerNode, fixed = KeyScope::kFixed;

  bind("train.task", c.train.task, "task: bert-pretrain | bert-classify | image-classify, or one the program registered", fixed);
  bind("train.max-steps", c.train.max_steps, "stop after this many optimizer steps; -1 runs train.epochs epochs");
  bind("train.epochs", c.train.epochs, "epochs to run when train.max-steps is -1");
  bind("train.seed", c.train.seed, "seed for every RNG: init, data order, dropout", fixed);
  bind("train.device", c.train.device, "auto | cpu | cuda", node);
  bind("train.threads", c.train.threads, "intra-op threads per rank; 0 = free cores / local ranks", node, "--threads");
  bind("train.early-stop-patience", c.train.early_stop_patience, "stop after N evaluations in a row without a "
       "better ckpt.best-metric (the best checkpoint is kept); 0 = off");
  bind("train.activation-checkpointing", c.train.activation_checkpointing, "modernbert: keep only each layer's "
       "input while training and run the layer again in backward: less memory for longer sequences, about a third "
       "more compute; the same result", node);
  bind("train.precision", c.train.precision, "autocast dtype; master weights stay fp32. auto = bf16 on a CPU with AMX, else fp32; fp16 (loss-scaled) on CUDA (on a CPU it runs, slower than bf16)");

  bind("data.path", c.data.path, "dataset directory (may differ between nodes)", node);
  bind("data.global-batch", c.data.global_batch, "samples per optimizer step, summed over all ranks and micro-batches", fixed);
  bind("data.micro-batch", c.data.micro_batch, "most samples in one forward and backward (memory), the same on every "
       "rank: each global batch is cut into micro-batches in its sample order and ranks compute whole ones, so the "
       "loss does not depend on the world size or split; 0 = auto: at most 32, and a multiple of 12 of them, so 1, 2, "
       "3, 4, 6 or 12 ranks get equal shares");
  bind("data.workers", c.data.workers, "background loader threads per rank; 0 loads inline", node);
  bind("data.prefetch", c.data.prefetch, "steps prepared ahead per rank", node);
  bind("data.drop-last", c.data.drop_last, "drop the epoch's last, short global batch", fixed);
  bind("data.bucket", c.data.bucket, "length bucketing: sort each window of N global batches by length; 0 = off", fixed);
  bind("data.pack", c.data.pack, "bert-pretrain: pack several instances into each row of the shards' length, "
       "attention block-diagonal, so no compute goes to padding (the same losses as unpacked)");
  bind("data.balance", c.data.balance, "each rank's share of the global batch: equal, by data.balance-weights, "
       "or auto from each rank's measured speed");
  bind("data.balance-weights", c.data.balance_weights, "data.balance = weights: one weight per rank, e.g. 2,1");
  bind("data.balance-every", c.data.balance_every, "data.balance = auto: re-measure the ranks' speeds every N steps");
  bind("data.vocab", c.data.vocab, "vocab.txt for bert-classify, and for bert-pretrain's dynamic masking of "
       "shards written without one; '' = data.path's, else the one beside model.init", node);
  bind("data.labels", c.data.labels, "bert-classify: the label names (a run's labels.json); '' = the train split's; "
       "eval and predict use the run's", node);
  bind("data.lowercase", c.data.lowercase, "bert-classify: uncased WordPiece (lowercase, strip accents)", fixed);

  bind("optim.name", c.optim.name, "optimizer", fixed);
  bind("optim.lr", c.optim.lr, "peak learning rate");
  bind("optim.weight-decay", c.optim.weight_decay, "decoupled weight decay (not applied to biases)");
  bind("optim.beta1", c.optim.beta1, "adamw/lamb beta1");
  bind("optim.beta2", c.optim.beta2, "adamw/lamb beta2");
  bind("optim.eps", c.optim.eps, "adamw/lamb epsilon");
  bind("optim.momentum", c.optim.momentum, "sgd momentum");
  bind("optim.schedule", c.optim.schedule, "learning-rate decay after warmup");
  bind("optim.poly-power", c.optim.poly_power, "poly schedule exponent: lr = min + (peak - min) * (1 - progress)^power");
  bind("optim.warmup-ratio", c.optim.warmup_ratio, "fraction of total steps with linear warmup from 0");
  bind("optim.min-lr-ratio", c.optim.min_lr_ratio, "final lr as a fraction of optim.lr (linear, cosine, poly)");
  bind("optim.clip-norm", c.optim.clip_norm, "clip the global gradient norm to this; 0 disables");
  bind("optim.outer-lr", c.optim.outer_lr, "dist.sync = local: learning rate of the outer Nesterov step applied "
       "to the ranks' averaged parameter change");
  bind("optim.outer-momentum", c.optim.outer_momentum, "dist.sync = local: momentum of the outer Nesterov step (0: "
       "plain averaging; DiLoCo's lr 0.7 and momentum 0.9 suit hundreds of local steps)");
  bind("optim.outer-mix", c.optim.outer_mix, "dist.outer-delay > 0: when a fragment's sum lands, the fragment "
       "becomes mix * this rank's parameters + (1 - mix) * the outer step's (Streaming DiLoCo's alpha; 0 drops the "
       "steps taken while the sum travelled)");

  bind("eval.every-steps", c.eval.every_steps, "evaluate every N steps; 0 = at the end of each epoch");
  bind("eval.split", c.eval.split, "split to evaluate on");
  bind("eval.batch", c.eval.batch, "evaluation batch size per rank");
  bind("eval.max-samples", c.eval.max_samples, "evaluate on the first N samples only; 0 = all");

  bind("log.every-steps", c.log.every_steps, "console and metrics.jsonl line every N steps");
  bind("log.tensorboard", c.log.tensorboard, "write TensorBoard scalars to RUN_DIR/tensorboard/", node);
  bind("log.progress-bar", c.log.progress_bar, "redraw a progress bar when the console is a terminal "
       "(never under mpirun, which hands every rank one); false: plain lines", node);
  bind("log.mlflow", c.log.mlflow, "MLflow tracking server (http://host:5000): rank 0 sends the config, metrics, "
       "plots and exports; '' = off", node);
  bind("log.mlflow-experiment", c.log.mlflow_experiment, "MLflow experiment of the run (created when missing)", node);
  bind("log.mlflow-run-name", c.log.mlflow_run_name, "MLflow run name; '' = the run directory's name", node);
  bind("log.sample-ids", c.log.sample_ids, "debug: write every rank's sample ids per step to RUN_DIR/sample-ids/", node);

  bind("ckpt.every-steps", c.ckpt.every_steps, "checkpoint every N steps; 0 = only at the end");
  bind("ckpt.keep", c.ckpt.keep, "checkpoints kept");
  bind("ckpt.best-metric", c.ckpt.best_metric, "also keep the checkpoint with the best eval value of this metric "
       "(RUN_DIR/checkpoints/best.json names it); lower is better for names with 'loss'; '' = off");

  bind("dist.timeout", c.dist.timeout, "seconds any collective may take before the job fails", node);
  bind("dist.bucket-cap-mb", c.dist.bucket_cap_mb, "gradient all-reduce bucket size, MiB");
  bind("dist.grad-compression", c.dist.grad_compression, "gradients on the wire: none = exact (the micro-batches' "
       "gradients summed in fp64, so the sum does not depend on its order: the same at any world size), fp32 (half "
       "none's traffic; the rounding then follows the world size), bf16, fp16, or powersgd (each matrix as a rank-r "
       "product, with error feedback); local sync: the parameter change's dtype (none = fp32; int8 = one byte a value "
       "and an fp32 scale per 4096; int4 = half a byte a value and an fp32 scale per 128; both gathered and added in "
       "fp32)");
  bind("dist.powersgd-rank", c.dist.powersgd_rank, "powersgd: rank of each gradient matrix's approximation");
  bind("dist.sync", c.dist.sync, "step: gradients summed exactly every step (the loss per step does not depend on "
       "the world size); local: each rank steps alone for dist.local-steps, then the ranks average the parameter "
       "change and apply an outer Nesterov step (DiLoCo: far less traffic, for slow links)", fixed);
  bind("dist.local-steps", c.dist.local_steps, "dist.sync = local: inner optimizer steps between syncs");
  bind("dist.outer-fragments", c.dist.outer_fragments, "dist.sync = local: the parameter change is sent in this many "
       "fragments, one every dist.local-steps / N steps, each still every dist.local-steps (Streaming DiLoCo: N times "
       "smaller sums); must divide dist.local-steps");
  bind("dist.outer-delay", c.dist.outer_delay, "dist.sync = local: inner steps a fragment's sum travels while training "
       "goes on before it is applied (0: each sum blocks); below dist.local-steps / dist.outer-fragments");
  bind("dist.outer-error-feedback", c.dist.outer_error_feedback, "dist.sync = local with dist.grad-compression "
       "bf16, fp16, int8 or int4: each rank keeps what rounding its change left out and adds it to its next sync's "
       "(error feedback), so that no part of the change is lost for good");
  bind("dist.islands", c.dist.islands, "dist.sync = local: ranks that train one model exactly together (gradients "
       "summed every step) and meet the other islands in the outer sync: node = one island per node, rank = every "
       "rank its own (flat local steps), sizes = consecutive ranks (e.g. 2, or 2,1); auto = node when there are "
       "several nodes of more than one rank each, else rank; on resume another grouping merges the open window. "
       "dist.grad-compression powersgd: node or sizes sum exactly inside each island and compress between them");
  bind("dist.island-compression", c.dist.island_compression, "dist.sync = local with islands of several ranks: the "
       "gradients on the wire inside an island, summed every step: none = exact (fp64), fp32, bf16 or fp16, as "
       "dist.grad-compression is for dist.sync = step");
  bind("dist.shard", c.dist.shard, "ZeRO: none; optimizer = each rank keeps the AdamW/LAMB state of its range of the "
       "parameters and updates only that range (stage 1); gradients = each rank also keeps only its range's gradients "
       "(stage 2); under dist.sync = local, over the ranks of each island (dist.islands)");
  bind("dist.shard-weights", c.dist.shard_weights, "dist.shard: each rank's share of the state: auto (by free memory: "
       "the GPU's, or the node's available memory over its ranks) or one weight per rank, e.g. 2,1");
  bind("dist.max-memory-gb", c.dist.max_memory_gb, "dist.shard-weights = auto on the CPU: this node's memory for the "
       "job, GB; 0 = the node's available memory", node);
  bind("dist.shard-replicas", c.dist.shard_replicas, "dist.shard: ranks holding each range (1 or 2); with 2 an elastic "
       "world that loses a rank goes on from its partner's copy, without a checkpoint");
  bind("dist.backend", c.dist.backend, "collectives on CUDA tensors: auto = nccl when built with it, else gloo; "
       "gloo also runs several ranks on one GPU. CPU tensors always use gloo");

  bind("model.name", c.model.name, "model: mlp | cnn (image tasks), bert or modernbert (text tasks), or one the "
       "program registered", fixed);
  bind("model.hidden", c.model.hidden, "hidden width", fixed);
  bind("model.dropout", c.model.dropout, "dropout probability (bert: hidden dropout; modernbert: after the embeddings "
       "and in GeGLU, 0 in ModernBERT's recipe)", fixed);
  bind("model.layers", c.model.layers, "bert, modernbert: transformer layers", fixed);
  bind("model.heads", c.model.heads, "bert, modernbert: attention heads; must divide model.hidden", fixed);
  bind("model.intermediate", c.model.intermediate, "bert: feed-forward width, 0 = 4 * model.hidden; modernbert: GeGLU's width, 0 = 1.5 * model.hidden", fixed);
  bind("model.max-positions", c.model.max_positions, "bert: position embeddings, the longest sequence; modernbert: the longest sequence (rotary positions)", fixed);
  bind("model.type-vocab", c.model.type_vocab, "bert: segment (token type) embeddings", fixed);
  bind("model.vocab-size", c.model.vocab_size, "bert, modernbert: vocabulary; 0 = the data's (manifest.json or vocab.txt)", fixed);
  bind("model.attention-dropout", c.model.attention_dropout, "bert: dropout on attention probabilities; modernbert: on attention probabilities and output", fixed);
  bind("model.local-attention", c.model.local_attention, "modernbert: the sliding window's width in tokens (each "
       "sees half of it on either side), as Hugging Face's local_attention", fixed);
  bind("model.global-every", c.model.global_every, "modernbert: every n-th layer (from the first) attends globally, "
       "the others in the sliding window", fixed);
  bind("model.global-rope-theta", c.model.global_rope_theta, "modernbert: the rotary base of the global layers", fixed);
  bind("model.local-rope-theta", c.model.local_rope_theta, "modernbert: the rotary base of the sliding-window layers",
       fixed);
  bind("model.dropout-rng", c.model.dropout_rng, "dropout masks: sample = keyed by (seed, step, sample id), the same "
       "on any world size and split; rank = each rank's torch generator", fixed);
  bind("model.init", c.model.init, "start from these weights (model.safetensors, export, checkpoint or run dir); '' = fresh", fixed);

  // The tasks' own keys, each after the last key of its section (to_toml
  // writes a section once).
  for (const auto& k : declared_task_keys()) {
    COHORT_CHECK(std::none_of(keys_.begin(), keys_.end(), [&](const auto& key) { return key->name == k.name; }),
                 UsageError, "config key ", k.name, " is declared by a task but is a built-in key");
    TaskValue& value = c.task.try_emplace(k.name, k.value).first->second;
    std::visit([&](auto& field) { bind(k.name, field, k.help, k.scope); }, value);
    const std::string section = k.name.substr(0, k.name.find('.') + 1);
    auto last = std::find_if(keys_.rbegin() + 1, keys_.rend(), [&](const auto& key) {
      return key->name.compare(0, section.size(), section) == 0;
    });
    if (last != keys_.rend()) std::rotate(last.base(), keys_.end() - 1, keys_.end());
  }

  // A key given twice is a mistake (which one was meant?), not "the last wins".
  app.parse_complete_callback([this] {
    for (const auto& k : keys_) {
      const auto& given = k->option->results();
      if (given.size() < 2) continue;
      std::string values;
      for (const auto& v : given) values += (values.empty() ? "" : ", then ") + (v.empty() ? "''" : v);
      throw UsageError(detail::cat("--", k->name, " is given ",
                                   given.size() == 2 ? std::string("twice") : detail::cat(given.size(), " times"),
                                   " on the command line (", values, "); give each key once"));
    }
  });
}

ConfigBinding::~ConfigBinding() = default;

namespace {

std::vector<TaskKey>& task_keys() {
  static std::vector<TaskKey> keys;
  return keys;
}

}  // namespace

void declare_task_keys(const std::vector<TaskKey>& keys) {
  for (const auto& k : keys) {
    for (const auto& have : task_keys()) {
      COHORT_CHECK(have.name != k.name, UsageError, "config key ", k.name, " is declared twice");
    }
    COHORT_CHECK(k.name.find('.') != std::string::npos, UsageError, "config key ", k.name,
                 " needs a section: section.name");
    task_keys().push_back(k);
  }
}

const std::vector<TaskKey>& declared_task_keys() { return task_keys(); }

std::vector<TaskKey> keys_of_task(const std::string& task, std::vector<TaskKey> keys) {
  for (auto& k : keys) k.task = task;
  return keys;
}

namespace {

// Every key with its scope, from a binding of its own (members destroyed in
// reverse): what scope_of and closest_key look up.
const ConfigBinding& reference_binding() {
  static const struct Reference {
    CLI::App app;
    Config cfg;
    ConfigBinding binding{app, cfg};
  } reference;
  return reference.binding;
}

KeyScope scope_of(const std::string& key) { return reference_binding().scope(key); }

}  // namespace

std::string closest_key(const std::string& name) {
  const auto keys = reference_binding().keys();
  auto known = [&](const std::string& k) { return std::find(keys.begin(), keys.end(), k) != keys.end(); };
  // The fewest edits; among as few, the longest common start (optim.lrate
  // is optim.lr's, not optim.name's, though both are 3 edits away).
  std::string hint;
  size_t best = 4, shared = 0;
  for (const auto& k : keys) {
    const size_t d = edit_distance(name, k);
    size_t same = 0;
    while (same < name.size() && same < k.size() && name[same] == k[same]) ++same;
    if (d < best || (d == best && same > shared)) best = d, shared = same, hint = k;
  }
  if (!hint.empty()) return hint;
  // Hugging Face Trainer's and other tools' spellings: snake_case, their
  // section names, their key names.
  std::string dashed = name;
  std::replace(dashed.begin(), dashed.end(), '_', '-');
  static const std::map<std::string, std::string> foreign_keys = {
      {"learning-rate", "optim.lr"},        {"lr", "optim.lr"},
      {"num-train-epochs", "train.epochs"}, {"epochs", "train.epochs"},
      {"max-steps", "train.max-steps"},     {"seed", "train.seed"},
      {"weight-decay", "optim.weight-decay"}, {"warmup-ratio", "optim.warmup-ratio"},
      {"adam-beta1", "optim.beta1"},        {"adam-beta2", "optim.beta2"},
      {"adam-epsilon", "optim.eps"},        {"max-grad-norm", "optim.clip-norm"},
      {"lr-scheduler-type", "optim.schedule"}, {"gradient-accumulation-steps", "data.micro-batch"},
      {"logging-steps", "log.every-steps"}, {"eval-steps", "eval.every-steps"},
      {"save-steps", "ckpt.every-steps"},   {"save-total-limit", "ckpt.keep"},
      {"metric-for-best-model", "ckpt.best-metric"}, {"per-device-train-batch-size", "data.micro-batch"},
      {"train-batch-size", "data.global-batch"}, {"per-device-eval-batch-size", "eval.batch"},
      {"dataloader-num-workers", "data.workers"}, {"max-seq-length", "data.max-seq-length"},
      {"device", "train.device"},           {"batch", "data.global-batch"},
      {"batch-size", "data.global-batch"},  {"accum-steps", "data.micro-batch"},
      {"max-micro-batch", "data.micro-batch"},
      {"precision", "train.precision"},     {"model-name-or-path", "model.init"},
  };
  static const std::map<std::string, std::string> foreign_sections = {
      {"optimizer", "optim"},   {"optimiser", "optim"}, {"training", "train"}, {"trainer", "train"},
      {"logging", "log"},       {"checkpoint", "ckpt"}, {"checkpoints", "ckpt"}, {"checkpointing", "ckpt"},
      {"distributed", "dist"},  {"evaluation", "eval"}, {"dataset", "data"},  {"scheduler", "optim"},
  };
  const auto dot = dashed.find('.');
  const std::string section = dot == std::string::npos ? "" : dashed.substr(0, dot);
  const std::string key = dot == std::string::npos ? dashed : dashed.substr(dot + 1);
  if (auto it = foreign_sections.find(section); it != foreign_sections.end() && known(it->second + "." + key))
    return it->second + "." + key;
  if (auto it = foreign_keys.find(key); it != foreign_keys.end() && known(it->second)) return it->second;
  if (known(dashed)) return dashed;
  // A key given without its section: --seed, --max-steps.
  std::string only;
  for (const auto& k : keys) {
    if (k.size() > key.size() && k.compare(k.size() - key.size(), key.size(), key) == 0 &&
        k[k.size() - key.size() - 1] == '.') {
      if (!only.empty()) return "";  // in two sections: no single answer
      only = k;
    }
  }
  return only;
}

std::set<std::string> ConfigBinding::given() const {
  std::set<std::string> out;
  for (const auto& k : keys_) {
    if (k->option->count() > 0) out.insert(k->name);
  }
  return out;
}

std::vector<std::string> ConfigBinding::keys() const {
  std::vector<std::string> out;
  for (const auto& k : keys_) out.push_back(k->name);
  return out;
}

KeyScope ConfigBinding::scope(const std::string& key) const {
  for (const auto& k : keys_) {
    if (k->name == key) return k->scope;
  }
  for (const auto& k : declared_task_keys()) {  // declared after this binding was made
    if (k.name == key) return k.scope;
  }
  return KeyScope::kShared;
}

std::vector<std::pair<std::string, std::string>> read_config_values(const std::string& toml_text) {
  std::vector<std::pair<std::string, std::string>> out;
  std::istringstream in(toml_text);
  std::string section;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    if (line.front() == '[' && line.back() == ']') {
      section = line.substr(1, line.size() - 2);
      continue;
    }
    auto eq = line.find(" = ");
    if (eq == std::string::npos) continue;
    out.emplace_back(section + "." + line.substr(0, eq), line.substr(eq + 3));
  }
  return out;
}

std::string shared_config(const std::string& toml_text) {
  std::string out;
  for (const auto& [key, value] : read_config_values(toml_text)) {
    if (scope_of(key) != KeyScope::kPerNode) out += key + "=" + value + "\n";
  }
  return out;
}

std::vector<std::string> check_resume_config(const std::string& saved_toml, const std::string& current_toml) {
  std::map<std::string, std::string> saved;
  for (auto& [k, v] : read_config_values(saved_toml)) saved[k] = v;
  // A key the checkpoint's config lacks (it came with a later Cohort, or a
  // task declared it since) had its default's behaviour when it was written.
  std::map<std::string, std::string> defaults;
  {
    CLI::App app;
    Config cfg;
    ConfigBinding binding(app, cfg);
    for (auto& [k, v] : read_config_values(binding.to_toml())) defaults[k] = v;
  }
  std::vector<std::string> changes;
  for (auto& [key, value] : read_config_values(current_toml)) {
    auto it = saved.find(key);
    const bool known = it != saved.end();
    auto d = defaults.find(key);
    if (!known && d == defaults.end()) continue;
    const std::string was = known ? it->second : d->second;
    if (was == value) continue;
    const std::string shown = known ? was : was + " (the default; the checkpoint's config predates the key)";
    COHORT_CHECK(scope_of(key) != KeyScope::kFixed, ConfigError, "cannot resume: ", key, " was ", shown,
                 " in the checkpoint but is ", value,
                 " now; it changes what is trained. Resume with the original value or start a new run");
    changes.push_back(key + ": " + was + " -> " + value);
  }
  if (saved.count("optim.accum-steps") && !saved.count("data.micro-batch")) {
    // Written before micro-batches were cut the same at every world size
    // (every config.toml then held optim.accum-steps): its steps computed
    // each rank's share whole and summed it in fp32.
    changes.push_back("data.micro-batch: each rank's share whole, summed in fp32 (the checkpoint predates the key) -> "
                      "the same micro-batches at every world size, summed exactly: the steps from here round "
                      "differently from the original run's");
  }
  return changes;
}

Config load_config(const std::string& path) {
  CLI::App app;
  Config cfg;
  ConfigBinding binding(app, cfg);
  app.parse(std::vector<std::string>{});
  binding.apply_file(path);
  validate(cfg);
  return cfg;
}

namespace {

// One `key = value` of a config file; `values` has one entry, or an array's.
struct TomlEntry {
  std::string key;  // section.key
  std::vector<std::string> values;
  bool array = false;
  bool quoted = false;  // a value was a string ("0.1"), not a bare number or boolean
  int line = 0;
};

// The TOML that a config file needs, read strictly: [section] tables,
// `key = value` with a basic or literal string, a bare value (number,
// boolean) or an array of those (over several lines too), and comments.
// (CLI11's reader let an unterminated string or `[model` through as values
// and cut a string at '#'.) UsageError naming the file and line.
class TomlReader {
 public:
  explicit TomlReader(std::string path) : path_(std::move(path)) {}

  std::vector<TomlEntry> read(const std::string& text) {
    std::istringstream raw(text);
    while (std::getline(raw, line_)) {
      ++number_;
      if (!line_.empty() && line_.back() == '\r') line_.pop_back();
      if (open_array_) {
        array_items(0);
        continue;
      }
      size_t i = skip(0);
      if (i == line_.size()) continue;
      if (line_[i] == '[') table_header(i);
      else key_value(i);
    }
    if (open_array_) {
      line_ = "";
      fail("an array is not closed with ']' before the end of the file");
    }
    std::set<std::string> keys;
    for (const auto& e : out_) {
      COHORT_CHECK(keys.insert(e.key).second, UsageError, "config ", path_, ":", e.line, ": key '", e.key,
                   "' is given twice (a repeated [section]?)");
    }
    COHORT_CHECK(repeated_table_.empty(), UsageError, repeated_table_);
    return std::move(out_);
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw UsageError(detail::cat("config ", path_, ":", number_, ": ", what, " (line '", line_, "')"));
  }

  // Skips blanks; a comment or the end of the line reads as the end.
  size_t skip(size_t i) const {
    while (i < line_.size() && (line_[i] == ' ' || line_[i] == '\t')) ++i;
    return i < line_.size() && line_[i] == '#' ? line_.size() : i;
  }

  void table_header(size_t i) {
    size_t close = line_.find(']', i);
    if (close == std::string::npos) fail("table header without ']'");
    section_ = line_.substr(i + 1, close - i - 1);
    bool ok = !section_.empty();
    for (char c : section_)
      ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.');
    if (!ok) fail("malformed table header");
    if (skip(close + 1) != line_.size()) fail("text after a table header");
    if (auto [it, fresh] = tables_.emplace(section_, number_); !fresh && repeated_table_.empty()) {
      // Reported at the end, unless a key given twice is named first.
      repeated_table_ = detail::cat("config ", path_, ":", number_, ": table [", section_,
                                    "] is given twice (first at line ", it->second, "); put its keys under one [",
                                    section_, "]");
    }
  }

  void key_value(size_t i) {
    size_t eq = line_.find('=', i);
    if (eq == std::string::npos) fail("expected key = value");
    std::string key = line_.substr(i, eq - i);
    key = key.substr(0, key.find_last_not_of(" \t") + 1);
    if (key.empty()) fail("a value without a key");
    for (char c : key)
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) fail("malformed key");
    TomlEntry entry{section_.empty() ? key : section_ + "." + key, {}, false, false, number_};
    size_t v = skip(eq + 1);
    if (v == line_.size()) fail("a key without a value");
    out_.push_back(std::move(entry));
    if (line_[v] == '[') {
      out_.back().array = true;
      open_array_ = &out_.back();
      want_item_ = true;
      array_items(v + 1);
      return;
    }
    out_.back().values.push_back(scalar(v));
    out_.back().quoted = quoted_;
    if (skip(v) != line_.size()) fail("text after the value");
  }

  // The items of `open_array_` from `i` on, up to its ']' or the line's end.
  void array_items(size_t i) {
    for (i = skip(i); i < line_.size(); i = skip(i)) {
      if (line_[i] == ']') {
        open_array_ = nullptr;
        if (skip(i + 1) != line_.size()) fail("text after an array");
        return;
      }
      if (line_[i] == ',') {
        if (want_item_) fail("a missing value in an array");
        want_item_ = true;
        ++i;
        continue;
      }
      if (!want_item_) fail("a ',' is missing between array values");
      if (line_[i] == '[') fail("nested arrays are not supported");
      open_array_->values.push_back(scalar(i));
      open_array_->quoted = open_array_->quoted || quoted_;
      want_item_ = false;
    }
  }

  // One scalar at `i`, decoded; moves `i` past it.
  std::string scalar(size_t& i) {
    const char quote = line_[i];
    quoted_ = quote == '"' || quote == '\'';
    return quoted_ ? string_value(i) : bare_value(i);
  }

  // A basic ("...", with escapes) or literal ('...') string at `i`.
  std::string string_value(size_t& i) {
    std::string v;
    const char quote = line_[i];
    if (line_.compare(i, 3, std::string(3, quote)) == 0) fail("multi-line strings are not supported");
    for (++i;; ++i) {
      if (i >= line_.size()) fail("unterminated string");
      char c = line_[i];
      if (c == quote) break;
      if (quote == '"' && c == '\\') {
        if (++i >= line_.size()) fail("unterminated string");
        switch (line_[i]) {
          case 'n': v += '\n'; break;
          case 't': v += '\t'; break;
          case 'r': v += '\r'; break;
          case '"': v += '"'; break;
          case '\\': v += '\\'; break;
          default: fail(detail::cat("unsupported escape '\\", line_[i], "'"));
        }
        continue;
      }
      v += c;
    }
    ++i;
    return v;
  }

  // A number or boolean at `i`, up to a ',', ']' or comment.
  std::string bare_value(size_t& i) {
    size_t end = line_.find_first_of(",]#", i);
    if (end == std::string::npos) end = line_.size();
    std::string v = line_.substr(i, end - i);
    v = v.substr(0, v.find_last_not_of(" \t") + 1);
    if (v.empty()) fail("a missing value");
    if (v[0] == '{') fail("inline tables are not supported");
    if (v.find_first_of(" \t=\"'[") != std::string::npos) fail(detail::cat("'", v, "' is not one value"));
    i = end;
    return v;
  }

  const std::string path_;
  std::string line_;  // the line being read
  int number_ = 0;    // its number
  std::string section_;
  std::map<std::string, int> tables_;  // header -> its line
  std::string repeated_table_;          // the error for the first header given twice
  bool quoted_ = false;                 // the last scalar read was a string
  std::vector<TomlEntry> out_;
  TomlEntry* open_array_ = nullptr;  // an array continued on the next line
  bool want_item_ = true;            // in an array: a value may come next
};

std::vector<TomlEntry> read_toml(const std::string& text, const std::string& path) {
  return TomlReader(path).read(text);
}

}  // namespace

void ConfigBinding::apply_file(const std::string& path) {
  std::error_code ec;
  COHORT_CHECK(!std::filesystem::is_directory(path, ec), UsageError, "config ", path,
               ": is a directory; --config takes a TOML file");
  std::string text;
  {
    std::ifstream file(path);
    COHORT_CHECK(file.good(), UsageError, "config ", path, ": cannot read file (", std::strerror(errno), ")");
    text.assign(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
  }
  if (text.rfind("\xEF\xBB\xBF", 0) == 0) text.erase(0, 3);  // a UTF-8 byte-order mark (Windows editors)
  const bool written_by_cohort = text.rfind(kResolvedHeader, 0) == 0;  // a run's config.toml (to_toml)
  std::map<std::string, Key*> by_name;
  for (auto& k : keys_) by_name[k->name] = k.get();
  std::set<std::string> seen;
  for (const auto& item : read_toml(text, path)) {
    const std::string& name = item.key;
    const std::string where = detail::cat("config ", path, ":", item.line, ": key '", name, "'");
    COHORT_CHECK(seen.insert(name).second, UsageError, where, " is given twice (a repeated [section]?)");
    auto it = by_name.find(name);
    // Keys of earlier Cohorts that a run's config.toml may hold (a run
    // written by Cohort, whose checksummed config cannot be edited) are
    // passed over: what they set, data.micro-batch now sets for every
    // world size, and a resume says so (check_resume_config). In a config
    // the user writes, the hint names the key that replaced them.
    static const std::set<std::string> retired = {"optim.accum-steps", "data.max-micro-batch"};
    if (it == by_name.end() && retired.count(name) && written_by_cohort) continue;
    if (it == by_name.end()) {
      std::string hint = closest_key(name);
      throw UsageError(detail::cat("config ", path, ":", item.line, ": unknown key '", name, "'",
                                   hint.empty() ? "" : detail::cat(" (did you mean '", hint, "'?)")));
    }
    const Key& key = *it->second;
    CLI::Option* opt = key.option;
    if (opt->count() > 0) continue;  // the command line wins
    COHORT_CHECK(key.list || !item.array, UsageError, where, " takes one value, not a list");
    if (key.list && item.values.empty()) continue;  // [] : the default, no weights
    const std::string shown = item.values.empty() ? "" : item.values[0];
    if (key.boolean) {
      COHORT_CHECK(!item.quoted && item.values.size() == 1 && (shown == "true" || shown == "false"), UsageError,
                   where, " takes true or false (got ", item.quoted ? "the string \"" + shown + "\"" : "'" + shown + "'",
                   ")");
    }
    if (key.number_problem) {
      COHORT_CHECK(!item.quoted, UsageError, where, " takes ", key.list ? "numbers" : "a number",
                   ", not a string (got \"", shown, "\"; write it without quotes)");
      for (const auto& v : item.values) {
        std::string problem = key.number_problem(v);
        COHORT_CHECK(problem.empty(), ConfigError, where, " ", problem);
      }
    }
    std::vector<std::string> values = item.values;
    if (key.list) values = {detail::join(item.values, ",")};
    try {
      opt->add_result(values);
      opt->run_callback();
    } catch (const CLI::Error&) {
      throw UsageError(detail::cat(where, ": cannot use '", shown, "' (expected ", opt->get_type_name(), ")"));
    } catch (const ConfigError& e) {
      throw ConfigError(detail::cat("config ", path, ":", item.line, ": ", e.what()));
    }
  }
}

std::string ConfigBinding::to_toml() const {
  std::ostringstream os;
  os << kResolvedHeader;
  std::string section;
  for (const auto& k : keys_) {
    auto dot = k->name.find('.');
    std::string sec = k->name.substr(0, dot);
    if (sec != section) {
      os << (section.empty() ? "" : "\n") << "[" << sec << "]\n";
      section = sec;
    }
    os << k->name.substr(dot + 1) << " = " << k->to_toml() << "\n";
  }
  return os.str();
}

namespace {

// A task key's value as an error shows it: '' for empty text.
std::string shown(const TaskValue& v) {
  if (const auto* text = std::get_if<std::string>(&v)) return text->empty() ? "''" : *text;
  if (const auto* flag = std::get_if<bool>(&v)) return *flag ? "true" : "false";
  if (const auto* number = std::get_if<double>(&v)) return detail::cat(*number);
  return std::to_string(std::get<int64_t>(v));
}

// What is wrong with a tracking server's address ("" when nothing): the
// scheme, a host, a port in range, no spaces; a path may follow.
std::string url_problem(const std::string& url) {
  const std::string scheme = url.rfind("http://", 0) == 0 ? "http://" : url.rfind("https://", 0) == 0 ? "https://" : "";
  if (scheme.empty()) return "must be a tracking server's http:// or https:// address";
  for (unsigned char ch : url) {
    if (ch <= ' ' || ch == 0x7f) return "must be an address without spaces or control characters";
  }
  std::string authority = url.substr(scheme.size());
  authority = authority.substr(0, authority.find_first_of("/?#"));
  if (auto at = authority.rfind('@'); at != std::string::npos) authority = authority.substr(at + 1);
  std::string host = authority, port;
  if (!authority.empty() && authority.front() == '[') {  // [::1]:5000
    auto close = authority.find(']');
    if (close == std::string::npos) return "has an unclosed [ in its host: http://[::1]:5000";
    host = authority.substr(0, close + 1);
    std::string rest = authority.substr(close + 1);
    if (!rest.empty() && rest.front() != ':') return "has text after its host's ]";
    if (!rest.empty()) port = rest.substr(1);
    if (rest == ":") return "has an empty port";
  } else if (auto colon = authority.rfind(':'); colon != std::string::npos) {
    host = authority.substr(0, colon);
    port = authority.substr(colon + 1);
    if (port.empty()) return "has an empty port";
  }
  if (host.empty() || host == "[]") return "names no host: http://HOST:PORT";
  if (!port.empty()) {
    if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos) return "has a port that is not a number: http://HOST:PORT";
    int n = std::stoi(port);
    if (n < 1 || n > 65535) return detail::cat("has port ", n, ", outside 1..65535");
  }
  return "";
}

// Upper bounds of train.threads and data.workers (see docs/configuration.md's table).
constexpr int kMaxThreads = 1024;
constexpr int kMaxWorkers = 256;

template <class T>
void require(bool ok, const char* key, const T& value, const char* what) {
  COHORT_CHECK(ok, ConfigError, key, " ", what, " (got ", value, ")");
}

}  // namespace

namespace {

// A key of a mode that is off: its value would be silently ignored, so a
// value other than its default is refused, naming what turns the mode on.
struct InertRule {
  const char* key;
  std::function<bool(const Config&)> inert;  // set away from its default, its mode off
  std::function<void(Config&)> reset;        // back to the default
  std::function<std::string(const Config&)> value;  // as an error shows it
  const char* why;
};

const std::vector<InertRule>& inert_rules() {
  static const DistOptions dist;
  static const OptimOptions optim;
  const char* unsharded = "applies to a sharded run; dist.shard = none keeps the whole state on every rank: set "
                          "dist.shard, or drop the key";
  const char* every_step = "applies to dist.sync = local (the outer step); dist.sync = step has none: set dist.sync "
                           "local, or drop the key";
  static const ModelOptions model;
  const char* not_modern = "applies to model.name modernbert (its sliding window and rotary positions): drop the key";
  static const std::vector<InertRule> rules = {
      {"model.local-attention", [](const Config& c) { return c.model.name != "modernbert" && c.model.local_attention != model.local_attention; },
       [](Config& c) { c.model.local_attention = model.local_attention; },
       [](const Config& c) { return std::to_string(c.model.local_attention); }, not_modern},
      {"model.global-every", [](const Config& c) { return c.model.name != "modernbert" && c.model.global_every != model.global_every; },
       [](Config& c) { c.model.global_every = model.global_every; },
       [](const Config& c) { return std::to_string(c.model.global_every); }, not_modern},
      {"model.global-rope-theta", [](const Config& c) { return c.model.name != "modernbert" && c.model.global_rope_theta != model.global_rope_theta; },
       [](Config& c) { c.model.global_rope_theta = model.global_rope_theta; },
       [](const Config& c) { return detail::cat(c.model.global_rope_theta); }, not_modern},
      {"model.local-rope-theta", [](const Config& c) { return c.model.name != "modernbert" && c.model.local_rope_theta != model.local_rope_theta; },
       [](Config& c) { c.model.local_rope_theta = model.local_rope_theta; },
       [](const Config& c) { return detail::cat(c.model.local_rope_theta); }, not_modern},
      {"train.activation-checkpointing", [](const Config& c) { return c.model.name != "modernbert" && c.train.activation_checkpointing; },
       [](Config& c) { c.train.activation_checkpointing = false; },
       [](const Config&) { return std::string("true"); }, "applies to model.name modernbert (its layers): drop the key"},
      {"model.type-vocab", [](const Config& c) { return c.model.name == "modernbert" && c.model.type_vocab != model.type_vocab; },
       [](Config& c) { c.model.type_vocab = model.type_vocab; },
       [](const Config& c) { return std::to_string(c.model.type_vocab); },
       "applies to model.name bert: ModernBERT has no segment embeddings: drop the key"},
      {"dist.shard-replicas", [](const Config& c) { return c.dist.shard == ShardMode::kNone && c.dist.shard_replicas != dist.shard_replicas; },
       [](Config& c) { c.dist.shard_replicas = dist.shard_replicas; },
       [](const Config& c) { return std::to_string(c.dist.shard_replicas); }, unsharded},
      {"dist.shard-weights", [](const Config& c) { return c.dist.shard == ShardMode::kNone && c.dist.shard_weights != dist.shard_weights; },
       [](Config& c) { c.dist.shard_weights = dist.shard_weights; },
       [](const Config& c) { return c.dist.shard_weights; }, unsharded},
      {"optim.outer-lr", [](const Config& c) { return c.dist.sync == SyncMode::kStep && c.optim.outer_lr != optim.outer_lr; },
       [](Config& c) { c.optim.outer_lr = optim.outer_lr; },
       [](const Config& c) { return detail::cat(c.optim.outer_lr); }, every_step},
      {"optim.outer-momentum", [](const Config& c) { return c.dist.sync == SyncMode::kStep && c.optim.outer_momentum != optim.outer_momentum; },
       [](Config& c) { c.optim.outer_momentum = optim.outer_momentum; },
       [](const Config& c) { return detail::cat(c.optim.outer_momentum); }, every_step},
      {"dist.local-steps", [](const Config& c) { return c.dist.sync == SyncMode::kStep && c.dist.local_steps != dist.local_steps; },
       [](Config& c) { c.dist.local_steps = dist.local_steps; },
       [](const Config& c) { return std::to_string(c.dist.local_steps); }, every_step},
      {"dist.islands", [](const Config& c) { return c.dist.sync == SyncMode::kStep && c.dist.grad_compression != Compression::kPowerSgd && c.dist.islands != dist.islands; },
       [](Config& c) { c.dist.islands = dist.islands; },
       [](const Config& c) { return c.dist.islands; },
       "applies to dist.sync = local (the outer step's islands) and to dist.grad-compression powersgd (compressed "
       "between islands only); an exact or rounded sum every step has none: set one of those, or drop the key"},
      {"dist.island-compression", [](const Config& c) { return (c.dist.sync == SyncMode::kStep || c.dist.islands == "rank") && c.dist.island_compression != dist.island_compression; },
       [](Config& c) { c.dist.island_compression = dist.island_compression; },
       [](const Config& c) { return std::string(name_of(c.dist.island_compression)); },
       "applies inside islands of several ranks (dist.sync = local, dist.islands node or sizes); flat local steps and "
       "dist.sync = step have none (use dist.grad-compression): drop the key"},
      {"dist.outer-error-feedback", [](const Config& c) { return c.dist.outer_error_feedback && (c.dist.sync == SyncMode::kStep || !rounding_wire(c.dist.grad_compression)); },
       [](Config& c) { c.dist.outer_error_feedback = dist.outer_error_feedback; },
       [](const Config& c) { return std::string(c.dist.outer_error_feedback ? "true" : "false"); },
       "applies to a rounded outer sync (dist.sync = local with dist.grad-compression bf16, fp16, int8 or int4); an "
       "fp32 change loses nothing: set one of those, or drop the key"},
      {"dist.outer-fragments", [](const Config& c) { return c.dist.sync == SyncMode::kStep && c.dist.outer_fragments != dist.outer_fragments; },
       [](Config& c) { c.dist.outer_fragments = dist.outer_fragments; },
       [](const Config& c) { return std::to_string(c.dist.outer_fragments); }, every_step},
      {"dist.outer-delay", [](const Config& c) { return c.dist.sync == SyncMode::kStep && c.dist.outer_delay != dist.outer_delay; },
       [](Config& c) { c.dist.outer_delay = dist.outer_delay; },
       [](const Config& c) { return std::to_string(c.dist.outer_delay); }, every_step},
      {"optim.outer-mix", [](const Config& c) { return c.dist.outer_delay == 0 && c.optim.outer_mix != optim.outer_mix; },
       [](Config& c) { c.optim.outer_mix = optim.outer_mix; },
       [](const Config& c) { return detail::cat(c.optim.outer_mix); },
       "applies when a fragment's sum lands after dist.outer-delay steps; with delay 0 it lands at once: set "
       "dist.outer-delay, or drop the key"},
  };
  return rules;
}

// A key that would be ignored: its error, and how to put it back.
struct Inert {
  std::string key, error, value;
  std::function<void(Config&)> reset;
};

std::vector<Inert> find_inert(const Config& c) {
  std::vector<Inert> out;
  for (const auto& r : inert_rules()) {
    if (!r.inert(c)) continue;
    std::string value = r.value(c);
    out.push_back({r.key, detail::cat(r.key, " ", r.why, " (got ", value, ")"), value, r.reset});
  }
  // Another task's key, away from its default.
  for (const auto& k : declared_task_keys()) {
    auto it = c.task.find(k.name);
    if (k.task.empty() || k.task == c.train.task || it == c.task.end() || it->second == k.value) continue;
    const std::string name = k.name, value = shown(it->second);
    out.push_back({name, detail::cat(name, " applies to train.task ", k.task, "; this run's task is ", c.train.task,
                                     ", which does not read it (got ", value, "): drop the key"),
                   value, [name](Config& cfg) { cfg.task.erase(name); }});
  }
  return out;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> inert_keys(const Config& c) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& i : find_inert(c)) out.emplace_back(i.key, i.error);
  return out;
}

std::vector<std::string> reset_inert_keys(Config& c, const std::set<std::string>& given) {
  std::vector<std::string> notes;
  for (const auto& i : find_inert(c)) {
    if (given.count(i.key)) continue;
    notes.push_back(detail::cat(i.key, " = ", i.value, " from the checkpoint has no effect now: back to its default"));
    i.reset(c);
  }
  return notes;
}

void validate(const Config& c) {
  // train.task and model.name are checked by their registries, which know
  // every registered name.
  require(c.train.max_steps == -1 || c.train.max_steps >= 1, "train.max-steps", c.train.max_steps,
          "must be >= 1, or -1 to run train.epochs epochs");
  require(c.train.epochs >= 1, "train.epochs", c.train.epochs, "must be >= 1");
  require(c.train.early_stop_patience >= 0, "train.early-stop-patience", c.train.early_stop_patience, "must be >= 0");
  require(c.train.early_stop_patience == 0 || !c.ckpt.best_metric.empty(), "train.early-stop-patience",
          c.train.early_stop_patience, "needs ckpt.best-metric, the metric that must improve");
  // Each thread is real: torch would start 100000 of them (and hang).
  require(c.train.threads >= 0 && c.train.threads <= kMaxThreads, "train.threads", c.train.threads,
          "must be between 0 and 1024");

  require(!c.data.path.empty(), "data.path", "''", "must not be empty");
  require(c.data.global_batch >= 1, "data.global-batch", c.data.global_batch, "must be >= 1");
  require(c.data.workers >= 0 && c.data.workers <= kMaxWorkers, "data.workers", c.data.workers,
          "must be between 0 and 256");
  require(c.data.prefetch >= 1, "data.prefetch", c.data.prefetch, "must be >= 1");
  require(c.data.bucket >= 0, "data.bucket", c.data.bucket, "must be >= 0");
  require(!c.data.pack || c.train.task == "bert-pretrain", "data.pack", "true", "is for train.task bert-pretrain");
  for (double w : c.data.balance_weights) {
    require(std::isfinite(w) && w > 0, "data.balance-weights", w, "must all be > 0");
  }
  require(c.data.balance != Balance::kWeights || !c.data.balance_weights.empty(), "data.balance-weights", "[]",
          "must give one weight per rank when data.balance = weights");
  require(c.data.balance == Balance::kWeights || c.data.balance_weights.empty(), "data.balance-weights",
          c.data.balance_weights.size(), "are only used with data.balance = weights; set it, or drop the weights");
  require(c.data.balance_every >= 1, "data.balance-every", c.data.balance_every, "must be >= 1");
  require(c.data.micro_batch >= 0, "data.micro-batch", c.data.micro_batch, "must be >= 0 (0 = auto)");

  if (!c.log.mlflow.empty()) {
    std::string why = url_problem(c.log.mlflow);
    COHORT_CHECK(why.empty(), ConfigError, "log.mlflow ", why, " (got ", c.log.mlflow, ")");
  }
  require(!c.log.mlflow_experiment.empty(), "log.mlflow-experiment", "''", "must name an experiment");

  require(std::isfinite(c.optim.lr) && c.optim.lr > 0, "optim.lr", c.optim.lr, "must be finite and > 0");
  require(std::isfinite(c.optim.weight_decay) && c.optim.weight_decay >= 0, "optim.weight-decay",
          c.optim.weight_decay, "must be finite and >= 0");
  require(c.optim.beta1 >= 0 && c.optim.beta1 < 1, "optim.beta1", c.optim.beta1, "must be in [0, 1)");
  require(c.optim.beta2 >= 0 && c.optim.beta2 < 1, "optim.beta2", c.optim.beta2, "must be in [0, 1)");
  require(std::isfinite(c.optim.eps) && c.optim.eps > 0, "optim.eps", c.optim.eps, "must be finite and > 0");
  require(c.optim.momentum >= 0 && c.optim.momentum < 1, "optim.momentum", c.optim.momentum, "must be in [0, 1)");
  require(std::isfinite(c.optim.poly_power) && c.optim.poly_power > 0, "optim.poly-power", c.optim.poly_power,
          "must be finite and > 0");
  require(c.optim.warmup_ratio >= 0 && c.optim.warmup_ratio < 1, "optim.warmup-ratio",
          c.optim.warmup_ratio, "must be in [0, 1)");
  require(c.optim.min_lr_ratio >= 0 && c.optim.min_lr_ratio <= 1, "optim.min-lr-ratio",
          c.optim.min_lr_ratio, "must be in [0, 1]");
  require(std::isfinite(c.optim.clip_norm) && c.optim.clip_norm >= 0, "optim.clip-norm", c.optim.clip_norm,
          "must be finite and >= 0");

  require(c.eval.every_steps >= 0, "eval.every-steps", c.eval.every_steps, "must be >= 0");
  require(c.eval.batch >= 1, "eval.batch", c.eval.batch, "must be >= 1");
  require(c.eval.max_samples >= 0, "eval.max-samples", c.eval.max_samples, "must be >= 0");
  require(c.log.every_steps >= 1, "log.every-steps", c.log.every_steps, "must be >= 1");
  require(c.ckpt.every_steps >= 0, "ckpt.every-steps", c.ckpt.every_steps, "must be >= 0");
  require(c.ckpt.keep >= 1, "ckpt.keep", c.ckpt.keep, "must be >= 1");
  require(c.dist.timeout > 0 && c.dist.timeout <= 1e7, "dist.timeout", c.dist.timeout,
          "must be > 0 and <= 1e7 seconds (116 days)");
  require(c.dist.bucket_cap_mb > 0 && c.dist.bucket_cap_mb <= 1 << 20, "dist.bucket-cap-mb", c.dist.bucket_cap_mb,
          "must be > 0 and <= 1048576 (1 TiB)");

  require(c.dist.powersgd_rank >= 1 && c.dist.powersgd_rank <= 1024, "dist.powersgd-rank", c.dist.powersgd_rank,
          "must be in [1, 1024]");
  require(c.dist.local_steps >= 1, "dist.local-steps", c.dist.local_steps, "must be >= 1");
  require(c.dist.outer_fragments >= 1 && c.dist.local_steps % c.dist.outer_fragments == 0, "dist.outer-fragments",
          c.dist.outer_fragments, detail::cat("must be >= 1 and divide dist.local-steps (", c.dist.local_steps, ")").c_str());
  require(c.dist.outer_delay >= 0 && c.dist.outer_delay < c.dist.local_steps / std::max<int64_t>(1, c.dist.outer_fragments),
          "dist.outer-delay", c.dist.outer_delay,
          detail::cat("must be >= 0 and below dist.local-steps / dist.outer-fragments (",
                      c.dist.local_steps / std::max<int64_t>(1, c.dist.outer_fragments),
                      "): one fragment travels at a time").c_str());
  require(c.optim.outer_mix >= 0 && c.optim.outer_mix <= 1, "optim.outer-mix", c.optim.outer_mix, "must be in [0, 1]");
  require(c.dist.sync == SyncMode::kLocal || !integer_wire(c.dist.grad_compression), "dist.grad-compression",
          name_of(c.dist.grad_compression),
          detail::cat("quantizes the outer sync's parameter change (dist.sync = local), gathered and added in fp32; "
                      "a gradient sum in ", name_of(c.dist.grad_compression),
                      " would wrap: use bf16 or powersgd for dist.sync = step").c_str());
  require(c.dist.island_compression != Compression::kPowerSgd && !integer_wire(c.dist.island_compression),
          "dist.island-compression", name_of(c.dist.island_compression), "must be none, fp32, bf16 or fp16: an "
          "island's ranks sum whole gradients every step (integers would wrap; PowerSGD is for slow links)");
  require(c.dist.sync == SyncMode::kStep || c.dist.grad_compression != Compression::kPowerSgd,
          "dist.grad-compression", "powersgd", "compresses the gradient all-reduce, which dist.sync = local does "
          "not have: use none or bf16 for the parameter change");
  (void)shard_weights(c.dist);
  (void)island_sizes(c.dist.islands);
  require(std::isfinite(c.dist.max_memory_gb) && c.dist.max_memory_gb >= 0, "dist.max-memory-gb",
          c.dist.max_memory_gb, "must be >= 0");
  require(c.dist.shard_replicas == 1 || c.dist.shard_replicas == 2, "dist.shard-replicas", c.dist.shard_replicas,
          "must be 1 or 2");
  require(c.dist.shard == ShardMode::kNone || c.optim.name != OptimizerKind::kSgd, "dist.shard",
          name_of(c.dist.shard), "shards AdamW's or LAMB's state; optim.name = sgd has none worth sharding: use none");
  require(c.dist.shard != ShardMode::kGradients || c.dist.grad_compression != Compression::kPowerSgd, "dist.shard",
          "gradients", "saves whole-model gradients, which PowerSGD's error feedback keeps on every rank anyway: use "
          "dist.shard = optimizer with powersgd (the same memory, one compressed sum a step)");
  require(std::isfinite(c.optim.outer_lr) && c.optim.outer_lr > 0, "optim.outer-lr", c.optim.outer_lr,
          "must be finite and > 0");
  require(c.optim.outer_momentum >= 0 && c.optim.outer_momentum < 1, "optim.outer-momentum", c.optim.outer_momentum,
          "must be in [0, 1)");

  require(c.model.hidden >= 1, "model.hidden", c.model.hidden, "must be >= 1");
  require(c.model.dropout >= 0 && c.model.dropout < 1, "model.dropout", c.model.dropout, "must be in [0, 1)");
  require(c.model.layers >= 1, "model.layers", c.model.layers, "must be >= 1");
  require(c.model.heads >= 1, "model.heads", c.model.heads, "must be >= 1");
  require(c.model.intermediate >= 0, "model.intermediate", c.model.intermediate, "must be >= 0");
  require(c.model.max_positions >= 2, "model.max-positions", c.model.max_positions, "must be >= 2");
  require(c.model.type_vocab >= 2, "model.type-vocab", c.model.type_vocab, "must be >= 2");
  require(!c.train.activation_checkpointing || c.model.dropout_rng == DropoutRng::kSample ||
              (c.model.dropout == 0 && c.model.attention_dropout == 0),
          "train.activation-checkpointing", "true", "runs each layer again in backward, which must draw the "
          "forward's dropout masks: set model.dropout-rng sample (masks by sample), or dropout 0");
  require(c.model.local_attention >= 2, "model.local-attention", c.model.local_attention, "must be >= 2");
  require(c.model.global_every >= 1, "model.global-every", c.model.global_every, "must be >= 1");
  require(std::isfinite(c.model.global_rope_theta) && c.model.global_rope_theta > 1, "model.global-rope-theta",
          c.model.global_rope_theta, "must be finite and > 1");
  require(std::isfinite(c.model.local_rope_theta) && c.model.local_rope_theta > 1, "model.local-rope-theta",
          c.model.local_rope_theta, "must be finite and > 1");
  require(c.model.vocab_size >= 0, "model.vocab-size", c.model.vocab_size, "must be >= 0");
  require(c.model.attention_dropout >= 0 && c.model.attention_dropout < 1, "model.attention-dropout",
          c.model.attention_dropout, "must be in [0, 1)");
  for (const auto& k : declared_task_keys()) {
    if (!k.problem) continue;
    auto it = c.task.find(k.name);
    const TaskValue& value = it != c.task.end() ? it->second : k.value;
    std::string why = k.problem(value);
    COHORT_CHECK(why.empty(), ConfigError, k.name, " ", why, " (got ", shown(value), ")");
  }
  // Last: a value that is wrong is said before one that would be ignored.
  if (auto inert = inert_keys(c); !inert.empty()) throw ConfigError(inert.front().second);
}

std::string shard_needs_islands(const DistOptions& dist) {
  return detail::cat("dist.shard ", name_of(dist.shard), " shards an island's optimizer over its ranks, but "
                     "dist.islands '", dist.islands, "' gives islands of one rank, each stepping alone: set "
                     "dist.islands to node or a size above 1, or dist.shard none");
}

void validate_world(const Config& c, int world_size, bool one_node) {
  std::vector<double> weights = shard_weights(c.dist);
  COHORT_CHECK(weights.empty() || static_cast<int>(weights.size()) == world_size, ConfigError,
               "dist.shard-weights gives ", weights.size(), " weight(s) ('", c.dist.shard_weights, "') but the world has ",
               world_size, " rank(s): give one per rank, or auto (on a resume at another world size, give new weights "
               "or auto)");
  if (c.dist.sync == SyncMode::kLocal || c.dist.grad_compression == Compression::kPowerSgd) {
    std::vector<int64_t> sizes = island_sizes(c.dist.islands);
    int64_t covered = 0;
    for (int64_t s : sizes) covered += sizes.size() == 1 ? world_size / s * s : s;
    COHORT_CHECK(sizes.empty() || covered == world_size, ConfigError, "dist.islands '", c.dist.islands, "' does not "
                 "divide the world's ", world_size, " rank(s) into islands: give sizes that add up to it, or one size "
                 "that divides it");
  }
  if (c.dist.sync == SyncMode::kLocal) {
    std::vector<int64_t> sizes = island_sizes(c.dist.islands);
    const bool single = c.dist.islands == "rank" || (one_node && c.dist.islands == "auto") ||
                        (!sizes.empty() && *std::max_element(sizes.begin(), sizes.end()) == 1);
    COHORT_CHECK(c.dist.shard == ShardMode::kNone || !single || world_size == 1, ConfigError,
                 shard_needs_islands(c.dist));
    COHORT_CHECK(c.dist.island_compression == Compression::kNone || !single || world_size == 1, ConfigError,
                 "dist.island-compression ", name_of(c.dist.island_compression), " applies inside islands of several "
                 "ranks, but dist.islands '", c.dist.islands, "' gives islands of one rank: drop the key, or set "
                 "dist.islands to node or a size above 1");
  }
  if (c.dist.shard == ShardMode::kNone || c.dist.shard_replicas == 1) return;
  const int replicas = static_cast<int>(c.dist.shard_replicas);
  if (world_size % replicas == 0) return;
  const int below = world_size / replicas * replicas, above = below + replicas;
  throw ConfigError(detail::cat("dist.shard-replicas ", replicas, " holds each range on ", replicas, " ranks, so the "
                                "world must be a multiple of ", replicas, "; this one has ", world_size, " rank(s): use ",
                                below > 0 ? detail::cat(below, " or ") : std::string(), above,
                                " ranks, or dist.shard-replicas 1"));
}

std::vector<double> shard_weights(const DistOptions& dist) {
  const std::string& text = dist.shard_weights;
  if (text == "auto") return {};
  std::vector<double> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    double w = 0;
    try {
      w = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    while (used < item.size() && std::isspace(static_cast<unsigned char>(item[used]))) ++used;
    COHORT_CHECK(used > 0 && used == item.size() && std::isfinite(w) && w > 0, ConfigError,
                 "dist.shard-weights: '", text, "' must be auto or positive numbers, one per rank (e.g. 2,1)");
    out.push_back(w);
  }
  COHORT_CHECK(!out.empty(), ConfigError, "dist.shard-weights: '", text, "' must be auto or one weight per rank");
  return out;
}

std::vector<int64_t> island_sizes(const std::string& islands) {
  if (islands == "auto" || islands == "node" || islands == "rank") return {};
  std::vector<int64_t> out;
  std::stringstream in(islands);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    long long n = 0;
    try {
      n = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    while (used < item.size() && std::isspace(static_cast<unsigned char>(item[used]))) ++used;
    COHORT_CHECK(used > 0 && used == item.size() && n >= 1 && n <= 1 << 20, ConfigError, "dist.islands: '", islands,
                 "' must be auto, node, rank, or island sizes of at least 1 rank (e.g. 2, or 2,2)");
    out.push_back(n);
  }
  COHORT_CHECK(!out.empty(), ConfigError, "dist.islands: '", islands, "' must be auto, node, rank or island sizes");
  return out;
}

}  // namespace cohort
