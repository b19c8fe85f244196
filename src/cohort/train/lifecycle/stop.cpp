#include "cohort/train/lifecycle/stop.hpp"

#include <signal.h>

#include <atomic>

namespace cohort {

namespace {
// Signal handlers can reach only globals; this flag is the one exception.
std::atomic<int> g_stop{0};

void on_signal(int sig) {
  g_stop.store(sig);
  signal(sig, SIG_DFL);  // a second signal acts at once
}
}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

bool stop_requested() { return g_stop.load() != 0; }
void request_stop() { g_stop.store(SIGTERM); }
int stop_signal() { return g_stop.load(); }

}  // namespace cohort
