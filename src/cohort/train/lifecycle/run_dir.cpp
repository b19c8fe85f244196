#include "cohort/train/lifecycle/run_dir.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <set>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "cohort/core/error.hpp"
#include "cohort/core/files.hpp"
#include "cohort/core/sha256.hpp"

namespace cohort {

namespace fs = std::filesystem;

std::string RunDir::metrics_file() const { return (fs::path(path_) / "metrics.jsonl").string(); }
std::string RunDir::tensorboard_dir() const { return (fs::path(path_) / "tensorboard").string(); }
std::string RunDir::sample_ids_file(int rank) const {
  return (fs::path(path_) / "sample-ids" / ("rank-" + std::to_string(rank) + ".jsonl")).string();
}

void RunDir::refuse_fresh_over_a_run(RunMode mode) const {
  fs::path dir(path_);
  COHORT_CHECK(mode != RunMode::kFresh || !(fs::exists(dir / "metrics.jsonl") || fs::exists(dir / "checkpoints")),
               UsageError, path_, " already holds a run (metrics.jsonl or checkpoints/); choose a new --out, continue it with --resume ", path_,
               ", or pass --overwrite");
}

void RunDir::write_run_files(const std::vector<std::pair<std::string, std::string>>& files, RunMode mode) const {
  for (const auto& [name, text] : files) {
    const fs::path file = fs::path(path_) / name;
    if (mode == RunMode::kResume && name.rfind("tokenizer/", 0) == 0 && fs::exists(file)) continue;
    fs::create_directories(file.parent_path());
    write_file_atomically(file.string(), text);
  }
}

std::vector<std::string> RunDir::prepare(RunMode mode, const std::string& config_toml, int64_t resumed_step) const {
  COHORT_CHECK(!path_.empty(), UsageError, "--out RUN_DIR is required");
  fs::path dir(path_);
  refuse_fresh_over_a_run(mode);
  std::error_code ec;
  fs::create_directories(dir, ec);
  COHORT_CHECK(!ec, Error, path_, ": cannot create directory (", ec.message(), ")");
  std::vector<std::string> notes;
  if (mode == RunMode::kOverwrite) {
    fs::remove(dir / "metrics.jsonl", ec);
    fs::remove_all(dir / "checkpoints", ec);
    fs::remove_all(dir / "sample-ids", ec);
  } else if (mode == RunMode::kResume) {
    // What a crash or a full disk left half-written goes first: it holds
    // the space the rewrites below need.
    for (const auto& name : Checkpoints::remove_partial(path_)) notes.push_back("removed partial checkpoint " + name);
    for (const char* f : {"metrics.jsonl.tmp", "config.toml.tmp"}) fs::remove(dir / f, ec);
    for (auto& note : set_aside_checkpoints_after(resumed_step)) notes.push_back(note);
    drop_lines_after(metrics_file(), resumed_step);
    // The steps after the checkpoint are trained again: a crash must not
    // leave their sample ids logged twice.
    for (const auto& e : fs::directory_iterator(dir / "sample-ids", ec)) {
      if (e.path().extension() == ".jsonl") drop_lines_after(e.path().string(), resumed_step);
    }
  }
  write_file_atomically((dir / "config.toml").string(), config_toml);
  return notes;
}

void RunDir::drop_lines_after(const std::string& file, int64_t step) {
  std::ifstream in(file);
  if (!in) return;
  std::string kept, line;
  while (std::getline(in, line)) {
    try {
      if (nlohmann::json::parse(line).value("step", int64_t{0}) > step) continue;
    } catch (const std::exception&) {
      continue;  // a torn last line from a crash
    }
    kept += line + "\n";
  }
  write_file_atomically(file, kept);
}

std::vector<std::string> RunDir::set_aside_checkpoints_after(int64_t step) const {
  // So that `latest` and pruning follow the resumed line.
  std::vector<std::string> notes;
  fs::path root = fs::path(path_) / "checkpoints";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    std::string n = e.path().filename().string();
    if (Checkpoints::step_of(n) <= step) continue;
    fs::path target = root / ("abandoned-" + n);
    for (int k = 2; fs::exists(target); ++k) target = root / ("abandoned-" + n + "-" + std::to_string(k));
    fs::rename(e.path(), target, ec);
    COHORT_CHECK(!ec, Error, "cannot move aside newer checkpoint ", e.path().string(), ": ", ec.message());
    notes.push_back("moved aside newer checkpoint " + n + " (now " + target.filename().string() + ")");
  }
  return notes;
}

bool RunDir::has_train_line(int64_t step) const {
  std::ifstream in(metrics_file());
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.value("kind", "") == "train" && j.value("step", int64_t{-1}) == step) return true;
  }
  return false;
}

int64_t RunDir::eval_lines_at(const std::string& split, int64_t step) const {
  int64_t n = 0;
  std::ifstream in(metrics_file());
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    n += j.is_object() && j.value("kind", "") == "eval" && j.value("split", "") == split && j.value("step", int64_t{-1}) == step;
  }
  return n;
}

int64_t RunDir::eval_steps_after(const std::string& split, int64_t step) const {
  std::set<int64_t> steps;
  std::ifstream in(metrics_file());
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || j.value("kind", "") != "eval" || j.value("split", "") != split) continue;
    if (int64_t s = j.value("step", int64_t{-1}); s > step) steps.insert(s);
  }
  return static_cast<int64_t>(steps.size());
}

size_t RunDir::complete_sample_ids(int64_t step, int64_t epoch, const std::vector<int64_t>& step_ids, int rank) const {
  std::set<int64_t> missing(step_ids.begin(), step_ids.end());
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(path_) / "sample-ids", ec)) {
    std::ifstream in(e.path());
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!j.is_object() || j.value("step", int64_t{-1}) != step || !j.contains("ids")) continue;
      for (const auto& id : j["ids"]) missing.erase(id.get<int64_t>());
    }
  }
  if (missing.empty()) return 0;
  std::string file = sample_ids_file(rank);
  fs::create_directories(fs::path(file).parent_path(), ec);
  // Ids in the step's own order, as its ranks would have logged them.
  std::vector<int64_t> ids;
  for (int64_t id : step_ids) {
    if (missing.count(id)) ids.push_back(id);
  }
  std::ofstream out(file, std::ios::app);
  out << nlohmann::json({{"step", step}, {"epoch", epoch}, {"ids", ids}, {"recovered", true}}).dump() << '\n'
      << std::flush;
  COHORT_CHECK(out.good(), Error, file, ": cannot write the recovered sample ids of step ", step);
  return ids.size();
}

// RUN_DIR/.lock ------------------------------------------------------------

namespace {

// A holder on another host is dead once its lease went unrenewed this long.
// At least two minutes whatever dist.timeout says: NFS clients cache a
// file's times for up to a minute, so a younger lease could look expired
// while its holder is well.
constexpr double kMinLeaseS = 120;

std::string this_host() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return host;
}

// The pid namespace ("pid:[4026531836]"): containers that share a host
// name (--net=host) each number their own processes.
std::string this_pid_ns() {
  char buf[64] = {0};
  ssize_t n = ::readlink("/proc/self/ns/pid", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

std::string this_boot_id() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

// When `pid` started, in clock ticks after boot (/proc/PID/stat field 22);
// -1 when there is no such process. Tells a live holder from a newer
// process that got its pid.
int64_t start_ticks(int64_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream fields(stat.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i) {
    if (i == 22) return std::stoll(field);
  }
  return -1;
}

std::string local_time_now() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S %Z", &tm);
  return buf;
}

std::string random_hex(int bytes) {
  std::random_device rd;
  std::string out;
  char buf[3];
  for (int i = 0; i < bytes; ++i) {
    std::snprintf(buf, sizeof buf, "%02x", static_cast<unsigned>(rd() & 0xFF));
    out += buf;
  }
  return out;
}

std::string to_json(const RunDirLock::Holder& h) {
  return nlohmann::json({{"job", h.job}, {"host", h.host}, {"pid", h.pid}, {"pid_start", h.pid_start},
                         {"boot_id", h.boot_id}, {"pid_ns", h.pid_ns}, {"started", h.started}, {"nonce", h.nonce}})
             .dump() + "\n";
}

// The lock file's holder; nullopt when there is no file. A file that does
// not parse gives a holder with empty fields (judged by its age alone).
// `key`, when given, is set to a short digest of the file's bytes: what
// names that very version of the file (a takeover's claim on it).
std::optional<RunDirLock::Holder> read_holder(const std::string& path, std::string* key = nullptr) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (key) *key = sha256_hex(text).substr(0, 16);
  RunDirLock::Holder h;
  try {
    auto j = nlohmann::json::parse(text);
    h.job = j.value("job", "");
    h.host = j.value("host", "");
    h.pid = j.value("pid", int64_t{0});
    h.pid_start = j.value("pid_start", int64_t{0});
    h.boot_id = j.value("boot_id", "");
    h.pid_ns = j.value("pid_ns", "");
    h.started = j.value("started", "");
    h.nonce = j.value("nonce", "");
  } catch (const std::exception&) {
    h.job = "(unreadable lock file)";
  }
  return h;
}

double seconds_of(const timespec& t) { return static_cast<double>(t.tv_sec) + t.tv_nsec * 1e-9; }

// Seconds since `lock` was last renewed, by the file system's clock (the
// time stamp of a file created now next to it), so that clocks that differ
// between hosts do not matter. -1 when the lock is gone.
double lease_age(const std::string& lock, const std::string& dir) {
  struct stat st {};
  if (::stat(lock.c_str(), &st) != 0) return -1;
  double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::string probe = (fs::path(dir) / (".lock.now-" + random_hex(8))).string();
  int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd >= 0) {  // else (a full disk) this host's clock will do
    struct stat pst {};
    if (::fstat(fd, &pst) == 0) now = seconds_of(pst.st_mtim);
    ::close(fd);
    ::unlink(probe.c_str());
  }
  return std::max(0.0, now - seconds_of(st.st_mtim));
}

// Why `h` no longer holds its lock ("which is no longer running"), or ""
// while it lives; `live` then says how it was judged.
std::string dead_reason(const RunDirLock::Holder& h, const RunDirLock::Holder& me, const std::string& lock,
                        const std::string& dir, double lease_s, std::string& live) {
  // Its pid is checked only where it means the same process: the same host
  // name, boot and pid namespace. Otherwise (another machine, a machine that
  // shares the name, another container, or this host before a reboot) the
  // lease decides, which has expired after a reboot anyway.
  if (!h.host.empty() && h.host == me.host && h.boot_id == me.boot_id && h.pid_ns == me.pid_ns) {
    bool exists = h.pid > 0 && (::kill(static_cast<pid_t>(h.pid), 0) == 0 || errno == EPERM);
    if (!exists) return "which is no longer running";
    int64_t now = start_ticks(h.pid);
    if (h.pid_start > 0 && now >= 0 && now != h.pid_start) {
      return detail::cat("which is no longer running (pid ", h.pid, " is another process now)");
    }
    live = "running on this host";
    return "";
  }
  double age = lease_age(lock, dir);
  if (age > lease_s) {
    return detail::cat("whose lease expired (not renewed for ", std::lround(age), " s; a live job renews it every few "
                       "seconds, and it expires after ", std::lround(lease_s), " s)");
  }
  live = detail::cat("lease renewed ", std::lround(std::max(age, 0.0)), " s ago");
  return "";
}

// Why `holder` no longer holds the lock at `lock`; UsageError naming it
// when it is alive.
std::string refuse_live(const std::string& dir, const RunDirLock::Holder& holder, const RunDirLock::Holder& me,
                        const std::string& lock, double lease) {
  std::string live;
  std::string dead = dead_reason(holder, me, lock, dir, lease, live);
  COHORT_CHECK(!dead.empty(), UsageError, dir, " is in use by ", holder.describe(), "; ", live,
               ": another job may not touch it, with --overwrite or not. Wait for that job to end or stop it, or "
               "choose another --out");
  return dead;
}

// Creates `path` holding what `tmp` holds, only if `path` does not exist:
// link() is atomic on NFS too (O_EXCL is not on old NFS). False when it
// exists.
bool create_exclusively(const std::string& tmp, const std::string& path, const std::string& text) {
  if (::link(tmp.c_str(), path.c_str()) == 0) return true;
  int err = errno;
  if (err == EEXIST) return false;
  if (err == EPERM || err == EOPNOTSUPP || err == ENOSYS) {  // no hard links here (FAT, some FUSE)
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno == EEXIST) return false;
    COHORT_CHECK(fd >= 0, Error, path, ": cannot create (", std::strerror(errno), ")");
    bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) && ::fsync(fd) == 0;
    err = errno;
    ::close(fd);
    if (!ok) ::unlink(path.c_str());
    COHORT_CHECK(ok, Error, path, ": write failed (", std::strerror(err), ")");
    return true;
  }
  throw Error(detail::cat(path, ": cannot create (", std::strerror(err), ")"));
}

// Writes `text` over `path` from its first byte and fsyncs it (`flags`:
// O_CREAT | O_TRUNC for a new file, 0 to overwrite one in place). 0, or
// the errno of the failure; the file is left as the failure left it.
int write_synced(const std::string& path, const std::string& text, int flags) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | flags, 0666);
  if (fd < 0) return errno;
  int err = 0;
  for (size_t done = 0; done < text.size() && err == 0;) {
    ssize_t n = ::pwrite(fd, text.data() + done, text.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) err = n < 0 ? errno : ENOSPC;
    else done += static_cast<size_t>(n);
  }
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;  // NFS reports some write errors only here
  return err;
}

// This job's own lock, rewritten for its new process (a restart, a later
// elastic world): a new file renamed over it, so that a failed write keeps
// the old one. On a full disk, where there is no room for a second file, the
// old one is overwritten where it stands: its blocks are there already (a
// restart after a full disk must get as far as the clean-up). Padded with
// spaces to the old length, so that none of the old text is left after the
// new (JSON ignores the spaces). Error naming the lock when neither works;
// the lock is never removed.
void rewrite_own_lock(const std::string& lock, const std::string& tmp, std::string text) {
  int err = write_synced(tmp, text, O_CREAT | O_TRUNC);
  if (err == 0 && std::rename(tmp.c_str(), lock.c_str()) == 0) return;
  if (err == 0) err = errno;
  ::unlink(tmp.c_str());
  if (err == ENOSPC || err == EDQUOT) {
    struct stat st {};
    if (::stat(lock.c_str(), &st) == 0 && text.size() < static_cast<size_t>(st.st_size)) {
      text.append(static_cast<size_t>(st.st_size) - text.size(), ' ');
    }
    err = write_synced(lock, text, 0);
    if (err == 0) return;
  }
  throw Error(detail::cat(lock, ": cannot rewrite this job's lock (", std::strerror(err),
                          "); the lock is kept as it was"));
}

}  // namespace

std::string RunDirLock::Holder::describe() const {
  return detail::cat("job ", job, " (host ", host.empty() ? "?" : host, ", pid ", pid, ", started ",
                     started.empty() ? "?" : started, ")");
}

std::string RunDirLock::new_job_id() { return detail::cat(this_host(), "-", getpid(), "-", random_hex(4)); }

std::string RunDirLock::job_id_from(const std::map<std::string, std::string>& env) {
  auto get = [&](const char* key) {
    auto it = env.find(key);
    return it == env.end() ? std::string() : it->second;
  };
  if (!get("COHORT_JOB_ID").empty()) return get("COHORT_JOB_ID");
  // srun: every rank of one job step shares these (two steps of one
  // allocation are two jobs).
  if (!get("SLURM_JOB_ID").empty() && !get("SLURM_STEP_ID").empty()) {
    return "slurm-" + get("SLURM_JOB_ID") + "." + get("SLURM_STEP_ID");
  }
  return "";
}

struct RunDirLock::Renewer {
  std::mutex mutex;
  std::condition_variable wake;
  bool stop = false;
  std::thread thread;
};

void RunDir::refuse_if_held(const std::string& job_id) const {
  const std::string lock = (fs::path(path_) / ".lock").string();
  auto holder = read_holder(lock);
  if (!holder || job_id.empty() || holder->job == job_id) return;
  RunDirLock::Holder me;
  me.host = this_host();
  me.boot_id = this_boot_id();
  me.pid_ns = this_pid_ns();
  refuse_live(path_, *holder, me, lock, kMinLeaseS);
}

std::unique_ptr<RunDirLock> RunDir::lock(const std::string& job_id, double lease_s, RunMode mode,
                                         std::vector<std::string>& notes) const {
  COHORT_CHECK(!path_.empty(), UsageError, "--out RUN_DIR is required");
  std::error_code ec;
  fs::create_directories(path_, ec);
  COHORT_CHECK(!ec, Error, path_, ": cannot create directory (", ec.message(), ")");
  const double lease = std::max(lease_s, kMinLeaseS);
  const std::string lock = (fs::path(path_) / ".lock").string();
  RunDirLock::Holder me;
  me.job = job_id.empty() ? RunDirLock::new_job_id() : job_id;
  me.host = this_host();
  me.boot_id = this_boot_id();
  me.pid_ns = this_pid_ns();
  me.pid = getpid();
  me.pid_start = start_ticks(me.pid);
  me.started = local_time_now();
  me.nonce = random_hex(8);
  const std::string tmp = (fs::path(path_) / (".lock." + me.nonce)).string();
  struct RemoveTmp {
    const std::string& path;
    ~RemoveTmp() { ::unlink(path.c_str()); }
  } remove_tmp{tmp};

  std::unique_ptr<RunDirLock> held;
  for (int attempt = 0; !held; ++attempt) {
    COHORT_CHECK(attempt < 20, Error, lock, ": could not take the lock (other jobs keep changing it)");
    std::string key;  // names this version of the lock file
    auto holder = read_holder(lock, &key);
    if (holder && (holder->job == me.job || (holder->host == me.host && holder->pid == me.pid &&
                                             holder->pid_start == me.pid_start))) {
      // This job's own (a restart, a later elastic world): it goes on, as
      // started then, with this process as its holder.
      if (!holder->started.empty()) me.started = holder->started;
      rewrite_own_lock(lock, tmp, to_json(me));
      held = std::make_unique<RunDirLock>(lock, me, lease);
      break;
    }
    // A live holder is refused before anything is written: on a full disk
    // too, the answer is "in use", not a failed write.
    std::string dead;
    if (holder) dead = refuse_live(path_, *holder, me, lock, lease);
    write_file_durably(tmp, {to_json(me)});
    if (!holder) {
      if (create_exclusively(tmp, lock, to_json(me))) held = std::make_unique<RunDirLock>(lock, me, lease);
      continue;  // else another job was quicker: look at it
    }
    // A dead job's lock. Of the jobs that found it dead, one takes it over:
    // the one that creates the claim named after this version of the lock.
    // A claimant that died while taking over is passed the same way, by a
    // claim named after its claim's version, and so on: a file is only ever
    // created exclusively, never removed while a live job may count on it.
    std::string claim = detail::cat(lock, ".takeover-", key);
    for (int passed = 0; !create_exclusively(tmp, claim, to_json(me)); ++passed) {
      COHORT_CHECK(passed < 20, Error, lock, ": could not take the lock over (", passed,
                   " claimants died while taking it over)");
      std::string claim_key;
      auto claimant = read_holder(claim, &claim_key);
      if (!claimant) continue;  // removed after a takeover that ended: try again
      std::string claimant_live;
      if (dead_reason(*claimant, me, claim, path_, lease, claimant_live).empty()) {
        throw UsageError(detail::cat(path_, " is being taken over by ", claimant->describe(), " right now"));
      }
      claim = detail::cat(claim, "-", claim_key);
    }
    // The claim is this job's; the lock is replaced only if it is still the
    // version claimed (another claimant may have finished a takeover before
    // this one began: then look again).
    std::string now_key;
    auto again = read_holder(lock, &now_key);
    if (again && now_key == key) {
      bool replaced = std::rename(tmp.c_str(), lock.c_str()) == 0;
      int err = errno;
      COHORT_CHECK(replaced, Error, lock, ": cannot replace (", std::strerror(err), ")");
      notes.push_back(detail::cat("took over the lock of ", path_, " from job ", holder->job, " on host ", holder->host,
                                  " pid ", holder->pid, " (started ", holder->started, "), ", dead));
      held = std::make_unique<RunDirLock>(lock, me, lease);
    }
    // Claims on a version of the lock that is gone can no longer win: every
    // one, this job's too, may go now.
    if (held) {
      for (const auto& e : fs::directory_iterator(path_, ec)) {
        if (e.path().filename().string().rfind(".lock.takeover", 0) == 0) fs::remove(e.path(), ec);
      }
    } else {
      ::unlink(claim.c_str());
    }
  }
  if (mode == RunMode::kFresh) {
    try {
      refuse_fresh_over_a_run(mode);
    } catch (...) {
      held->release();  // refused: no lock is left behind
      throw;
    }
  }
  return held;
}

RunDirLock::RunDirLock(std::string path, Holder me, double lease_s)
    : path_(std::move(path)), me_(std::move(me)), lease_s_(lease_s), renewer_(std::make_unique<Renewer>()) {
  renewer_->thread = std::thread([this] { renew_loop(); });
}

RunDirLock::~RunDirLock() {
  {
    std::lock_guard<std::mutex> g(renewer_->mutex);
    renewer_->stop = true;
  }
  renewer_->wake.notify_all();
  if (renewer_->thread.joinable()) renewer_->thread.join();
}

void RunDirLock::release() {
  {
    std::lock_guard<std::mutex> g(renewer_->mutex);
    renewer_->stop = true;
  }
  renewer_->wake.notify_all();
  if (renewer_->thread.joinable()) renewer_->thread.join();
  auto holder = read_holder(path_);
  if (holder && holder->nonce == me_.nonce) ::unlink(path_.c_str());
}

// The lease: the lock's time stamp is moved to now (the file server's now,
// on NFS) well within lease_s, so another host sees a live holder.
void RunDirLock::renew_loop() {
  const auto every = std::chrono::duration<double>(std::min(10.0, lease_s_ / 12));
  std::unique_lock<std::mutex> g(renewer_->mutex);
  while (!renewer_->wake.wait_for(g, every, [&] { return renewer_->stop; })) {
    auto holder = read_holder(path_);
    // Unreadable for a moment (an NFS hiccup, a rewrite in progress): the
    // next beat tries again rather than letting the lease lapse.
    if (!holder || holder->nonce.empty()) continue;
    if (holder->nonce != me_.nonce) {
      // The job's next holder (a restart, an elastic world's new rank 0) is
      // no news; another job is.
      if (holder->job != me_.job) {
        std::fprintf(stderr, "cohort: warning: %s was taken over by %s; this job no longer holds its run directory\n",
                     path_.c_str(), holder->describe().c_str());
      }
      return;
    }
    ::utimensat(AT_FDCWD, path_.c_str(), nullptr, 0);
  }
}

}  // namespace cohort
