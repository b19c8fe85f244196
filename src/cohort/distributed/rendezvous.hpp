// defines: InitMethod, parse_init_method, RankSpec, Env, process_env,
//          detect_rank_spec, slurm_first_host
//
// Where a process learns its place in the job before any network traffic:
// from a launcher (COHORT_* variables), env:// (RANK, WORLD_SIZE, ...),
// SLURM (SLURM_PROCID, ...) or Open MPI (OMPI_COMM_WORLD_*). The environment
// is passed in as a map so tests can fake any scheduler.
#pragma once

#include <map>
#include <optional>
#include <string>

namespace cohort {

struct InitMethod {
  enum class Kind { kNone, kTcp, kFile, kEnv };
  Kind kind = Kind::kNone;
  std::string host;  // tcp
  int port = 0;      // tcp
  std::string path;  // file
  std::string text;  // as given, for messages
};

// "tcp://HOST:PORT", "file:///PATH", "env://" or "" (none). Throws UsageError.
InitMethod parse_init_method(const std::string& text);

// A process's place in the job, known before rendezvous.
struct RankSpec {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = 0;
  InitMethod init;           // where ranks meet (tcp or file)
  bool host_store = false;   // this process hosts the TCP store
  std::string source = "single process";  // "launcher", "env://", "SLURM", "Open MPI"
};

using Env = std::map<std::string, std::string>;
Env process_env();

// The spec from the environment, or nullopt for a plain single process.
// `init_flag` is --init-method, which overrides the master address a
// scheduler implies. Throws UsageError for missing or inconsistent variables.
std::optional<RankSpec> detect_rank_spec(const Env& env, const std::string& init_flag);

// Whether `host` (a name or an address) resolves to an address.
bool resolves(const std::string& host);

// The port a job uses when MASTER_PORT is not set: 29500, or under SLURM
// 29500 + SLURM_JOB_ID mod 10000, so that two jobs on one node differ.
int default_master_port(const Env& env);

// The first host of a SLURM node list: "gpu[03-05,9],cpu1" -> "gpu03".
std::string slurm_first_host(const std::string& nodelist);

}  // namespace cohort
