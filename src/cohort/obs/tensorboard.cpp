#include "cohort/obs/tensorboard.hpp"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "cohort/core/error.hpp"

namespace cohort {

namespace {

// Protobuf wire format, just what Event needs.
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}
void tag(std::string& out, int field, int wire) { varint(out, (static_cast<uint64_t>(field) << 3) | wire); }
void bytes_field(std::string& out, int field, const std::string& b) {
  tag(out, field, 2);
  varint(out, b.size());
  out += b;
}
template <class T>
void fixed_field(std::string& out, int field, T v) {
  tag(out, field, sizeof(T) == 8 ? 1 : 5);
  char buf[sizeof(T)];
  std::memcpy(buf, &v, sizeof(T));  // little-endian host
  out.append(buf, sizeof(T));
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void add_scalars(const std::string& prefix, const nlohmann::json& obj,
                 std::vector<std::pair<std::string, double>>& out) {
  for (const auto& [key, value] : obj.items()) {
    if (value.is_number()) {
      out.emplace_back(prefix + "/" + key, value.get<double>());
    } else if (value.is_object()) {
      add_scalars(prefix + "/" + key, value, out);
    }
  }
}

}  // namespace

std::vector<std::pair<std::string, double>> tensorboard_scalars(const std::string& prefix,
                                                                 const nlohmann::json& line) {
  std::vector<std::pair<std::string, double>> out;
  nlohmann::json values = line;
  for (const char* where : {"step", "kind", "split", "source"}) values.erase(where);
  // metrics.jsonl keeps one key for the rate and says its unit beside it;
  // a chart is named by what it counts (images_per_s for an image task).
  if (values.contains("unit") && values.contains("tokens_per_s") && values["unit"].is_string()) {
    values[values["unit"].get<std::string>() + "_per_s"] = values["tokens_per_s"];
    if (values["unit"] != "tokens") values.erase("tokens_per_s");
  }
  values.erase("unit");
  add_scalars(prefix, values, out);
  return out;
}

uint32_t crc32c(const void* data, size_t size) {
  static const auto table = [] {
    std::vector<uint32_t> t(256);
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t crc = 0xFFFFFFFFu;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::filesystem::create_directories(dir);
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  // TensorFlow's own form, time.host.pid: a later process (a resume, `cohort
  // eval`) starting in the same second writes a file of its own.
  path_ = dir + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(now_seconds())) + "." + host + "." +
          std::to_string(::getpid());
  out_.open(path_, std::ios::binary | std::ios::app);
  COHORT_CHECK(out_.is_open(), Error, path_, ": cannot open for writing (", std::strerror(errno), ")");
  std::string event;
  fixed_field(event, 1, now_seconds());
  bytes_field(event, 3, "brain.Event:2");
  record(event);
}

void TensorBoardWriter::scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values) {
  if (!out_.is_open()) return;
  std::string summary;
  for (const auto& [name, v] : values) {
    std::string value;
    bytes_field(value, 1, name);
    fixed_field(value, 2, static_cast<float>(v));
    bytes_field(summary, 1, value);
  }
  std::string event;
  fixed_field(event, 1, now_seconds());
  tag(event, 2, 0);
  varint(event, static_cast<uint64_t>(step));
  bytes_field(event, 5, summary);
  record(event);
}

void TensorBoardWriter::record(const std::string& event) {
  char header[12];
  uint64_t len = event.size();
  std::memcpy(header, &len, 8);
  uint32_t len_crc = masked_crc32c(header, 8);
  std::memcpy(header + 8, &len_crc, 4);
  uint32_t data_crc = masked_crc32c(event.data(), event.size());
  out_.write(header, 12);
  out_.write(event.data(), static_cast<std::streamsize>(event.size()));
  out_.write(reinterpret_cast<const char*>(&data_crc), 4);
  errno = 0;
  out_.flush();
  if (!out_.good()) {
    // Like metrics.jsonl: a full disk ends the run with one error naming the
    // file (the next checkpoint could not be written either).
    int err = errno;
    out_.close();
    throw Error(detail::cat(path_, ": write failed (", err ? std::strerror(err) : "disk full?", ")"));
  }
}

}  // namespace cohort
