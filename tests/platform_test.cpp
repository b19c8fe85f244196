// The platform Cohort builds on: libtorch 2.x from the PyPI wheel, with the
// Gloo inside it as the only Gloo. Cohort compiles ProcessGroupGloo.hpp
// against Debian's (older) Gloo headers, which is sound only while no Gloo
// code of its own is compiled in and no libgloo is loaded beside libtorch's.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <torch/version.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "cohort/distributed/comm.hpp"
#include "helpers.hpp"
#include "thread_world.hpp"

using namespace cohort;
namespace fs = std::filesystem;

namespace {

std::set<std::string> mapped_files() {
  std::ifstream maps("/proc/self/maps");
  std::set<std::string> files;
  for (std::string line; std::getline(maps, line);) {
    auto slash = line.find('/');
    if (slash != std::string::npos) files.insert(line.substr(slash));
  }
  return files;
}

}  // namespace

TEST(Platform, LibtorchIsTwoX) {
  EXPECT_GE(TORCH_VERSION_MAJOR, 2) << TORCH_VERSION;
  // The headers compiled against are the library loaded.
  auto files = mapped_files();
  bool wheel = false;
  for (const auto& f : files) wheel = wheel || f.find("torch/lib/libtorch_cpu.so") != std::string::npos;
  EXPECT_TRUE(wheel) << "libtorch_cpu.so is not loaded from a torch install's lib/";
}

TEST(Platform, OneGlooOnlyTheOneInsideLibtorch) {
  test::spawn_world(2, [&](Comm& comm) {
    int rank = comm.rank();
    auto t = torch::full({4}, static_cast<double>(rank + 1));
    comm.all_reduce_sum(t);
    EXPECT_TRUE(t.eq(3).all().item<bool>());
  });
  // A process group ran; no library named gloo was loaded for it...
  for (const auto& f : mapped_files()) EXPECT_EQ(f.find("gloo"), std::string::npos) << f;
  // ...and Gloo's own functions resolve into libtorch.
  void* fn = dlsym(RTLD_DEFAULT, "_ZN4gloo10allgathervERNS_17AllgathervOptionsE");  // gloo::allgatherv
  ASSERT_NE(fn, nullptr);
  Dl_info info{};
  ASSERT_NE(dladdr(fn, &info), 0);
  EXPECT_NE(std::string(info.dli_fname).find("libtorch_cpu.so"), std::string::npos) << info.dli_fname;
}

// Nothing of Gloo is compiled into Cohort: a function, vtable or typeinfo of
// the older headers' classes (Gloo's own, or c10d's GlooStore, whose virtuals
// depend on the Gloo version) would shadow or disagree with libtorch's.
TEST(Platform, NoGlooCodeInTheBinaries) {
  test::TempDir tmp;
  for (std::string bin : {std::string(COHORT_BIN), fs::read_symlink("/proc/self/exe").string()}) {
    std::string cmd = "nm -C --defined-only '" + bin + "' > " + (tmp / "syms");
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    std::ifstream in(tmp / "syms");
    int lines = 0;
    for (std::string line; std::getline(in, line); ++lines) {
      // "ADDR T name": the name starts after the type letter.
      auto name = line.size() > 19 ? line.substr(19) : line;
      for (const char* bad : {"gloo::", "vtable for gloo::", "typeinfo for gloo::", "VTT for gloo::",
                              "vtable for c10d::ProcessGroupGloo", "typeinfo for c10d::ProcessGroupGloo"}) {
        EXPECT_NE(name.rfind(bad, 0), 0u) << bin << ": " << line;
      }
      EXPECT_EQ(name.find("GlooStore"), std::string::npos) << bin << ": " << line;
    }
    EXPECT_GT(lines, 1000) << bin;  // nm read the real binary
  }
}
