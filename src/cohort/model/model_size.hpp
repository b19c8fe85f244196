// defines: check_model_fits
//
// A model too large for this machine is refused before any tensor is
// allocated, naming the keys that make it so; libtorch's allocator would
// fail deep inside the model's constructor, naming none.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <string>

#include "cohort/core/error.hpp"

namespace cohort {

// Throws ConfigError when `params` fp32 parameters (an estimate, in double
// so that absurd sizes do not overflow) exceed this machine's memory.
// `keys` names the keys and values that set the size ("model.hidden
// 100000000"), `model` the model ("mlp").
inline void check_model_fits(double params, const std::string& keys, const std::string& model) {
  const double bytes = params * 4;
  const double memory = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  if (memory <= 0 || bytes <= memory) return;
  auto gib = [](double b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g GiB", b / (1u << 30));
    return std::string(buf);
  };
  char count[32];
  std::snprintf(count, sizeof count, "%.3g", params);
  throw ConfigError(detail::cat(keys, " makes the ", model, " model ", count, " parameters (", gib(bytes),
                                " of fp32 weights alone), more than this machine's ", gib(memory),
                                " of memory: make it smaller"));
}

}  // namespace cohort
