#include "cohort/sync/in_order_worker.hpp"

#include <utility>

namespace cohort {

InOrderWorker::InOrderWorker() : thread_([this] { run(); }) {}

InOrderWorker::~InOrderWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void InOrderWorker::push(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
    ++pushed_;
  }
  cv_.notify_all();
}

void InOrderWorker::wait_unfinished_at_most(size_t n) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return pushed_ - done_ <= n; });
}

void InOrderWorker::finish() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_ == pushed_; });
  auto error = std::exchange(error_, nullptr);
  if (error) std::rethrow_exception(error);
}

void InOrderWorker::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    auto task = std::move(queue_.front());
    queue_.pop_front();
    bool failed = error_ != nullptr;
    lock.unlock();
    if (!failed) {
      try {
        task();
      } catch (...) {
        lock.lock();
        error_ = std::current_exception();
        lock.unlock();
      }
    }
    task = nullptr;  // what it held (a bucket's wire buffer) is freed before the next
    lock.lock();
    ++done_;
    cv_.notify_all();
  }
}

}  // namespace cohort
