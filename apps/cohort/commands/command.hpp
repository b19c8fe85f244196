// defines: Command, train_command, eval_command, predict_command, export_command, plot_command,
//          bench_command, prepare_command, prepare_classify_command, at_least, DistFlags
//
// The `cohort` subcommands, one file each under apps/cohort/commands/:
// each declares its flags on the app (add) and, when the parse chose it,
// does its work (run). cli_main (cli.cpp) parses and turns errors into one
// line and an exit code.
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <optional>
#include <string>

#include "cohort/config/config.hpp"
#include "cohort/distributed/comm.hpp"
#include "cohort/distributed/rendezvous.hpp"
#include "cohort/launch/launcher.hpp"
#include "cohort/train/lifecycle/launch_shape.hpp"

namespace cohort::cli {

class Command {
 public:
  virtual ~Command() = default;
  // Declares the subcommand and its flags on `app`; returns it.
  virtual CLI::App* add(CLI::App& app) = 0;
  // Runs it with the parsed flags; returns the exit code. `who` is put in
  // front of an error that does not say which rank it is from ("rank 3: ").
  virtual int run(int argc, char** argv, std::string& who) = 0;
};

std::unique_ptr<Command> train_command();
std::unique_ptr<Command> plot_command();
std::unique_ptr<Command> export_command();
std::unique_ptr<Command> eval_command();
std::unique_ptr<Command> predict_command();
std::unique_ptr<Command> bench_command();
std::unique_ptr<Command> prepare_classify_command();
std::unique_ptr<Command> prepare_command();

// A CLI11 check for an integer flag: at least `least`. The message names the
// value; CLI11 puts the flag in front.
CLI::Validator at_least(long long least);

// The flags that start and join ranks (HetSeq's spellings as aliases), for
// train, eval and predict: a test set of millions of rows is a job too.
struct DistFlags {
  LaunchOptions launch;
  CommOptions comm;
  // Declares them on `sub`; `elastic` adds --min-nodes and --max-nodes.
  void add(CLI::App& sub, bool elastic);
  // On a node's launcher (not yet a rank) asked for ranks: checks the flags,
  // starts this node's ranks running this same command and returns their
  // exit code. nullopt in a rank, and in a process that is the whole job.
  // One rank per GPU by default, as torchrun users expect.
  std::optional<int> launch_ranks(const CLI::App& sub, const Env& env, const Config& cfg, int argc, char** argv);
  // train --resume on a node's launcher: this node's --nproc-per-node from
  // the run's recorded shape unless the flag is given, so that the same
  // command continues bit-identically. UsageError naming the per-node
  // command when a multi-node run is resumed without --nnodes.
  void keep_shape(const CLI::App& sub, const LaunchShape& shape, const std::string& run_dir);
  // `comm` completed from the run's config.
  void complete(const Config& cfg, int generation);

 private:
  bool nproc_kept_ = false;  // nproc_per_node is the recorded shape's
};

}  // namespace cohort::cli
