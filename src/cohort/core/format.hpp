// defines: strf
#pragma once

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <string>

namespace cohort {

// printf into a std::string: "step %lld: %s".
inline std::string strf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline std::string strf(const char* fmt, ...) {
  va_list args, again;
  va_start(args, fmt);
  va_copy(again, args);
  std::string out(static_cast<size_t>(std::max(0, std::vsnprintf(nullptr, 0, fmt, args))), '\0');
  std::vsnprintf(out.data(), out.size() + 1, fmt, again);
  va_end(again);
  va_end(args);
  return out;
}

}  // namespace cohort
