// A world of n ranks as threads of this test process, over an in-memory
// store (as gloo's BaseTest::spawn): no port to pick, no file to share.
#pragma once

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <chrono>

#include "cohort/distributed/comm.hpp"
#include "helpers.hpp"

namespace cohort::test {

// Runs fn(comm) on n threads, one per rank of a Gloo world over a HashStore,
// and rethrows the first failure (by rank order) after every rank is done.
template <class Fn>
void spawn_world(int n, Fn fn, std::chrono::seconds timeout = std::chrono::seconds(30)) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  spawn(n, [&](int rank) {
    World w;
    w.rank = w.local_rank = rank;
    w.world_size = w.local_world_size = n;
    RankSpec spec;
    spec.rank = spec.local_rank = rank;
    spec.world_size = spec.local_world_size = n;
    CommOptions o;
    o.timeout = timeout;
    o.device = DeviceKind::kCpu;
    auto comm = Comm::form(w, spec, o, store, /*link=*/nullptr);
    fn(*comm);
  });
}

}  // namespace cohort::test
