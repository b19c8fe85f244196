// defines: MlflowError, MlflowMetric, MlflowRunInfo, MlflowClient, mlflow_metric_key,
//          MlflowTarget, MlflowReporter, mlflow_upload_to_run
//
// MLflow tracking (log.mlflow), through the tracking server's REST API:
// no Python, no MLflow library. The HTTP client is libcurl (Debian's
// libcurl4-openssl-dev): HTTPS with the system's CA store, the proxies
// clusters set in http_proxy/https_proxy/no_proxy, connect and transfer
// timeouts, keep-alive, all in a library every Linux machine has.
// cpp-httplib would need its own TLS set-up and knows no proxy variables.
//
// Like MLflow's own client it reads MLFLOW_TRACKING_TOKEN (a bearer token),
// MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (basic auth) and
// MLFLOW_TRACKING_INSECURE_TLS=true.
//
// RUN_DIR/mlflow.json names the run (server, experiment, run id), so that a
// resume, `cohort eval` and `cohort export` add to the same MLflow run.
#pragma once

#include <chrono>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/obs/reporter.hpp"

namespace cohort {

// A request that failed. status(): the HTTP status, 0 when no answer came
// (refused, timed out). A permanent error (a 4xx other than 408 and 429)
// is not retried: the server will refuse the same request again.
// unanswered(): the whole request reached the server, which did not answer
// (a hung server, a cut connection): it may have been carried out.
class MlflowError : public Error {
 public:
  MlflowError(const std::string& msg, long status, bool unanswered = false)
      : Error(msg), status_(status), unanswered_(unanswered) {}
  long status() const { return status_; }
  bool permanent() const { return status_ >= 400 && status_ < 500 && status_ != 408 && status_ != 429; }
  bool unanswered() const { return unanswered_; }

 private:
  long status_;
  bool unanswered_;
};

struct MlflowMetric {
  std::string key;
  double value = 0;
  int64_t timestamp_ms = 0;
  int64_t step = 0;
};

struct MlflowRunInfo {
  std::string run_id, experiment_id, status, artifact_uri;
  std::map<std::string, std::string> params;
};

// A metric name as MLflow accepts it: letters, digits and _ - . / space;
// anything else becomes '_' ("f1/adjective:all" -> "f1/adjective_all").
std::string mlflow_metric_key(const std::string& name);

// MLflow's REST API (/api/2.0/mlflow/...), one blocking request at a time.
// Not thread-safe: one client per thread. Throws MlflowError.
class MlflowClient {
 public:
  // `uri`: "http://host:port" (a trailing '/' is fine). `timeout_s` bounds
  // each request; connecting takes at most 5 s of it.
  explicit MlflowClient(std::string uri, double timeout_s = 30);
  ~MlflowClient();
  MlflowClient(const MlflowClient&) = delete;
  MlflowClient& operator=(const MlflowClient&) = delete;

  const std::string& uri() const { return uri_; }
  // No request runs past `when`: each is cut to the time left, and one
  // asked after it fails at once.
  void set_deadline(std::chrono::steady_clock::time_point when) { deadline_ = when; }
  // The same, set by another thread (steady_clock nanoseconds; INT64_MAX:
  // none): a request in flight when it passes is cut there too.
  void watch_deadline(const std::atomic<int64_t>* ns) { watched_ = ns; }

  // The experiment's id, created when there is none by that name.
  std::string experiment_id(const std::string& name);
  MlflowRunInfo create_run(const std::string& experiment_id, const std::string& run_name, int64_t start_ms,
                           const std::map<std::string, std::string>& tags);
  // nullopt when the server has no such run (or it was deleted).
  std::optional<MlflowRunInfo> get_run(const std::string& run_id);
  // At most 1000 metrics, 100 params and 100 tags (MLflow's limits).
  void log_batch(const std::string& run_id, const std::vector<MlflowMetric>& metrics,
                 const std::vector<std::pair<std::string, std::string>>& params = {},
                 const std::map<std::string, std::string>& tags = {});
  // "RUNNING", "FINISHED", "FAILED", "KILLED"; end_ms 0 leaves the end open.
  void set_status(const std::string& run_id, const std::string& status, int64_t end_ms);
  // Uploads `file` as the run's artifact `path` ("plots.png", "export/config.json")
  // through the server's artifact proxy (mlflow server's default), or copies
  // it when the run's artifact store is a local directory.
  void upload_artifact(const MlflowRunInfo& run, const std::string& file, const std::string& path);

 private:
  std::string call(const char* method, const std::string& api_path, const std::string& body,
                   const std::string& content_type = "application/json", long* status = nullptr);

  std::string uri_;
  double timeout_s_;
  std::chrono::steady_clock::time_point deadline_ = std::chrono::steady_clock::time_point::max();
  const std::atomic<int64_t>* watched_ = nullptr;
  void* curl_ = nullptr;
};

struct MlflowTarget {
  std::string uri;          // log.mlflow
  std::string experiment;   // log.mlflow-experiment
  std::string run_name;     // log.mlflow-run-name; "": RUN_DIR's name
  std::string run_dir;      // RUN_DIR: mlflow.json, and the artifacts sent at the end
  std::string config_toml;  // the resolved config, sent as the run's params
  std::string source;       // "cohort train": the mlflow.source.name tag
  // Add to RUN_DIR/mlflow.json's run when it is on this server (a resume,
  // `cohort eval`); else start a new run and record it there.
  bool continue_run = false;
  // Leave the status of a continued run as it is (`cohort eval`); a run
  // this reporter started is finished by it.
  bool keep_status = false;
  double request_timeout_s = 30;  // each request
  double final_flush_s = 60;      // at the end, how long to keep sending to a server that answers
};

// Sends rank 0's reports to an MLflow run from a background thread, so a
// tracking server that is down or slow never holds training up: values
// queue in memory and are retried with back-off (one warning on stderr when
// the server first fails, one line when it answers again). Metrics are
// every number of every metrics.jsonl line, named as in TensorBoard
// (train/loss, test/accuracy, train/phase_ms/data), at their step.
// finish() queues the artifacts (config.toml, metrics.jsonl, labels.json,
// the run's plots.png when gnuplot is installed) and the final status; the
// destructor sends what it can within final_flush_s of being called, a
// request in flight included (5 s at most when finish() was not called: an
// elastic world that ends, or a failure, which sets the status FAILED), the
// status first, and prints on stderr what was not sent and what was sent
// but not answered (it may have arrived).
// At most a million values wait for a server that does not answer; later
// ones are counted as not sent. Rank 0 only.
class MlflowReporter : public Reporter {
 public:
  explicit MlflowReporter(MlflowTarget target);
  ~MlflowReporter() override;

  void train(const TrainReport& r) override;
  void eval(const EvalReport& r) override;
  void finish(bool ok) override;
  // Queues RUN_DIR-independent files as artifacts (`cohort export`'s files).
  void artifact(const std::string& file, const std::string& artifact_path);
  // Blocks until everything queued so far was sent or given up on; returns
  // the one-line account of what was not sent ("" when all was).
  std::string flush();

 private:
  void queue(const std::vector<std::pair<std::string, double>>& values, int64_t step);
  struct Shared;
  static void work(Shared& s);  // the worker thread's loop
  std::shared_ptr<Shared> s_;
  std::thread worker_;
};

// `cohort export` and `cohort eval --plot`: uploads files to the MLflow run
// RUN_DIR/mlflow.json names, when `uri` (the run's log.mlflow) is set.
// Returns a line for the user: what was sent, or why not. Never throws for
// a server that is down: the files are on disk either way.
std::string mlflow_upload_to_run(const std::string& uri, const std::string& run_dir,
                                 const std::vector<std::pair<std::string, std::string>>& files);

}  // namespace cohort
