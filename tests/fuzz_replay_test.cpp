// The fuzz targets (fuzz/) replayed over their corpora, fuzz/corpus/<target>/:
// the seeds and every input a fuzzing run found worth keeping. Each must be
// read or refused with a cohort::Error; a crash, a sanitizer report or
// another exception fails the suite. This is the short smoke run CI does;
// the fuzzing itself needs clang (fuzz/CMakeLists.txt).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "fuzz.hpp"

namespace {

struct Target {
  const char* name;
  int (*fn)(const uint8_t*, size_t);
};

class FuzzCorpus : public testing::TestWithParam<Target> {};

TEST_P(FuzzCorpus, EveryInputIsReadOrRefused) {
  namespace fs = std::filesystem;
  fs::path dir = fs::path(COHORT_SOURCE_DIR) / "fuzz" / "corpus" / GetParam().name;
  ASSERT_TRUE(fs::is_directory(dir)) << dir;
  size_t inputs = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::ifstream in(e.path(), std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    SCOPED_TRACE(e.path().string());
    EXPECT_NO_THROW(GetParam().fn(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
    ++inputs;
  }
  EXPECT_GE(inputs, 3u) << "the corpus of " << GetParam().name << " is missing its seeds";
  // And the edge cases no corpus needs to hold.
  for (std::string s : {std::string(), std::string(1, '\0'), std::string(4096, '\xff')})
    EXPECT_NO_THROW(GetParam().fn(reinterpret_cast<const uint8_t*>(s.data()), s.size()));
}

INSTANTIATE_TEST_SUITE_P(Fuzz, FuzzCorpus,
                         testing::Values(Target{"safetensors", cohort::fuzz::safetensors},
                                         Target{"idx", cohort::fuzz::idx}, Target{"toml", cohort::fuzz::toml},
                                         Target{"vocab", cohort::fuzz::vocab},
                                         Target{"tokenizer", cohort::fuzz::tokenizer},
                                         Target{"state_json", cohort::fuzz::state_json},
                                         Target{"hdf5_shard", cohort::fuzz::hdf5_shard}),
                         [](const testing::TestParamInfo<Target>& info) { return std::string(info.param.name); });

}  // namespace
