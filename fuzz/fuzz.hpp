// defines: the fuzz targets' entry points, FuzzFile, COHORT_FUZZ_TARGET
//
// Each target feeds arbitrary bytes to one reader of untrusted input. A
// reader may refuse them only with a cohort::Error (what `main` prints as
// one line); a crash, a sanitizer report, a hang or any other exception is
// a finding. With -DCOHORT_FUZZ_MAIN (the COHORT_FUZZ build, clang's
// libFuzzer) every target is its own fuzzer binary; without it the targets
// are plain functions that the test suite replays over fuzz/corpus/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace cohort::fuzz {

int safetensors(const uint8_t* data, size_t size);
int idx(const uint8_t* data, size_t size);
int toml(const uint8_t* data, size_t size);
int vocab(const uint8_t* data, size_t size);
int tokenizer(const uint8_t* data, size_t size);
int state_json(const uint8_t* data, size_t size);
int hdf5_shard(const uint8_t* data, size_t size);

// A scratch file (under /dev/shm when it exists), private to this process
// and target, holding `data`. The readers take paths, as users give them.
class FuzzFile {
 public:
  FuzzFile(const std::string& target, const std::string& name, const uint8_t* data, size_t size);
  ~FuzzFile();  // removes its directory: a replay leaves nothing in /dev/shm
  FuzzFile(const FuzzFile&) = delete;
  FuzzFile& operator=(const FuzzFile&) = delete;
  const std::string& path() const { return path_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_, path_;
};

}  // namespace cohort::fuzz

#ifdef COHORT_FUZZ_MAIN
#define COHORT_FUZZ_TARGET(fn) \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { return cohort::fuzz::fn(data, size); }
#else
#define COHORT_FUZZ_TARGET(fn)
#endif
