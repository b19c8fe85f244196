// defines: on_main_then_agree, on_each_then_agree, shared_config_fingerprint, agree_startup, StartPoint, agree_start_point
//
// What the ranks check with one another before training, so that ranks
// started differently fail at once, naming the key, the rank and the value,
// instead of drifting apart or hanging inside a collective later. Every
// function here is collective unless said otherwise: every rank calls it, in
// the same order.
#pragma once

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "cohort/config/choice.hpp"
#include "cohort/core/error.hpp"
#include "cohort/distributed/comm.hpp"

namespace cohort {

// Work only rank 0 does ahead of a collective: if it fails there, every
// rank fails now (rank 0 with its own error, the others with its message
// and exit code) instead of waiting out dist.timeout in the next collective.
namespace detail {
// Runs `fn`; on an exception keeps it in `error` and its message in
// `message`, and returns its exit code.
template <class Fn>
int run_keeping_error(Fn& fn, std::exception_ptr& error, std::string& message) {
  try {
    fn();
    return 0;
  } catch (const Error& e) {
    error = std::current_exception();
    message = first_line(e.what());
    return e.exit_code();
  } catch (const std::exception& e) {  // c10::Error's backtrace stays with its own rank
    error = std::current_exception();
    message = first_line(e.what());
    return 1;
  } catch (...) {
    error = std::current_exception();
    return 1;
  }
}
}  // namespace detail

template <class Fn>
void on_main_then_agree(Comm& comm, const char* what, Fn fn) {
  std::exception_ptr error;
  std::string message;
  // rank 0's exit code: every rank exits with it
  int code = comm.world().is_main() ? detail::run_keeping_error(fn, error, message) : 0;
  double failed = comm.all_reduce_sum(std::vector<double>{static_cast<double>(code)}, what)[0];
  if (failed == 0) return;
  comm.broadcast_bytes(message, 0, what);
  if (error) std::rethrow_exception(error);
  throw Error(message.empty() ? detail::cat("rank 0 failed in the ", what)
                              : message.rfind("rank ", 0) == 0 ? message : detail::cat("rank 0: ", message),
              static_cast<int>(failed));
}

// Work every rank does ahead of a collective (each writes its own file):
// when any fails, every rank fails now, the failing ones with their own
// error and the others with the first failing rank's.
template <class Fn>
void on_each_then_agree(Comm& comm, const char* what, Fn fn) {
  std::exception_ptr error;
  std::string message;
  int code = detail::run_keeping_error(fn, error, message);
  std::vector<double> codes(comm.size(), 0.0);
  codes[comm.rank()] = code;
  codes = comm.all_reduce_sum(codes, what);
  for (int r = 0; r < comm.size(); ++r) {
    if (codes[r] == 0) continue;
    std::string cause = r == comm.rank() ? message : std::string();
    comm.broadcast_bytes(cause, r, what);
    if (error) std::rethrow_exception(error);
    throw Error(cause.empty() ? detail::cat("rank ", r, " failed in the ", what)
                              : cause.rfind("rank ", 0) == 0 ? cause : detail::cat("rank ", r, ": ", cause),
                static_cast<int>(codes[r]));
  }
  if (error) std::rethrow_exception(error);
}

// The shared config's fingerprint (16 hex digits): equal on the ranks and
// nodes of one job, whatever their per-node keys. Not collective.
std::string shared_config_fingerprint(const std::string& config_toml);

// First thing in a run: every shared config key is compared (a difference
// names the key, the ranks and this rank's value: ConfigError), and
// train.precision is resolved: auto follows each machine's CPU, so bf16 only
// where every rank has it. Every multi-rank CPU job runs the precision
// collective, whatever its setting, so ranks started with different configs
// still meet the config check.
Precision agree_startup(Comm& comm, const std::string& config_toml, Precision requested);

// Where a run starts, once model, data and state are built: every rank
// must hold the same.
struct StartPoint {
  std::string out_dir;      // each rank resumes from what it finds here
  std::string config_toml;  // the run's config
  int64_t step = 0;
  int64_t train_samples = 0;
  int64_t total_steps = 0;
  std::vector<int64_t> shares;  // data.balance's split of a global batch
};
void agree_start_point(Comm& comm, const StartPoint& p);

}  // namespace cohort
