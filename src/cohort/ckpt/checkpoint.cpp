#include "cohort/ckpt/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <c10/util/Exception.h>
#include <torch/serialize.h>

#include <algorithm>
#include <limits>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "cohort/core/error.hpp"
#include "cohort/core/files.hpp"
#include "cohort/core/json_fields.hpp"
#include "cohort/core/sha256.hpp"

namespace cohort {

namespace fs = std::filesystem;

namespace {

const char* const kFiles[] = {"model.safetensors", "optimizer.pt", "rng.safetensors", "config.toml"};

}  // namespace

int64_t Checkpoints::step_of(const std::string& name) {
  if (name.rfind("step-", 0) != 0 || name.size() == 5) return -1;
  if (name.find_first_not_of("0123456789", 5) != std::string::npos) return -1;
  return std::stoll(name.substr(5));
}

Checkpoints::Checkpoints(std::string run_dir, int keep)
    : root_((fs::path(run_dir) / "checkpoints").string()), keep_(keep) {}

std::string Checkpoints::dir_name(int64_t step) { return "step-" + std::to_string(step); }

std::vector<std::string> Checkpoints::remove_partial(const std::string& run_dir) {
  std::vector<std::string> removed;
  fs::path root = fs::path(run_dir) / "checkpoints";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    std::string name = e.path().filename().string();
    if (name.rfind(".tmp-", 0) != 0 && !(name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0)) continue;
    std::error_code rm;
    fs::remove_all(e.path(), rm);
    COHORT_CHECK(!rm, Error, e.path().string(), ": cannot remove this partial checkpoint (", rm.message(), ")");
    removed.push_back(name);
  }
  return removed;
}

std::string Checkpoints::not_written(int64_t step) const {
  std::string latest;
  std::ifstream in(fs::path(root_) / "latest");
  std::getline(in, latest);
  return detail::cat("checkpoint ", dir_name(step), " was not written",
                     latest.empty() ? std::string() : "; " + latest + " is intact and still the latest");
}

std::string Checkpoints::temp_dir(int64_t step) const { return (fs::path(root_) / (".tmp-" + dir_name(step))).string(); }

std::string Checkpoints::begin(int64_t step) {
  std::error_code ec;
  fs::create_directories(root_, ec);
  COHORT_CHECK(!ec, Error, root_, ": cannot create directory (", ec.message(), ")");
  remove_partial(fs::path(root_).parent_path().string());  // crashed writes
  fs::path tmp = temp_dir(step);
  fs::create_directory(tmp, ec);
  COHORT_CHECK(!ec, Error, tmp.string(), ": cannot create directory (", ec.message(), ")");
  return tmp.string();
}

void Checkpoints::abandon(int64_t step) const {
  std::error_code ignored;
  fs::remove_all(temp_dir(step), ignored);
}

std::string Checkpoints::write(const CheckpointState& state, const NamedTensors& model,
                               torch::optim::Optimizer& optimizer, const NamedTensors& rng,
                               const std::string& config_toml) {
  std::error_code ec;
  fs::path final_dir = fs::path(root_) / dir_name(state.step);
  fs::path tmp = temp_dir(state.step);
  std::vector<std::string> files(std::begin(kFiles), std::end(kFiles));
  for (int g = 0; g < state.shard.groups(); ++g) files.push_back(ShardRecord::file(g));
  try {
    if (!state.shard.sharded()) begin(state.step);  // sharded: begun, the ranges written into it
    for (const auto& f : files) {
      COHORT_CHECK(f.rfind("optimizer.shard-", 0) != 0 || fs::exists(tmp / f), Error, (tmp / f).string(),
                   ": the optimizer range's file is missing (RUN_DIR must be on a filesystem every rank shares)");
    }
    save_safetensors((tmp / "model.safetensors").string(), model, {{"format", "pt"}});
    // libtorch's file writer throws from its destructor when the disk is
    // full (std::terminate, a stack trace instead of an error): serialize in
    // memory, where nothing fails, and write the bytes ourselves.
    std::ostringstream opt;
    try {
      torch::save(optimizer, opt);
    } catch (const c10::Error& e) {
      throw Error(detail::cat((tmp / "optimizer.pt").string(), ": cannot serialize the optimizer (",
                              detail::first_line(e.what_without_backtrace()), ")"));
    }
    write_file_durably((tmp / "optimizer.pt").string(), {opt.str()});
    save_safetensors((tmp / "rng.safetensors").string(), rng);
    write_file_durably((tmp / "config.toml").string(), {config_toml});

    nlohmann::json manifest = {{"format_version", state.shard.sharded() ? CheckpointState::kShardedFormatVersion
                                                                         : CheckpointState::kFormatVersion},
                               {"step", state.step},
                               {"epoch", state.cursor.epoch},
                               {"consumed", state.cursor.consumed},
                               {"samples_seen", state.samples_seen},
                               {"world_size", state.world_size},
                               {"train_samples", state.train_samples},
                               {"balance_shares", state.balance_shares}};
    if (state.shard.sharded()) {
      manifest["shard"] = {{"mode", state.shard.mode},
                           {"replicas", state.shard.replicas},
                           {"bounds", state.shard.bounds},
                           {"weights", state.shard.weights}};
    }
    for (const auto& f : files) manifest["sha256"][f] = sha256_hex(read_file((tmp / f).string()));
    manifest["state_sha256"] = sha256_hex(manifest.dump());  // covers the fields above, the step and cursor too
    write_file_durably((tmp / "state.json").string(), {manifest.dump(2) + "\n"});
    sync_path(tmp.string(), true);

    fs::remove_all(final_dir, ec);  // an older attempt at the same step
    fs::rename(tmp, final_dir, ec);
    COHORT_CHECK(!ec, Error, final_dir.string(), ": cannot rename ", tmp.string(), " into place (", ec.message(), ")");
  } catch (const Error& e) {
    // The partial checkpoint goes (it would only fill the disk further);
    // `latest` still names the previous one, which is untouched.
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    throw Error(detail::cat(e.what(), "; ", not_written(state.step)), e.exit_code());
  } catch (...) {  // c10::Error, bad_alloc: the partial checkpoint goes too
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    throw;
  }
  sync_path(root_, true);
  write_file_atomically((fs::path(root_) / "latest").string(), dir_name(state.step) + "\n");

  prune();
  return final_dir.string();
}

// Keeps the newest `keep` checkpoints, and the best.
void Checkpoints::prune() const {
  const int64_t best_step = best(fs::path(root_).parent_path().string()).step;
  std::vector<std::pair<int64_t, fs::path>> all;
  for (const auto& e : fs::directory_iterator(root_)) {
    int64_t s = step_of(e.path().filename().string());
    if (s >= 0 && s != best_step && e.is_directory()) all.emplace_back(s, e.path());
  }
  std::sort(all.rbegin(), all.rend());
  for (size_t i = static_cast<size_t>(keep_); i < all.size(); ++i) fs::remove_all(all[i].second);
}

void Checkpoints::mark_best(int64_t step, const std::string& metric, double value) {
  write_file_atomically((fs::path(root_) / "best.json").string(),
                        nlohmann::json({{"step", step}, {"metric", metric}, {"value", value}}).dump() + "\n");
  prune();  // the previous best is an ordinary checkpoint again
}

Checkpoints::Best Checkpoints::best(const std::string& run_dir) {
  Best b;
  auto path = fs::path(run_dir) / "checkpoints" / "best.json";
  if (!fs::exists(path)) return b;
  try {
    auto j = nlohmann::json::parse(read_file(path.string()));
    b.step = json_int(j.at("step"), path.string() + ": field 'step'", 0);
    b.metric = j.at("metric").get<std::string>();
    b.value = j.at("value").get<double>();
  } catch (const nlohmann::json::exception& e) {
    throw DataError(detail::cat(path.string(), ": unreadable (", e.what(), ")"));
  }
  return b;
}

HeldFiles::~HeldFiles() {
  names_.clear();  // before the descriptors (and their numbers) are let go
  for (const auto& [name, fd] : fds_) ::close(fd);
}

bool HeldFiles::open(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_regular_file(ec)) continue;
    int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) break;  // removed meanwhile
    fds_[e.path().filename().string()] = fd;
    names_.push_back(std::make_unique<HeldPathName>("/proc/self/fd/" + std::to_string(fd), e.path().string()));
  }
  if (!ec && fds_.count("state.json") && fs::exists(fs::path(dir) / "state.json", ec)) return true;
  names_.clear();
  for (const auto& [name, fd] : fds_) ::close(fd);
  fds_.clear();
  return false;
}

std::string HeldFiles::path(const std::string& name) const {
  auto it = fds_.find(name);
  return it == fds_.end() ? std::string() : "/proc/self/fd/" + std::to_string(it->second);
}

std::string ResolvedCheckpoint::file(const std::string& name) const {
  std::string p = held ? held->path(name) : std::string();
  return p.empty() ? (fs::path(dir) / name).string() : p;
}

CheckpointState Checkpoints::verify(const std::string& dir, const HeldFiles* held) {
  fs::path d(dir);
  auto read = [&](const std::string& name) {
    std::string p = held ? held->path(name) : std::string();
    if (p.empty()) return read_file((d / name).string());
    try {
      return read_file(p);
    } catch (const DataError&) {
      throw DataError(detail::cat((d / name).string(), ": cannot read"));
    }
  };
  std::string text = read("state.json");
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw DataError(detail::cat((d / "state.json").string(), ": not valid JSON (", e.what(), ")"));
  }
  try {
    const std::string file = (d / "state.json").string();
    auto field = [&](const char* key, int64_t lo, int64_t hi = std::numeric_limits<int64_t>::max()) {
      return json_int(m.at(key), detail::cat(file, ": field '", key, "'"), lo, hi);
    };
    int version = static_cast<int>(field("format_version", 0, 1 << 20));
    COHORT_CHECK(version >= 1 && version <= CheckpointState::kShardedFormatVersion, DataError,
                 (d / "state.json").string(), ": format version ", version, ", this cohort reads versions 1 to ",
                 CheckpointState::kShardedFormatVersion);
    COHORT_CHECK((version == CheckpointState::kShardedFormatVersion) == m.contains("shard"), DataError,
                 (d / "state.json").string(), ": format version ", version,
                 m.contains("shard") ? " with" : " without", " optimizer ranges (\"shard\")");
    if (version >= 2) {
      // The step and cursor decide what is trained next: a changed bit there
      // would resume silently at the wrong place. (Version 1 had no checksum.)
      std::string want = m.at("state_sha256").get<std::string>();
      m.erase("state_sha256");
      COHORT_CHECK(sha256_hex(m.dump()) == want, DataError, (d / "state.json").string(),
                   ": checksum mismatch (corrupt or edited)");
    }
    for (const char* f : kFiles) {
      COHORT_CHECK(m.at("sha256").contains(f), DataError, (d / "state.json").string(), ": no checksum for ", f);
    }
    for (const auto& [f, sum] : m.at("sha256").items()) {
      COHORT_CHECK(f.find('/') == std::string::npos && sha256_hex(read(f)) == sum.get<std::string>(),
                   DataError, (d / f).string(), ": checksum mismatch (corrupt or partly written)");
    }
    CheckpointState s;
    s.step = field("step", 0);
    s.cursor = {field("epoch", 0), field("consumed", 0)};
    s.samples_seen = field("samples_seen", 0);
    s.world_size = static_cast<int>(field("world_size", 1, std::numeric_limits<int>::max()));
    s.train_samples = m.contains("train_samples") ? field("train_samples", -1) : -1;
    if (m.contains("balance_shares")) s.balance_shares = json_ints(m.at("balance_shares"), file + ": field 'balance_shares'", 0);
    if (m.contains("shard")) {
      const auto& j = m.at("shard");
      s.shard.mode = j.at("mode").get<std::string>();
      s.shard.replicas = static_cast<int>(json_int(j.at("replicas"), file + ": field 'shard.replicas'", 1, 1 << 20));
      s.shard.bounds = json_ints(j.at("bounds"), file + ": field 'shard.bounds'", 0);
      s.shard.weights = j.at("weights").get<std::vector<double>>();
      COHORT_CHECK(s.shard.bounds.size() >= 2 && std::is_sorted(s.shard.bounds.begin(), s.shard.bounds.end()) &&
                       s.shard.bounds.front() == 0,
                   DataError, file, ": field 'shard.bounds' must rise from 0");
      for (int g = 0; g < s.shard.groups(); ++g) {
        COHORT_CHECK(m.at("sha256").contains(ShardRecord::file(g)), DataError, file, ": no checksum for ",
                     ShardRecord::file(g));
      }
    }
    return s;
  } catch (const nlohmann::json::exception& e) {
    throw DataError(detail::cat((d / "state.json").string(), ": missing field (", e.what(), ")"));
  }
}

ResolvedCheckpoint Checkpoints::resolve(const std::string& path, std::vector<std::string>* warnings) {
  fs::path p(path);
  // Held before it is verified, so that what was verified is what is read.
  auto hold = [](const fs::path& dir) -> std::shared_ptr<HeldFiles> {
    auto held = std::make_shared<HeldFiles>();
    return held->open(dir.string()) ? held : nullptr;
  };
  if (fs::exists(p / "state.json")) {
    auto held = hold(p);
    COHORT_CHECK(held, DataError, path, ": removed while it was read (the job writing this run keeps only its "
                 "newest ckpt.keep checkpoints): name the run directory to take its newest");
    CheckpointState state = verify(p.string(), held.get());
    return {p.string(), state, held};
  }
  COHORT_CHECK(fs::exists(p), UsageError, path, ": no such directory (name a run directory or a checkpoint in one)");
  fs::path root = fs::exists(p / "checkpoints") ? p / "checkpoints" : p;
  COHORT_CHECK(fs::is_directory(root), DataError, path, ": no checkpoints here (expected RUN_DIR/checkpoints/)");
  // A live job may remove checkpoints while they are looked at: then the
  // newest is looked for again.
  constexpr int kLooks = 20;
  for (int look = 0; look < kLooks; ++look) {
    std::vector<std::pair<int64_t, fs::path>> all;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(root, ec)) {
      int64_t s = step_of(e.path().filename().string());
      if (s >= 0 && e.is_directory(ec)) all.emplace_back(s, e.path());
    }
    std::sort(all.rbegin(), all.rend());
    COHORT_CHECK(!all.empty(), DataError, path, ": no checkpoints here (expected step-N directories in ",
                 root.string(), ")");
    // The newest checkpoint that verifies: `latest` may lag a completed rename
    // after a crash, and a resume from an older step moves newer ones aside.
    std::string why;  // each one's reason, when none verifies
    std::vector<std::string> skipped;
    bool moved_on = false;
    for (const auto& [step, dir] : all) {
      auto held = hold(dir);
      if (!held) {
        moved_on = true;  // removed under us
        break;
      }
      try {
        CheckpointState state = verify(dir.string(), held.get());
        if (warnings) warnings->insert(warnings->end(), skipped.begin(), skipped.end());
        return {dir.string(), state, held};
      } catch (const DataError& e) {
        skipped.push_back(detail::cat("skipping checkpoint ", dir.string(), ": ", e.what()));
        why += detail::cat(why.empty() ? "" : "; ", dir.filename().string(), ": ", detail::first_line(e.what()));
      }
    }
    if (!moved_on) {
      if (warnings) warnings->insert(warnings->end(), skipped.begin(), skipped.end());
      throw DataError(detail::cat(path, ": no complete checkpoint; every one was rejected (", why, ")"));
    }
  }
  throw DataError(detail::cat(path, ": its checkpoints were removed ", kLooks, " times while being read (a live "
                              "job's ckpt.keep rotation); try again, or raise that job's ckpt.keep"));
}

namespace {

// Tensors a Hugging Face BERT file may hold beside Cohort's names: the MLM
// decoder tied to the word embeddings and to cls.predictions.bias (present in
// `cohort export`, and in state_dict()s saved with torch.save), and the
// position-id buffer of older transformers. A tied copy must equal its source.
struct TiedAlias {
  const char* name;
  const char* source;  // nullptr: ignored outright
};
constexpr TiedAlias kHuggingFaceAliases[] = {
    {"cls.predictions.decoder.weight", "bert.embeddings.word_embeddings.weight"},
    {"cls.predictions.decoder.bias", "cls.predictions.bias"},
    {"bert.embeddings.position_ids", nullptr},
};

}  // namespace

NamedTensors module_tensors(torch::nn::Module& module) {
  NamedTensors out;
  for (auto& item : module.named_parameters()) out.emplace_back(item.key(), item.value());
  for (auto& item : module.named_buffers()) out.emplace_back(item.key(), item.value());
  return out;
}

void load_model_weights(torch::nn::Module& module, const std::string& path) { load_model_weights(module, path, {}); }

std::vector<std::string> load_model_weights(torch::nn::Module& module, const std::string& path,
                                            const std::function<bool(const std::string&)>& may_skip) {
  auto weights = load_safetensors(path);
  torch::NoGradGuard no_grad;
  std::vector<std::string> skipped;
  auto skippable = [&](const std::string& name) { return may_skip && may_skip(name); };
  // The model's tensors the file lacks that may stay as initialised.
  auto params = module.named_parameters();
  auto buffers = module.named_buffers();
  for (const auto* set : {&params, &buffers}) {
    for (auto& item : *set) {
      if (weights.tensors.count(item.key()) || !skippable(item.key())) continue;
      skipped.push_back(item.key());
    }
  }
  auto load_into = [&](const std::string& name, torch::Tensor& dst) {
    auto it = weights.tensors.find(name);
    if (it == weights.tensors.end() && skippable(name)) return;
    COHORT_CHECK(it != weights.tensors.end(), ConfigError, path, " has no tensor '", name,
                 "' that the model needs: was a model.* key changed?");
    COHORT_CHECK(it->second.sizes() == dst.sizes(), ConfigError, path, ": tensor '", name, "' has shape ",
                 it->second.sizes(), " but the model expects ", dst.sizes(), ": a model.* key differs");
    dst.copy_(it->second.to(dst.device()));
  };
  // Aliases first, so that a refused file leaves the model untouched.
  for (const auto& alias : kHuggingFaceAliases) {
    auto it = weights.tensors.find(alias.name);
    if (it == weights.tensors.end() || params.contains(alias.name) || buffers.contains(alias.name)) continue;
    if (alias.source) {
      auto src = weights.tensors.find(alias.source);
      COHORT_CHECK(src != weights.tensors.end() && src->second.sizes() == it->second.sizes() &&
                       torch::equal(src->second, it->second),
                   ConfigError, path, ": tensor '", alias.name, "' differs from '", alias.source,
                   "'; Cohort's BERT ties them, so an untied decoder cannot be loaded");
    }
  }
  // The file's tensors the model lacks: only skippable ones may be left out.
  std::vector<std::string> extra;
  for (const auto& [name, t] : weights.tensors) {
    if (params.contains(name) || buffers.contains(name)) continue;
    bool alias = std::any_of(std::begin(kHuggingFaceAliases), std::end(kHuggingFaceAliases),
                             [&](const auto& a) { return name == a.name; });
    if (alias) continue;
    if (skippable(name)) skipped.push_back(name);
    else extra.push_back(name);
  }
  COHORT_CHECK(extra.empty(), ConfigError, path, " has ", extra.size(), " tensor(s) the model does not have (",
               extra.front(), extra.size() > 1 ? ", ..." : "", "): was a model.* key changed?");
  for (auto& item : params) load_into(item.key(), item.value());
  for (auto& item : buffers) load_into(item.key(), item.value());
  return skipped;
}

WeightsLoad load_model_weights_partial(torch::nn::Module& module, const std::string& path) {
  auto weights = load_safetensors(path);
  // HF's BertModel saves the encoder without the "bert." prefix.
  bool bare = weights.tensors.count("embeddings.word_embeddings.weight") > 0 &&
              !module.named_parameters().contains("embeddings.word_embeddings.weight");
  auto file_name = [&](const std::string& name) {
    if (bare && name.rfind("bert.", 0) == 0) return name.substr(5);
    return name;
  };
  WeightsLoad r;
  std::set<std::string> used;
  std::vector<std::pair<torch::Tensor*, const torch::Tensor*>> copies;  // checked first, copied after
  auto params = module.named_parameters();
  auto buffers = module.named_buffers();
  for (auto* items : {&params, &buffers}) {
    for (auto& item : *items) {
      auto it = weights.tensors.find(file_name(item.key()));
      if (it == weights.tensors.end()) {
        r.initialised.push_back(item.key());
        continue;
      }
      COHORT_CHECK(it->second.sizes() == item.value().sizes(), ConfigError, path, ": tensor '", it->first,
                   "' has shape ", it->second.sizes(), " but the model's '", item.key(), "' is ", item.value().sizes(),
                   ": set the model.* keys to the checkpoint's shape (its config.json says)");
      copies.emplace_back(&item.value(), &it->second);
      used.insert(it->first);
    }
  }
  COHORT_CHECK(!copies.empty(), ConfigError, path, " has none of the model's tensors (", weights.tensors.size(),
               " others): is this a model of this kind?");
  torch::NoGradGuard no_grad;
  for (auto& [dst, src] : copies) dst->copy_(src->to(dst->device()));
  r.loaded = static_cast<int64_t>(copies.size());
  for (const auto& [name, t] : weights.tensors) {
    if (!used.count(name)) r.ignored.push_back(name);
  }
  return r;
}

std::string model_weights_file(const std::string& path) {
  fs::path p(path);
  if (fs::is_regular_file(p)) return p.string();
  if (fs::exists(p / "model.safetensors")) return (p / "model.safetensors").string();
  COHORT_CHECK(fs::is_directory(p), DataError, path, ": no such file or directory");
  bool any_checkpoint = fs::exists(p / "checkpoints");
  for (const auto& e : fs::directory_iterator(p)) any_checkpoint = any_checkpoint || Checkpoints::step_of(e.path().filename().string()) >= 0;
  COHORT_CHECK(any_checkpoint, DataError, path, ": no weights here: expected a model.safetensors, a directory "
               "holding one (an export or a checkpoint), or a run directory with checkpoints/");
  std::vector<std::string> ignored;
  return (fs::path(Checkpoints::resolve(path, &ignored).dir) / "model.safetensors").string();
}

std::string Checkpoints::run_dir_of(const std::string& checkpoint_dir) {
  auto ckpt = fs::absolute(checkpoint_dir).lexically_normal();
  if (!ckpt.has_filename()) ckpt = ckpt.parent_path();  // a trailing '/'
  return ckpt.parent_path().parent_path().string();
}

}  // namespace cohort
