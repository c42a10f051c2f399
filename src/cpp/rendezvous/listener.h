#pragma once

#include <cstdint>
#include <string>

#include "common/socket.h"

// Which address a rank's TCP listener binds, and which it publishes for its peers.
namespace ringtree::rendezvous {

// A listening TCP socket on a port the kernel chose, and the address that peers should
// connect to.
struct TcpListener {
  net::Socket socket;
  std::string host;  // numeric address peers connect to
  uint16_t port = 0;
  std::string origin;  // how host was chosen, for errors: "interface 'eth0'", ...
};

// Binds port 0 and returns the listener (see ConnectOptions::interface):
//  - interface not empty: the first of its addresses that can be bound;
//  - else the first address the host name resolves to that is not loopback and can be
//    bound;
//  - else every interface, publishing the first address of an interface that is up and
//    not loopback (127.0.0.1 when there is none).
// Throws NetworkError when the named interface has no address or none can be bound, or
// when no socket can listen at all.
TcpListener listenForPeers(const std::string& interface);

}  // namespace ringtree::rendezvous
