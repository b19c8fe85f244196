#include "cohort/obs/mlflow.hpp"

#include <curl/curl.h>
#include <nlohmann/json.hpp>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <set>

#include "cohort/config/config.hpp"
#include "cohort/core/files.hpp"
#include "cohort/obs/plot.hpp"
#include "cohort/obs/tensorboard.hpp"

namespace fs = std::filesystem;

namespace cohort {

using detail::cat;
using detail::first_line;

namespace {

constexpr size_t kMaxMetricsPerBatch = 1000;  // MLflow's log-batch limits
constexpr size_t kMaxParamsPerBatch = 100;
constexpr size_t kMaxParamValue = 6000;       // MLflow >= 2.7; longer values are cut

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// libcurl's progress callback, at least once a second: a request still in
// flight when the watched deadline passes is cut (CURLE_ABORTED_BY_CALLBACK).
int past_deadline(void* watched, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  const auto* ns = static_cast<const std::atomic<int64_t>*>(watched);
  return ns && steady_ns() > ns->load() ? 1 : 0;
}

size_t append_body(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

// JSON text that a stray non-UTF-8 byte (a path, a host name) cannot break.
std::string dumps(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

// A JSON number, or MLflow's spelling of the values JSON has none for.
nlohmann::json metric_value_json(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  return v;
}

// MLflow's answer to a failed call: {"error_code": ..., "message": ...}.
std::string server_message(const std::string& body) {
  auto j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("message") && j["message"].is_string()) {
    return first_line(j["message"].get<std::string>()).substr(0, 300);
  }
  return first_line(body).substr(0, 200);
}

std::string error_code(const std::string& body) {
  auto j = nlohmann::json::parse(body, nullptr, false);
  return j.is_object() && j.contains("error_code") && j["error_code"].is_string() ? j["error_code"].get<std::string>()
                                                                                   : "";
}

std::string url_escape(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

// "a/b c" -> "a/b%20c": each segment escaped, the slashes kept.
std::string path_escape(const std::string& path) {
  std::string out, seg;
  for (char c : path + "/") {
    if (c == '/') {
      if (!out.empty()) out += '/';
      out += url_escape(seg);
      seg.clear();
    } else {
      seg += c;
    }
  }
  return out;
}

MlflowRunInfo run_info(const nlohmann::json& run) {
  MlflowRunInfo info;
  const auto& i = run.at("info");
  info.run_id = i.at("run_id").get<std::string>();
  info.experiment_id = i.value("experiment_id", "");
  info.status = i.value("status", "");
  info.artifact_uri = i.value("artifact_uri", "");
  if (run.contains("data") && run["data"].contains("params")) {
    for (const auto& p : run["data"]["params"]) info.params[p.at("key").get<std::string>()] = p.value("value", "");
  }
  return info;
}

// A config value as a param: TOML strings without their quotes.
std::string param_value(std::string v) {
  if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = v.substr(1, v.size() - 2);
  if (v.size() > kMaxParamValue) {
    size_t cut = kMaxParamValue - 3;
    while (cut > 0 && (static_cast<unsigned char>(v[cut]) & 0xC0) == 0x80) --cut;  // not inside a character
    v = v.substr(0, cut) + "...";
  }
  return v;
}

std::string hostname() {
  char buf[256] = {0};
  return gethostname(buf, sizeof buf - 1) == 0 ? buf : "";
}

std::string same_server(std::string uri) {
  while (!uri.empty() && uri.back() == '/') uri.pop_back();
  return uri;
}

struct RunRecord {
  std::string uri, experiment_id, run_id;
};

std::optional<RunRecord> read_record(const std::string& run_dir) {
  const fs::path file = fs::path(run_dir) / "mlflow.json";
  if (!fs::exists(file)) return std::nullopt;
  auto j = nlohmann::json::parse(read_file(file.string()), nullptr, false);
  if (!j.is_object() || !j.contains("run_id")) return std::nullopt;
  return RunRecord{j.value("tracking_uri", ""), j.value("experiment_id", ""), j.value("run_id", "")};
}

// The run in MLflow's web UI.
std::string run_page(const std::string& uri, const MlflowRunInfo& run) {
  return same_server(uri) + "/#/experiments/" + run.experiment_id + "/runs/" + run.run_id;
}

void write_record(const std::string& run_dir, const std::string& uri, const MlflowRunInfo& run,
                  const std::string& experiment, const std::string& run_name) {
  nlohmann::json j = {{"tracking_uri", same_server(uri)}, {"experiment", experiment},
                      {"experiment_id", run.experiment_id}, {"run_id", run.run_id}, {"run_name", run_name},
                      {"run_page", run_page(uri, run)}};
  write_file_atomically((fs::path(run_dir) / "mlflow.json").string(), j.dump(2) + "\n");
}

}  // namespace

std::string mlflow_metric_key(const std::string& name) {
  std::string out;
  for (char c : name) {
    bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.' || c == '/' || c == ' ';
    out += ok ? c : '_';
  }
  return out;
}

// ---- MlflowClient -------------------------------------------------------------

MlflowClient::MlflowClient(std::string uri, double timeout_s) : uri_(same_server(std::move(uri))), timeout_s_(timeout_s) {
  static const CURLcode global = curl_global_init(CURL_GLOBAL_DEFAULT);
  COHORT_CHECK(global == CURLE_OK, Error, "mlflow: libcurl failed to start: ", curl_easy_strerror(global));
  curl_ = curl_easy_init();
  COHORT_CHECK(curl_ != nullptr, Error, "mlflow: libcurl failed to start");
}

MlflowClient::~MlflowClient() { curl_easy_cleanup(static_cast<CURL*>(curl_)); }

std::string MlflowClient::call(const char* method, const std::string& api_path, const std::string& body,
                               const std::string& content_type, long* status_out) {
  CURL* c = static_cast<CURL*>(curl_);
  curl_easy_reset(c);
  const std::string url = uri_ + api_path;
  std::string response;
  char curl_error[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  double timeout = timeout_s_;
  if (deadline_ != std::chrono::steady_clock::time_point::max()) {
    timeout = std::min(timeout, std::chrono::duration<double>(deadline_ - std::chrono::steady_clock::now()).count());
  }
  if (watched_ && watched_->load() != std::numeric_limits<int64_t>::max()) {
    timeout = std::min(timeout, static_cast<double>(watched_->load() - steady_ns()) / 1e9);
  }
  if (timeout <= 0) throw MlflowError(cat(method, " ", url, ": no time left to send it"), 0);
  curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, past_deadline);
  curl_easy_setopt(c, CURLOPT_XFERINFODATA, watched_);
  curl_easy_setopt(c, CURLOPT_NOPROGRESS, watched_ ? 0L : 1L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(std::max(std::min(timeout, 5.0), 0.001) * 1000));
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(std::max(timeout, 0.001) * 1000));
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, append_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &response);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, curl_error);
  curl_easy_setopt(c, CURLOPT_USERAGENT, "cohort");
  if (std::string(method) != "GET") {
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  }
  curl_slist* headers = nullptr;
  headers = curl_slist_append(headers, ("Content-Type: " + content_type).c_str());
  if (const char* token = env("MLFLOW_TRACKING_TOKEN")) {
    headers = curl_slist_append(headers, (std::string("Authorization: Bearer ") + token).c_str());
  } else if (const char* user = env("MLFLOW_TRACKING_USERNAME")) {
    const char* password = env("MLFLOW_TRACKING_PASSWORD");
    curl_easy_setopt(c, CURLOPT_HTTPAUTH, CURLAUTH_BASIC);
    curl_easy_setopt(c, CURLOPT_USERNAME, user);
    curl_easy_setopt(c, CURLOPT_PASSWORD, password ? password : "");
  }
  if (const char* insecure = env("MLFLOW_TRACKING_INSECURE_TLS"); insecure && std::string(insecure) == "true") {
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 0L);
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 0L);
  }
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  CURLcode rc = curl_easy_perform(c);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, nullptr);  // curl_error dies with this call
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, nullptr);
  curl_slist_free_all(headers);
  long status = 0;
  if (rc == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  if (status_out) *status_out = status;
  if (rc != CURLE_OK) {
    // Connected and every byte sent, but no answer: the server may have
    // carried it out (a hung server works through its socket's backlog
    // when it wakes).
    curl_off_t connect_us = 0, sent = 0;
    curl_easy_getinfo(c, CURLINFO_CONNECT_TIME_T, &connect_us);
    curl_easy_getinfo(c, CURLINFO_SIZE_UPLOAD_T, &sent);
    const bool no_answer = rc == CURLE_OPERATION_TIMEDOUT || rc == CURLE_ABORTED_BY_CALLBACK ||
                           rc == CURLE_RECV_ERROR || rc == CURLE_GOT_NOTHING;
    const bool unanswered = no_answer && connect_us > 0 && sent >= static_cast<curl_off_t>(body.size());
    throw MlflowError(cat(method, " ", url, ": ",
                          rc == CURLE_ABORTED_BY_CALLBACK ? "cut at the end of the time to send it"
                          : curl_error[0]                 ? curl_error
                                                          : curl_easy_strerror(rc)),
                      0, unanswered);
  }
  if (status < 200 || status >= 300) {
    throw MlflowError(cat(method, " ", url, ": HTTP ", status, " ", error_code(response), " ",
                          server_message(response)),
                      status);
  }
  return response;
}

std::string MlflowClient::experiment_id(const std::string& name) {
  long status = 0;
  try {
    auto j = nlohmann::json::parse(
        call("GET", "/api/2.0/mlflow/experiments/get-by-name?experiment_name=" + url_escape(name), "",
             "application/json", &status));
    if (j.at("experiment").value("lifecycle_stage", "active") == "deleted") {
      throw MlflowError(cat("experiment '", name, "' was deleted on ", uri_,
                            ": restore it, or name another with log.mlflow-experiment"), 400);
    }
    return j.at("experiment").at("experiment_id").get<std::string>();
  } catch (const MlflowError& e) {
    if (status != 404) throw;
  }
  try {
    auto j = nlohmann::json::parse(call("POST", "/api/2.0/mlflow/experiments/create",
                                        dumps(nlohmann::json({{"name", name}})), "application/json", &status));
    return j.at("experiment_id").get<std::string>();
  } catch (const MlflowError& e) {
    if (status != 400) throw;  // another process created it first (RESOURCE_ALREADY_EXISTS): look again
  }
  auto j = nlohmann::json::parse(
      call("GET", "/api/2.0/mlflow/experiments/get-by-name?experiment_name=" + url_escape(name), ""));
  return j.at("experiment").at("experiment_id").get<std::string>();
}

MlflowRunInfo MlflowClient::create_run(const std::string& experiment_id, const std::string& run_name,
                                       int64_t start_ms, const std::map<std::string, std::string>& tags) {
  nlohmann::json t = nlohmann::json::array();
  for (const auto& [k, v] : tags) t.push_back({{"key", k}, {"value", v}});
  nlohmann::json body = {{"experiment_id", experiment_id}, {"run_name", run_name}, {"start_time", start_ms}, {"tags", t}};
  auto j = nlohmann::json::parse(call("POST", "/api/2.0/mlflow/runs/create", dumps(body)));
  return run_info(j.at("run"));
}

std::optional<MlflowRunInfo> MlflowClient::get_run(const std::string& run_id) {
  long status = 0;
  try {
    auto j = nlohmann::json::parse(call("GET", "/api/2.0/mlflow/runs/get?run_id=" + url_escape(run_id), "",
                                        "application/json", &status));
    MlflowRunInfo info = run_info(j.at("run"));
    if (j["run"]["info"].value("lifecycle_stage", "active") == "deleted") return std::nullopt;
    return info;
  } catch (const MlflowError& e) {
    if (status == 404 || (status == 400 && std::string(e.what()).find("RESOURCE_DOES_NOT_EXIST") != std::string::npos)) {
      return std::nullopt;
    }
    throw;
  }
}

void MlflowClient::log_batch(const std::string& run_id, const std::vector<MlflowMetric>& metrics,
                             const std::vector<std::pair<std::string, std::string>>& params,
                             const std::map<std::string, std::string>& tags) {
  nlohmann::json m = nlohmann::json::array(), p = nlohmann::json::array(), t = nlohmann::json::array();
  for (const auto& x : metrics) {
    m.push_back({{"key", x.key}, {"value", metric_value_json(x.value)}, {"timestamp", x.timestamp_ms}, {"step", x.step}});
  }
  for (const auto& [k, v] : params) p.push_back({{"key", k}, {"value", v}});
  for (const auto& [k, v] : tags) t.push_back({{"key", k}, {"value", v}});
  nlohmann::json body = {{"run_id", run_id}, {"metrics", m}, {"params", p}, {"tags", t}};
  call("POST", "/api/2.0/mlflow/runs/log-batch", dumps(body));
}

void MlflowClient::set_status(const std::string& run_id, const std::string& status, int64_t end_ms) {
  nlohmann::json body = {{"run_id", run_id}, {"status", status}};
  if (end_ms > 0) body["end_time"] = end_ms;
  call("POST", "/api/2.0/mlflow/runs/update", dumps(body));
}

void MlflowClient::upload_artifact(const MlflowRunInfo& run, const std::string& file, const std::string& path) {
  std::string root = run.artifact_uri;
  const std::string proxied = "mlflow-artifacts:";
  if (root.rfind(proxied, 0) == 0) {
    root = root.substr(proxied.size());
    if (root.rfind("//", 0) == 0) {  // mlflow-artifacts://host:port/1/<run>/artifacts
      size_t slash = root.find('/', 2);
      root = slash == std::string::npos ? "" : root.substr(slash);
    }
    while (!root.empty() && root.front() == '/') root.erase(0, 1);
    call("PUT", "/api/2.0/mlflow-artifacts/artifacts/" + path_escape(root + "/" + path), read_file(file),
         "application/octet-stream");
    return;
  }
  std::string local = root.rfind("file://", 0) == 0 ? root.substr(7) : root;
  if (!local.empty() && local.front() == '/' && fs::is_directory(fs::path(local).parent_path())) {
    fs::path to = fs::path(local) / path;
    fs::create_directories(to.parent_path());
    fs::copy_file(file, to, fs::copy_options::overwrite_existing);
    return;
  }
  throw MlflowError(cat("cannot store artifacts in ", run.artifact_uri,
                        ": Cohort sends them through the tracking server (mlflow server serves artifacts by default)"),
                    400);
}

// ---- MlflowReporter ------------------------------------------------------------

namespace {

// What was not sent, kept as counts (a server down for a week must not
// hold a week of values twice).
struct Unsent {
  size_t metrics = 0;
  int64_t first_step = 0, last_step = 0;
  std::set<std::string> keys;
  std::vector<std::string> artifacts;
  void add(const MlflowMetric& m) {
    if (metrics++ == 0 || m.step < first_step) first_step = m.step;
    last_step = std::max(last_step, m.step);
    keys.insert(m.key);
  }
};

constexpr size_t kMaxQueued = 1'000'000;  // metric values held for a server that does not answer (~70 MB)

// What the worker does next, decided under the lock: the run, then metrics,
// the status, the artifacts.
struct Job {
  enum { kConnect, kMetrics, kStatus, kArtifact } kind = kConnect;
  std::vector<MlflowMetric> batch;
  std::pair<std::string, std::string> artifact;
  std::string status;
};

// How a job's request went: `error` is empty when it was sent.
struct Outcome {
  std::string error;
  bool permanent = false;
  bool unanswered = false;  // sent whole, no answer: it may have been carried out
};

// The tags of a run this reporter starts.
std::map<std::string, std::string> run_tags(const MlflowTarget& t) {
  std::map<std::string, std::string> tags = {
      {"mlflow.runName", t.run_name},
      {"mlflow.source.name", t.source},
      {"mlflow.source.type", "LOCAL"},
      {"cohort.run_dir", fs::absolute(t.run_dir).lexically_normal().string()},
      {"cohort.host", hostname()}};
  if (const char* user = env("USER")) {
    tags["mlflow.user"] = user;
  } else if (const passwd* pw = getpwuid(getuid())) {
    tags["mlflow.user"] = pw->pw_name;
  }
  return tags;
}

// Into `run`: RUN_DIR/mlflow.json's run when it is continued on this server,
// else a new run, recorded there. Returns whether its status is this
// reporter's to set.
bool open_run(MlflowClient& client, const MlflowTarget& t, MlflowRunInfo& run) {
  const auto record = t.continue_run ? read_record(t.run_dir) : std::nullopt;
  if (record && same_server(record->uri) == same_server(t.uri)) {
    if (auto found = client.get_run(record->run_id)) run = *found;
  }
  bool own = !t.keep_status;
  if (run.run_id.empty()) {
    own = true;
    std::map<std::string, std::string> tags = run_tags(t);
    run = client.create_run(client.experiment_id(t.experiment), t.run_name, now_ms(), tags);
    write_record(t.run_dir, t.uri, run, t.experiment, t.run_name);
  } else if (own && run.status != "RUNNING") {
    client.set_status(run.run_id, "RUNNING", 0);
  }
  return own;
}

// Params are set once: a value changed on resume (train.max-steps,
// say) keeps the first one, as MLflow requires.
void log_params(MlflowClient& client, const MlflowTarget& t, const MlflowRunInfo& run) {
  std::vector<std::pair<std::string, std::string>> params;
  for (const auto& [key, value] : read_config_values(t.config_toml)) {
    if (!run.params.count(key)) params.emplace_back(key, param_value(value));
  }
  for (size_t i = 0; i < params.size(); i += kMaxParamsPerBatch) {
    const size_t end = std::min(params.size(), i + kMaxParamsPerBatch);
    client.log_batch(run.run_id, {},
                     std::vector<std::pair<std::string, std::string>>(params.begin() + static_cast<long>(i),
                                                                      params.begin() + static_cast<long>(end)));
  }
}

}  // namespace

// What the caller and the worker share, under `mu`.
struct MlflowReporter::Shared {
  MlflowTarget target;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<MlflowMetric> metrics;
  std::deque<std::pair<std::string, std::string>> artifacts;  // file, artifact path
  std::string final_status;   // queued by finish() (or a failure): "FINISHED", "KILLED", "FAILED"
  bool finished = false;      // finish() was called
  bool stopping = false;      // the destructor: send what can be sent, then end
  bool ended = false;         // the worker is gone
  size_t in_flight = 0;       // requests being sent now (for flush())
  bool own_status = true;     // the status is this reporter's to set
  Unsent lost;                // refused for good, or given up on at the end, never delivered
  Unsent unanswered;          // given up on after a send that got no answer: may have arrived
  size_t unanswered_front = 0;  // metrics at the queue's front sent at least once without an answer
  bool status_unanswered = false;
  std::string status_lost;
  bool status_maybe = false;  // status_lost was sent once without an answer
  // The end of sending (steady_clock ns; INT64_MAX: none yet), set by the
  // destructor and watched by the client, a request in flight included.
  std::atomic<int64_t> deadline_ns{std::numeric_limits<int64_t>::max()};
  std::string last_error;
  bool warned = false;
  bool connected = false;     // the run is known (created or continued)

  // The worker's steps (work()).
  std::optional<Job> next_job();  // nullopt: the worker ends
  Outcome send(const Job& job, MlflowClient& client, MlflowRunInfo& run);
  void connect(MlflowClient& client, MlflowRunInfo& run);
  void fail(const std::string& what);
  bool settle(const Job& job, const Outcome& outcome, double& backoff);  // false: the worker ends
};

MlflowReporter::MlflowReporter(MlflowTarget target) : s_(std::make_shared<Shared>()) {
  s_->target = std::move(target);
  if (s_->target.run_name.empty()) s_->target.run_name = fs::absolute(s_->target.run_dir).filename().string();
  s_->own_status = !s_->target.keep_status;
  std::shared_ptr<Shared> s = s_;
  worker_ = std::thread([s] {
    try {
      work(*s);
    } catch (const std::exception& e) {  // libcurl that cannot start: nothing can be sent
      std::lock_guard<std::mutex> lock(s->mu);
      s->last_error = e.what();
    }
    std::lock_guard<std::mutex> lock(s->mu);
    s->in_flight = 0;
    s->ended = true;
    s->cv.notify_all();
  });
}

void MlflowReporter::work(Shared& s) {
  MlflowClient client(s.target.uri, s.target.request_timeout_s);
  client.watch_deadline(&s.deadline_ns);
  MlflowRunInfo run;
  double backoff = 1.0;
  for (;;) {
    const std::optional<Job> job = s.next_job();
    if (!job) return;
    const Outcome outcome = s.send(*job, client, run);
    if (!outcome.error.empty()) s.fail(outcome.error);
    if (!s.settle(*job, outcome, backoff)) return;
  }
}

// Waits for work; the job chosen is in flight when this returns.
std::optional<Job> MlflowReporter::Shared::next_job() {
  for (;;) {
    std::unique_lock<std::mutex> lock(mu);
    const bool work = !metrics.empty() || !artifacts.empty() || !final_status.empty();
    if (!work && (stopping || connected)) {
      if (stopping) return std::nullopt;
      in_flight = 0;
      cv.notify_all();
      cv.wait(lock, [&] { return stopping || !metrics.empty() || !artifacts.empty() || !final_status.empty(); });
      continue;
    }
    Job job;
    if (!connected) {
      job.kind = Job::kConnect;
    } else if (stopping && !final_status.empty()) {
      // At the end the run's status goes first: a server slow to take the
      // last values still learns how the run ended.
      job.kind = Job::kStatus;
      job.status = final_status;
    } else if (!metrics.empty()) {
      job.kind = Job::kMetrics;
      const size_t n = std::min(metrics.size(), kMaxMetricsPerBatch);
      job.batch.assign(metrics.begin(), metrics.begin() + static_cast<long>(n));
    } else if (!final_status.empty()) {
      job.kind = Job::kStatus;
      job.status = final_status;
    } else {
      job.kind = Job::kArtifact;
      job.artifact = artifacts.front();
    }
    in_flight = 1;
    return job;
  }
}

Outcome MlflowReporter::Shared::send(const Job& job, MlflowClient& client, MlflowRunInfo& run) {
  Outcome outcome;
  try {
    switch (job.kind) {
      case Job::kConnect:
        connect(client, run);
        break;
      case Job::kMetrics:
        client.log_batch(run.run_id, job.batch);
        break;
      case Job::kStatus:
        client.set_status(run.run_id, job.status, now_ms());
        break;
      case Job::kArtifact:
        client.upload_artifact(run, job.artifact.first, job.artifact.second);
        break;
    }
  } catch (const MlflowError& e) {
    outcome.error = e.what();
    outcome.unanswered = e.unanswered();
    outcome.permanent =
        e.permanent() && job.kind != Job::kConnect;  // a refused run set-up may be fixed on the server: retry
  } catch (const std::exception& e) {  // a file that vanished, an answer that is not JSON
    outcome.error = e.what();
    outcome.permanent = job.kind == Job::kArtifact;
  }
  return outcome;
}

void MlflowReporter::Shared::connect(MlflowClient& client, MlflowRunInfo& run) {
  const bool own = open_run(client, target, run);
  {
    std::lock_guard<std::mutex> lock(mu);
    own_status = own;
  }
  log_params(client, target, run);
  std::fprintf(stderr, "cohort: mlflow: %s\n", run_page(target.uri, run).c_str());
}

void MlflowReporter::Shared::fail(const std::string& what) {
  std::lock_guard<std::mutex> lock(mu);
  last_error = what;
  if (!warned) {
    warned = true;
    std::fprintf(stderr,
                 "cohort: warning: mlflow: %s; training goes on, and the values wait in memory to be sent "
                 "(RUN_DIR/metrics.jsonl has them all)\n",
                 what.c_str());
  }
}

bool MlflowReporter::Shared::settle(const Job& job, const Outcome& outcome, double& backoff) {
  const std::string& error = outcome.error;
  std::unique_lock<std::mutex> lock(mu);
  if (error.empty() && warned && backoff > 1.0) {
    std::fprintf(stderr, "cohort: mlflow: %s answers again; the values kept are being sent\n", target.uri.c_str());
  }
  if (error.empty()) backoff = 1.0;
  // Done, refused for good, or (at the end) given up on: off the queue.
  const bool give_up = !error.empty() && (outcome.permanent || stopping);
  if (job.kind == Job::kConnect) {
    if (error.empty()) connected = true;
    if (!error.empty() && stopping) return false;  // no run: everything queued stays unsent
  }
  if (outcome.unanswered && job.kind == Job::kMetrics) unanswered_front = std::max(unanswered_front, job.batch.size());
  if (outcome.unanswered && job.kind == Job::kStatus) status_unanswered = true;
  if (job.kind != Job::kConnect && (error.empty() || give_up)) {
    if (job.kind == Job::kMetrics) {
      const size_t maybe = std::min(unanswered_front, job.batch.size());
      if (give_up) {
        for (size_t i = 0; i < job.batch.size(); ++i) (i < maybe ? unanswered : lost).add(job.batch[i]);
      }
      unanswered_front -= maybe;
      metrics.erase(metrics.begin(), metrics.begin() + static_cast<long>(job.batch.size()));
    } else if (job.kind == Job::kStatus) {
      if (give_up) {
        status_lost = job.status;
        status_maybe = status_unanswered;
      }
      status_unanswered = false;
      final_status.clear();
    } else {
      if (give_up) lost.artifacts.push_back(job.artifact.second);
      artifacts.pop_front();
    }
  }
  if (!error.empty() && !give_up) {  // the server may come back: wait, then try again
    in_flight = 0;
    cv.notify_all();
    cv.wait_for(lock, std::chrono::duration<double>(backoff), [&] { return stopping; });
    backoff = std::min(backoff * 2, 30.0);
  }
  return true;
}

void MlflowReporter::train(const TrainReport& r) { queue(tensorboard_scalars("train", report_json(r)), r.step); }

void MlflowReporter::eval(const EvalReport& r) { queue(tensorboard_scalars(r.split, report_json(r)), r.step); }

void MlflowReporter::queue(const std::vector<std::pair<std::string, double>>& values, int64_t step) {
  std::lock_guard<std::mutex> lock(s_->mu);
  const int64_t at = now_ms();
  for (const auto& [key, value] : values) {
    MlflowMetric m{mlflow_metric_key(key), value, at, step};
    if (s_->metrics.size() >= kMaxQueued) {
      s_->lost.add(m);  // the server has not answered for a long while: count, do not hold
    } else {
      s_->metrics.push_back(std::move(m));
    }
  }
  s_->cv.notify_all();
}

void MlflowReporter::artifact(const std::string& file, const std::string& artifact_path) {
  std::lock_guard<std::mutex> lock(s_->mu);
  s_->artifacts.emplace_back(file, artifact_path);
  s_->cv.notify_all();
}

void MlflowReporter::finish(bool ok) {
  const fs::path dir(s_->target.run_dir);
  for (const char* name : {"config.toml", "metrics.jsonl", "labels.json"}) {
    if (fs::exists(dir / name)) artifact((dir / name).string(), name);
  }
  if (fs::exists(dir / "metrics.jsonl") && gnuplot_available()) {
    try {
      artifact(plot_run(dir.string()), "plots.png");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "cohort: warning: mlflow: no plots.png for the run: %s\n", first_line(e.what()).c_str());
    }
  }
  std::lock_guard<std::mutex> lock(s_->mu);
  s_->finished = true;
  s_->final_status = ok ? "FINISHED" : "KILLED";
  s_->cv.notify_all();
}

std::string MlflowReporter::flush() {
  std::unique_lock<std::mutex> lock(s_->mu);
  s_->cv.wait(lock, [&] {
    return s_->ended || (s_->in_flight == 0 && s_->connected && s_->metrics.empty() && s_->artifacts.empty() &&
                         s_->final_status.empty()) ||
           (s_->in_flight == 0 && s_->warned);
  });
  const size_t metrics = s_->metrics.size() + s_->lost.metrics;
  const size_t artifacts = s_->artifacts.size() + s_->lost.artifacts.size();
  if (metrics == 0 && artifacts == 0) return "";
  return cat(metrics, " metric value(s) and ", artifacts, " artifact(s) not sent yet: ", s_->last_error);
}

MlflowReporter::~MlflowReporter() {
  {
    std::lock_guard<std::mutex> lock(s_->mu);
    // Destroyed while an error unwinds the run: it failed.
    if (!s_->finished && std::uncaught_exceptions() > 0) s_->final_status = "FAILED";
    // The time to send what is left runs from now, a request in flight
    // included. A reporter that was not finished (an elastic world ending,
    // a failure) holds the process up for a few seconds at most.
    const double flush = s_->finished ? s_->target.final_flush_s : std::min(s_->target.final_flush_s, 5.0);
    s_->deadline_ns = steady_ns() + static_cast<int64_t>(flush * 1e9);
    s_->stopping = true;
    s_->cv.notify_all();
  }
  if (worker_.joinable()) worker_.join();
  Shared& s = *s_;
  Unsent lost = s.lost, maybe = s.unanswered;
  for (size_t i = 0; i < s.metrics.size(); ++i) (i < s.unanswered_front ? maybe : lost).add(s.metrics[i]);
  for (const auto& a : s.artifacts) lost.artifacts.push_back(a.second);
  std::string status = !s.final_status.empty() ? s.final_status : s.status_lost;
  const bool status_maybe = !s.final_status.empty() ? s.status_unanswered : s.status_maybe;
  if (!s.own_status) status.clear();  // an attached run's status is not this reporter's to send
  auto describe = [](const Unsent& u, const std::string& status) {
    std::string what;
    if (u.metrics > 0) {
      std::string keys;
      int shown = 0;
      for (const auto& k : u.keys) {
        if (shown++ == 4) {
          keys += cat(", and ", u.keys.size() - 4, " more");
          break;
        }
        keys += (keys.empty() ? "" : ", ") + k;
      }
      what += cat(u.metrics, " metric value(s) (", keys, "; steps ", u.first_step, "-", u.last_step, "), ");
    }
    if (!u.artifacts.empty()) what += cat(u.artifacts.size(), " artifact(s) (", detail::join(u.artifacts, ", "), "), ");
    if (!status.empty()) what += "the run's final status " + status + ", ";
    if (!what.empty()) what.resize(what.size() - 2);
    return what;
  };
  std::string not_sent = describe(lost, status_maybe ? "" : status);
  if (!s.connected) not_sent = "the run and its params (it was never created)" + (not_sent.empty() ? "" : ", " + not_sent);
  const std::string unanswered = describe(maybe, status_maybe ? status : "");
  if (not_sent.empty() && unanswered.empty()) return;
  std::string said;
  if (!not_sent.empty()) said += cat("not sent to ", s.target.uri, ": ", not_sent, ". ");
  if (!unanswered.empty()) {
    said += cat("Sent to ", s.target.uri, " but not answered (the server may have stored them): ", unanswered, ". ");
  }
  std::fprintf(stderr, "cohort: warning: mlflow: %sRUN_DIR/metrics.jsonl and RUN_DIR have them all. Last error: %s\n",
               said.c_str(), s.last_error.c_str());
}

std::string mlflow_upload_to_run(const std::string& uri, const std::string& run_dir,
                                 const std::vector<std::pair<std::string, std::string>>& files) {
  if (uri.empty()) return "";
  auto record = read_record(run_dir);
  if (!record) return "mlflow: " + run_dir + " has no MLflow run (no mlflow.json): nothing sent";
  try {
    MlflowClient client(record->uri.empty() ? uri : record->uri, 30);
    auto run = client.get_run(record->run_id);
    if (!run) return "mlflow: run " + record->run_id + " is gone from " + client.uri() + ": nothing sent";
    for (const auto& [file, path] : files) client.upload_artifact(*run, file, path);
    return cat("mlflow: sent ", files.size(), " file(s) to run ", record->run_id, " at ", client.uri());
  } catch (const std::exception& e) {
    return cat("mlflow: not sent (", first_line(e.what()), "); the files are on disk");
  }
}

}  // namespace cohort
