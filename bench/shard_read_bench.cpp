// shard_read_bench: how fast BertShards serves random batches, and that its
// memory does not grow with the number of shards.
//
//   shard_read_bench [TOTAL_MB=1100] [DIR=$TMPDIR/cohort-shard-bench-cCHUNK] [CHUNK_ROWS] [OPEN_FILES]
//
// CHUNK_ROWS: rows per HDF5 chunk of the written shards; OPEN_FILES: the
// reader's BertShardsOptions::open_files (defaults: the library's).
// Writes DIR/all/train/part-NNNNN.hdf5 (65536 rows of L=128, P=20 each, ids
// drawn Zipf-like so gzip compresses them like real text) until the shards
// hold TOTAL_MB, unless they are there already, and DIR/ten/train with links
// to the first 10. Then, for 10 shards and for all of them, a fresh process
// (so that one measurement's heap does not hide the other's) drops the shards
// from the page cache, opens the split, times the first batch of 32 random
// rows, reads 200 more random batches, then 200 on one thread and 200 on 4
// with the shards in the page cache, and prints VmRSS before and after.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cohort/core/error.hpp"
#include "cohort/data/bert_shards.hpp"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int64_t kRowsPerShard = 65536, kSeqLen = 128, kMaxPred = 20, kVocab = 30522;
constexpr int kBatch = 32, kBatches = 200;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double vm_rss_mb() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return -1;
}

int64_t dir_bytes(const fs::path& dir) {
  int64_t total = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file(ec)) total += static_cast<int64_t>(e.file_size(ec));
  return total;
}

// Rows like BERT's: mostly full length, a tenth shorter; [CLS] A [SEP] B
// [SEP]; Zipf-like word pieces (log-uniform rank over the vocabulary); 15% of
// the tokens masked, at most P, positions ascending and 0-padded.
cohort::BertRows random_rows(std::mt19937_64& rng, int64_t n) {
  cohort::BertRows r;
  r.seq_len = kSeqLen;
  r.max_predictions = kMaxPred;
  std::uniform_real_distribution<double> u(0, 1);
  auto word = [&] {
    return static_cast<int32_t>(std::min<double>(kVocab - 1, 998 + std::exp(u(rng) * std::log(kVocab - 998.0))));
  };
  r.input_ids.reserve(static_cast<size_t>(n * kSeqLen));
  for (int64_t i = 0; i < n; ++i) {
    int64_t len = u(rng) < 0.9 ? kSeqLen : 8 + static_cast<int64_t>(u(rng) * (kSeqLen - 8));
    int64_t sep = 1 + static_cast<int64_t>(u(rng) * static_cast<double>(len - 3));
    for (int64_t j = 0; j < kSeqLen; ++j) {
      int32_t id = j >= len ? 0 : j == 0 ? 101 : (j == sep || j == len - 1) ? 102 : word();
      r.input_ids.push_back(id);
      r.input_mask.push_back(j < len ? 1 : 0);
      r.segment_ids.push_back(j > sep && j < len ? 1 : 0);
    }
    std::vector<int32_t> pos;
    for (int64_t j = 1; j < len - 1 && static_cast<int64_t>(pos.size()) < kMaxPred; ++j)
      if (j != sep && u(rng) < 0.15) pos.push_back(static_cast<int32_t>(j));
    for (int64_t k = 0; k < kMaxPred; ++k) {
      bool real = k < static_cast<int64_t>(pos.size());
      r.masked_lm_positions.push_back(real ? pos[static_cast<size_t>(k)] : 0);
      r.masked_lm_ids.push_back(real ? word() : 0);
    }
    r.next_sentence_labels.push_back(u(rng) < 0.5 ? 1 : 0);
  }
  return r;
}

void generate(const fs::path& root, int64_t total_mb, const cohort::BertShardWriteOptions& w) {
  const fs::path all = root / "all/train", ten = root / "ten/train";
  if (dir_bytes(all) >= total_mb * 1000000) {
    std::printf("reusing %s: %.0f MB\n", all.c_str(), dir_bytes(all) / 1e6);
  } else {
    fs::remove_all(root);
    fs::create_directories(all);
    std::mt19937_64 rng(2024);
    auto t0 = Clock::now();
    int shards = 0;
    while (dir_bytes(all) < total_mb * 1000000) {
      char name[32];
      std::snprintf(name, sizeof name, "part-%05d.hdf5", shards++);
      cohort::write_bert_shard((all / name).string(), random_rows(rng, kRowsPerShard), w);
      std::printf("\rwrote %d shards, %.0f MB", shards, dir_bytes(all) / 1e6);
      std::fflush(stdout);
    }
    std::printf(" in %.1f s\n", seconds_since(t0));
  }
  fs::remove_all(root / "ten");
  fs::create_directories(ten);
  auto files = cohort::shard_files((root / "all").string(), "train");
  for (size_t i = 0; i < files.size() && i < 10; ++i)
    fs::create_symlink(files[i], ten / fs::path(files[i]).filename());
}

// Writes back and evicts the shards from the page cache, so the first batch
// pays for real reads (as on a fresh node), not memory copies.
void drop_page_cache(const std::vector<std::string>& files) {
  for (const auto& f : files) {
    int fd = ::open(f.c_str(), O_RDONLY);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

std::vector<int64_t> random_batch(std::mt19937_64& rng, int64_t n) {
  std::vector<int64_t> b(kBatch);
  for (auto& i : b) i = static_cast<int64_t>(rng() % static_cast<uint64_t>(n));
  return b;
}

// Rows per second reading kBatches random batches on `threads` threads.
double random_rows_per_s(const cohort::BertShards& ds, int threads, uint64_t seed) {
  auto t0 = Clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::mt19937_64 rng(seed + static_cast<uint64_t>(t));
      for (int i = t; i < kBatches; i += threads) ds.get_batch(random_batch(rng, ds.size()));
    });
  }
  for (auto& t : pool) t.join();
  return kBatches * kBatch / seconds_since(t0);
}

void read_through(const std::vector<std::string>& files) {
  std::vector<char> buf(1 << 20);
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    while (in.read(buf.data(), static_cast<std::streamsize>(buf.size()))) {
    }
  }
}

int measure(const std::string& dir, const cohort::BertShardsOptions& opts) {
  const auto files = cohort::shard_files(dir, "train");
  drop_page_cache(files);
  const double rss0 = vm_rss_mb();
  auto t0 = Clock::now();
  cohort::BertShards ds(dir, "train", opts);
  const double open_s = seconds_since(t0);
  std::mt19937_64 rng(7);
  ds.get_batch(random_batch(rng, ds.size()));
  const double first_s = seconds_since(t0);
  const double rss1 = vm_rss_mb();
  const double cold = random_rows_per_s(ds, 1, 1);
  read_through(files);
  const double warm1 = random_rows_per_s(ds, 1, 2), warm4 = random_rows_per_s(ds, 4, 3);
  const double rss2 = vm_rss_mb();

  std::printf("%s\n", ds.describe().c_str());
  std::printf("  open %.0f ms, first batch of %d ready %.0f ms after the start (cold page cache)\n", open_s * 1e3,
              kBatch, first_s * 1e3);
  std::printf("  %d random batches: %.0f rows/s cold on 1 thread; files in the page cache: %.0f rows/s on 1 thread, "
              "%.0f on 4\n",
              kBatches, cold, warm1, warm4);
  std::printf("  VmRSS %.0f MB before, %.0f MB after the first batch, %.0f MB after %d batches\n", rss0, rss1, rss2,
              3 * kBatches + 1);
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  cohort::BertShardsOptions read;
  if (argc == 4 && std::string(argv[1]) == "--measure") {
    read.open_files = std::stoll(argv[3]);
    return measure(argv[2], read);
  }
  const int64_t total_mb = argc > 1 ? std::stoll(argv[1]) : 1100;
  cohort::BertShardWriteOptions w;
  if (argc > 3) w.chunk_rows = std::stoll(argv[3]);
  if (argc > 4) read.open_files = std::stoll(argv[4]);
  const fs::path root = argc > 2 ? fs::path(argv[2])
                                 : fs::temp_directory_path() / ("cohort-shard-bench-c" + std::to_string(w.chunk_rows));
  std::printf("shards of %lld rows, L=%lld, P=%lld, %lld rows per chunk; reading with %lld files open\n",
              static_cast<long long>(kRowsPerShard), static_cast<long long>(kSeqLen), static_cast<long long>(kMaxPred),
              static_cast<long long>(w.chunk_rows), static_cast<long long>(read.open_files));
  generate(root, total_mb, w);
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  for (const char* which : {"ten", "all"}) {
    std::fflush(stdout);
    std::string cmd = self + " --measure " + (root / which).string() + " " + std::to_string(read.open_files);
    if (std::system(cmd.c_str()) != 0) return 1;
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "shard_read_bench: error: %s\n", e.what());
  return 1;
}
