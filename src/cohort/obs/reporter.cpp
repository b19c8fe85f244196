#include "cohort/obs/reporter.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "cohort/core/error.hpp"
#include "cohort/core/format.hpp"

namespace cohort {

nlohmann::json report_json(const TrainReport& r) {
  nlohmann::json line = {{"kind", "train"}, {"step", r.step},       {"epoch", r.epoch},
                         {"lr", r.lr},      {"samples", r.samples}, {"tokens_per_s", r.units_per_s}};
  if (!r.unit.empty()) line["unit"] = r.unit;  // what tokens_per_s counts: tokens, images, samples
  for (const auto& [name, value] : r.metrics) line[name] = value;
  nlohmann::json phases = nlohmann::json::object();
  for (const auto& [name, ms] : r.phase_ms) phases[name] = ms;
  line["phase_ms"] = phases;
  line["slowest_rank"] = r.slowest_rank;
  line["idle_ms"] = r.idle_ms;
  if (!r.balance.empty()) line["balance"] = r.balance;
  return line;
}

nlohmann::json report_json(const EvalReport& r) {
  nlohmann::json line = {{"kind", "eval"}, {"step", r.step}, {"split", r.split}, {"count", r.count}};
  if (!r.source.empty()) line["source"] = r.source;
  for (const auto& [name, value] : r.metrics) line[name] = value;
  return line;
}

namespace {

nlohmann::json to_json(const MembershipReport& r) {
  return {{"kind", "membership"}, {"step", r.step},   {"generation", r.generation}, {"world_size", r.world_size},
          {"nodes", r.nodes},     {"left", r.left},   {"joined", r.joined},         {"cause", r.cause},
          {"state", r.state},     {"formed_s", r.formed_s}, {"recovery_s", r.recovery_s}, {"unix_ms", r.unix_ms}};
}

}  // namespace

std::string format_metrics(const Metrics& metrics) {
  std::string out;
  char buf[96];
  for (const auto& [name, value] : metrics) {
    if (name.find('/') != std::string::npos) continue;  // per-class detail: metrics.jsonl and TensorBoard only
    std::snprintf(buf, sizeof buf, "  %s %.4f", name.c_str(), value);
    out += buf;
  }
  return out;
}

double metric_value(const Metrics& metrics, const std::string& name) {
  for (const auto& [n, v] : metrics) {
    if (n == name) return v;
  }
  return 0.0;
}

double eta_seconds(double elapsed, int64_t done, int64_t remaining) {
  return elapsed / static_cast<double>(std::max<int64_t>(1, done)) * static_cast<double>(remaining);
}

void ReporterFanOut::message(const std::string& line) {
  for (auto& r : to_) r->message(line);
}
void ReporterFanOut::progress(const StepProgress& p) {
  for (auto& r : to_) r->progress(p);
}
void ReporterFanOut::train(const TrainReport& t) {
  for (auto& r : to_) r->train(t);
}
void ReporterFanOut::eval(const EvalReport& e) {
  for (auto& r : to_) r->eval(e);
}

void ReporterFanOut::membership(const MembershipReport& m) {
  for (auto& r : to_) r->membership(m);
}
void ReporterFanOut::finish(bool ok) {
  for (auto& r : to_) r->finish(ok);
}

void ConsoleReporter::print(const std::string& line) {
  if (bar_shown_) {
    std::fputs("\r\033[K", stdout);  // clear the status line first
    bar_shown_ = false;
  }
  std::fputs(line.c_str(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

void ConsoleReporter::message(const std::string& line) { print(line); }

void ConsoleReporter::progress(const StepProgress& p) {
  if (!live_ || p.step == p.total_steps) return;
  auto now = std::chrono::steady_clock::now();
  if (now - last_bar_ < std::chrono::milliseconds(100)) return;
  last_bar_ = now;
  if (p.units_per_s > 0) last_rate_ = p.units_per_s;
  const int width = 24;
  int filled = static_cast<int>(width * p.step / std::max<int64_t>(1, p.total_steps));
  std::string bar(static_cast<size_t>(filled), '#');
  bar.append(static_cast<size_t>(width - filled), '.');
  const std::string loss = std::isnan(p.loss) ? "-" : strf("%.4f", p.loss);
  std::printf("\r\033[K[%s] %lld/%lld  epoch %lld  loss %s  lr %.2e  %.0f %s/s  eta %s", bar.c_str(),
              static_cast<long long>(p.step), static_cast<long long>(p.total_steps),
              static_cast<long long>(p.epoch), loss.c_str(), p.lr, last_rate_, p.unit.c_str(),
              format_duration(p.eta_s).c_str());
  std::fflush(stdout);
  bar_shown_ = true;
}

void ConsoleReporter::train(const TrainReport& r) {
  char buf[512];
  std::snprintf(buf, sizeof buf, "step %6lld/%lld  epoch %lld %s  lr %.2e  %.0f %s/s  eta %s",
                static_cast<long long>(r.step), static_cast<long long>(r.total_steps),
                static_cast<long long>(r.epoch), format_metrics(r.metrics).c_str(), r.lr, r.units_per_s,
                r.unit.c_str(), format_duration(r.eta_s).c_str());
  print(buf);
}

void ConsoleReporter::eval(const EvalReport& r) {
  char buf[512];
  std::snprintf(buf, sizeof buf, "eval  step %lld  %s:%s  (%lld samples, %s)", static_cast<long long>(r.step),
                r.split.c_str(), format_metrics(r.metrics).c_str(), static_cast<long long>(r.count),
                format_duration(r.seconds).c_str());
  print(buf);
}

void ConsoleReporter::membership(const MembershipReport& r) {
  std::string line = "elastic: step " + std::to_string(r.step) + ": a world of " + std::to_string(r.world_size) +
                     " rank(s) on " + std::to_string(r.nodes) + " node(s) (generation " + std::to_string(r.generation) + ")";
  if (!r.left.empty()) line += "; left: " + detail::join(r.left, ", ");
  if (!r.joined.empty()) line += "; joined: " + detail::join(r.joined, ", ");
  char buf[160];
  std::snprintf(buf, sizeof buf, "; state from %s; formed in %.1f s, first step %.1f s after the change",
                r.state.c_str(), r.formed_s, r.recovery_s);
  line += buf;
  if (!r.cause.empty()) line += " (" + r.cause + ")";
  print(line);
}

void MetricsFileReporter::train(const TrainReport& r) { log_.write(report_json(r)); }
void MetricsFileReporter::membership(const MembershipReport& r) { log_.write(to_json(r)); }
void MetricsFileReporter::eval(const EvalReport& r) { log_.write(report_json(r)); }

void TensorBoardReporter::train(const TrainReport& r) {
  writer_.scalars(r.step, tensorboard_scalars("train", report_json(r)));
}
void TensorBoardReporter::eval(const EvalReport& r) {
  writer_.scalars(r.step, tensorboard_scalars(r.split, report_json(r)));
}

}  // namespace cohort
