#include "cohort/eval/tally.hpp"

#include "cohort/core/error.hpp"

namespace cohort {

void Tally::add(const std::string& name, double sum, double count) {
  auto& e = entries_[name];
  e.sum += sum;
  e.count += count;
}

void Tally::merge(const Tally& other) {
  for (const auto& [name, e] : other.entries_) add(name, e.sum, e.count);
}

double Tally::sum(const std::string& name) const {
  auto it = entries_.find(name);
  COHORT_CHECK(it != entries_.end(), Error, "metric '", name, "' was never recorded");
  return it->second.sum;
}

double Tally::count(const std::string& name) const {
  auto it = entries_.find(name);
  COHORT_CHECK(it != entries_.end(), Error, "metric '", name, "' was never recorded");
  return it->second.count;
}

double Tally::mean(const std::string& name) const {
  double c = count(name);
  COHORT_CHECK(c > 0, Error, "metric '", name, "' has no samples to average");
  return sum(name) / c;
}

std::vector<std::string> Tally::names() const {
  std::vector<std::string> out;
  for (const auto& [name, e] : entries_) out.push_back(name);
  return out;
}

std::vector<double> Tally::flatten() const {
  std::vector<double> out;
  for (const auto& [name, e] : entries_) {
    out.push_back(e.sum);
    out.push_back(e.count);
  }
  return out;
}

void Tally::unflatten(const std::vector<double>& flat) {
  COHORT_CHECK(flat.size() == 2 * entries_.size(), Error, "tally: ", flat.size(),
               " values for ", entries_.size(), " metrics");
  size_t i = 0;
  for (auto& [name, e] : entries_) {
    e.sum = flat[i++];
    e.count = flat[i++];
  }
}

}  // namespace cohort
