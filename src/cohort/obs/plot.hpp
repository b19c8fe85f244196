// defines: PlotOptions, plot_run
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace cohort {

// Whether `gnuplot` is on the PATH (what plot_run and plot_confusion run).
bool gnuplot_available();

struct PlotOptions {
  std::string output;  // the PNG; "": RUN_DIR/plots.png
  // The run's learning-rate schedule, lr(step) for steps 0..total_steps-1,
  // drawn as a curve under the logged points (so warm-up shows even when the
  // first line is step 50); null: the logged points alone.
  std::function<double(int64_t)> lr_at;
  int64_t total_steps = 0;
};

// Draws RUN_DIR/metrics.jsonl as one PNG with gnuplot, a panel each, with
// labelled axes and legends under the data: loss (train line, eval points);
// each accuracy (mlm_accuracy, nsp_accuracy; accuracy and macro_f1) on its
// own scale; the learning rate; throughput in the run's units (tokens/s,
// images/s); and for a classifier, the last evaluation's per-class F1 as
// one sorted bar chart. The gnuplot script stays in RUN_DIR/.plot/plot.gp.
// Returns the PNG's path. Throws DataError for a missing or empty metrics
// file, Error when gnuplot fails.
std::string plot_run(const std::string& run_dir, const PlotOptions& options = {});

// A confusion matrix as a heatmap PNG: rows the true classes, columns the
// predicted ones, each row coloured by its share of the row (recall on the
// diagonal), its count written in each cell when there are at most 20
// classes. `counts` is square, one row and column per name. Returns `png`.
std::string plot_confusion(const std::string& png, const std::vector<std::string>& names,
                           const std::vector<std::vector<double>>& counts, const std::string& title);

}  // namespace cohort
