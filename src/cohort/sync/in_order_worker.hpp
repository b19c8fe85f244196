// defines: InOrderWorker
//
// One thread that runs the tasks given to it strictly in the order given.
// A reduction that needs several collectives in a row per bucket, with
// arithmetic between them (PowerSGD), or a sink after its sum (reduce to
// owner), runs there while backward goes on; bucket order is kept, so every
// rank issues the same collectives in the same order.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace cohort {

class InOrderWorker {
 public:
  InOrderWorker();
  ~InOrderWorker();
  InOrderWorker(const InOrderWorker&) = delete;
  InOrderWorker& operator=(const InOrderWorker&) = delete;

  // Runs `task` after every task pushed before it. After a task throws, the
  // ones that follow until finish() are skipped (only counted).
  void push(std::function<void()> task);
  // Blocks until at most `n` of the tasks pushed are unfinished.
  void wait_unfinished_at_most(size_t n);
  // Waits for every task pushed, then rethrows the first error since the
  // last finish().
  void finish();

 private:
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  size_t pushed_ = 0;
  size_t done_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: starts once the rest is built
};

}  // namespace cohort
