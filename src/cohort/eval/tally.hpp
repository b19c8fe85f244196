// defines: Tally
//
// Metrics as sums and counts, never as averages: a tally from any number of
// ranks or batches adds up to the same totals, so a metric reduced across
// ranks is identical for every world size. Keys iterate in sorted order, which
// fixes the layout of the flat vector that ranks all-reduce.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace cohort {

class Tally {
 public:
  void add(const std::string& name, double sum, double count);
  void merge(const Tally& other);

  bool has(const std::string& name) const { return entries_.count(name) > 0; }
  double sum(const std::string& name) const;
  double count(const std::string& name) const;
  // sum / count. Throws Error when the count is zero.
  double mean(const std::string& name) const;
  std::vector<std::string> names() const;

  // [sum0, count0, sum1, count1, ...] in name order, for an all-reduce.
  std::vector<double> flatten() const;
  // The inverse of flatten(): same names, values taken from `flat`.
  void unflatten(const std::vector<double>& flat);

 private:
  struct Entry {
    double sum = 0;
    double count = 0;
  };
  std::map<std::string, Entry> entries_;
};

}  // namespace cohort
