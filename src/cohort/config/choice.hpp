// defines: DeviceKind, Precision, OptimizerKind, Schedule, Compression, SyncMode, ShardMode, Choices,
//          BackendKind, Balance, DropoutRng, name_of, parse_choice, choice_list, integer_wire, rounding_wire
//
// The config keys that take one of a fixed set of words. Each is an enum
// class with one table of its spellings: the table alone parses the key,
// prints it back into config.toml and lists the choices in errors and help.
// (train.task and model.name are open: their registries hold the names.)
#pragma once

#include <array>
#include <string>
#include <utility>

#include "cohort/core/error.hpp"

namespace cohort {

enum class DeviceKind { kAuto, kCpu, kCuda };              // train.device
enum class Precision { kFp32, kBf16, kFp16, kAuto };   // train.precision
enum class OptimizerKind { kAdamW, kLamb, kSgd };          // optim.name
enum class Schedule { kConstant, kLinear, kCosine, kPoly };  // optim.schedule
enum class Compression { kNone, kFp32, kBf16, kFp16, kPowerSgd, kInt8, kInt4 };  // dist.grad-compression
enum class SyncMode { kStep, kLocal };                 // dist.sync
enum class ShardMode { kNone, kOptimizer, kGradients };  // dist.shard
enum class BackendKind { kAuto, kNccl, kGloo };        // dist.backend
enum class Balance { kEqual, kAuto, kWeights };        // data.balance
enum class DropoutRng { kSample, kRank };              // model.dropout-rng

// Choices<E>::table: every value of E with its spelling, in help order.
template <class E>
struct Choices;

template <>
struct Choices<DeviceKind> {
  static constexpr std::array<std::pair<DeviceKind, const char*>, 3> table{
      {{DeviceKind::kAuto, "auto"}, {DeviceKind::kCpu, "cpu"}, {DeviceKind::kCuda, "cuda"}}};
};
template <>
struct Choices<Precision> {
  static constexpr std::array<std::pair<Precision, const char*>, 4> table{
      {{Precision::kFp32, "fp32"}, {Precision::kBf16, "bf16"}, {Precision::kFp16, "fp16"}, {Precision::kAuto, "auto"}}};
};
template <>
struct Choices<OptimizerKind> {
  static constexpr std::array<std::pair<OptimizerKind, const char*>, 3> table{
      {{OptimizerKind::kAdamW, "adamw"}, {OptimizerKind::kLamb, "lamb"}, {OptimizerKind::kSgd, "sgd"}}};
};
template <>
struct Choices<Schedule> {
  static constexpr std::array<std::pair<Schedule, const char*>, 4> table{{{Schedule::kConstant, "constant"},
                                                                          {Schedule::kLinear, "linear"},
                                                                          {Schedule::kCosine, "cosine"},
                                                                          {Schedule::kPoly, "poly"}}};
};
template <>
struct Choices<Compression> {
  static constexpr std::array<std::pair<Compression, const char*>, 7> table{{{Compression::kNone, "none"},
                                                                             {Compression::kFp32, "fp32"},
                                                                             {Compression::kBf16, "bf16"},
                                                                             {Compression::kFp16, "fp16"},
                                                                             {Compression::kPowerSgd, "powersgd"},
                                                                             {Compression::kInt8, "int8"},
                                                                             {Compression::kInt4, "int4"}}};
};

// Integer wires (int8, int4) quantize the outer sync's parameter change,
// gathered and added in fp32; a sum in them would wrap.
constexpr bool integer_wire(Compression c) { return c == Compression::kInt8 || c == Compression::kInt4; }
// Wires that round what they carry (error feedback has something to keep).
constexpr bool rounding_wire(Compression c) {
  return c == Compression::kBf16 || c == Compression::kFp16 || integer_wire(c);
}
template <>
struct Choices<SyncMode> {
  static constexpr std::array<std::pair<SyncMode, const char*>, 2> table{
      {{SyncMode::kStep, "step"}, {SyncMode::kLocal, "local"}}};
};

template <>
struct Choices<ShardMode> {
  static constexpr std::array<std::pair<ShardMode, const char*>, 3> table{
      {{ShardMode::kNone, "none"}, {ShardMode::kOptimizer, "optimizer"}, {ShardMode::kGradients, "gradients"}}};
};

template <>
struct Choices<BackendKind> {
  static constexpr std::array<std::pair<BackendKind, const char*>, 3> table{
      {{BackendKind::kAuto, "auto"}, {BackendKind::kNccl, "nccl"}, {BackendKind::kGloo, "gloo"}}};
};

template <>
struct Choices<Balance> {
  static constexpr std::array<std::pair<Balance, const char*>, 3> table{
      {{Balance::kEqual, "equal"}, {Balance::kAuto, "auto"}, {Balance::kWeights, "weights"}}};
};

template <>
struct Choices<DropoutRng> {
  static constexpr std::array<std::pair<DropoutRng, const char*>, 2> table{
      {{DropoutRng::kSample, "sample"}, {DropoutRng::kRank, "rank"}}};
};

template <class E>
const char* name_of(E value) {
  for (const auto& [v, name] : Choices<E>::table) {
    if (v == value) return name;
  }
  return "?";
}

// "fp32 | bf16 | fp16 | auto"
template <class E>
std::string choice_list() {
  std::string out;
  for (const auto& [v, name] : Choices<E>::table) out += (out.empty() ? "" : " | ") + std::string(name);
  return out;
}

// The value spelled `text`. Throws ConfigError naming `key`, the text and
// the choices.
template <class E>
E parse_choice(const std::string& key, const std::string& text) {
  for (const auto& [v, name] : Choices<E>::table) {
    if (text == name) return v;
  }
  throw ConfigError(detail::cat(key, " must be one of ", choice_list<E>(), " (got '", text, "')"));
}

}  // namespace cohort
