// Timing two variants side by side on a noisy machine: rounds that run one
// and then the other, and the median of each (bench/*.cpp).
#pragma once

#include <algorithm>
#include <utility>
#include <vector>

namespace cohort::bench {

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// `warmup` rounds and then `rounds` more, each timing a() and then b() (each
// returns its time); the medians of the timed rounds, a's first.
template <class A, class B>
std::pair<double, double> interleaved_medians(int rounds, int warmup, A&& a, B&& b) {
  std::vector<double> ta, tb;
  for (int r = 0; r < warmup + rounds; ++r) {
    const double x = a(), y = b();
    if (r >= warmup) ta.push_back(x), tb.push_back(y);
  }
  return {median(std::move(ta)), median(std::move(tb))};
}

}  // namespace cohort::bench
