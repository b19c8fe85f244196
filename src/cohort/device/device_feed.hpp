// defines: DeviceFeed, ComputeClock
//
// What a GPU needs so that the host never waits for it in a step: batches
// copied ahead of use, and compute timed by events. The CUDA specifics live
// in device_feed.cpp; on a CPU both classes take the plain path (a batch is
// already where it is used; work is done when the call returns).
#pragma once

#include <c10/core/Device.h>
#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace cohort {

// Copies batches to the device ahead of their use. stage() returns at once:
// on a GPU the copies run on a side stream, from page-locked memory (a batch
// not page-locked is locked first), while the compute stream still works on
// the step before; the compute stream waits for them on an event (the host
// does not), and each tensor is recorded on it, so that its memory is not
// reused while the step reads it. On a CPU, stage() returns the batches.
class DeviceFeed {
 public:
  using Batch = std::map<std::string, torch::Tensor>;
  explicit DeviceFeed(const c10::Device& device);
  ~DeviceFeed();
  DeviceFeed(const DeviceFeed&) = delete;
  DeviceFeed& operator=(const DeviceFeed&) = delete;

  std::vector<Batch> stage(const std::vector<Batch>& batches);
  // Batches that went through the side stream (0 on a CPU).
  int64_t staged() const { return staged_; }

  struct Stream;

 private:
  c10::Device device_;
  std::unique_ptr<Stream> stream_;  // null on a CPU
  int64_t staged_ = 0;
};

// Seconds of forward and backward (data.balance = auto) without making the
// host wait: on a GPU, events recorded around each span, read only when
// take() is called (one counted host wait, at the balance interval); on a
// CPU, whose work is done when each call returns, the wall clock.
class ComputeClock {
 public:
  explicit ComputeClock(const c10::Device& device);
  ~ComputeClock();
  ComputeClock(const ComputeClock&) = delete;
  ComputeClock& operator=(const ComputeClock&) = delete;

  void start();
  void stop();
  // The seconds of every start-stop span since the last take() or discard().
  double take();
  // Forgets the spans since the last take() (a warm-up step), reading nothing.
  void discard();

  struct Events;

 private:
  std::unique_ptr<Events> events_;  // null on a CPU
  std::chrono::steady_clock::time_point began_;
  double seconds_ = 0;
};

}  // namespace cohort
