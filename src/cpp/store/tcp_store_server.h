#pragma once

#include <cstdint>
#include <memory>

#include <ringtree/store/tcp_store.h>

#include "common/socket.h"

namespace ringtree {

// The server behind TcpStore: holds the key/value map and serves any number of clients
// from ONE background thread running an epoll loop over non-blocking sockets (protocol in
// store/tcp_store_protocol.h).
//
// A blocked get/wait never blocks the loop: the request is parked on the first key it
// misses and re-checked when that key is written; the loop sleeps until the nearest
// deadline and answers kTimeout there. A malformed, truncated, oversized or
// unauthenticated frame closes that one connection (logged at debug level); a peer that
// never completes the handshake is dropped after a grace period.
//
// Threading: the constructor starts the loop thread; every public method may be called
// from any thread. The destructor stops the loop, joins the thread and closes every
// connection (clients then see the connection closed).
class TcpStoreServer {
 public:
  // Listens on options.bindAddress:options.port (port 0: the kernel picks; see port()) and
  // starts the loop. Uses options.token exactly as given (empty: no token; the caller
  // resolves RINGTREE_STORE_TOKEN) and options.maxMessageBytes as the request size limit.
  // Throws NetworkError when it cannot listen.
  explicit TcpStoreServer(const TcpStoreOptions& options);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  // The port actually bound.
  uint16_t port() const;

  // Connections that completed the handshake and are still open.
  int numClients() const;

  // Blocks until `count` connections have completed the handshake since the server
  // started (connections closed since then included) or deadline passes; returns
  // whether the count was reached. Returns false at once after stop().
  bool waitForClients(int count, net::Deadline deadline) const;

  // Number of connections that have completed the handshake since the server started.
  int64_t totalClients() const;

  // Stops the loop and closes every connection. Idempotent; also done by the destructor.
  void stop();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ringtree
