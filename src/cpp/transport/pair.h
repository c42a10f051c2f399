#pragma once

#include <poll.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include <ringtree/error.h>

#include "common/reduce_fn.h"
#include "common/socket.h"

namespace ringtree::transport {

// What every message carries besides its bytes: which collective call it belongs to.
// The receiver posts the envelope it expects; a different one arriving means the ranks
// called different collectives (or the same with different arguments), and the receive
// fails with EnvelopeMismatch instead of corrupting data or hanging.
struct Envelope {
  uint64_t sequence = 0;  // per-communicator collective call counter
  uint32_t operation = 0; // algorithm-defined: collective kind and algorithm step
  uint8_t dataType = 0;   // ringtree::DataType
  uint8_t reduceOp = 0;   // ringtree::ReduceOp
  uint16_t reserved = 0;
  uint64_t count = 0;     // element count of the whole call (not of this message)
  int32_t root = -1;      // root rank, or -1
  uint32_t padding = 0;

  // Compares everything but padding. `reserved` counts: a message flagged there (a
  // mismatch notice, see Pair::sendNotice) never completes an ordinary receive.
  bool operator==(const Envelope& o) const {
    return sequence == o.sequence && operation == o.operation && dataType == o.dataType &&
           reduceOp == o.reduceOp && reserved == o.reserved && count == o.count && root == o.root;
  }
  bool operator!=(const Envelope& o) const { return !(*this == o); }
};
static_assert(sizeof(Envelope) == 32, "Envelope is part of the wire format");

// Thrown by a receive whose arriving message does not match what was posted. Carries
// both envelopes so that the algorithm layer can name both calls.
class EnvelopeMismatch : public CollectiveMismatchError {
 public:
  EnvelopeMismatch(int peerRank, const Envelope& expected, size_t expectedBytes, const Envelope& actual,
                   size_t actualBytes, const std::string& message)
      : CollectiveMismatchError(message),
        peerRank(peerRank),
        expected(expected),
        expectedBytes(expectedBytes),
        actual(actual),
        actualBytes(actualBytes) {}

  int peerRank;
  Envelope expected;
  size_t expectedBytes;
  Envelope actual;
  size_t actualBytes;
};

// How a receive combines arriving bytes with the destination: without one, bytes are
// copied; with one, dst = dst (op) incoming, element-wise. `elementSize` tells the
// transport how to cut chunks on element boundaries.
struct Accumulate {
  ReduceFn fn = nullptr;
  size_t elementSize = 1;
};

// One connection to one peer: ordered, reliable, two-sided messages.
//
// Every postSend on one side is matched by the peer's postRecv of the same size, in
// posting order (messages are never reordered or merged). Posting never blocks and never
// copies the payload up front: the buffers must stay valid (and a send's bytes unchanged)
// until progress() reports the pair idle. Progress happens only inside progress(), on the
// thread that owns the communicator (a Pair is not thread-safe).
//
// Errors (thrown from postRecv/progress, naming the peer rank and its host/pid):
//   NetworkError     the connection broke or the peer process died;
//   EnvelopeMismatch the next message's envelope or size differs from the posted receive.
class Pair {
 public:
  virtual ~Pair() = default;

  int peerRank() const { return peerRank_; }
  // "rank 3 (host 'node1', pid 1234, tcp 10.0.0.2:41234)": for error messages.
  const std::string& peerDescription() const { return peerDescription_; }
  // "tcp" or "shm".
  virtual const char* kind() const = 0;

  virtual void postSend(const Envelope& envelope, const void* data, size_t bytes) = 0;
  virtual void postRecv(const Envelope& expected, void* data, size_t bytes,
                        const Accumulate& accumulate = {}) = 0;

  // Advances posted sends and receives as far as possible without blocking. Returns
  // true when nothing posted is left unfinished.
  virtual bool progress() = 0;

  // Prepares the caller to sleep in poll(): fills *pfd with the descriptor and events
  // that signal this pair can make progress. After arming, call progress() once more
  // before sleeping (an event may have arrived in between); disarmWait() after waking.
  virtual void armWait(pollfd* pfd) = 0;
  virtual void disarmWait() = 0;

  // Best effort, for a rank that gave up on the current call (typically after an
  // EnvelopeMismatch): drops every posted operation and, when the outgoing stream is at a
  // message boundary, sends one empty message whose envelope is `notice`, waiting at most
  // until `deadline` for it to be handed to the peer (TCP: taken by the kernel; shm: in the
  // ring and the peer woken). Never throws; the pair is failed afterwards (every later
  // call rethrows the earlier error, or a NetworkError saying the pair was abandoned).
  // Dropped operations never touch their buffers again. The peer sees the notice as an
  // ordinary message, all 32 envelope bytes (`reserved` included) as given here.
  virtual void sendNotice(const Envelope& notice, net::Deadline deadline) noexcept = 0;

 protected:
  Pair(int peerRank, std::string peerDescription)
      : peerRank_(peerRank), peerDescription_(std::move(peerDescription)) {}

 private:
  int peerRank_;
  std::string peerDescription_;
};

}  // namespace ringtree::transport
