#include "cohort/device/device_tally.hpp"

#include <algorithm>

#include "cohort/core/error.hpp"
#include "cohort/device/host_read.hpp"

namespace cohort {

namespace {

torch::Tensor plus(const torch::Tensor& a, const torch::Tensor& b) {
  if (!a.defined()) return b;
  if (!b.defined()) return a;
  return a + b;
}

bool same_names(const std::shared_ptr<const std::vector<std::string>>& a,
                const std::shared_ptr<const std::vector<std::string>>& b) {
  return a == b || *a == *b;
}

}  // namespace

void DeviceTally::add(const std::string& name, double sum, double count) {
  auto& e = entries_[name];
  e.sum += sum;
  e.count += count;
}

void DeviceTally::add(const std::string& name, const torch::Tensor& sum, double count) {
  COHORT_CHECK(sum.numel() == 1, Error, "metric '", name, "': a sum of ", sum.numel(), " values, not one");
  auto& e = entries_[name];
  e.device_sum = plus(e.device_sum, sum.detach().to(torch::kFloat64).reshape({}));
  e.count += count;
}

void DeviceTally::add(const std::string& name, const torch::Tensor& sum, const torch::Tensor& count) {
  COHORT_CHECK(count.numel() == 1, Error, "metric '", name, "': a count of ", count.numel(), " values, not one");
  add(name, sum, 0.0);
  auto& e = entries_[name];
  e.device_count = plus(e.device_count, count.detach().to(torch::kFloat64).reshape({}));
}

void DeviceTally::add(std::shared_ptr<const std::vector<std::string>> names, const torch::Tensor& sums,
                      const torch::Tensor& counts) {
  const auto n = static_cast<int64_t>(names->size());
  COHORT_CHECK(sums.numel() == n && counts.numel() == n, Error, "a block of ", n, " metrics with ", sums.numel(),
               " sums and ", counts.numel(), " counts");
  COHORT_CHECK(std::is_sorted(names->begin(), names->end()), Error, "a block's metric names are not sorted");
  Block b{std::move(names), sums.detach().to(torch::kFloat64).reshape({-1}), counts.detach().to(torch::kFloat64).reshape({-1})};
  for (auto& mine : blocks_) {
    if (!same_names(mine.names, b.names)) continue;
    mine.sums = mine.sums + b.sums;
    mine.counts = mine.counts + b.counts;
    return;
  }
  blocks_.push_back(std::move(b));
}

void DeviceTally::merge(const DeviceTally& other) {
  for (const auto& [name, o] : other.entries_) {
    auto& e = entries_[name];
    e.sum += o.sum;
    e.count += o.count;
    e.device_sum = plus(e.device_sum, o.device_sum);
    e.device_count = plus(e.device_count, o.device_count);
  }
  for (const auto& b : other.blocks_) add(b.names, b.sums, b.counts);
}

bool DeviceTally::on_device() const {
  if (!blocks_.empty()) return true;
  for (const auto& [name, e] : entries_) {
    if (e.device_sum.defined() || e.device_count.defined()) return true;
  }
  return false;
}

torch::Tensor DeviceTally::flatten(const Tally& layout, const c10::Device& device) const {
  auto opts = torch::TensorOptions().dtype(torch::kFloat64).device(device);
  const auto names = layout.names();
  for (const auto& [name, e] : entries_) {
    COHORT_CHECK(layout.has(name), Error, "metric '", name, "' is not one of the task's metrics");
  }
  // add() sums blocks over the same names, so each block starts at its own name.
  std::map<std::string, const Block*> starts;
  for (const auto& b : blocks_) {
    if (b.names->empty()) continue;
    COHORT_CHECK(starts.emplace(b.names->front(), &b).second, Error, "two blocks of metrics start at '",
                 b.names->front(), "'");
  }
  size_t used = 0;
  // An entry's host value is a fill kernel's argument, not a copy: a copy to
  // the device from pageable memory would make the host wait.
  auto value = [&](const torch::Tensor& on_device, double on_host) {
    if (!on_device.defined()) return torch::scalar_tensor(on_host, opts);
    return on_host == 0 ? on_device.to(device) : on_device.to(device) + on_host;
  };
  auto entry_values = [&](const Entry& e) {
    return torch::stack({value(e.device_sum, e.sum), value(e.device_count, e.count)});
  };
  std::vector<torch::Tensor> pieces;
  int64_t zeros = 0;  // a run of names never added
  auto flush = [&] {
    if (zeros > 0) pieces.push_back(torch::zeros({2 * zeros}, opts));
    zeros = 0;
  };
  for (size_t i = 0; i < names.size();) {
    auto block = starts.find(names[i]);
    if (block != starts.end()) {
      const auto& bn = *block->second->names;
      COHORT_CHECK(i + bn.size() <= names.size() && std::equal(bn.begin(), bn.end(), names.begin() + static_cast<long>(i)),
                   Error, "a block of metrics from '", bn.front(), "' is not adjacent in the task's metrics");
      auto piece = torch::stack({block->second->sums.to(device), block->second->counts.to(device)}, 1).reshape({-1});
      ++used;
      // Entries over a block's names (a tally restored from the host) add in.
      std::vector<torch::Tensor> extra;
      for (size_t j = 0; j < bn.size(); ++j) {
        auto e = entries_.find(bn[j]);
        extra.push_back(e == entries_.end() ? torch::zeros({2}, opts) : entry_values(e->second));
      }
      bool any = std::any_of(bn.begin(), bn.end(), [&](const std::string& n) { return entries_.count(n) > 0; });
      flush();
      pieces.push_back(any ? piece + torch::cat(extra) : piece);
      i += bn.size();
      continue;
    }
    auto e = entries_.find(names[i]);
    if (e == entries_.end()) {
      ++zeros;
    } else {
      flush();
      pieces.push_back(entry_values(e->second));
    }
    ++i;
  }
  flush();
  size_t nonempty = std::count_if(blocks_.begin(), blocks_.end(), [](const Block& b) { return !b.names->empty(); });
  COHORT_CHECK(used == nonempty, Error, nonempty - used, " block(s) of metrics are not in the task's metrics");
  return pieces.empty() ? torch::zeros({0}, opts) : torch::cat(pieces);
}

DeviceTally DeviceTally::unflatten(const Tally& layout, const torch::Tensor& flat) {
  auto names = std::make_shared<const std::vector<std::string>>(layout.names());
  const auto n = static_cast<int64_t>(names->size());
  COHORT_CHECK(flat.numel() == 2 * n, Error, "tally: ", flat.numel(), " values for ", n, " metrics");
  DeviceTally out;
  if (n == 0) return out;
  auto pairs = flat.reshape({n, 2});
  out.blocks_.push_back({names, pairs.select(1, 0), pairs.select(1, 1)});
  return out;
}

Tally DeviceTally::read(const Tally& layout) const {
  Tally out = layout;
  if (!on_device()) {
    for (const auto& [name, e] : entries_) {
      COHORT_CHECK(layout.has(name), Error, "metric '", name, "' is not one of the task's metrics");
    }
    auto flat = layout.flatten();
    const auto names = layout.names();
    for (size_t i = 0; i < names.size(); ++i) {
      auto e = entries_.find(names[i]);
      flat[2 * i] += e == entries_.end() ? 0.0 : e->second.sum;
      flat[2 * i + 1] += e == entries_.end() ? 0.0 : e->second.count;
    }
    out.unflatten(flat);
    return out;
  }
  c10::Device device = blocks_.empty() ? c10::Device(c10::kCPU) : blocks_.front().sums.device();
  for (const auto& [name, e] : entries_) {
    if (e.device_sum.defined()) device = e.device_sum.device();
    if (e.device_count.defined()) device = e.device_count.device();
  }
  std::vector<double> flat = host_values(flatten(layout, device));
  auto base = layout.flatten();
  for (size_t i = 0; i < flat.size(); ++i) flat[i] += base[i];
  out.unflatten(flat);
  return out;
}

}  // namespace cohort
