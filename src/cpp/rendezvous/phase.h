#pragma once

#include <chrono>
#include <cstdint>

#include "common/socket.h"

// What the parts of one connection phase (connectMesh) share besides the records:
// this rank, the world size and the phase's clock.
namespace ringtree::rendezvous {

// How long an accepted connection may take to send its handshake before it is dropped
// (a peer sends it right after connecting; this only bounds stray connections).
constexpr std::chrono::milliseconds kHelloTimeout = std::chrono::seconds(10);

struct Phase {
  int rank = 0;
  int size = 0;
  net::Clock::time_point start;
  net::Deadline deadline;               // of the whole phase
  std::chrono::milliseconds timeout{0};  // that the deadline was computed from

  // Milliseconds since the phase started, for errors.
  int64_t elapsedMs() const {
    return std::chrono::duration_cast<std::chrono::milliseconds>(net::Clock::now() - start).count();
  }
  // Time left before the deadline: what store waits of the phase get (the whole timeout
  // when the deadline saturated).
  std::chrono::milliseconds remaining() const {
    const int ms = net::pollTimeoutMs(deadline);
    return ms < 0 ? timeout : std::chrono::milliseconds(ms);
  }
};

}  // namespace ringtree::rendezvous
