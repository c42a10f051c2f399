#pragma once

#include <memory>
#include <string>

#include "common/socket.h"
#include "transport/pair.h"

// TCP transport: one non-blocking socket per pair (TCP_NODELAY, large socket buffers).
namespace ringtree::transport::tcp {

struct PairOptions {
  // SO_SNDBUF / SO_RCVBUF requested on each socket.
  int socketBufferBytes = 4 << 20;
};

// Builds the pair over a connected TCP socket (the rendezvous made it and exchanged the
// ranks). Throws NetworkError naming the peer.
std::unique_ptr<Pair> createPair(net::Socket socket, int selfRank, int peerRank,
                                 const std::string& peerDescription, const PairOptions& options);

}  // namespace ringtree::transport::tcp
