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
  uint16_t reserved = 0;  // 0, or a notice's kind (kMismatchNotice, kAbandonNotice)
  uint64_t count = 0;     // element count of the whole call (not of this message)
  int32_t root = -1;      // root rank, or -1
  // Ordinary messages: a hash of the call's per-rank counts (allgather, reduce_scatter;
  // 0 for the others), so that ranks that agree on the total but not on the split
  // mismatch. An abandon notice: its culprit (see kAbandonNotice).
  uint32_t extra = 0;

  // Compares every field. `reserved` counts: a message flagged there (a notice, see
  // Pair::sendNotice) never completes an ordinary receive.
  bool operator==(const Envelope& o) const {
    return sequence == o.sequence && operation == o.operation && dataType == o.dataType &&
           reduceOp == o.reduceOp && reserved == o.reserved && count == o.count && root == o.root &&
           extra == o.extra;
  }
  bool operator!=(const Envelope& o) const { return !(*this == o); }
};
static_assert(sizeof(Envelope) == 32, "Envelope is part of the wire format");

// How transports name a message in their errors: "1024 bytes of allreduce(seq=3, ...)"
// through the describer the layer above installed, which knows what the operation codes
// mean (it returns "" for envelopes it does not know); otherwise, and until one is
// installed, "1024 bytes (sequence 3, operation 258, ...)". Thread-safe.
std::string envelopeText(const Envelope& envelope, size_t bytes);
using EnvelopeDescriber = std::string (*)(const Envelope&);
void setEnvelopeDescriber(EnvelopeDescriber describer);

// Envelope.reserved of notices (Pair::sendNotice), low byte: the kind.
// kMismatchNotice: "this is the call I made", sent to the peer whose message did not
// match. kAbandonNotice: "I gave up on this call", sent to every other peer by a rank
// whose call failed: the high byte of `reserved` is the failure's class (NoticeFailure),
// `extra` the rank that caused it (the one that died, disconnected, did not arrive or
// called something else; the sender itself when none is known), and the other fields
// describe the call that failed.
constexpr uint16_t kMismatchNotice = 1;
constexpr uint16_t kAbandonNotice = 2;
enum class NoticeFailure : uint8_t { kError = 0, kNetwork = 1, kTimeout = 2, kMismatch = 3 };

inline bool isNotice(const Envelope& envelope) { return envelope.reserved != 0; }
inline bool isAbandonNotice(const Envelope& envelope) { return (envelope.reserved & 0xff) == kAbandonNotice; }

// A NetworkError caused by one peer (its connection closed or broke, or it broke the
// protocol): carries that peer's rank, so that the rank that fails can tell the others
// who caused it.
class PeerError : public NetworkError {
 public:
  PeerError(int peerRank, const std::string& message) : NetworkError(message), peerRank(peerRank) {}
  int peerRank;
};

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

  // How many posted sends / receives are not finished, counted from the oldest unfinished
  // one: of the sends (receives) posted so far, all but the last pendingSends()
  // (pendingRecvs()) are finished, so their buffers are free again. Never throws.
  virtual size_t pendingSends() const = 0;
  virtual size_t pendingRecvs() const = 0;

  // For a caller that chooses where a message goes by what arrives (point-to-point tag
  // matching): looks at the next incoming message without taking it. Only while no
  // receive is posted: when that message's envelope and payload size have arrived, stores
  // them in *envelope and *bytes and returns true; the message stays first in line until
  // a receive is posted for it (posted with exactly that envelope and size, it matches).
  // Returns false when its header has not fully arrived yet, or a receive is posted (the
  // stream is then that receive's). Never blocks; may read ahead into the pair's own
  // buffers. Throws like progress(): NetworkError when the connection broke before the
  // header arrived (messages that arrived before are still seen first), after which the
  // pair is failed.
  virtual bool peekIncoming(Envelope* envelope, size_t* bytes) = 0;

  // For a caller that posted no receive on this pair (its sends finished, or stalled):
  // looks, without blocking, at what the peer sent meanwhile, so that a peer that went
  // away or gave up is noticed although nothing is read from it. Reads ahead into the
  // pair's own buffers (later receives still get every message). Throws PeerError when
  // the connection broke (or closed before the peer received what this side sent), and
  // EnvelopeMismatch when the next incoming message is a notice (sendNotice), or, with
  // `current` not null, a message of the call current->sequence whose envelope differs
  // from *current (the peer is in the same call with other arguments). Does nothing
  // while a receive is posted (the receive reports all of this itself).
  virtual void checkIncoming(const Envelope* current) = 0;

  // Prepares the caller to sleep in poll(): fills *pfd with the descriptor and events
  // that signal this pair can make progress. After arming, call progress() once more
  // before sleeping (an event may have arrived in between); disarmWait() after waking.
  virtual void armWait(pollfd* pfd) = 0;
  // armWait() for a caller that also waits on peekIncoming(): the pair wakes it as well
  // when the next message starts to arrive while no receive is posted. After arming, call
  // peekIncoming() once more before sleeping.
  virtual void armWaitForIncoming(pollfd* pfd) = 0;
  virtual void disarmWait() = 0;

  // Best effort, for a rank that gave up on the current call (typically after an
  // EnvelopeMismatch): drops every posted operation and, when the outgoing stream is at a
  // message boundary, sends one empty message whose envelope is `notice`, waiting at most
  // until `deadline` for it to be handed to the peer (TCP: taken by the kernel; shm: in the
  // ring and the peer woken). Never throws; the pair is failed afterwards (every later
  // call rethrows the earlier error, or a NetworkError saying the pair was abandoned).
  // Dropped operations never touch their buffers again. The peer sees the notice as an
  // ordinary message, all 32 envelope bytes (`reserved` included) as given here, and the
  // connection's end of stream after it (this side sends nothing more).
  virtual void sendNotice(const Envelope& notice, net::Deadline deadline) noexcept = 0;

 protected:
  Pair(int peerRank, std::string peerDescription)
      : peerRank_(peerRank), peerDescription_(std::move(peerDescription)) {}

 private:
  int peerRank_;
  std::string peerDescription_;
};

}  // namespace ringtree::transport
