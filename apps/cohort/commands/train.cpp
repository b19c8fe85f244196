#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "cohort/cli.hpp"
#include "cohort/core/error.hpp"
#include "cohort/distributed/membership.hpp"
#include "cohort/train/elastic/elastic.hpp"
#include "cohort/train/lifecycle/run.hpp"
#include "cohort/train/lifecycle/run_dir.hpp"
#include "cohort/train/lifecycle/startup.hpp"
#include "cohort/train/lifecycle/stop.hpp"
#include "cohort/train/loop/trainer.hpp"
#include "commands/command.hpp"

namespace cohort::cli {

namespace {

// Testing aids, so that a test waits for an event instead of guessing how
// fast the machine is. COHORT_DEBUG_GATE=FILE holds every rank before step N
// until FILE holds a number >= N (a test lets the job go step by step);
// COHORT_DEBUG_DIE=RANK:STEP:POINT kills rank RANK (SIGKILL) at POINT of
// step STEP: `forward` (its first forward begins: nothing of the step is
// shared yet), `applied` (its update applied, nothing logged) or `line` (its
// train line agreed, not yet written); COHORT_DEBUG_DELAY=RANK:MS makes one
// rank's forward passes that much slower (the straggler report);
// COHORT_DEBUG_SLOWDOWN=RANK:FACTOR makes its compute FACTOR times slower,
// as a slower device (data.balance, bench/balance_bench.sh).
StepHook debug_hook(const Env& env, int rank) {
  auto for_rank = [&](const char* name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    auto colon = it->second.find(':');
    COHORT_CHECK(colon != std::string::npos, UsageError, name, " must be RANK:VALUE (got '", it->second, "')");
    int target = 0;
    try {
      target = std::stoi(it->second.substr(0, colon));
    } catch (const std::exception&) {
      throw UsageError(detail::cat(name, ": '", it->second, "' has no number for RANK"));
    }
    if (target != rank) return std::nullopt;
    return it->second.substr(colon + 1);
  };
  auto number = [](const char* name, const std::string& text) {
    try {
      return std::stod(text);
    } catch (const std::exception&) {
      throw UsageError(detail::cat(name, ": '", text, "' is not a number"));
    }
  };
  std::string gate;
  if (auto it = env.find("COHORT_DEBUG_GATE"); it != env.end()) gate = it->second;
  std::optional<std::pair<int64_t, StepPoint>> die;
  if (auto it = env.find("COHORT_DEBUG_DIE"); it != env.end()) {
    std::istringstream in(it->second);
    std::string r, step, point;
    const bool ok = std::getline(in, r, ':') && std::getline(in, step, ':') && std::getline(in, point) &&
                    (point == "forward" || point == "applied" || point == "line");
    COHORT_CHECK(ok, UsageError, "COHORT_DEBUG_DIE must be RANK:STEP:forward|applied|line (got '", it->second, "')");
    try {
      StepPoint at = point == "forward" ? StepPoint::kForwardBegin
                     : point == "applied" ? StepPoint::kApplied
                                          : StepPoint::kLine;
      if (std::stoi(r) == rank) die.emplace(std::stoll(step), at);
    } catch (const std::exception&) {
      throw UsageError(detail::cat("COHORT_DEBUG_DIE: '", it->second, "' has no numbers for RANK and STEP"));
    }
  }
  double delay_ms = 0, slowdown = 1;
  if (auto v = for_rank("COHORT_DEBUG_DELAY")) delay_ms = number("COHORT_DEBUG_DELAY", *v);
  if (auto v = for_rank("COHORT_DEBUG_SLOWDOWN")) {
    slowdown = number("COHORT_DEBUG_SLOWDOWN", *v);
    COHORT_CHECK(slowdown >= 1, UsageError, "COHORT_DEBUG_SLOWDOWN: the factor must be >= 1 (got ", *v, ")");
  }
  if (gate.empty() && !die && delay_ms <= 0 && slowdown <= 1) return nullptr;
  auto compute_began = std::make_shared<std::chrono::steady_clock::time_point>();
  return [gate, die, delay_ms, slowdown, compute_began](StepPoint point, int64_t step) {
    using std::chrono::duration;
    if (die && die->first == step && die->second == point) ::kill(::getpid(), SIGKILL);
    if (point == StepPoint::kForwardBegin) *compute_began = std::chrono::steady_clock::now();
    if (point == StepPoint::kForwardDone && delay_ms > 0) std::this_thread::sleep_for(duration<double, std::milli>(delay_ms));
    if (point == StepPoint::kBackwardDone && slowdown > 1) {  // a device this many times slower
      std::this_thread::sleep_for((slowdown - 1) * (std::chrono::steady_clock::now() - *compute_began));
    }
    if (gate.empty() || point != StepPoint::kBegin) return;
    for (;;) {
      std::ifstream in(gate);
      int64_t allowed = 0;
      if ((in >> allowed) && allowed >= step) return;
      if (stop_requested()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  };
}

class Train : public Command {
 public:
  CLI::App* add(CLI::App& app) override {
    sub_ = app.add_subcommand("train", "Train a model. Config keys come from --config FILE.toml "
                                       "and from --section.key flags, which win.");
    binding_ = std::make_unique<ConfigBinding>(*sub_, cfg_);
    sub_->add_option("--config", request_.config_path, "TOML config file; command-line keys override it");
    sub_->add_option("--out", request_.out_dir, "run directory: config.toml, metrics.jsonl, checkpoints/");
    sub_->add_option("--resume", request_.resume_path,
                     "continue from RUN_DIR's newest valid checkpoint, or from a checkpoint dir; "
                     "its config is the base, --config and flags override harmless keys");
    sub_->add_option("--max-restarts", dist_.launch.max_restarts,
                     "restart all local ranks from the latest checkpoint when one dies, up to N times")
        ->capture_default_str();
    sub_->add_flag("--overwrite", request_.overwrite, "replace a run already in --out");
    sub_->add_flag("--quiet", quiet_, "no console progress lines");
    dist_.add(*sub_, /*elastic=*/true);
    return sub_;
  }

  int run(int argc, char** argv, std::string& who) override {
    Env env = process_env();
    request_.generation = env.count("COHORT_GENERATION") ? std::stoi(env["COHORT_GENERATION"]) : 0;
    request_.job_id = RunDirLock::job_id_from(env);
    auto spec = detect_rank_spec(env, dist_.launch.init_method);
    request_.starts_job = request_.job_id.empty() && !env.count("COHORT_RANK") && dist_.launch.nnodes == 1 &&
                          dist_.launch.min_nodes == 0 && !spec;
    RunOptions run = plan_training(request_, *binding_, cfg_);
    run.quiet = quiet_;
    // mpirun hands every rank a terminal, and its log then fills with the
    // bar's escape codes.
    const bool under_mpirun = env.count("OMPI_COMM_WORLD_SIZE") || env.count("PMI_RANK") || env.count("PMIX_RANK");
    run.live_progress = cfg_.log.progress_bar && !under_mpirun && isatty(fileno(stdout)) != 0;
    // A resume launches the run's recorded shape (train/lifecycle/launch_shape.hpp)
    // unless flags name another; an elastic job's shape is its membership's.
    std::optional<LaunchShape> shape;
    if (const ResolvedCheckpoint* from = run.checkpoint();
        from && !env.count("COHORT_ELASTIC") && dist_.launch.min_nodes == 0) {
      shape = LaunchShape::read(Checkpoints::run_dir_of(from->dir));
    }
    if (shape && !env.count("COHORT_RANK") && !spec) dist_.keep_shape(*sub_, *shape, run.out_dir);
    if (auto code = dist_.launch_ranks(*sub_, env, cfg_, argc, argv)) return *code;
    dist_.complete(cfg_, request_.generation);
    install_stop_handlers();
    dist_.comm.interrupted = [] { return stop_requested(); };
    auto per_world = [&](const World& world, RunOptions& r) {
      TrainOptions process = cfg_.train;
      if (auto threads = shape ? shape->threads_for(world) : std::nullopt; threads && process.threads == 0) {
        process.threads = *threads;  // auto: the recorded shape's, so the steps' bits are the same
      }
      configure_process(process, world);
      r.at = debug_hook(env, world.rank);
    };
    if (env.count("COHORT_ELASTIC") && spec) {
      // Launched with --min-nodes: ranks come from the membership, world by world.
      ElasticOptions eo = parse_elastic_env(env["COHORT_ELASTIC"]);
      eo.node_key = env.count("COHORT_NODE_KEY") ? env["COHORT_NODE_KEY"] : std::to_string(spec->node_rank);
      eo.config = shared_config_fingerprint(run.config_toml);
      who = "node " + std::to_string(spec->node_rank) + " local rank " + std::to_string(spec->local_rank) + ": ";
      auto membership = Membership::join(*spec, dist_.comm, eo);
      train_elastic(cfg_, *membership, run, per_world);
      return 0;
    }
    std::unique_ptr<Comm> comm = spec ? Comm::connect(*spec, dist_.comm) : Comm::single(cfg_.train.device);
    if (comm->size() > 1) who = "rank " + std::to_string(comm->rank()) + ": ";
    per_world(comm->world(), run);
    Trainer(cfg_, *comm, run).run();
    // Stopped by a signal: a launched worker reports success to its
    // launcher (which exits 128+signal); a lone process says so itself.
    if (stop_signal() != 0 && !env.count("COHORT_RANK")) return 128 + stop_signal();
    return 0;
  }

 private:
  CLI::App* sub_ = nullptr;
  Config cfg_;
  std::unique_ptr<ConfigBinding> binding_;
  TrainRequest request_;
  DistFlags dist_;
  bool quiet_ = false;
};

}  // namespace

std::unique_ptr<Command> train_command() { return std::make_unique<Train>(); }

}  // namespace cohort::cli
