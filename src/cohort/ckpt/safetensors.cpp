#include "cohort/ckpt/safetensors.hpp"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "cohort/core/error.hpp"
#include "cohort/core/files.hpp"
#include "cohort/core/json_fields.hpp"

namespace cohort {

namespace {

const std::vector<std::pair<std::string, torch::ScalarType>>& dtypes() {
  static const std::vector<std::pair<std::string, torch::ScalarType>> d = {
      {"F64", torch::kFloat64}, {"F32", torch::kFloat32}, {"F16", torch::kFloat16}, {"BF16", torch::kBFloat16},
      {"I64", torch::kInt64},   {"I32", torch::kInt32},   {"I16", torch::kInt16},   {"I8", torch::kInt8},
      {"U8", torch::kUInt8},    {"BOOL", torch::kBool}};
  return d;
}

std::string dtype_name(torch::ScalarType t) {
  for (const auto& [name, type] : dtypes())
    if (type == t) return name;
  throw Error(detail::cat("safetensors: dtype ", c10::toString(t), " is not supported"));
}

}  // namespace

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<torch::Tensor> data;
  int64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    auto c = t.detach().to(torch::kCPU).contiguous();
    int64_t bytes = c.numel() * static_cast<int64_t>(c.element_size());
    header[name] = {{"dtype", dtype_name(c.scalar_type())}, {"shape", c.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    data.push_back(c);
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // align the data to 8 bytes
  uint64_t n = text.size();
  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>(n >> (8 * i));
  std::vector<std::string_view> parts = {std::string_view(len, 8), text};
  for (const auto& c : data) {
    parts.emplace_back(static_cast<const char*>(c.data_ptr()), static_cast<size_t>(c.numel() * c.element_size()));
  }
  write_file_durably(path, parts);  // names the file and the reason on failure
}

SafetensorsFile load_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  COHORT_CHECK(in.good(), DataError, path, ": cannot open (", std::strerror(errno), ")");
  const int64_t file_size = static_cast<int64_t>(in.tellg());
  in.seekg(0);
  COHORT_CHECK(file_size >= 8, DataError, path, ": truncated: ", file_size, " bytes, too short for a safetensors header");
  unsigned char len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(len[i]) << (8 * i);
  COHORT_CHECK(n <= static_cast<uint64_t>(file_size - 8) && n < (uint64_t(1) << 31), DataError, path,
               ": header length ", n, " does not fit in a ", file_size, "-byte file (truncated or not safetensors)");
  std::string text(n, '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw DataError(detail::cat(path, ": header is not valid JSON (", e.what(), ")"));
  }
  COHORT_CHECK(header.is_object(), DataError, path, ": header is not a JSON object");
  const int64_t data_size = file_size - 8 - static_cast<int64_t>(n);
  std::string blob(static_cast<size_t>(data_size), '\0');
  in.read(blob.data(), data_size);
  COHORT_CHECK(in.good() || in.eof(), DataError, path, ": read failed");

  SafetensorsFile out;
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      for (auto& [k, v] : entry.items()) out.metadata[k] = v.is_string() ? v.get<std::string>() : v.dump();
      continue;
    }
    try {
      std::string dtype = entry.at("dtype").get<std::string>();
      const std::string field = detail::cat(path, ": tensor '", name, "': ");
      auto shape = json_ints(entry.at("shape"), field + "shape");
      auto offsets = json_ints(entry.at("data_offsets"), field + "data_offsets");
      torch::ScalarType type = torch::kFloat32;
      bool known = false;
      for (const auto& [dn, dt] : dtypes())
        if (dn == dtype) type = dt, known = true;
      COHORT_CHECK(known, DataError, path, ": tensor '", name, "' has unsupported dtype ", dtype);
      // Overflow-checked (found by fuzz/: a shape of 2^62 x 4 wrapped around).
      int64_t bytes = static_cast<int64_t>(c10::elementSize(type));
      for (int64_t d : shape) {
        COHORT_CHECK(d >= 0, DataError, path, ": tensor '", name, "' has a negative dimension");
        COHORT_CHECK(!__builtin_mul_overflow(bytes, d, &bytes), DataError, path, ": tensor '", name,
                     "' has an impossible shape (its size overflows)");
      }
      COHORT_CHECK(offsets.size() == 2 && offsets[0] >= 0 && offsets[1] >= offsets[0] &&
                       offsets[1] - offsets[0] == bytes && offsets[1] <= data_size,
                   DataError, path, ": tensor '", name, "' has data_offsets outside the file or not matching its "
                   "shape (file truncated?)");
      auto t = torch::empty(shape, torch::TensorOptions().dtype(type));
      if (bytes > 0) std::memcpy(t.data_ptr(), blob.data() + offsets[0], static_cast<size_t>(bytes));
      out.tensors[name] = t;
    } catch (const nlohmann::json::exception& e) {
      throw DataError(detail::cat(path, ": tensor '", name, "' has a malformed header entry (", e.what(), ")"));
    }
  }
  return out;
}

}  // namespace cohort
