#include "cohort/launch/bench.hpp"

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cohort/build_info.hpp"
#include "cohort/ckpt/checkpoint.hpp"
#include "cohort/train/precision.hpp"
#include "cohort/core/error.hpp"

namespace cohort {

namespace fs = std::filesystem;

namespace {

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Rate {
  double step_ms = 0;
  double units_per_s = 0;
};

// Median over the log intervals after the first (which includes start-up).
Rate read_rate(const fs::path& metrics) {
  std::ifstream in(metrics);
  COHORT_CHECK(in.good(), Error, metrics.string(), ": missing; the benchmark run failed");
  std::vector<double> step_ms, rate;
  bool first = true;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.value("kind", "") != "train") continue;
    if (first) {
      first = false;
      continue;
    }
    step_ms.push_back(j["phase_ms"]["step"].get<double>());
    rate.push_back(j["tokens_per_s"].get<double>());
  }
  COHORT_CHECK(!rate.empty(), Error, metrics.string(), ": too few log lines; raise --steps");
  return {median(step_ms), median(rate)};
}

// A script under bench/peers/, from the source tree this binary was built from.
std::string peer_script(const std::string& name) {
  for (const fs::path& p : {fs::path(COHORT_SOURCE_DIR) / "bench/peers" / name,
                            fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "bench/peers" / name}) {
    if (fs::exists(p)) return p.string();
  }
  throw UsageError("--peer pytorch: bench/peers/" + name + " not found next to this build");
}

std::string config_value(const std::vector<std::pair<std::string, std::string>>& values, const std::string& key) {
  for (const auto& [k, v] : values) {
    if (k == key) return v.size() >= 2 && v.front() == '"' ? v.substr(1, v.size() - 2) : v;
  }
  throw Error("cohort bench: the run's config.toml has no " + key);
}

// The PyTorch peer's command line for the model a Cohort run trained: its
// resolved config.toml, and for BERT the data's manifest (sequence length,
// predictions, vocabulary).
std::string peer_command(const fs::path& run_dir, int ranks, const BenchOptions& o) {
  std::ifstream in(run_dir / "config.toml");
  std::stringstream text;
  text << in.rdbuf();
  auto cfg = read_config_values(text.str());
  std::string model = config_value(cfg, "model.name");
  std::string common = " --ranks " + std::to_string(ranks) + " --batch " + std::to_string(o.per_rank_batch) +
                       " --steps " + std::to_string(o.steps) + " --threads " + std::to_string(o.threads_per_rank) +
                       " --hidden " + config_value(cfg, "model.hidden");
  if (model == "mlp") return "/usr/bin/python3 " + quote(peer_script("ddp_mlp.py")) + common;
  COHORT_CHECK(model == "bert", UsageError, "--peer pytorch mirrors the mlp and bert models (this config has model.name ",
               model, ")");
  auto manifest_path = fs::path(config_value(cfg, "data.path")) / "manifest.json";
  std::ifstream mf(manifest_path);
  COHORT_CHECK(mf.good(), UsageError, "--peer pytorch needs ", manifest_path.string(),
               " (shards made by cohort prepare) for the sequence shape");
  auto manifest = nlohmann::json::parse(mf);
  std::string vocab = config_value(cfg, "model.vocab-size");
  if (vocab == "0") vocab = std::to_string(manifest.at("vocab_size").get<int64_t>());
  std::string precision = resolve_precision(config_value(cfg, "train.precision"), c10::Device(torch::kCPU));
  return "/usr/bin/python3 " + quote(peer_script("bert_pretrain.py")) + common + " --layers " +
         config_value(cfg, "model.layers") + " --heads " + config_value(cfg, "model.heads") + " --intermediate " +
         config_value(cfg, "model.intermediate") + " --vocab " + vocab + " --seq " +
         std::to_string(manifest.at("max_seq_length").get<int64_t>()) + " --predictions " +
         std::to_string(manifest.at("max_predictions").get<int64_t>()) + " --precision " + precision +
         " --mlm masked";  // the same computation as Cohort's model
}

}  // namespace

int run_bench(const BenchOptions& o, const std::vector<std::string>& train_args) {
  COHORT_CHECK(!o.ranks.empty(), UsageError, "--ranks needs at least one rank count");
  for (int r : o.ranks) COHORT_CHECK(r >= 1, UsageError, "--ranks: ", r, " is not a rank count");
  COHORT_CHECK(o.per_rank_batch >= 1, UsageError, "--per-rank-batch must be >= 1 (got ", o.per_rank_batch, ")");
  COHORT_CHECK(o.steps >= 8, UsageError, "--steps must be >= 8 (got ", o.steps, ")");
  COHORT_CHECK(o.peer.empty() || o.peer == "pytorch", UsageError, "--peer must be pytorch (got '", o.peer, "')");

  fs::path root = o.out_dir.empty() ? fs::temp_directory_path() / ("cohort-bench-" + std::to_string(getpid()))
                                    : fs::path(o.out_dir);
  fs::create_directories(root);
  std::string self = fs::read_symlink("/proc/self/exe").string();
  std::string extra;
  for (const auto& a : train_args) extra += " " + quote(a);

  std::printf("cohort bench: %lld samples per rank per step, %d thread(s) per rank, %lld steps per run\n",
              static_cast<long long>(o.per_rank_batch), o.threads_per_rank, static_cast<long long>(o.steps));
  std::printf("%6s %13s %10s %12s %8s %11s", "ranks", "global batch", "step ms", "units/s", "speedup",
              "efficiency");
  if (!o.peer.empty()) std::printf(" %14s %8s", "pytorch/s", "ratio");
  std::printf("\n");
  std::fflush(stdout);

  double base = 0;
  for (int r : o.ranks) {
    fs::path run = root / ("ranks-" + std::to_string(r));
    std::string cmd = quote(self) + " train" + extra + " --nproc-per-node " + std::to_string(r) +
                      " --data.global-batch " + std::to_string(o.per_rank_batch * r) + " --train.max-steps " +
                      std::to_string(o.steps) + " --log.every-steps " + std::to_string(std::max<int64_t>(1, o.steps / 6)) +
                      " --eval.max-samples " + std::to_string(std::max<int64_t>(r, 64)) + " --eval.every-steps 1000000000" +
                      " --threads " + std::to_string(o.threads_per_rank) + " --log.tensorboard=false --quiet --overwrite" +
                      " --out " + quote(run.string()) + " >" + quote((root / "bench.log").string()) + " 2>&1";
    int rc = std::system(cmd.c_str());
    COHORT_CHECK(rc == 0, Error, "the ", r, "-rank benchmark run failed; see ", (root / "bench.log").string());
    Rate rate = read_rate(run / "metrics.jsonl");
    if (base == 0) base = rate.units_per_s / r;
    double speedup = rate.units_per_s / base;
    std::printf("%6d %13lld %10.1f %12.0f %8.2f %11.3f", r, static_cast<long long>(o.per_rank_batch * r),
                rate.step_ms, rate.units_per_s, speedup, speedup / r);
    if (!o.peer.empty()) {
      std::string peer_cmd = peer_command(run, r, o) + " 2>>" + quote((root / "bench.log").string());
      FILE* pipe = popen(peer_cmd.c_str(), "r");
      std::string out;
      char buf[512];
      while (pipe && fgets(buf, sizeof buf, pipe)) out = buf;
      int prc = pipe ? pclose(pipe) : -1;
      COHORT_CHECK(prc == 0, Error, "the PyTorch peer failed; see ", (root / "bench.log").string());
      auto peer = nlohmann::json::parse(out);
      double peer_rate = peer.contains("tokens_per_s") ? peer["tokens_per_s"].get<double>()
                                                       : peer["samples_per_s"].get<double>();
      std::printf(" %14.0f %8.2f", peer_rate, rate.units_per_s / peer_rate);
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  if (o.out_dir.empty()) fs::remove_all(root);
  return 0;
}

}  // namespace cohort
