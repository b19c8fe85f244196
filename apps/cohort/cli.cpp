#include "cohort/cli.hpp"

#include <CLI/CLI.hpp>
#include <malloc.h>
#include <torch/cuda.h>
#include <unistd.h>
#include <c10/util/Exception.h>
#include <c10/util/Logging.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include "cohort/ckpt/checkpoint.hpp"
#include "cohort/ckpt/export.hpp"
#include "cohort/config/config.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/sha256.hpp"
#include "cohort/core/version.hpp"
#include "cohort/distributed/comm.hpp"
#include "cohort/distributed/membership.hpp"
#include "cohort/distributed/rendezvous.hpp"
#include "cohort/launch/bench.hpp"
#include "cohort/launch/launcher.hpp"
#include "cohort/obs/mlflow.hpp"
#include "cohort/obs/plot.hpp"
#include "cohort/text/prepare.hpp"
#include "cohort/text/wordnet.hpp"
#include "cohort/train/elastic.hpp"
#include "cohort/train/evaluate.hpp"
#include "cohort/train/optim.hpp"
#include "cohort/train/run.hpp"
#include "cohort/train/run_dir.hpp"
#include "cohort/train/runtime.hpp"
#include "cohort/train/stop.hpp"
#include "cohort/train/trainer.hpp"

namespace cohort {

namespace {

int fail(const std::string& msg, int code) {
  std::string line = msg;
  for (char& c : line) {
    if (c == '\n') c = ' ';
  }
  std::fprintf(stderr, "cohort: error: %s\n", line.c_str());
  return code;
}

// Testing aids, so that a test waits for an event instead of guessing how
// fast the machine is. COHORT_DEBUG_GATE=FILE holds every rank before step N
// until FILE holds a number >= N (a test lets the job go step by step);
// COHORT_DEBUG_DIE=RANK:STEP:POINT kills rank RANK (SIGKILL) at POINT of
// step STEP: `applied` (its update applied, nothing logged) or `line` (its
// train line agreed, not yet written).
std::function<void(StepPoint, int64_t)> debug_hook(const Env& env, int rank) {
  std::string gate;
  if (auto it = env.find("COHORT_DEBUG_GATE"); it != env.end()) gate = it->second;
  std::optional<std::pair<int64_t, StepPoint>> die;
  if (auto it = env.find("COHORT_DEBUG_DIE"); it != env.end()) {
    std::istringstream in(it->second);
    std::string r, step, point;
    const bool ok = std::getline(in, r, ':') && std::getline(in, step, ':') && std::getline(in, point) &&
                    (point == "applied" || point == "line");
    COHORT_CHECK(ok, UsageError, "COHORT_DEBUG_DIE must be RANK:STEP:applied|line (got '", it->second, "')");
    try {
      if (std::stoi(r) == rank) die.emplace(std::stoll(step), point == "applied" ? StepPoint::kApplied : StepPoint::kLine);
    } catch (const std::exception&) {
      throw UsageError(detail::cat("COHORT_DEBUG_DIE: '", it->second, "' has no numbers for RANK and STEP"));
    }
  }
  if (gate.empty() && !die) return nullptr;
  return [gate, die](StepPoint point, int64_t step) {
    if (die && die->first == step && die->second == point) ::kill(::getpid(), SIGKILL);
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

// A CLI11 check for an integer flag: at least `least`. The message names the
// value; CLI11 puts the flag in front.
CLI::Validator at_least(long long least) {
  return CLI::Validator(
      [least](std::string& text) -> std::string {
        long long v = 0;
        auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
        if (ec != std::errc() || end != text.data() + text.size()) return "must be an integer (got '" + text + "')";
        return v < least ? detail::cat("must be >= ", least, " (got ", text, ")") : std::string();
      },
      "", "");
}

// The first argument that looks like an option and is not one of `sub`'s
// ("--name" without its value), or "".
std::string unknown_option(const CLI::App& sub, int argc, char** argv) {
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-' || std::isdigit(static_cast<unsigned char>(arg[1])) || arg[1] == '.') continue;
    std::string name = arg.substr(0, arg.find('='));
    if (sub.get_option_no_throw(name) == nullptr) return name;
  }
  return "";
}

// What a user of torchrun, Hugging Face Trainer or DeepSpeed meant by
// `option`, in Cohort's spelling; "" when nothing is near.
std::string option_hint(const CLI::App& sub, const std::string& option) {
  const auto start = option.find_first_not_of('-');
  if (start == std::string::npos) return "";  // "--", "---": nothing to match
  std::string name = option.substr(start);
  std::string dashed = name;
  std::replace(dashed.begin(), dashed.end(), '_', '-');
  static const std::map<std::string, std::string> foreign = {
      {"master-addr", "--init-method tcp://HOST:PORT"}, {"master-port", "--init-method tcp://HOST:PORT"},
      {"rdzv-endpoint", "--init-method tcp://HOST:PORT"}, {"dist-url", "--init-method tcp://HOST:PORT"},
      {"output-dir", "--out"},          {"output", "--out"},
      {"resume-from-checkpoint", "--resume"}, {"bf16", "--train.precision bf16"},
      {"fp16", "--train.precision fp16"}, {"fp32", "--train.precision fp32"},
      {"nproc", "--nproc-per-node"},    {"gpus", "--nproc-per-node"},
      {"world-size", "--distributed-world-size"},
      {"overwrite-output-dir", "--overwrite"}, {"config-file", "--config"},
  };
  if (auto it = foreign.find(dashed); it != foreign.end()) {
    const std::string flag = it->second.substr(0, it->second.find(' '));
    if (sub.get_option_no_throw(flag) != nullptr) return it->second;
  }
  if (sub.get_option_no_throw("--" + dashed) != nullptr) return "--" + dashed;
  if (sub.get_name() != "train") return "";
  if (std::string key = closest_key(name); !key.empty()) return "--" + key;
  return "";
}

// The flags that start and join ranks (HetSeq's spellings as aliases), on
// `sub`; `elastic` adds --min-nodes and --max-nodes (train only).
void add_dist_flags(CLI::App& sub, LaunchOptions& launch, CommOptions& comm_opts, bool elastic) {
  const std::string group = "Distributed (per node; HetSeq spellings accepted)";
  sub.add_option("--nproc-per-node,--distributed-gpus", launch.nproc_per_node,
                 "ranks to start on this node (one per GPU, or CPU ranks)")
      ->capture_default_str()->group(group);
  sub.add_flag("--oversubscribe", launch.oversubscribe,
               "allow more ranks on this node than it has cores (CPU) or GPUs")->group(group);
  sub.add_option("--nnodes", launch.nnodes, elastic ? "nodes in the job (elastic: nodes the first world waits for)"
                                                    : "nodes in the job")
      ->capture_default_str()->group(group);
  if (elastic) {
    sub.add_option("--min-nodes", launch.min_nodes,
                   "elastic: the job goes on while at least N nodes remain, and nodes may join mid-run "
                   "(0: off, a fixed world)")->capture_default_str()->group(group);
    sub.add_option("--max-nodes", launch.max_nodes, "elastic: at most N nodes; later ones wait (0: no limit)")
        ->capture_default_str()->group(group);
  }
  sub.add_option("--node-rank", launch.node_rank, "this node's index, 0..nnodes-1")
      ->capture_default_str()->group(group);
  sub.add_option("--init-method,--distributed-init-method", launch.init_method,
                 "rendezvous: tcp://HOST:PORT | file:///shared/path | env://; "
                 "default: SLURM/Open MPI/env:// variables, else a private store on one node")
      ->group(group);
  sub.add_option("--distributed-world-size", launch.world_size, "total ranks over all nodes (HetSeq)")
      ->check(at_least(1))->group(group);
  sub.add_option("--distributed-rank", launch.first_rank, "first global rank on this node (HetSeq)")
      ->check(at_least(0))->group(group);
  sub.add_option("--dist.secret", comm_opts.secret, "shared secret every process of the job must know")
      ->envname("COHORT_SECRET")->group(group);
  sub.add_option("--dist.iface", comm_opts.iface, "network interface for collectives (default: the one "
                 "that reaches the master)")->envname("GLOO_SOCKET_IFNAME")->group(group);
}

// On a node's launcher (not yet a rank) asked for ranks: checks the flags,
// starts this node's ranks running this same command and returns their exit
// code. nullopt in a rank, and in a process that is the whole job. One rank
// per GPU by default, as torchrun users expect.
std::optional<int> launch_ranks(const CLI::App& sub, LaunchOptions& launch, const Env& env, const Config& cfg,
                                int argc, char** argv) {
  const bool gpus = cfg.train.device != DeviceKind::kCpu && torch::cuda::is_available();
  if (!env.count("COHORT_RANK") && sub.count("--nproc-per-node") == 0 && gpus) {
    launch.nproc_per_node = std::max<int>(1, static_cast<int>(torch::cuda::device_count()));
  }
  launch.max_local_ranks = gpus ? static_cast<int>(torch::cuda::device_count()) : available_cores();
  launch.local_units = gpus ? "GPUs" : "cores";
  validate(launch);  // one process too: a bad --init-method or --node-rank is refused, not ignored
  if (env.count("COHORT_RANK") || !wants_launcher(launch)) return std::nullopt;
  launch.timeout_s = cfg.dist.timeout;
  return launch_node(launch, std::vector<std::string>(argv, argv + argc));
}

// `comm_opts` completed from the run's config.
void complete_comm_options(CommOptions& comm_opts, const Config& cfg, int generation) {
  comm_opts.timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.dist.timeout * 1000));
  comm_opts.device = cfg.train.device;
  comm_opts.backend = cfg.dist.backend;
  comm_opts.generation = generation;
}

}  // namespace

void configure_process(const TrainOptions& opts, const World& world) {
  // Large tensors are allocated and freed every step. With glibc's dynamic
  // mmap threshold each one is a fresh mmap and a page-fault storm; a fixed
  // high threshold and a lazy trim keep them in the heap (51 ms vs 146 ms for
  // one bf16 layer step, measured).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  mallopt(M_TOP_PAD, 64 << 20);
  // libtorch's default can be 1 (cpuinfo counts one physical core), so set it.
  int cores = available_cores();
  torch::set_num_threads(opts.threads > 0 ? opts.threads : std::max(1, cores / std::max(1, world.local_world_size)));
}

int cli_main(int argc, char** argv) {
  // c10's own log lines (socket retries with stack traces) would bury the
  // one-line errors below; TORCH_CPP_LOG_LEVEL=INFO brings them back.
  setenv("TORCH_CPP_LOG_LEVEL", "FATAL", /*overwrite=*/0);
  c10::initLogging();
  // A peer that dies mid-collective leaves Gloo writing into a socket the
  // peer reset. With SIGPIPE's default action that write would kill this
  // rank too, instead of failing the collective so the survivors can go on
  // (Python, and so PyTorch DDP, ignores SIGPIPE from the start). Children
  // inherit it.
  std::signal(SIGPIPE, SIG_IGN);
  CLI::App app{"Cohort: data-parallel training of transformer models across heterogeneous machines."};
  app.set_version_flag("--version", std::string("cohort ") + kVersion);
  app.require_subcommand(1);

  CLI::App* train = app.add_subcommand("train", "Train a model. Config keys come from --config FILE.toml "
                                                "and from --section.key flags, which win.");
  Config cfg;
  ConfigBinding binding(*train, cfg);
  LaunchOptions launch;
  TrainRequest request;
  bool quiet = false;
  train->add_option("--config", request.config_path, "TOML config file; command-line keys override it");
  train->add_option("--out", request.out_dir, "run directory: config.toml, metrics.jsonl, checkpoints/");
  train->add_option("--resume", request.resume_path,
                    "continue from RUN_DIR's newest valid checkpoint, or from a checkpoint dir; "
                    "its config is the base, --config and flags override harmless keys");
  train->add_option("--max-restarts", launch.max_restarts,
                    "restart all local ranks from the latest checkpoint when one dies, up to N times")
      ->capture_default_str();
  train->add_flag("--overwrite", request.overwrite, "replace a run already in --out");
  train->add_flag("--quiet", quiet, "no console progress lines");

  CLI::App* plot = app.add_subcommand("plot", "Draw RUN_DIR/metrics.jsonl as a PNG (loss, lr, throughput, eval)");
  std::string plot_dir, plot_out;
  plot->add_option("RUN_DIR", plot_dir, "run directory")->required();
  plot->add_option("--out,-o,--output", plot_out, "PNG to write (default RUN_DIR/plots.png)");

  CLI::App* exporter = app.add_subcommand(
      "export", "Write a checkpoint as a standalone model directory: model.safetensors (Hugging Face names), "
                "config.json and, for BERT, the run's tokenizer; bert-pretrain loads as BertForPreTraining, "
                "bert-classify as BertForSequenceClassification");
  std::string export_path, export_out;
  exporter->add_option("CHECKPOINT", export_path, "a run dir (its newest checkpoint) or a checkpoint dir")->required();
  exporter->add_option("--out,-o", export_out, "directory to write (default RUN_DIR/export)");

  CLI::App* evaluator = app.add_subcommand(
      "eval", "Evaluate a checkpoint on a split with the run's own config; appends an eval line to "
              "RUN_DIR/metrics.jsonl");
  EvalRequest eval_request;
  evaluator->add_option("CHECKPOINT", eval_request.checkpoint, "a run dir (its newest checkpoint) or a checkpoint dir")
      ->required();
  evaluator->add_option("--split", eval_request.split, "split to evaluate")->capture_default_str();
  evaluator->add_option("--max-samples", eval_request.max_samples, "the first N samples only; 0 = all")
      ->capture_default_str()->check(at_least(0));
  bool eval_plot = false;
  evaluator->add_flag("--plot", eval_plot,
                      "also draw the confusion matrix (bert-classify) as RUN_DIR/confusion-SPLIT-step-N.png");

  CLI::App* predictor = app.add_subcommand(
      "predict", "Predict the classes of the inputs in a TSV or JSONL file (bert-classify) with a checkpoint; "
                 "writes one JSON line per input, in input order: its index and text (or --data.id-column), "
                 "the label, its probability and every class's");
  EvalRequest predict_request;
  std::string predict_input, predict_out;
  int64_t predict_batch = 0;
  predictor->add_option("CHECKPOINT", predict_request.checkpoint, "a run dir (its newest checkpoint) or a checkpoint dir")
      ->required();
  predictor->add_option("--input", predict_input, "inputs: the run's columns; labels optional")->required();
  predictor->add_option("--out,-o", predict_out, "JSONL to write (default RUN_DIR/predictions.jsonl)");
  predictor->add_option("--batch", predict_batch, "inputs per forward; 0 = the run's eval.batch")
      ->capture_default_str()->check(at_least(0));
  // The input's columns, when they are not named as in the run's data.
  std::map<std::string, std::string> predict_columns;
  for (const char* key : {"data.text-column", "data.text-pair-column", "data.label-column", "data.id-column"}) {
    predictor->add_option_function<std::string>(
        std::string("--") + key, [&predict_columns, key](const std::string& v) { predict_columns[key] = v; },
        std::string(key) == "data.id-column"
            ? "a column of the input written beside each prediction instead of its text"
            : std::string("the input's column for the run's ") + key);
  }

  CLI::App* bench = app.add_subcommand(
      "bench", "Weak-scaling table: a short run of a config at each rank count (per-rank batch fixed). "
               "Extra arguments after -- go to `cohort train`");
  BenchOptions bench_opts;
  std::vector<std::string> bench_train_args;
  // One token, split here: a vector option would swallow a following "--".
  bench->add_option_function<std::string>(
           "--ranks",
           [&bench_opts](const std::string& list) {
             bench_opts.ranks.clear();
             std::stringstream in(list);
             for (std::string item; std::getline(in, item, ',');) {
               size_t used = 0;
               int n = 0;
               try {
                 n = std::stoi(item, &used);
               } catch (const std::exception&) {
                 used = 0;
               }
               if (used != item.size() || n < 1) throw CLI::ValidationError("--ranks", "'" + item + "' is not a rank count >= 1");
               bench_opts.ranks.push_back(n);
             }
           },
           "rank counts to run, e.g. 1,2,4")
      ->default_str("1,2");
  bench->add_option("--per-rank-batch", bench_opts.per_rank_batch, "samples per rank per step")->capture_default_str();
  bench->add_option("--steps", bench_opts.steps, "optimizer steps per run")->capture_default_str();
  bench->add_option("--threads-per-rank", bench_opts.threads_per_rank, "intra-op threads per rank")
      ->capture_default_str();
  bench->add_option("--peer", bench_opts.peer, "also run PyTorch DDP on the same model and batch: pytorch");
  bench->add_option("--hosts", bench_opts.hosts, "also run each rank count on N network-namespace hosts (root)")
      ->capture_default_str();
  bench->add_option("--netem", bench_opts.netem, "tc netem options for each host's link, e.g. 'delay 1ms rate 1gbit'");
  bench->add_option("--out", bench_opts.out_dir, "keep the runs here (default: a temp dir, removed)");
  bench->add_option("train-args", bench_train_args, "arguments for `cohort train` (--config, --model.*, ...)");
  bench->allow_extras(false);

  CLI::App* prepare_classify = app.add_subcommand(
      "prepare-classify", "Write WordNet (wordnet-base) as sequence classification TSVs, split by synset: "
                          "train/valid/test.tsv with columns synset, pos, lexname, words, gloss");
  text::WordnetOptions wordnet;
  prepare_classify->add_option("--wordnet", wordnet.dir, "WordNet's dict directory")->capture_default_str();
  prepare_classify->add_option("--out", wordnet.out, "directory to write")->required();
  prepare_classify->add_option("--valid-fraction", wordnet.valid_fraction, "synsets in valid.tsv")->capture_default_str();
  prepare_classify->add_option("--test-fraction", wordnet.test_fraction, "synsets in test.tsv")->capture_default_str();
  prepare_classify->add_option("--seed", wordnet.seed, "seed of the split")->capture_default_str();
  prepare_classify->add_flag("--overwrite", wordnet.overwrite, "replace existing files");

  CLI::App* prepare = app.add_subcommand(
      "prepare", "BERT pretraining data: text files or the GCIDE dictionary -> WordPiece vocabulary -> "
                 "masked-LM/next-sentence instances -> HDF5 shards in OUT/{train,valid,test}/");
  text::PrepareOptions prep;
  bool prep_cased = false;
  prepare->add_option("--input", prep.inputs,
                      "text file (one sentence per line, a blank line between documents; .gz read too) or the "
                      "GCIDE dictionary (.dict or .dict.dz, e.g. /usr/share/dictd/gcide.dict.dz); repeatable")
      ->required();
  prepare->add_option("--out", prep.out, "output directory: vocab.txt, manifest.json, train/ valid/ test/")
      ->required();
  prepare->add_option("--vocab", prep.vocab, "use this vocab.txt instead of building one from the training split");
  prepare->add_option("--vocab-size", prep.vocab_size, "tokens in the vocabulary built (without --vocab)")
      ->capture_default_str();
  prepare->add_flag("--cased", prep_cased, "keep case and accents (default: lowercase and strip accents)");
  prepare->add_option("--max-seq-length", prep.instances.max_seq_length, "tokens per instance, [CLS] and [SEP]s included")
      ->capture_default_str();
  prepare->add_option("--max-predictions", prep.instances.max_predictions, "masked-LM targets per instance, at most")
      ->capture_default_str();
  prepare->add_option("--masked-lm-prob", prep.instances.masked_lm_prob, "fraction of tokens to predict")
      ->capture_default_str();
  prepare->add_option("--short-seq-prob", prep.instances.short_seq_prob,
                      "chance that a document aims at a shorter random length")
      ->capture_default_str();
  prepare->add_option("--dupe-factor", prep.instances.dupe_factor, "passes over the documents, each masked differently")
      ->capture_default_str();
  prepare->add_flag("--whole-word-mask", prep.instances.whole_word_mask, "mask every piece of a word or none");
  prepare->add_option("--valid-fraction", prep.valid_fraction, "fraction of documents for the valid split")
      ->capture_default_str();
  prepare->add_option("--test-fraction", prep.test_fraction, "fraction of documents for the test split")
      ->capture_default_str();
  prepare->add_option("--rows-per-shard", prep.rows_per_shard, "instances per HDF5 file")->capture_default_str();
  prepare->add_option("--seed", prep.instances.seed, "the same seed and inputs give the same shards, on any thread count")
      ->capture_default_str();
  prepare->add_option("--threads", prep.instances.threads, "worker threads; 0: every core")->capture_default_str();
  prepare->add_flag("--quiet", prep.quiet, "no progress lines and no summary");
  prepare->add_flag("--overwrite", prep.overwrite, "replace what an earlier run wrote to --out");

  // Per-node launch flags: not config keys, since they differ between nodes.
  // eval and predict take them too: a test set of millions of rows is a job.
  CommOptions comm_opts;
  add_dist_flags(*train, launch, comm_opts, /*elastic=*/true);
  add_dist_flags(*evaluator, launch, comm_opts, /*elastic=*/false);
  add_dist_flags(*predictor, launch, comm_opts, /*elastic=*/false);

  if (argc > 1 && argv[1][0] != '-') {
    std::string known;
    bool found = false;
    for (const auto* sub : app.get_subcommands({})) {
      known += (known.empty() ? "" : ", ") + sub->get_name();
      found = found || sub->get_name() == argv[1];
    }
    if (!found)
      return fail("unknown command '" + std::string(argv[1]) + "' (commands: " + known + "; see 'cohort --help')", 2);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    const auto parsed = app.get_subcommands();
    CLI::App* sub = parsed.empty() ? nullptr : parsed.front();
    const std::string help = sub ? "cohort " + sub->get_name() + " --help" : "cohort --help";
    if (sub && dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) {
      if (std::string unknown = unknown_option(*sub, argc, argv); !unknown.empty()) {
        std::string near = option_hint(*sub, unknown);
        return fail("unknown option '" + unknown + "' for 'cohort " + sub->get_name() + "'" +
                        (near.empty() ? "" : " (did you mean '" + near + "'?)") + " (see '" + help + "')",
                    2);
      }
    }
    return fail(std::string(e.what()) + " (see '" + help + "')", 2);
  } catch (const Error& e) {  // a config choice that is not one of its words
    return fail(e.what(), e.exit_code());
  }

  // In a multi-rank job, errors that do not already say which rank they are
  // from get "rank N: " in front.
  std::string who;
  try {
    if (bench->parsed()) return run_bench(bench_opts, bench_train_args);
    if (prepare_classify->parsed()) {
      text::WordnetCounts n = text::prepare_wordnet(wordnet);
      std::printf("cohort: wrote %s/{train,valid,test}.tsv: %lld, %lld, %lld synsets\n", wordnet.out.c_str(),
                  static_cast<long long>(n.train), static_cast<long long>(n.valid), static_cast<long long>(n.test));
      return 0;
    }
    if (prepare->parsed()) {
      prep.lowercase = !prep_cased;
      text::run_prepare(prep);
      return 0;
    }
    if (evaluator->parsed() || predictor->parsed()) {
      // Both are collective: run as one process or as a job of ranks, like train.
      CLI::App& sub = evaluator->parsed() ? *evaluator : *predictor;
      EvalPlan plan = plan_evaluation(evaluator->parsed() ? eval_request : predict_request);
      if (predictor->parsed() && predict_batch > 0) plan.cfg.eval.batch = predict_batch;
      for (const auto& [key, value] : predict_columns) {
        if (key == "data.text-column") plan.cfg.data.text_column = value;
        if (key == "data.text-pair-column") plan.cfg.data.text_pair_column = value;
        if (key == "data.label-column") plan.cfg.data.label_column = value;
        if (key == "data.id-column") plan.cfg.data.id_column = value;
      }
      validate(plan.cfg);
      Env env = process_env();
      if (auto code = launch_ranks(sub, launch, env, plan.cfg, argc, argv)) return *code;
      complete_comm_options(comm_opts, plan.cfg, 0);
      auto spec = detect_rank_spec(env, launch.init_method);
      std::unique_ptr<Comm> comm = spec ? Comm::connect(*spec, comm_opts) : Comm::single(plan.cfg.train.device);
      if (comm->size() > 1) who = "rank " + std::to_string(comm->rank()) + ": ";
      // Only the process that reports draws a progress line (under mpirun every rank has a terminal).
      plan.run.live_progress = comm->world().is_main() && isatty(fileno(stderr)) != 0;
      configure_process(plan.cfg.train, comm->world());
      if (predictor->parsed()) {
        if (predict_out.empty()) predict_out = plan.run.out_dir + "/predictions.jsonl";
        int64_t n = predict_checkpoint(plan.cfg, *comm, plan.run, predict_input, predict_out);
        if (comm->world().is_main()) {
          std::printf("cohort: wrote %lld predictions to %s\n", static_cast<long long>(n), predict_out.c_str());
        }
        return 0;
      }
      std::string png;
      if (eval_plot) {
        png = plan.run.out_dir + "/confusion-" + plan.cfg.eval.split + "-step-" +
              std::to_string(plan.run.resume->state.step) + ".png";
      }
      evaluate_checkpoint(plan.cfg, *comm, plan.run, png);
      return 0;
    }
    if (exporter->parsed()) {
      ExportResult r = export_model(export_path, export_out);
      for (const auto& w : r.warnings) std::fprintf(stderr, "cohort: warning: %s\n", w.c_str());
      for (const auto& note : r.notes) std::fprintf(stderr, "cohort: note: %s\n", note.c_str());
      std::printf("cohort: wrote %s: %s\n", r.dir.c_str(), detail::join(r.files, ", ").c_str());
      if (!r.hf_class.empty())
        std::printf("cohort: load it with transformers' %s.from_pretrained('%s') (or the Auto classes)\n",
                    r.hf_class.c_str(), r.dir.c_str());
      if (!r.mlflow.empty() && !r.run_dir.empty()) {  // the export joins the run's MLflow run, under export/
        std::vector<std::pair<std::string, std::string>> files;
        for (const auto& name : r.files) files.emplace_back((std::filesystem::path(r.dir) / name).string(), "export/" + name);
        std::printf("cohort: %s\n", mlflow_upload_to_run(r.mlflow, r.run_dir, files).c_str());
      }
      return 0;
    }
    if (plot->parsed()) {
      PlotOptions po;
      po.output = plot_out;
      // The schedule the run followed, drawn whole, when its length is known.
      if (auto toml = std::filesystem::path(plot_dir) / "config.toml"; std::filesystem::exists(toml)) {
        try {
          Config run_cfg = load_config(toml.string());
          if (run_cfg.train.max_steps > 0) {
            po.total_steps = run_cfg.train.max_steps;
            po.lr_at = [s = LrSchedule::from(run_cfg.optim, run_cfg.train.max_steps)](int64_t step) { return s.at(step); };
          }
        } catch (const Error& e) {
          std::fprintf(stderr, "cohort: note: the learning-rate schedule is left out: %s\n", e.what());
        }
      }
      std::printf("cohort: wrote %s\n", plot_run(plot_dir, po).c_str());
      return 0;
    }
    if (train->parsed()) {
      Env env = process_env();
      request.generation = env.count("COHORT_GENERATION") ? std::stoi(env["COHORT_GENERATION"]) : 0;
      request.job_id = RunDirLock::job_id_from(env);
      RunOptions run = plan_training(request, binding, cfg);
      run.quiet = quiet;
      // mpirun hands every rank a terminal, and its log then fills with the
      // bar's escape codes.
      const bool under_mpirun = env.count("OMPI_COMM_WORLD_SIZE") || env.count("PMI_RANK") || env.count("PMIX_RANK");
      run.live_progress = cfg.log.progress_bar && !under_mpirun && isatty(fileno(stdout)) != 0;
      if (auto code = launch_ranks(*train, launch, env, cfg, argc, argv)) return *code;
      complete_comm_options(comm_opts, cfg, request.generation);
      install_stop_handlers();
      comm_opts.interrupted = [] { return stop_requested(); };
      auto spec = detect_rank_spec(env, launch.init_method);
      // Testing aids: COHORT_DEBUG_DELAY=RANK:MS makes one rank's forward
      // passes that much slower (the straggler report);
      // COHORT_DEBUG_SLOWDOWN=RANK:FACTOR makes its compute FACTOR times
      // slower, as a slower device (data.balance, bench/balance_bench.sh).
      auto for_rank = [&](const char* name, int rank) -> std::optional<std::string> {
        auto it = env.find(name);
        if (it == env.end()) return std::nullopt;
        auto colon = it->second.find(':');
        COHORT_CHECK(colon != std::string::npos, UsageError, name, " must be RANK:VALUE (got '", it->second, "')");
        if (std::stoi(it->second.substr(0, colon)) != rank) return std::nullopt;
        return it->second.substr(colon + 1);
      };
      auto number = [](const char* name, const std::string& text) {
        try {
          return std::stod(text);
        } catch (const std::exception&) {
          throw UsageError(detail::cat(name, ": '", text, "' is not a number"));
        }
      };
      auto per_world = [&](const World& world, RunOptions& r) {
        configure_process(cfg.train, world);
        r.debug_delay_ms = 0;
        r.debug_slowdown = 1;
        r.at = debug_hook(env, world.rank);
        if (auto v = for_rank("COHORT_DEBUG_DELAY", world.rank)) r.debug_delay_ms = static_cast<int>(number("COHORT_DEBUG_DELAY", *v));
        if (auto v = for_rank("COHORT_DEBUG_SLOWDOWN", world.rank)) {
          r.debug_slowdown = number("COHORT_DEBUG_SLOWDOWN", *v);
          COHORT_CHECK(r.debug_slowdown >= 1, UsageError, "COHORT_DEBUG_SLOWDOWN: the factor must be >= 1 (got ", *v, ")");
        }
      };
      if (env.count("COHORT_ELASTIC") && spec) {
        // Launched with --min-nodes: ranks come from the membership, world by world.
        ElasticOptions eo = parse_elastic_env(env["COHORT_ELASTIC"]);
        eo.node_key = env.count("COHORT_NODE_KEY") ? env["COHORT_NODE_KEY"] : std::to_string(spec->node_rank);
        eo.config = sha256_hex(shared_config(run.config_toml)).substr(0, 16);
        who = "node " + std::to_string(spec->node_rank) + " local rank " + std::to_string(spec->local_rank) + ": ";
        auto membership = Membership::join(*spec, comm_opts, eo);
        train_elastic(cfg, *membership, run, per_world);
        return 0;
      }
      std::unique_ptr<Comm> comm = spec ? Comm::connect(*spec, comm_opts) : Comm::single(cfg.train.device);
      if (comm->size() > 1) who = "rank " + std::to_string(comm->rank()) + ": ";
      per_world(comm->world(), run);
      Trainer(cfg, *comm, run).run();
      // Stopped by a signal: a launched worker reports success to its
      // launcher (which exits 128+signal); a lone process says so itself.
      if (stop_signal() != 0 && !env.count("COHORT_RANK")) return 128 + stop_signal();
    }
    return 0;
  } catch (const Error& e) {
    std::string msg = e.what();
    // Stopped by a signal before training began: nothing to save.
    int code = stop_signal() != 0 ? 128 + stop_signal() : e.exit_code();
    return fail(msg.rfind("rank ", 0) == 0 ? msg : who + msg, code);
  } catch (const c10::Error& e) {
    return fail(who + e.what_without_backtrace(), 1);
  } catch (const std::exception& e) {
    return fail(who + e.what(), 1);
  }
}

}  // namespace cohort
