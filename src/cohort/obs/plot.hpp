// defines: plot_run
#pragma once

#include <string>

namespace cohort {

// Draws RUN_DIR/metrics.jsonl as one PNG with gnuplot: training and
// evaluation loss, learning rate, throughput, and evaluation metrics against
// the step. Returns the PNG's path (default RUN_DIR/plots.png). Throws
// DataError for a missing or empty metrics file, Error when gnuplot fails.
std::string plot_run(const std::string& run_dir, const std::string& output = "");

}  // namespace cohort
