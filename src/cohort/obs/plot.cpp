#include "cohort/obs/plot.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <vector>

#include "cohort/core/error.hpp"

namespace cohort {

namespace fs = std::filesystem;

bool gnuplot_available() { return std::system("command -v gnuplot >/dev/null 2>&1") == 0; }

namespace {

// Numeric fields by step, in the order read.
struct Series {
  std::vector<int64_t> steps;
  std::vector<std::map<std::string, double>> values;
  std::set<std::string> names;

  void add(const nlohmann::json& j) {
    steps.push_back(j["step"].get<int64_t>());
    values.emplace_back();
    for (const auto& [k, v] : j.items()) {
      if (k == "step" || !v.is_number() || k == "epoch" || k == "samples" || k == "count" || k == "slowest_rank")
        continue;
      values.back()[k] = v.get<double>();
      names.insert(k);
    }
  }
  bool has(const std::string& name) const { return names.count(name) > 0; }
  // Writes step and every name as columns (NaN where a line lacks it);
  // returns the column of each name.
  std::map<std::string, int> write(const fs::path& file) const {
    std::ofstream out(file);
    std::map<std::string, int> column;
    int c = 2;
    for (const auto& n : names) column[n] = c++;
    for (size_t i = 0; i < steps.size(); ++i) {
      out << steps[i];
      for (const auto& n : names) {
        auto it = values[i].find(n);
        out << ' ';
        if (it == values[i].end() || !std::isfinite(it->second)) out << "NaN";
        else out << it->second;
      }
      out << '\n';
    }
    return column;
  }
};

bool is_quality(const std::string& name) {
  return name.find("accuracy") != std::string::npos || name == "macro_f1";
}

// A gnuplot single-quoted string: a quote inside is doubled.
std::string gq(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}
std::string quoted(const fs::path& p) { return gq(p.string()); }

// A shell single-quoted word.
std::string shell_quoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Writes `script` to `file` (kept, to restyle) and runs gnuplot on it;
// returns `png`, which it must have drawn.
std::string run_gnuplot(const std::string& script, const fs::path& file, const std::string& png) {
  std::ofstream(file) << script;
  COHORT_CHECK(gnuplot_available(), Error, "gnuplot is not installed (apt-get install gnuplot-nox)");
  const fs::path err = file.parent_path() / "gnuplot.err";
  std::string cmd = "gnuplot " + shell_quoted(file.string()) + " 2>" + shell_quoted(err.string());
  int rc = std::system(cmd.c_str());
  COHORT_CHECK(rc == 0 && fs::exists(png), Error, "gnuplot failed drawing ", png, " (see ", err.string(), ")");
  return png;
}

// "mlm_accuracy" -> "MLM accuracy", for titles and axis labels.
std::string readable(const std::string& name) {
  std::string out;
  std::string word;
  auto flush = [&] {
    if (word.empty()) return;
    if (word == "mlm" || word == "nsp") {
      for (char& ch : word) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    } else if (word == "f1") {
      word = "F1";
    }
    out += (out.empty() ? "" : " ") + word;
    word.clear();
  };
  for (char ch : name) {
    if (ch == '_') flush();
    else word += ch;
  }
  flush();
  return out;
}

// What plot_run draws from metrics.jsonl.
struct RunMetrics {
  Series train, eval;
  std::string unit, eval_split;
  nlohmann::json last_eval;
};

// Line `line_no` of `metrics`, parsed and its fields' types checked.
nlohmann::json parse_metrics_line(const std::string& line, const fs::path& metrics, size_t line_no) {
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
  return j;
}

RunMetrics read_metrics(std::istream& in, const fs::path& metrics) {
  RunMetrics m;
  size_t line_no = 0;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = parse_metrics_line(line, metrics, ++line_no);
    const std::string kind = j.value("kind", "");
    if (kind == "train") {
      m.train.add(j);
      if (j.contains("unit") && j["unit"].is_string()) m.unit = j["unit"].get<std::string>();
    } else if (kind == "eval") {
      // One curve: the training's own eval split (the first one logged);
      // `cohort eval` lines for other splits are left out.
      const std::string split = j.value("split", std::string());
      if (m.eval.steps.empty()) m.eval_split = split;
      if (split != m.eval_split) continue;
      m.eval.add(j);
      m.last_eval = j;
    }
  }
  COHORT_CHECK(!m.train.steps.empty(), DataError, metrics.string(), ": no training lines to plot yet");
  if (m.unit.empty()) m.unit = m.train.has("mlm_loss") ? "tokens" : "samples";  // lines written before "unit"
  return m;
}

// The learning-rate schedule as "step lr" lines (steps from 1), a line every
// total_steps / 2000 steps (at least every step).
void write_schedule(const fs::path& file, const PlotOptions& options) {
  std::ofstream lr(file);
  const int64_t stride = std::max<int64_t>(1, options.total_steps / 2000);
  for (int64_t s = 0; s < options.total_steps; s += stride) lr << s + 1 << ' ' << options.lr_at(s) << '\n';
}

using ClassF1 = std::vector<std::pair<double, std::string>>;  // (F1, label)

// The last evaluation's per-class F1 ("f1/<label>"), best first.
ClassF1 per_class_f1(const nlohmann::json& last_eval) {
  ClassF1 f1;
  if (last_eval.is_object()) {
    for (const auto& [k, v] : last_eval.items())
      if (k.rfind("f1/", 0) == 0 && v.is_number()) f1.emplace_back(v.get<double>(), k.substr(3));
  }
  std::sort(f1.begin(), f1.end(), [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
  return f1;
}

// One "index "label" F1" line per class, the label made safe to quote.
void write_f1(const fs::path& file, const ClassF1& f1) {
  std::ofstream out(file);
  for (size_t i = 0; i < f1.size(); ++i) {
    std::string label = f1[i].second;
    std::replace(label.begin(), label.end(), '"', '\'');
    std::replace(label.begin(), label.end(), '\\', '/');
    out << i << " \"" << label << "\" " << f1[i].first << '\n';
  }
}

// Accuracies and F1, each in its own panel: 0.111 -> 0.128 must not look flat.
std::vector<std::string> quality_names(const RunMetrics& m) {
  std::vector<std::string> quality;
  for (const auto* s : {&m.train, &m.eval})
    for (const auto& n : s->names)
      if (is_quality(n) && n.rfind("f1/", 0) != 0 && std::find(quality.begin(), quality.end(), n) == quality.end())
        quality.push_back(n);
  std::sort(quality.begin(), quality.end());
  return quality;
}

// What the panels draw: the series' data files, the column of each name in
// them, and how the train series is drawn.
struct DataFiles {
  fs::path train_dat, eval_dat;
  std::map<std::string, int> train_columns, eval_columns;
  std::string train_style;
};

// The page: a multiplot of `panels` panels, two a row, and the line styles.
void write_layout(std::ostream& gp, const std::string& png, const std::string& run_dir, int panels,
                  const RunMetrics& m) {
  const int rows = (panels + 1) / 2;
  const int64_t last_step = std::max(m.train.steps.back(), m.eval.steps.empty() ? int64_t{0} : m.eval.steps.back());
  gp << "set terminal pngcairo noenhanced size 1400," << 380 * rows << " font ',10'\nset output " << gq(png) << "\n"
     << "set multiplot layout " << rows << ",2 title " << gq("cohort run: " + fs::path(run_dir).filename().string())
     << " font ',12'\n"
     << "set grid\nset key outside right top vertical\nset xlabel 'step'\nset xrange [0:"
     << std::max<int64_t>(1, last_step + (last_step + 24) / 25) << "]\n"
     << "set style line 1 lc rgb '#1f77b4' lw 1.5\nset style line 2 lc rgb '#d62728' lw 1.5 pt 7 ps 0.9\n";
}

// A value as the plots write it: four significant digits, always (6.680, 0.08479).
std::string four_digits(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%#.4g", v);
  return text;
}

// The y-range of `name` over both series, widened to at least `least`
// around its middle (and kept inside [0, 1] for a quality): a change of
// 0.003 must not fill the panel.
std::string y_range(const RunMetrics& m, const std::string& name, double least, bool quality) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const auto* s : {&m.train, &m.eval})
    for (const auto& v : s->values)
      if (auto it = v.find(name); it != v.end() && std::isfinite(it->second))
        lo = std::min(lo, it->second), hi = std::max(hi, it->second);
  if (!std::isfinite(lo) || hi - lo >= least) return "set autoscale y\n";
  double mid = (lo + hi) / 2, a = mid - least / 2, b = mid + least / 2;
  if (quality && a < 0) b -= a, a = 0;
  if (quality && b > 1) a -= b - 1, b = 1;
  return "set yrange [" + four_digits(a) + ":" + four_digits(b) + "]\n";
}

// A panel: the train column as a line, the eval column as points joined;
// the last evaluation's value is in its key, where it covers no curve.
void write_panel(std::ostream& gp, DataFiles& d, const RunMetrics& m, const std::string& title,
                 const std::string& ylabel, const std::string& name) {
  gp << "set title " << gq(title) << "\nset ylabel " << gq(ylabel) << "\n"
     << y_range(m, name, is_quality(name) ? 0.1 : 0.0, is_quality(name));
  std::vector<std::string> parts;
  if (d.train_columns.count(name))
    parts.push_back(quoted(d.train_dat) + " using 1:" + std::to_string(d.train_columns[name]) + " with " +
                    d.train_style + " title 'train'");
  if (d.eval_columns.count(name)) {
    std::string key = "eval (" + m.eval_split + ")";
    for (size_t i = m.eval.steps.size(); i-- > 0;) {
      if (auto it = m.eval.values[i].find(name); it != m.eval.values[i].end()) {
        key += ", last " + four_digits(it->second);
        break;
      }
    }
    parts.push_back(quoted(d.eval_dat) + " using 1:" + std::to_string(d.eval_columns[name]) +
                    " with linespoints ls 2 title " + gq(key));
  }
  gp << "plot ";
  for (size_t i = 0; i < parts.size(); ++i) gp << (i ? ", " : "") << parts[i];
  gp << "\n";
}

// The logged learning rate as points, over the schedule's curve when there is one.
void write_lr_panel(std::ostream& gp, DataFiles& d, const std::optional<fs::path>& schedule) {
  gp << "set title 'learning rate'\nset ylabel 'learning rate'\nset autoscale y\nset format y '%.1e'\nplot ";
  if (schedule) gp << quoted(*schedule) << " using 1:2 with lines lc rgb '#999999' title 'schedule', ";
  gp << quoted(d.train_dat) << " using 1:" << d.train_columns["lr"] << " with points ls 1 pt 7 ps 0.6 title 'logged'\n"
     << "set format y '% h'\n";
}

// Throughput in the run's unit per second.
void write_throughput_panel(std::ostream& gp, DataFiles& d, const RunMetrics& m) {
  const std::string rate = m.train.has(m.unit + "_per_s") ? m.unit + "_per_s" : "tokens_per_s";
  gp << "set title 'throughput'\nset ylabel " << gq(m.unit + "/s") << "\nset yrange [0:*]\nplot " << quoted(d.train_dat)
     << " using 1:" << d.train_columns[rate] << " with " << d.train_style << " title 'all ranks'\n";
}

// The per-class F1 as one bar chart, best first: the best kKeptClasses
// when there are more (every class is in metrics.jsonl and `cohort eval`'s
// confusion file), so that each label stays legible.
constexpr size_t kKeptClasses = 24;

void write_f1_panel(std::ostream& gp, const RunMetrics& m, const ClassF1& f1, const fs::path& f1_dat) {
  const size_t shown = std::min(f1.size(), kKeptClasses);
  const std::string which = shown < f1.size()
                                ? "best " + std::to_string(shown) + " of " + std::to_string(f1.size()) + " classes"
                                : std::to_string(f1.size()) + " classes, best first";
  gp << "set title " << gq("per-class F1 at step " + std::to_string(m.eval.steps.back()) + " (" + m.eval_split + ", " +
                            which + ")")
     << "\nset ylabel 'F1'\nset xlabel ''\nset yrange [0:1]\nset xrange [-1:" << shown
     << "]\nset style fill solid 0.7\nset boxwidth 0.8\nset xtics rotate by 60 right font ',9'\nunset key\nplot "
     << quoted(f1_dat) << " every ::0::" << shown - 1 << " using 1:3:xtic(2) with boxes lc rgb '#1f77b4' notitle\n"
     << "set xtics norotate font ',10'\n";
}

// For a page with an odd number of panels: the run in figures, where the
// last panel would be empty.
void write_summary_panel(std::ostream& gp, const RunMetrics& m) {
  std::vector<std::string> lines = {"steps logged: " + std::to_string(m.train.steps.front()) + " to " +
                                    std::to_string(m.train.steps.back())};
  auto last = [](const Series& s, const std::string& name) -> std::optional<double> {
    for (size_t i = s.values.size(); i-- > 0;)
      if (auto it = s.values[i].find(name); it != s.values[i].end() && std::isfinite(it->second)) return it->second;
    return std::nullopt;
  };
  if (auto loss = last(m.train, "loss")) lines.push_back("last train loss: " + four_digits(*loss));
  if (!m.eval.steps.empty()) {
    lines.push_back("eval (" + m.eval_split + ") at step " + std::to_string(m.eval.steps.back()) + ":");
    for (const auto& [name, value] : m.eval.values.back())
      if (name.find('/') == std::string::npos) lines.push_back("    " + readable(name) + " " + four_digits(value));
  }
  const std::string rate = m.train.has(m.unit + "_per_s") ? m.unit + "_per_s" : "tokens_per_s";
  if (auto r = last(m.train, rate)) lines.push_back("last throughput: " + four_digits(*r) + " " + m.unit + "/s");
  gp << "set title 'the run'\nunset border\nunset tics\nunset grid\nset xlabel ''\nset ylabel ''\n"
     << "set xrange [0:1]\nset yrange [0:1]\nunset key\n";
  const double gap = std::min(0.15, 0.9 / static_cast<double>(lines.size()));
  for (size_t i = 0; i < lines.size(); ++i)
    gp << "set label " << i + 1 << " " << gq(lines[i]) << " at 0.05," << 0.92 - gap * static_cast<double>(i)
       << " font ',11'\n";
  gp << "plot NaN notitle\nunset label\nset border\nset tics\nset grid\n";
}

}  // namespace

std::string plot_run(const std::string& run_dir, const PlotOptions& options) {
  fs::path metrics = fs::path(run_dir) / "metrics.jsonl";
  std::ifstream in(metrics);
  COHORT_CHECK(in.good(), DataError, metrics.string(), ": cannot read; is ", run_dir, " a run directory?");
  std::string png = options.output.empty() ? (fs::path(run_dir) / "plots.png").string() : options.output;
  fs::path work = fs::path(run_dir) / ".plot";
  fs::create_directories(work);
  const RunMetrics m = read_metrics(in, metrics);

  DataFiles d;
  d.train_dat = work / "train.dat";
  d.eval_dat = work / "eval.dat";
  const fs::path lr_dat = work / "lr.dat", f1_dat = work / "f1.dat";
  d.train_columns = m.train.write(d.train_dat);
  d.eval_columns = m.eval.write(d.eval_dat);
  // Few train lines (a short run): each one marked, or a single one would not show.
  d.train_style = m.train.steps.size() < 20 ? "linespoints ls 1 pt 7 ps 0.5" : "lines ls 1";
  const bool schedule = options.lr_at && options.total_steps > 0;
  if (schedule) write_schedule(lr_dat, options);
  const ClassF1 f1 = per_class_f1(m.last_eval);
  if (!f1.empty()) write_f1(f1_dat, f1);
  const std::vector<std::string> quality = quality_names(m);

  std::ostringstream gp;
  const int panels = 3 + static_cast<int>(quality.size()) + (f1.empty() ? 0 : 1);
  write_layout(gp, png, run_dir, panels, m);
  write_panel(gp, d, m, "loss", "loss (cross-entropy)", "loss");
  for (const auto& q : quality) write_panel(gp, d, m, readable(q), readable(q), q);
  write_lr_panel(gp, d, schedule ? std::optional<fs::path>(lr_dat) : std::nullopt);
  write_throughput_panel(gp, d, m);
  if (!f1.empty()) write_f1_panel(gp, m, f1, f1_dat);
  if (panels % 2 == 1) write_summary_panel(gp, m);
  gp << "unset multiplot\n";
  return run_gnuplot(gp.str(), work / "plot.gp", png);
}

std::string plot_confusion(const std::string& png, const std::vector<std::string>& names,
                           const std::vector<std::vector<double>>& counts, const std::string& title) {
  const size_t k = names.size();
  COHORT_CHECK(k > 0 && counts.size() == k, Error, "a confusion matrix needs one row per class (", counts.size(),
               " rows, ", k, " classes)");
  fs::path work = fs::path(png).parent_path() / ".plot";
  fs::create_directories(work);
  const fs::path dat = work / "confusion.dat";
  {
    std::ofstream out(dat);
    for (size_t t = 0; t < k; ++t) {
      COHORT_CHECK(counts[t].size() == k, Error, "confusion row ", t, " has ", counts[t].size(), " columns, not ", k);
      double row = 0;
      for (double v : counts[t]) row += v;
      for (size_t p = 0; p < k; ++p) out << t << ' ' << p << ' ' << (row > 0 ? counts[t][p] / row : 0.0) << ' ' << counts[t][p] << '\n';
      out << '\n';
    }
  }
  auto tics = [&] {
    std::string out = "(";
    for (size_t i = 0; i < k; ++i) out += (i ? ", " : "") + gq(names[i]) + " " + std::to_string(i);
    return out + ")";
  };
  const int side = static_cast<int>(std::clamp<size_t>(300 + 22 * k, 600, 1600));
  const int font = k > 30 ? 6 : k > 15 ? 8 : 10;
  std::ostringstream gp;
  gp << "set terminal pngcairo noenhanced size " << side + 150 << "," << side << " font '," << font << "'\n"
     << "set output " << gq(png) << "\nset title " << gq(title) << " font '," << font + 3 << "'\n"
     << "set xlabel 'predicted'\nset ylabel 'true'\nset xrange [-0.5:" << k - 0.5 << "]\nset yrange [" << k - 0.5
     << ":-0.5]\nset xtics " << tics() << " rotate by 90 right\nset ytics " << tics() << "\nset cbrange [0:1]\n"
     << "set cblabel 'share of the true class' font ',11'\nset palette defined (0 '#ffffff', 0.2 '#c6dbef', 1 '#08306b')\n"
     << "set view map\nunset key\nplot " << quoted(dat) << " using 2:1:3 with image";
  if (k <= 20) gp << ", '' using 2:1:(sprintf('%d', $4)) with labels tc rgb '#444444'";
  gp << "\n";
  return run_gnuplot(gp.str(), work / "confusion.gp", png);
}

}  // namespace cohort
