// loader_bench: how many samples per second the Loader prepares from BERT
// shards (global order, dealing, background workers, collation with dynamic
// padding), to set beside what the trainer consumes. bench/loader_vs_trainer.py
// runs it next to short bert-tiny and bert-small trainings.
//
//   build/bench/loader_bench DATA_DIR [GLOBAL_BATCH=64] [WORKERS=2] [STEPS=200]
//
// prints one JSON line: {"samples_per_s": ..., "first_batch_ms": ..., ...}
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cohort/core/error.hpp"
#include "cohort/data/bert_shards.hpp"
#include "cohort/data/loader.hpp"
#include "cohort/data/order.hpp"

int main(int argc, char** argv) {
  using namespace cohort;
  using Clock = std::chrono::steady_clock;
  if (argc < 2) {
    std::fprintf(stderr, "usage: loader_bench DATA_DIR [GLOBAL_BATCH=64] [WORKERS=2] [STEPS=200]\n");
    return 2;
  }
  try {
    std::string dir = argv[1];
    int64_t batch = argc > 2 ? std::atoll(argv[2]) : 64;
    int workers = argc > 3 ? std::atoi(argv[3]) : 2;
    int64_t steps = argc > 4 ? std::atoll(argv[4]) : 200;
    auto t0 = Clock::now();
    BertShards data(dir, "train");
    GlobalOrder order(data.size(), batch, 1, false);
    LoaderOptions o;
    o.micro_batch = batch;
    o.workers = workers;
    o.prefetch = 8;
    Loader loader(data, order, o, Cursor{});
    loader.next();
    double first_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    auto t1 = Clock::now();
    int64_t samples = 0;
    for (int64_t k = 0; k < steps; ++k) samples += loader.next().global_samples;
    double secs = std::chrono::duration<double>(Clock::now() - t1).count();
    std::printf("{\"samples_per_s\": %.1f, \"first_batch_ms\": %.1f, \"workers\": %d, \"global_batch\": %lld, "
                "\"rows\": %lld}\n",
                static_cast<double>(samples) / secs, first_ms, workers, static_cast<long long>(batch),
                static_cast<long long>(data.size()));
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "loader_bench: error: %s\n", e.what());
    return e.exit_code();
  }
}
