#include "cohort/launch/bench.hpp"

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include "cohort/build_info.hpp"
#include "cohort/ckpt/checkpoint.hpp"
#include "cohort/config/config.hpp"
#include "cohort/core/error.hpp"
#include "cohort/data/manifest.hpp"
#include "cohort/train/optimization/precision.hpp"

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

// The PyTorch peer's command line for the model a Cohort run trained: its
// resolved config.toml, and for BERT the data's manifest (sequence length,
// predictions, vocabulary).
std::string peer_command(const fs::path& run_dir, int ranks, const BenchOptions& o) {
  Config cfg = load_config((run_dir / "config.toml").string());
  const ModelOptions& m = cfg.model;
  std::string common = " --ranks " + std::to_string(ranks) + " --batch " + std::to_string(o.per_rank_batch) +
                       " --steps " + std::to_string(o.steps) + " --threads " + std::to_string(o.threads_per_rank) +
                       " --hidden " + std::to_string(m.hidden);
  const std::string python = quote(COHORT_PYTHON) + " ";
  if (m.name == "mlp") return python + quote(peer_script("ddp_mlp.py")) + common;
  COHORT_CHECK(m.name == "bert", UsageError, "--peer pytorch mirrors the mlp and bert models (this config has model.name ",
               m.name, ")");
  // The peer (bench/peers/bert_pretrain.py) runs the stored masks with NSP.
  COHORT_CHECK(cfg.task_key<std::string>("task.masking") == "static" && cfg.task_key<bool>("task.nsp"), UsageError,
               "--peer pytorch mirrors the static-mask NSP recipe; this config sets task.masking or task.nsp "
               "(bench/masking_recipes.py compares the dynamic recipes with Hugging Face's Trainer)");
  auto manifest = read_manifest(cfg.data.path);
  COHORT_CHECK(manifest && manifest->max_seq_length > 0 && manifest->max_predictions > 0, UsageError,
               "--peer pytorch needs ", (fs::path(cfg.data.path) / "manifest.json").string(),
               " (shards made by cohort prepare) for the sequence shape");
  int64_t vocab = m.vocab_size > 0 ? m.vocab_size : data_vocab_size(cfg.data.path);
  Precision precision = resolve_precision(cfg.train.precision, c10::Device(torch::kCPU));
  return python + quote(peer_script("bert_pretrain.py")) + common + " --layers " + std::to_string(m.layers) +
         " --heads " + std::to_string(m.heads) + " --intermediate " + std::to_string(m.intermediate) +
         " --vocab " + std::to_string(vocab) + " --seq " + std::to_string(manifest->max_seq_length) +
         " --predictions " + std::to_string(manifest->max_predictions) + " --precision " + name_of(precision) +
         " --model mirror --mlm masked" +  // the same computation as Cohort's model
         " --data " + quote(cfg.data.path);  // the same shards, trimmed the same way
}

// N network namespaces joined by a bridge in a switch namespace of their own
// (nothing touches the host's network), each with one address on 10.233.X.0/24.
class NamespaceHosts {
 public:
  NamespaceHosts(int n, const std::string& netem) : n_(n) {
    COHORT_CHECK(geteuid() == 0, UsageError, "--hosts needs root (it creates network namespaces)");
    COHORT_CHECK(std::system("ip -V >/dev/null 2>&1") == 0, UsageError, "--hosts needs iproute2 ('ip')");
    // A tag of our own (pid and a random part), so clean-up only ever
    // deletes what this run created; interface names stay under 15 bytes.
    std::random_device rd;
    uint32_t r = rd();
    subnet_ = static_cast<int>(r % 250);
    char tag[24];
    std::snprintf(tag, sizeof tag, "%d%03x", static_cast<int>(getpid() % 10000000), r & 0xFFF);
    tag_ = tag;
    for (int i = -1; i < n; ++i) {
      COHORT_CHECK(std::system(("ip netns pids " + name(i) + " >/dev/null 2>&1").c_str()) != 0, Error,
                   "cohort bench: network namespace ", name(i), " already exists");
    }
    std::string sw = name(-1), cmd = "set -e; ip netns add " + sw + "; ip -n " + sw + " link add br0 type bridge; ip -n " +
                                     sw + " link set br0 up";
    for (int i = 0; i < n; ++i) {
      std::string h = name(i), v = "cb" + tag_ + "h" + std::to_string(i), p = "cb" + tag_ + "s" + std::to_string(i);
      // Both ends are made inside our namespaces: nothing lands in the host's.
      cmd += "; ip netns add " + h + "; ip -n " + h + " link add " + v + " type veth peer name " + p + " netns " + sw +
             "; ip -n " + sw + " link set " + p + " master br0; ip -n " + sw + " link set " + p + " up; ip -n " + h +
             " addr add " + address(i) + "/24 dev " + v + "; ip -n " + h + " link set " + v + " up; ip -n " + h +
             " link set lo up";
      if (!netem.empty()) cmd += "; ip netns exec " + h + " tc qdisc add dev " + v + " root netem " + netem;
    }
    int rc = std::system(("bash -c " + quote(cmd) + " >/dev/null 2>&1").c_str());
    if (rc != 0) cleanup();
    COHORT_CHECK(rc == 0, Error, "cohort bench: could not create ", n, " network namespaces",
                 netem.empty() ? "" : " (is --netem valid, and is sch_netem available?)");
  }
  ~NamespaceHosts() { cleanup(); }
  std::string name(int host) const { return "cohortbench" + tag_ + (host < 0 ? "sw" : "h" + std::to_string(host)); }
  std::string address(int host) const {
    return "10.233." + std::to_string(subnet_) + "." + std::to_string(host + 1);
  }
  int size() const { return n_; }

 private:
  void cleanup() {
    std::string cmd;
    for (int i = -1; i < n_; ++i) cmd += "ip netns del " + name(i) + " 2>/dev/null; ";
    if (std::system(cmd.c_str()) != 0) std::fprintf(stderr, "cohort bench: warning: namespace clean-up failed\n");
  }
  std::string tag_;
  int subnet_ = 0;
  int n_;
};

// One run of `hosts` launchers, `ranks` ranks each, meeting at host 0;
// returns host 0's run directory.
fs::path run_on_hosts(const NamespaceHosts& hosts, int ranks, const std::string& base_cmd, const fs::path& root) {
  fs::path run = root / ("hosts-" + std::to_string(hosts.size()) + "x" + std::to_string(ranks));
  // The first launcher to fail stops the others (they would otherwise wait
  // in rendezvous until dist.timeout); so does Ctrl-C.
  std::string script = "pids=()\ntrap 'kill \"${pids[@]}\" 2>/dev/null' EXIT INT TERM\n";
  for (int h = 0; h < hosts.size(); ++h) {
    script += "ip netns exec " + hosts.name(h) + " " + base_cmd + " --nnodes " + std::to_string(hosts.size()) +
              " --node-rank " + std::to_string(h) + " --nproc-per-node " + std::to_string(ranks) +
              " --init-method tcp://" + hosts.address(0) + ":29650 --out " + quote((run / ("node-" + std::to_string(h))).string()) +
              " >>" + quote((root / "bench.log").string()) + " 2>&1 &\npids+=($!)\n";
  }
  script += "rc=0\nfor _ in \"${pids[@]}\"; do wait -n || { rc=1; break; }; done\nexit $rc\n";
  fs::path file = root / "hosts.sh";
  std::ofstream(file) << script;
  int rc = std::system(("bash " + quote(file.string())).c_str());
  COHORT_CHECK(rc == 0, Error, "the ", hosts.size(), "-host benchmark run failed; see ", (root / "bench.log").string());
  return run / "node-0";
}

}  // namespace

int run_bench(const BenchOptions& o, const std::vector<std::string>& train_args) {
  COHORT_CHECK(!o.ranks.empty(), UsageError, "--ranks needs at least one rank count");
  for (int r : o.ranks) COHORT_CHECK(r >= 1, UsageError, "--ranks: ", r, " is not a rank count");
  COHORT_CHECK(o.per_rank_batch >= 1, UsageError, "--per-rank-batch must be >= 1 (got ", o.per_rank_batch, ")");
  COHORT_CHECK(o.steps >= 8, UsageError, "--steps must be >= 8 (got ", o.steps, ")");
  COHORT_CHECK(o.peer.empty() || o.peer == "pytorch", UsageError, "--peer must be pytorch (got '", o.peer, "')");
  COHORT_CHECK(o.hosts >= 1, UsageError, "--hosts must be >= 1 (got ", o.hosts, ")");
  COHORT_CHECK(o.netem.empty() || o.hosts > 1, UsageError, "--netem shapes the links between --hosts: add --hosts 2 or more");
  COHORT_CHECK(o.netem.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ._%/-") ==
                   std::string::npos,
               UsageError, "--netem '", o.netem, "': only letters, digits, spaces and . _ % / - are allowed");
  // The keys bench sets itself: `cohort train` refuses a key given twice.
  const std::pair<const char*, const char*> own[] = {
      {"--data.global-batch", "--per-rank-batch"}, {"--train.max-steps", "--steps"},
      {"--threads", "--threads-per-rank"},         {"--train.threads", "--threads-per-rank"},
      {"--log.every-steps", nullptr},               {"--eval.max-samples", nullptr},
      {"--eval.every-steps", nullptr},              {"--log.tensorboard", nullptr},
      {"--quiet", nullptr},                         {"--overwrite", nullptr}};
  for (const auto& arg : train_args) {
    for (const auto& [flag, instead] : own) {
      if (arg != flag && arg.rfind(std::string(flag) + "=", 0) != 0) continue;
      throw UsageError(detail::cat("bench sets ", flag, " for each run itself; ",
                                   instead ? detail::cat("use bench's ", instead) : std::string("leave it out"),
                                   " (got '", arg, "' after --)"));
    }
  }

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

  auto base_cmd = [&](int world) {
    return quote(self) + " train" + extra + " --data.global-batch " + std::to_string(o.per_rank_batch * world) +
           " --train.max-steps " + std::to_string(o.steps) + " --log.every-steps " +
           std::to_string(std::max<int64_t>(1, o.steps / 6)) + " --eval.max-samples " +
           std::to_string(std::max<int64_t>(world, 64)) + " --eval.every-steps 1000000000" + " --threads " +
           std::to_string(o.threads_per_rank) + " --log.tensorboard=false --quiet --overwrite";
  };
  double base = 0;
  auto row = [&](int world, const fs::path& run, int ranks_per_host, const std::string& note) {
    Rate rate = read_rate(run / "metrics.jsonl");
    if (base == 0) base = rate.units_per_s / world;
    double speedup = rate.units_per_s / base;
    std::printf("%6d %13lld %10.1f %12.0f %8.2f %11.3f", world, static_cast<long long>(o.per_rank_batch * world),
                rate.step_ms, rate.units_per_s, speedup, speedup / world);
    if (!o.peer.empty() && note.empty()) {
      std::string peer_cmd = peer_command(run, ranks_per_host, o) + " 2>>" + quote((root / "bench.log").string());
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
    std::printf("%s\n", note.c_str());
    std::fflush(stdout);
  };
  for (int r : o.ranks) {
    fs::path run = root / ("ranks-" + std::to_string(r));
    std::string cmd = base_cmd(r) + " --nproc-per-node " + std::to_string(r) + " --out " + quote(run.string()) +
                      " >" + quote((root / "bench.log").string()) + " 2>&1";
    int rc = std::system(cmd.c_str());
    COHORT_CHECK(rc == 0, Error, "the ", r, "-rank benchmark run failed; see ", (root / "bench.log").string());
    row(r, run, r, "");
  }
  if (o.hosts > 1) {
    NamespaceHosts hosts(o.hosts, o.netem);
    for (int r : o.ranks) {
      fs::path run = run_on_hosts(hosts, r, base_cmd(o.hosts * r), root);
      row(o.hosts * r, run, r,
          "   (" + std::to_string(o.hosts) + " namespace hosts x " + std::to_string(r) + " rank(s)" +
              (o.netem.empty() ? "" : ", netem " + o.netem) + ")");
    }
  }
  if (o.out_dir.empty()) fs::remove_all(root);
  return 0;
}

}  // namespace cohort
