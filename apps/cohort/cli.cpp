#include "cohort/cli.hpp"

#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>
#include <c10/util/Logging.h>
#include <malloc.h>
#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "cohort/config/config.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/version.hpp"
#include "cohort/device/cpu_block_cache.hpp"
#include "cohort/distributed/world.hpp"
#include "cohort/train/lifecycle/runtime.hpp"
#include "cohort/train/lifecycle/stop.hpp"
#include "commands/command.hpp"

namespace cohort {

namespace {

int fail(const std::string& msg, int code) {
  std::string line = msg;
  for (char& c : line) {
    if (c == '\n') c = ' ';
  }
  std::fprintf(stderr, "cohort: error: %s\n", line.c_str());
  // A launched worker also leaves the line for its launcher, which names
  // it in its own last line.
  if (const char* file = std::getenv("COHORT_ERROR_FILE"); file && *file) {
    if (std::FILE* f = std::fopen(file, "w")) {
      std::fprintf(f, "%s\n", line.c_str());
      std::fclose(f);
    }
  }
  return code;
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

// Why Cohort's spelling is not a rename, for the options whose meaning
// differs; "" for the others.
std::string option_note(const std::string& option) {
  std::string dashed = option.substr(std::min(option.size(), option.find_first_not_of('-')));
  std::replace(dashed.begin(), dashed.end(), '_', '-');
  static const std::set<std::string> batch = {"per-device-train-batch-size", "per-gpu-train-batch-size",
                                              "gradient-accumulation-steps", "train-batch-size",
                                              "train-micro-batch-size-per-gpu", "batch-size"};
  if (!batch.count(dashed)) return "";
  return ": a step takes --data.global-batch samples over all ranks (per-device batch x devices x accumulation "
         "steps), cut into micro-batches of --data.micro-batch samples, the same at any world size";
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
  // Blocks above the threshold are still fresh mmaps each step (a ModernBERT
  // step's GeGLU inputs and logits): libtorch's CPU tensors keep them for
  // reuse instead, within the peak of their live bytes
  // (device/cpu_block_cache.hpp: a bf16 ModernBERT step at 512 tokens ran at
  // 13.0k tokens/s instead of 11.5k here, its peak memory 4% higher).
  CpuBlockCache::install(32 << 20);
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

  std::vector<std::unique_ptr<cli::Command>> commands;
  for (auto make : {cli::train_command, cli::plot_command, cli::export_command, cli::eval_command,
                    cli::predict_command, cli::bench_command, cli::prepare_classify_command, cli::prepare_command}) {
    commands.push_back(make());
  }
  std::vector<std::pair<CLI::App*, cli::Command*>> subs;
  for (auto& c : commands) subs.emplace_back(c->add(app), c.get());

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
                        (near.empty() ? "" : " (did you mean '" + near + "'?)") + option_note(unknown) +
                        " (see '" + help + "')",
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
    for (auto& [sub, command] : subs) {
      if (sub->parsed()) return command->run(argc, argv, who);
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
