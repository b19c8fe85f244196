// Shared test helpers: temp dirs, files, running the cohort binary.
#pragma once

#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/config/config.hpp"
#include "cohort/core/format.hpp"

namespace cohort::test {

// A fresh directory under the system temp dir, removed on destruction.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "cohort-test-XXXXXX").string();
    path_ = mkdtemp(tmpl.data()) ? tmpl : throw std::runtime_error("mkdtemp failed");
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The message of what `fn` throws, or "(no error)".
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream is(text);
  for (std::string line; std::getline(is, line);) out.push_back(line);
  return out;
}

struct Result {
  int code = -1;
  std::string out;
  std::string err;
};

// Runs `build/cohort ARGS` through the shell, with `env` (VAR=value ...)
// set; captures stdout, stderr, exit code.
inline Result run_cohort(const std::string& args, const std::string& env = "") {
  TempDir tmp;
  std::string cmd = (env.empty() ? "" : "env " + env + " ") + std::string(COHORT_BIN) + " " + args + " >" + (tmp / "out") + " 2>" + (tmp / "err");
  int status = std::system(cmd.c_str());
  Result r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_file(tmp / "out");
  r.err = read_file(tmp / "err");
  return r;
}

// A tiny but valid IDX image dataset in `dir`: n train and n test images of
// 8x8, labels 0..3.
// The loss of each train line of RUN_DIR/metrics.jsonl, in order.
inline std::vector<double> train_losses(const std::string& run_dir) {
  std::vector<double> out;
  for (const auto& line : lines_of(read_file(run_dir + "/metrics.jsonl"))) {
    auto j = nlohmann::json::parse(line);
    if (j["kind"] == "train") out.push_back(j["loss"].get<double>());
  }
  return out;
}

template <class Dir>
void write_tiny_dataset(const Dir& dir, uint32_t n = 8) {
  auto idx = [](std::vector<uint32_t> dims, size_t n, int mod) {
    std::string s = {0, 0, 8, static_cast<char>(dims.size())};
    for (uint32_t d : dims)
      for (int shift : {24, 16, 8, 0}) s += static_cast<char>((d >> shift) & 0xFF);
    for (size_t i = 0; i < n; ++i) s += static_cast<char>(i % mod);
    return s;
  };
  for (const char* p : {"train", "t10k"}) {
    write_file(dir / (std::string(p) + "-images-idx3-ubyte"), idx({n, 8, 8}, 64 * n, 251));
    write_file(dir / (std::string(p) + "-labels-idx1-ubyte"), idx({n}, n, 4));
  }
}

// A tiny BERT dataset: a 20-word corpus through `cohort prepare` (vocab
// 200, sequences of 32, train/valid/test) in `dir`/data. Returns the
// prepare run.
template <class Dir>
Result prepare_tiny_bert(const Dir& dir, int max_seq_length = 32) {
  std::string corpus;
  const char* words[] = {"the", "cat", "sat", "on", "a", "mat", "dog", "ran", "to", "park", "bird", "sang",
                         "in", "tree", "sun", "rose", "over", "hill", "rain", "fell"};
  for (int doc = 0; doc < 120; ++doc) {
    for (int s = 0; s < 4; ++s) {
      for (int w = 0; w < 8; ++w) corpus += std::string(words[(doc * 7 + s * 3 + w * w) % 20]) + (w < 7 ? " " : ".\n");
    }
    corpus += "\n";
  }
  write_file(dir / "corpus.txt", corpus);
  return run_cohort("prepare --input " + dir / "corpus.txt" + " --out " + dir / "data" +
                    " --vocab-size 200 --max-seq-length " + std::to_string(max_seq_length) +
                    " --max-predictions 5 --dupe-factor 2"
                    " --valid-fraction 0.1 --test-fraction 0.1 --quiet");
}

// Rows of 128 of instances of a document (about 35 tokens) each, so that
// three or so pack into a row: prepared once per process.
inline const std::string& packable_bert_data() {
  static TempDir dir;
  static std::string path = [] {
    auto r = prepare_tiny_bert(dir, 128);
    if (r.code != 0) throw std::runtime_error("prepare failed: " + r.err);
    return dir / "data";
  }();
  return path;
}

// A ModernBERT small enough for tests, alternating local (window 8) and
// global attention, dropout on, MLM alone: the model's flags.
inline const std::string kTinyModernBert =
    " --train.task bert-pretrain --model.name modernbert --model.hidden 32 --model.layers 4 --model.heads 4 "
    "--model.intermediate 48 --model.max-positions 128 --model.local-attention 8 --model.dropout 0.1 "
    "--model.attention-dropout 0.1 --task.nsp=false ";

// Sample ids 0 .. n-1.
inline std::vector<int64_t> first_ids(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
  return v;
}

inline bool have_fashion_mnist() {
  return std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz");
}

// A short Fashion-MNIST run of a small MLP, for tests that train in-process.
inline Config small_mlp_run() {
  Config cfg;
  cfg.model.name = "mlp";
  cfg.model.hidden = 64;
  cfg.train.max_steps = 60;
  cfg.data.global_batch = 32;
  cfg.optim.lr = 3e-3;
  cfg.log.every_steps = 20;
  cfg.eval.max_samples = 1000;
  return cfg;
}

}  // namespace cohort::test

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <dirent.h>
#include <signal.h>

#include <chrono>
#include <exception>
#include <mutex>
#include <thread>

namespace cohort::test {

// Waits (polling) until `ready` holds: the event a test waits for (a line,
// a file, a checkpoint). False after `limit`, which is a cap for a broken
// build, not a guess at how fast the machine is.
inline bool wait_until(const std::function<bool()>& ready, std::chrono::seconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (ready()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return ready();
}

// Runs fn(rank) for rank 0..n-1 on n threads and rethrows the first failure
// (by rank order), after every thread has finished.
template <class Fn>
void spawn(int n, Fn fn) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// A TCP port that was free a moment ago.
inline int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}



// A command running in the background: `sh -c "exec CMD >out 2>err"`.
class Background {
 public:
  Background(const std::string& cmd, const TempDir& dir, const std::string& name)
      : out_(dir / (name + ".out")), err_(dir / (name + ".err")) {
    std::string full = "exec " + cmd + " >" + out_ + " 2>" + err_;
    pid_ = fork();
    if (pid_ == 0) {
      setpgid(0, 0);
      execl("/bin/sh", "sh", "-c", full.c_str(), nullptr);
      _exit(127);
    }
  }
  ~Background() {
    if (!done_) {
      kill(-pid_, SIGKILL);
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid() const { return pid_; }
  // Whether it has exited (then reaped: exit_code() says how).
  bool ended() {
    int status = 0;
    if (!done_ && waitpid(pid_, &status, WNOHANG) == pid_) {
      done_ = true;
      code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    return done_;
  }
  int exit_code() const { return code_; }
  // Exit code (128+signal when killed), or -1 if still running after `limit`.
  int wait(std::chrono::milliseconds limit) {
    auto end = std::chrono::steady_clock::now() + limit;
    while (!ended() && std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return ended() ? code_ : -1;
  }
  // Exit code, with no limit of the test's own: for a job that its own
  // timeouts end (dist.timeout, heartbeats), however busy the machine.
  // ctest's TIMEOUT bounds a broken build.
  int wait_exit() {
    while (!ended()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return code_;
  }
  std::string out() const { return read_file(out_); }
  std::string err() const { return read_file(err_); }

 private:
  std::string out_, err_;
  pid_t pid_ = -1;
  bool done_ = false;
  int code_ = -1;
};

// Children of `parent`, from /proc.
inline std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> out;
  DIR* d = opendir("/proc");
  while (dirent* e = readdir(d)) {
    pid_t pid = atoi(e->d_name);
    if (pid <= 0) continue;
    std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
    auto close_paren = stat.rfind(')');
    if (close_paren == std::string::npos) continue;
    int ppid = 0;
    char state;
    if (sscanf(stat.c_str() + close_paren + 1, " %c %d", &state, &ppid) == 2 && ppid == parent) out.push_back(pid);
  }
  closedir(d);
  return out;
}

inline bool alive(pid_t pid) { return kill(pid, 0) == 0; }

// Whether process `pid` has a handler for signal `sig` (SigCgt in /proc):
// an event a test can wait for instead of a guess at start-up time.
inline bool catches(pid_t pid, int sig) {
  std::string status = read_file("/proc/" + std::to_string(pid) + "/status");
  auto at = status.find("SigCgt:");
  if (at == std::string::npos) return false;
  return (std::stoull(status.substr(at + 7, 32), nullptr, 16) >> (sig - 1)) & 1u;
}

// Whether something accepts connections on 127.0.0.1:`port`.
inline bool listening(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  close(fd);
  return ok;
}


// N "hosts" on one machine: a network namespace each, joined by a bridge
// in a namespace of their own, host i at 10.SUBNET.0.(i+1). Needs root and
// iproute2; ok() says whether it could be set up. Removed on destruction.
class NetnsHosts {
 public:
  NetnsHosts(int n, int subnet) : tag_(std::to_string(getpid() % 100000)), subnet_(subnet) {
    if (geteuid() != 0 || std::system("ip -V >/dev/null 2>&1") != 0) return;
    std::string sw = "cohortS" + tag_;
    std::string cmd = "ip netns add " + sw + " && ip -n " + sw + " link add br0 type bridge && ip -n " + sw +
                      " link set br0 up";
    for (int i = 0; i < n; ++i) {
      std::string h = host(i), a = "ch" + tag_ + "i" + std::to_string(i), b = "cs" + tag_ + "i" + std::to_string(i);
      names_.push_back(h);
      cmd += " && ip netns add " + h + " && ip link add " + a + " type veth peer name " + b + " && ip link set " + a +
             " netns " + h + " && ip link set " + b + " netns " + sw + " && ip -n " + sw + " link set " + b +
             " master br0 && ip -n " + sw + " link set " + b + " up && ip -n " + h + " addr add " + address(i) +
             "/24 dev " + a + " && ip -n " + h + " link set " + a + " up && ip -n " + h + " link set lo up";
    }
    names_.push_back(sw);
    ok_ = std::system((cmd + " 2>/dev/null").c_str()) == 0;
  }
  ~NetnsHosts() {
    for (const auto& n : names_) std::system(("ip netns del " + n + " 2>/dev/null").c_str());
  }
  bool ok() const { return ok_; }
  std::string host(int i) const { return "cohortH" + tag_ + "n" + std::to_string(i); }
  std::string address(int i) const { return "10." + std::to_string(subnet_) + ".0." + std::to_string(i + 1); }
  // `cmd` run inside host i.
  std::string on(int i, const std::string& cmd) const { return "ip netns exec " + host(i) + " " + cmd; }

 private:
  std::string tag_;
  int subnet_;
  std::vector<std::string> names_;
  bool ok_ = false;
};

}  // namespace cohort::test
