#include "cohort/launch/bench.hpp"

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "cohort/build_info.hpp"
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

// The PyTorch DDP peer, from the source tree this binary was built from.
std::string peer_script() {
  for (const fs::path& p : {fs::path(COHORT_SOURCE_DIR) / "bench/peers/ddp_mlp.py",
                            fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "bench/peers/ddp_mlp.py"}) {
    if (fs::exists(p)) return p.string();
  }
  throw UsageError("--peer pytorch: bench/peers/ddp_mlp.py not found next to this build");
}

}  // namespace

int run_bench(const BenchOptions& o, const std::vector<std::string>& train_args) {
  COHORT_CHECK(!o.ranks.empty(), UsageError, "--ranks needs at least one rank count");
  for (int r : o.ranks) COHORT_CHECK(r >= 1, UsageError, "--ranks: ", r, " is not a rank count");
  COHORT_CHECK(o.per_rank_batch >= 1, UsageError, "--per-rank-batch must be >= 1 (got ", o.per_rank_batch, ")");
  COHORT_CHECK(o.steps >= 8, UsageError, "--steps must be >= 8 (got ", o.steps, ")");
  COHORT_CHECK(o.peer.empty() || o.peer == "pytorch", UsageError, "--peer must be pytorch (got '", o.peer, "')");
  std::string model, hidden = "256";
  for (size_t i = 0; i + 1 < train_args.size(); ++i) {
    if (train_args[i] == "--model.name") model = train_args[i + 1];
    if (train_args[i] == "--model.hidden") hidden = train_args[i + 1];
  }
  COHORT_CHECK(o.peer.empty() || model == "mlp", UsageError,
               "--peer pytorch mirrors the mlp model only: add --model.name mlp");

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
  if (!o.peer.empty()) std::printf(" %14s %8s", "pytorch-ddp/s", "ratio");
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
      std::string peer_cmd = "/usr/bin/python3 " + quote(peer_script()) + " --ranks " + std::to_string(r) +
                             " --hidden " + hidden + " --batch " + std::to_string(o.per_rank_batch) + " --steps " +
                             std::to_string(o.steps) + " --threads " + std::to_string(o.threads_per_rank) + " 2>>" +
                             quote((root / "bench.log").string());
      FILE* pipe = popen(peer_cmd.c_str(), "r");
      std::string out;
      char buf[512];
      while (pipe && fgets(buf, sizeof buf, pipe)) out = buf;
      int prc = pipe ? pclose(pipe) : -1;
      COHORT_CHECK(prc == 0, Error, "the PyTorch DDP peer failed; see ", (root / "bench.log").string());
      double peer_rate = nlohmann::json::parse(out)["samples_per_s"].get<double>();
      std::printf(" %14.0f %8.2f", peer_rate, rate.units_per_s / peer_rate);
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  if (o.out_dir.empty()) fs::remove_all(root);
  return 0;
}

}  // namespace cohort
