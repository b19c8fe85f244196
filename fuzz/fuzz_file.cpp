#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "fuzz.hpp"

namespace cohort::fuzz {

FuzzFile::FuzzFile(const std::string& target, const std::string& name, const uint8_t* data, size_t size) {
  namespace fs = std::filesystem;
  fs::path root = fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
  dir_ = (root / ("cohort-fuzz-" + target + "-" + std::to_string(getpid()))).string();
  fs::path file = fs::path(dir_) / name;
  fs::create_directories(file.parent_path());
  path_ = file.string();
  std::ofstream(path_, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data),
                                                                  static_cast<std::streamsize>(size));
}

FuzzFile::~FuzzFile() {
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

}  // namespace cohort::fuzz
