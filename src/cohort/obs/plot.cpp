#include "cohort/obs/plot.hpp"

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "cohort/core/error.hpp"

namespace cohort {

namespace fs = std::filesystem;

std::string plot_run(const std::string& run_dir, const std::string& output) {
  fs::path metrics = fs::path(run_dir) / "metrics.jsonl";
  std::ifstream in(metrics);
  COHORT_CHECK(in.good(), DataError, metrics.string(), ": cannot read; is ", run_dir, " a run directory?");
  std::string png = output.empty() ? (fs::path(run_dir) / "plots.png").string() : output;
  fs::path work = fs::path(run_dir) / ".plot";
  fs::create_directories(work);

  std::ofstream train(work / "train.dat"), eval(work / "eval.dat");
  std::set<std::string> eval_metrics;
  std::vector<nlohmann::json> evals;
  size_t train_lines = 0, line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception&) {
      throw DataError(detail::cat(metrics.string(), ":", line_no, ": not a JSON line"));
    }
    // A field of the wrong type (a null step, a string loss) is named with
    // its line, not left to a raw JSON type error.
    const std::string at = detail::cat(metrics.string(), ":", line_no, ": ");
    COHORT_CHECK(j.is_object() && (!j.contains("kind") || j["kind"].is_string()), DataError, at,
                 "not a metrics line (an object with a string \"kind\")");
    const std::string kind = j.value("kind", "");
    if (kind == "train" || kind == "eval") {
      COHORT_CHECK(j.contains("step") && j["step"].is_number(), DataError, at, "\"step\" must be a number (got ",
                   j.contains("step") ? j["step"].dump() : std::string("none"), ")");
      for (auto& [k, v] : j.items()) {
        COHORT_CHECK(!(k == "loss" || k == "lr" || k == "tokens_per_s") || v.is_number(), DataError, at, "\"", k,
                     "\" must be a number (got ", v.dump(), ")");
        COHORT_CHECK(k != "split" || v.is_string(), DataError, at, "\"split\" must be a string (got ", v.dump(), ")");
      }
    }
    if (kind == "train") {
      train << j["step"] << ' ' << j.value("loss", 0.0) << ' ' << j.value("lr", 0.0) << ' '
            << j.value("tokens_per_s", 0.0) << '\n';
      ++train_lines;
    } else if (kind == "eval") {
      // One curve: the training's own eval split (the first one logged);
      // `cohort eval` lines for other splits are left out.
      if (!evals.empty() && j.value("split", std::string()) != evals.front().value("split", std::string())) continue;
      for (auto& [k, v] : j.items())
        if (v.is_number_float() && k != "loss") eval_metrics.insert(k);
      evals.push_back(j);
    }
  }
  COHORT_CHECK(train_lines > 0, DataError, metrics.string(), ": no training lines to plot yet");
  for (const auto& j : evals) {
    eval << j["step"] << ' ' << j.value("loss", 0.0);
    for (const auto& m : eval_metrics) eval << ' ' << j.value(m, 0.0);
    eval << '\n';
  }
  train.close();
  eval.close();

  std::ostringstream gp;
  gp << "set terminal pngcairo noenhanced size 1400,900 font ',10'\nset output '" << png << "'\n"
     << "set multiplot layout 2,2 title 'cohort run: " << fs::path(run_dir).filename().string() << "'\n"
     << "set grid\nset key top right\nset xlabel 'step'\n"
     << "set title 'loss'\nplot '" << (work / "train.dat").string() << "' using 1:2 with lines title 'train'"
     << (evals.empty() ? "" : ", '" + (work / "eval.dat").string() + "' using 1:2 with linespoints title 'eval'")
     << "\nset title 'learning rate'\nplot '" << (work / "train.dat").string()
     << "' using 1:3 with lines notitle\n"
     << "set title 'throughput (units/s)'\nplot '" << (work / "train.dat").string()
     << "' using 1:4 with lines notitle\n";
  if (evals.empty() || eval_metrics.empty()) {
    gp << "set title 'evaluation'\nunset key\nplot NaN notitle\n";
  } else {
    // Accuracies (in [0,1]) on the right axis, losses on the left, so
    // neither squashes the other.
    gp << "set title 'evaluation metrics'\nset y2tics\nset ytics nomirror\nset y2label 'accuracy'\nplot ";
    int col = 3;
    for (const auto& m : eval_metrics) {
      if (col > 3) gp << ", ";
      bool right = m.find("accuracy") != std::string::npos;
      gp << "'" << (work / "eval.dat").string() << "' using 1:" << col << " axes " << (right ? "x1y2" : "x1y1")
         << " with linespoints title '" << m << (right ? " (right)" : "") << "'";
      ++col;
    }
    gp << "\n";
  }
  gp << "unset multiplot\n";
  std::ofstream(work / "plot.gp") << gp.str();

  COHORT_CHECK(std::system("command -v gnuplot >/dev/null 2>&1") == 0, Error,
               "gnuplot is not installed (apt-get install gnuplot-nox)");
  std::string cmd = "gnuplot '" + (work / "plot.gp").string() + "' 2>'" + (work / "gnuplot.err").string() + "'";
  int rc = std::system(cmd.c_str());
  COHORT_CHECK(rc == 0 && fs::exists(png), Error, "gnuplot failed drawing ", png, " (see ",
               (work / "gnuplot.err").string(), ")");
  return png;
}

}  // namespace cohort
