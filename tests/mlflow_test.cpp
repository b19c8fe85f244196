// log.mlflow without a working server: keys MLflow accepts, the config's
// checks, and a server that refuses or never answers. The real server is
// tests/oracles/mlflow_tracking.py (oracle.mlflow_tracking).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "cohort/config/config.hpp"
#include "cohort/core/error.hpp"
#include "cohort/obs/mlflow.hpp"
#include "helpers.hpp"

using cohort::test::run_cohort;
using cohort::test::TempDir;

namespace {

// A loopback socket that listens (so connections succeed through its
// backlog) but never accepts or answers: a hung tracking server. With
// `listening` false the port is closed again: a server that is down.
class Port {
 public:
  explicit Port(bool listening) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t len = sizeof a;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    if (listening) {
      listen(fd_, 64);
    } else {
      close(fd_);
      fd_ = -1;
    }
  }
  ~Port() {
    for (int c : taken_) close(c);
    if (fd_ >= 0) close(fd_);
  }
  std::string uri() const { return "http://127.0.0.1:" + std::to_string(port_); }
  // Waits for a client's connection and the first bytes of its request
  // (the events), and keeps the connection open, never answering.
  void take_a_request() {
    int conn = accept(fd_, nullptr, nullptr);
    char buf[256];
    if (conn >= 0 && recv(conn, buf, sizeof buf, 0) > 0) taken_.push_back(conn);
  }
  size_t requests_taken() const { return taken_.size(); }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::vector<int> taken_;
};

// A reporter's target: `uri`, experiment "x", RUN_DIR `dir`.
cohort::MlflowTarget target(const std::string& uri, const std::string& dir) {
  cohort::MlflowTarget t;
  t.uri = uri;
  t.experiment = "x";
  t.run_dir = dir;
  t.source = "test";
  return t;
}

cohort::TrainReport report(int64_t step) {
  cohort::TrainReport r;
  r.step = step;
  r.metrics = {{"loss", 0.5}, {"accuracy", 0.25}};
  return r;
}

}  // namespace

TEST(Mlflow, MetricKeysAreTheOnesMlflowAccepts) {
  EXPECT_EQ(cohort::mlflow_metric_key("train/phase_ms/data"), "train/phase_ms/data");
  EXPECT_EQ(cohort::mlflow_metric_key("valid/f1/noun.animal"), "valid/f1/noun.animal");
  EXPECT_EQ(cohort::mlflow_metric_key("test/f1/a:b,c"), "test/f1/a_b_c");
  EXPECT_EQ(cohort::mlflow_metric_key("test/f1/caf\xc3\xa9"), "test/f1/caf__");
}

TEST(Mlflow, ConfigTakesAnHttpServerOnly) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp);
  auto bad = run_cohort("train --data.path " + tmp.path() + " --log.mlflow localhost:5000 --out " + tmp / "run");
  EXPECT_EQ(bad.code, 2) << bad.err;
  EXPECT_NE(bad.err.find("log.mlflow must be a tracking server's http:// or https:// address (got localhost:5000)"),
            std::string::npos) << bad.err;
  EXPECT_FALSE(std::filesystem::exists(tmp / "run"));
  auto empty = run_cohort("train --data.path " + tmp.path() + " --log.mlflow http://x --log.mlflow-experiment '' --out " +
                          tmp / "run");
  EXPECT_EQ(empty.code, 2) << empty.err;
  EXPECT_NE(empty.err.find("log.mlflow-experiment must name an experiment"), std::string::npos) << empty.err;
}

// A server that is down: the reports queue, and at the end the account
// names how many values of which metrics, at which steps, were not sent.
TEST(Mlflow, ADownServerIsWarnedOnceAndWhatWasNotSentIsNamed) {
  TempDir tmp;
  Port down(false);
  cohort::MlflowTarget t = target(down.uri(), tmp.path());
  t.final_flush_s = 5;
  testing::internal::CaptureStderr();
  {
    cohort::MlflowReporter r(t);
    for (int64_t step : {5, 10, 15}) r.train(report(step));
    std::string pending = r.flush();  // waits for the first failure
    EXPECT_NE(pending.find("not sent yet"), std::string::npos) << pending;
  }
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("cohort: warning: mlflow: GET " + t.uri + "/api/2.0/mlflow/experiments/get-by-name"),
            std::string::npos) << err;
  const std::string account = "cohort: warning: mlflow: not sent to " + t.uri +
                              ": the run and its params (it was never created), ";
  EXPECT_NE(err.find(account), std::string::npos) << err;
  // Each train report has loss, accuracy and the fixed fields (epoch, lr, ...).
  EXPECT_NE(err.find(" metric value(s) (train/accuracy, train/epoch, train/idle_ms, train/loss, and "),
            std::string::npos) << err;
  EXPECT_NE(err.find("; steps 5-15)"), std::string::npos) << err;
  EXPECT_EQ(err.find("answers again"), std::string::npos) << err;
  EXPECT_FALSE(std::filesystem::exists(tmp / "mlflow.json"));
}

// A server that takes connections and never answers: reporting returns at
// once (the requests wait on the worker thread), and the end gives up after
// final_flush_s, naming what was not sent.
TEST(Mlflow, AHungServerNeverHoldsReportsUp) {
  TempDir tmp;
  Port hung(true);
  cohort::MlflowTarget t = target(hung.uri(), tmp.path());
  t.request_timeout_s = 1;
  t.final_flush_s = 2;
  testing::internal::CaptureStderr();
  {
    cohort::MlflowReporter r(t);
    for (int64_t step = 1; step <= 200; ++step) r.train(report(step));
    cohort::EvalReport e;
    e.step = 200;
    e.split = "test";
    e.metrics = {{"loss", 0.4}};
    r.eval(e);
    r.finish(true);
  }
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("timed out"), std::string::npos) << err;
  EXPECT_NE(err.find("; steps 1-200)"), std::string::npos) << err;
  EXPECT_NE(err.find("the run's final status FINISHED"), std::string::npos) << err;
}

// Issue 46: a request in flight when the run ended held the process up for
// its own timeout before the final flush's time even began (73 s and 80 s
// after "done" against a promised 60). The flush's time now runs from the
// end, and a request still in flight is cut when it is over.
TEST(Mlflow, TheEndWaitsNoLongerThanTheFlushTimeWithARequestInFlight) {
  TempDir tmp;
  Port hung(true);
  cohort::MlflowTarget t = target(hung.uri(), tmp.path());
  t.request_timeout_s = 600;  // a request in flight would hold the end for 10 minutes
  t.final_flush_s = 1;
  testing::internal::CaptureStderr();
  std::chrono::steady_clock::time_point end;
  {
    cohort::MlflowReporter r(t);
    r.train(report(1));
    hung.take_a_request();  // the reporter's first request is in flight
    r.finish(true);
    end = std::chrono::steady_clock::now();
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - end).count();
  std::string err = testing::internal::GetCapturedStderr();
  // A bound, not a wait: 1 s of flush, the progress check's second, and
  // a loaded machine's slack; far below the request's 600 s.
  ASSERT_EQ(hung.requests_taken(), 1u);
  EXPECT_LT(waited, 60.0) << err;
  EXPECT_NE(err.find("cut at the end of the time to send it"), std::string::npos) << err;
  EXPECT_NE(err.find("the run's final status FINISHED"), std::string::npos) << err;
}

// A run that fails: the reporter is destroyed while the error unwinds, and
// the status it sends (or, here, names as not sent) is FAILED.
TEST(Mlflow, ARunUnwoundByAnErrorIsMarkedFailed) {
  TempDir tmp;
  Port down(false);
  cohort::MlflowTarget t = target(down.uri(), tmp.path());
  testing::internal::CaptureStderr();
  try {
    cohort::MlflowReporter r(t);
    r.train(report(1));
    throw cohort::DataError("a shard went missing");
  } catch (const cohort::DataError&) {
  }
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("; steps 1-1), the run's final status FAILED."), std::string::npos) << err;
}
