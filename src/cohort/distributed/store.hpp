// defines: open_tcp_store
#pragma once

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <string>

namespace cohort {

// A c10d TCPStore at host:port: the server when `server` (port 0 picks a free
// port; getPort() tells which), else a client that retries until `timeout`.
inline c10::intrusive_ptr<c10d::TCPStore> open_tcp_store(const std::string& host, int port, bool server,
                                                         std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(port);
  so.isServer = server;
  so.waitWorkers = false;
  so.timeout = timeout;
  return c10::make_intrusive<c10d::TCPStore>(host, so);
}

}  // namespace cohort
