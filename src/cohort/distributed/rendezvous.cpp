#include "cohort/distributed/rendezvous.hpp"

#include <netdb.h>
#include <unistd.h>  // environ

#include <algorithm>
#include <cstdlib>

#include "cohort/core/error.hpp"

namespace cohort {

namespace {

constexpr int kDefaultPort = 29500;

int parse_int(const std::string& text, const std::string& what) {
  try {
    size_t used = 0;
    int v = std::stoi(text, &used);
    if (used == text.size()) return v;
  } catch (const std::exception&) {
  }
  throw UsageError(detail::cat(what, " is not an integer (got '", text, "')"));
}

const std::string* find(const Env& env, const std::string& key) {
  auto it = env.find(key);
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

int get_int(const Env& env, const std::string& key, const std::string& hint) {
  const std::string* v = find(env, key);
  COHORT_CHECK(v != nullptr, UsageError, "environment variable ", key, " is not set", hint);
  return parse_int(*v, "environment variable " + key);
}

int get_int_or(const Env& env, const std::string& key, int fallback) {
  const std::string* v = find(env, key);
  return v ? parse_int(*v, "environment variable " + key) : fallback;
}

void check_spec(const RankSpec& s) {
  COHORT_CHECK(s.world_size >= 1, UsageError, s.source, ": world size ", s.world_size, " must be >= 1");
  COHORT_CHECK(s.rank >= 0 && s.rank < s.world_size, UsageError, s.source, ": rank ", s.rank,
               " is outside world size ", s.world_size);
  COHORT_CHECK(s.local_world_size >= 1 && s.local_rank >= 0 && s.local_rank < s.local_world_size, UsageError,
               s.source, ": local rank ", s.local_rank, " is outside local world size ", s.local_world_size);
}

// MASTER_ADDR/MASTER_PORT as a tcp:// init method, or the --init-method flag.
InitMethod master_from(const Env& env, const std::string& init_flag, const std::string& default_host,
                       const std::string& hint) {
  if (!init_flag.empty() && init_flag != "env://") return parse_init_method(init_flag);
  const std::string* addr = find(env, "MASTER_ADDR");
  std::string host = addr ? *addr : default_host;
  COHORT_CHECK(!host.empty(), UsageError, "MASTER_ADDR is not set", hint);
  int port = get_int_or(env, "MASTER_PORT", default_master_port(env));
  return parse_init_method(detail::cat("tcp://", host, ":", port));
}

}  // namespace

InitMethod parse_init_method(const std::string& text) {
  InitMethod m;
  m.text = text;
  if (text.empty()) return m;
  if (text == "env://") {
    m.kind = InitMethod::Kind::kEnv;
    return m;
  }
  if (text.rfind("file://", 0) == 0) {
    m.kind = InitMethod::Kind::kFile;
    m.path = text.substr(7);
    COHORT_CHECK(!m.path.empty() && m.path[0] == '/', UsageError, "init method '", text,
                 "' needs an absolute path: file:///shared/dir/rendezvous");
    return m;
  }
  if (text.rfind("tcp://", 0) == 0) {
    std::string rest = text.substr(6);
    auto colon = rest.rfind(':');
    COHORT_CHECK(colon != std::string::npos && colon > 0, UsageError, "init method '", text,
                 "' must be tcp://HOST:PORT");
    m.kind = InitMethod::Kind::kTcp;
    m.host = rest.substr(0, colon);
    if (m.host.size() > 2 && m.host.front() == '[' && m.host.back() == ']') m.host = m.host.substr(1, m.host.size() - 2);
    m.port = parse_int(rest.substr(colon + 1), "port of init method '" + text + "'");
    COHORT_CHECK(m.port >= 0 && m.port <= 65535, UsageError, "init method '", text, "': port ", m.port,
                 " is out of range");
    return m;
  }
  throw UsageError(detail::cat("init method '", text, "' is not tcp://HOST:PORT, file:///PATH or env://"));
}

bool resolves(const std::string& host) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  bool ok = getaddrinfo(host.c_str(), nullptr, &hints, &res) == 0 && res != nullptr;
  if (res) freeaddrinfo(res);
  return ok;
}

int default_master_port(const Env& env) {
  auto it = env.find("SLURM_JOB_ID");
  if (it == env.end() || it->second.empty()) return kDefaultPort;
  try {
    return kDefaultPort + static_cast<int>(std::stoull(it->second) % 10000);
  } catch (const std::exception&) {
    return kDefaultPort;
  }
}

Env process_env() {
  Env env;
  for (char** e = environ; e && *e; ++e) {
    std::string kv(*e);
    auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

std::string slurm_first_host(const std::string& nodelist) {
  size_t depth = 0, end = nodelist.size();
  for (size_t i = 0; i < nodelist.size(); ++i) {
    if (nodelist[i] == '[') ++depth;
    if (nodelist[i] == ']' && depth > 0) --depth;
    if (nodelist[i] == ',' && depth == 0) {
      end = i;
      break;
    }
  }
  std::string first = nodelist.substr(0, end);
  auto open = first.find('[');
  if (open == std::string::npos) return first;
  std::string range = first.substr(open + 1);
  size_t stop = range.find_first_of(",-]");
  return first.substr(0, open) + range.substr(0, stop);
}

namespace {

// The variables a launcher or scheduler sets, each under its own names.
struct SchedulerVars {
  const char* source;
  const char* rank;
  const char* world_size;
  const char* local_rank;
  const char* local_world_size;
  const char* node_rank;
  bool all_set;  // every variable is always set (Cohort's own launcher)
};

constexpr SchedulerVars kLauncher{"launcher", "COHORT_RANK", "COHORT_WORLD_SIZE", "COHORT_LOCAL_RANK",
                                  "COHORT_LOCAL_WORLD_SIZE", "COHORT_NODE_RANK", true};
constexpr SchedulerVars kTorchrun{"env://", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                  false};
constexpr SchedulerVars kSlurm{"SLURM", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE",
                               "SLURM_NODEID", false};
constexpr SchedulerVars kOpenMpi{"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                 "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
                                 "OMPI_COMM_WORLD_NODE_RANK", false};

// Rank, sizes and node from `v`'s variables. An optional local rank is 0, an
// optional local world size `default_local` (or local rank + 1 when that is
// negative), an optional node rank -1 (the caller fills it in).
RankSpec read_vars(const Env& env, const SchedulerVars& v, const std::string& hint, int default_local = 1) {
  RankSpec s;
  s.source = v.source;
  s.rank = get_int(env, v.rank, hint);
  s.world_size = get_int(env, v.world_size, hint);
  s.local_rank = v.all_set ? get_int(env, v.local_rank, hint) : get_int_or(env, v.local_rank, 0);
  s.local_world_size = v.all_set ? get_int(env, v.local_world_size, hint)
                                 : get_int_or(env, v.local_world_size, default_local < 0 ? s.local_rank + 1 : default_local);
  s.node_rank = get_int_or(env, v.node_rank, -1);
  s.host_store = s.rank == 0;
  return s;
}

bool present(const Env& env, const SchedulerVars& v) { return find(env, v.rank) && find(env, v.world_size); }

// SLURM_TASKS_PER_NODE is "4(x2),3": the local count is this node's entry,
// which SLURM_NTASKS_PER_NODE gives only when every node has the same.
int slurm_tasks_on_node(const std::string& per_node, int node_rank, int fallback) {
  int node = 0;
  for (size_t i = 0; i < per_node.size();) {
    size_t j = per_node.find(',', i);
    std::string part = per_node.substr(i, j == std::string::npos ? std::string::npos : j - i);
    int count = parse_int(part.substr(0, part.find('(')), "SLURM_TASKS_PER_NODE");
    int repeat = 1;
    if (auto x = part.find("(x"); x != std::string::npos) {
      repeat = parse_int(part.substr(x + 2, part.size() - x - 3), "SLURM_TASKS_PER_NODE");
    }
    if (node_rank >= node && node_rank < node + repeat) return count;
    node += repeat;
    if (j == std::string::npos) break;
    i = j + 1;
  }
  return fallback;
}

}  // namespace

std::optional<RankSpec> detect_rank_spec(const Env& env, const std::string& init_flag) {
  RankSpec s;
  if (find(env, kLauncher.rank)) {
    // Set by `cohort train --nproc-per-node`: the launcher already resolved
    // ranks and, on node 0, hosts the store.
    s = read_vars(env, kLauncher, "");
    s.node_rank = std::max(s.node_rank, 0);
    const std::string* init = find(env, "COHORT_INIT_METHOD");
    COHORT_CHECK(init != nullptr, UsageError, "COHORT_INIT_METHOD is not set for a launched worker");
    s.init = parse_init_method(*init);
    s.host_store = false;
  } else if (present(env, kTorchrun)) {
    const std::string hint = "; env:// needs MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE";
    s = read_vars(env, kTorchrun, hint, /*default_local=*/-1);
    if (s.node_rank < 0) s.node_rank = get_int_or(env, "NODE_RANK", 0);
    s.init = master_from(env, init_flag, "", hint);
  } else if (find(env, "SLURM_PROCID") && find(env, "SLURM_NTASKS")) {
    s = read_vars(env, kSlurm, "", /*default_local=*/-1);
    s.node_rank = std::max(s.node_rank, 0);
    if (const std::string* per = find(env, "SLURM_TASKS_PER_NODE")) {
      s.local_world_size = slurm_tasks_on_node(*per, s.node_rank, s.local_world_size);
    }
    const std::string* nodes = find(env, "SLURM_JOB_NODELIST");
    if (!nodes) nodes = find(env, "SLURM_NODELIST");
    s.init = master_from(env, init_flag, nodes ? slurm_first_host(*nodes) : "",
                         "; under SLURM, SLURM_JOB_NODELIST names the master, or pass --init-method");
  } else if (present(env, kOpenMpi)) {
    s = read_vars(env, kOpenMpi, "");
    if (s.node_rank < 0) s.node_rank = (s.rank - s.local_rank) / std::max(1, s.local_world_size);
    s.init = master_from(env, init_flag, "",
                         "; under mpirun pass -x MASTER_ADDR=HOST -x MASTER_PORT=PORT, or --init-method");
  } else {
    return std::nullopt;
  }
  check_spec(s);
  return s;
}

}  // namespace cohort
