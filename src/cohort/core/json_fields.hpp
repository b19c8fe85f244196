// defines: json_int, json_ints
//
// Integer fields of JSON that Cohort did not necessarily write (state.json,
// safetensors headers, best.json). nlohmann's get<int64_t>() converts a
// float such as 4e112 without a check, which is undefined behaviour (found
// by fuzz/); these accept integers only and throw DataError naming `what`
// (e.g. "FILE: field 'step'").
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "cohort/core/error.hpp"

namespace cohort {

inline int64_t json_int(const nlohmann::json& v, const std::string& what, int64_t lo = std::numeric_limits<int64_t>::min(),
                        int64_t hi = std::numeric_limits<int64_t>::max()) {
  bool ok = v.is_number_integer() &&
            !(v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()));
  COHORT_CHECK(ok, DataError, what, " must be an integer (got ", v.dump(), ")");
  int64_t x = v.get<int64_t>();
  COHORT_CHECK(x >= lo && x <= hi, DataError, what, " is ", x, ", outside [", lo, ", ", hi, "]");
  return x;
}

inline std::vector<int64_t> json_ints(const nlohmann::json& v, const std::string& what,
                                      int64_t lo = std::numeric_limits<int64_t>::min(),
                                      int64_t hi = std::numeric_limits<int64_t>::max()) {
  COHORT_CHECK(v.is_array(), DataError, what, " must be a list of integers (got ", v.dump(), ")");
  std::vector<int64_t> out;
  for (const auto& x : v) out.push_back(json_int(x, what, lo, hi));
  return out;
}

}  // namespace cohort
