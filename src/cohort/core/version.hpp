// defines: kVersion
//
// Cohort's version, for `cohort --version` and the manifests Cohort writes.
// Keep it equal to project(VERSION) in CMakeLists.txt.
#pragma once

namespace cohort {

inline constexpr const char* kVersion = "0.1.0";

}  // namespace cohort
