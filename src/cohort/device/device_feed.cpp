#include "cohort/device/device_feed.hpp"

#ifdef USE_C10D_NCCL
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "cohort/core/error.hpp"
#include "cohort/device/host_read.hpp"

namespace cohort {

#ifdef USE_C10D_NCCL

struct DeviceFeed::Stream {
  explicit Stream(const c10::Device& device) : side(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index())) {}
  c10::cuda::CUDAStream side;
};

DeviceFeed::DeviceFeed(const c10::Device& device) : device_(device) {
  if (device.is_cuda()) stream_ = std::make_unique<Stream>(device);
}

DeviceFeed::~DeviceFeed() = default;

std::vector<DeviceFeed::Batch> DeviceFeed::stage(const std::vector<Batch>& batches) {
  if (!stream_) {
    std::vector<Batch> out;
    out.reserve(batches.size());
    for (const auto& b : batches) {
      Batch moved;
      for (const auto& [name, t] : b) moved[name] = t.to(device_);
      out.push_back(std::move(moved));
    }
    return out;
  }
  c10::cuda::CUDAGuard guard(device_);
  auto compute = c10::cuda::getCurrentCUDAStream(device_.index());
  // The copies do not wait for the compute stream's queued work: that is
  // the overlap. Memory allocated on the side stream comes from its own
  // pool in the caching allocator, never from blocks the compute stream
  // may still use.
  std::vector<Batch> out(batches.size());
  {
    c10::cuda::CUDAStreamGuard on_side(stream_->side);
    for (size_t i = 0; i < batches.size(); ++i) {
      for (const auto& [name, t] : batches[i]) {
        auto host = t.is_pinned() ? t : t.pin_memory();
        out[i][name] = host.to(device_, /*non_blocking=*/true);
      }
    }
  }
  at::cuda::CUDAEvent copied;
  copied.record(stream_->side);
  copied.block(compute);
  for (auto& b : out) {
    for (auto& [name, t] : b) c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), compute);
  }
  staged_ += static_cast<int64_t>(batches.size());
  return out;
}

struct ComputeClock::Events {
  std::vector<std::pair<at::cuda::CUDAEvent, at::cuda::CUDAEvent>> spans;
  c10::Device device;
};

ComputeClock::ComputeClock(const c10::Device& device) {
  if (device.is_cuda()) events_.reset(new Events{{}, device});
}

ComputeClock::~ComputeClock() = default;

void ComputeClock::start() {
  if (!events_) {
    began_ = std::chrono::steady_clock::now();
    return;
  }
  auto& span = events_->spans.emplace_back(at::cuda::CUDAEvent(cudaEventDefault), at::cuda::CUDAEvent(cudaEventDefault));
  span.first.record(c10::cuda::getCurrentCUDAStream(events_->device.index()));
}

void ComputeClock::stop() {
  if (!events_) {
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - began_).count();
    return;
  }
  COHORT_CHECK(!events_->spans.empty(), Error, "ComputeClock::stop without start");
  events_->spans.back().second.record(c10::cuda::getCurrentCUDAStream(events_->device.index()));
}

double ComputeClock::take() {
  double s = seconds_;
  seconds_ = 0;
  if (!events_ || events_->spans.empty()) return s;
  count_host_wait();
  events_->spans.back().second.synchronize();
  for (auto& [a, b] : events_->spans) s += a.elapsed_time(b) / 1e3;
  events_->spans.clear();
  return s;
}

void ComputeClock::discard() {
  seconds_ = 0;
  if (events_) events_->spans.clear();
}

#else  // a build without CUDA: the CPU path only

struct DeviceFeed::Stream {};
DeviceFeed::DeviceFeed(const c10::Device& device) : device_(device) {
  COHORT_CHECK(!device.is_cuda(), Error, "this Cohort was built without CUDA");
}
DeviceFeed::~DeviceFeed() = default;
std::vector<DeviceFeed::Batch> DeviceFeed::stage(const std::vector<Batch>& batches) { return batches; }

struct ComputeClock::Events {};
ComputeClock::ComputeClock(const c10::Device&) {}
ComputeClock::~ComputeClock() = default;
void ComputeClock::start() { began_ = std::chrono::steady_clock::now(); }
void ComputeClock::stop() {
  seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - began_).count();
}
double ComputeClock::take() {
  double s = seconds_;
  seconds_ = 0;
  return s;
}
void ComputeClock::discard() { seconds_ = 0; }

#endif

}  // namespace cohort
