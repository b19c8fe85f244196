#include <algorithm>
#include <filesystem>

#include "cohort/core/error.hpp"
#include "cohort/data/bert_shards.hpp"

namespace cohort {

namespace {

namespace fs = std::filesystem;

bool is_shard_name(const fs::path& p) { return p.extension() == ".hdf5" || p.extension() == ".h5"; }

std::vector<std::string> listing(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    names.push_back(e.path().filename().string() + (e.is_directory(ec) ? "/" : ""));
  }
  std::sort(names.begin(), names.end());
  constexpr size_t kShown = 12;
  if (names.size() > kShown) {
    size_t more = names.size() - kShown;
    names.resize(kShown);
    names.push_back(detail::cat("... ", more, " more"));
  }
  return names;
}

}  // namespace

std::vector<std::string> shard_files(const std::string& dir, const std::string& split) {
  std::error_code ec;
  COHORT_CHECK(fs::is_directory(dir, ec), DataError, dir, ": no such directory (looking for the '", split,
               "' shards). Is data.path right?");
  COHORT_CHECK(!split.empty(), DataError, dir, ": no split name given");
  const fs::path sub = fs::path(dir) / split;
  const bool nested = fs::is_directory(sub, ec);
  std::vector<std::string> names = {split};
  if (split == "train") names.push_back("training");

  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(nested ? sub : fs::path(dir), ec)) {
    if (!e.is_regular_file(ec) || !is_shard_name(e.path())) continue;
    const std::string name = e.path().filename().string();
    bool match = nested || std::any_of(names.begin(), names.end(), [&](const std::string& s) {
                   return name.find(s) != std::string::npos;
                 });
    if (match) out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  if (out.empty()) {
    const fs::path shown = nested ? sub : fs::path(dir);
    auto has = listing(shown);
    throw DataError(detail::cat("no '", split, "' shards under ", dir, ": expected ", (fs::path(dir) / split).string(),
                                "/*.hdf5 or ", dir, "/*", split, "*.hdf5; ", shown.string(), " has: ",
                                has.empty() ? std::string("nothing") : detail::join(has, ", ")));
  }
  return out;
}

}  // namespace cohort
