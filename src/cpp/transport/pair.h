#pragma once

#include <poll.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include <ringtree/error.h>

#include "common/reduce_fn.h"
#include "common/socket.h"

namespace ringtree::transport {

// How a rank whose collective call failed names the failure's class in the abandon
// notices it sends (Envelope::noticeFailure).
enum class NoticeFailure : uint8_t { kError = 0, kNetwork = 1, kTimeout = 2, kMismatch = 3 };

// What every message carries besides its bytes: which call (collective or
// point-to-point) it belongs to and, for a notice, what it reports. Every field has one
// meaning; a field a message has no use for keeps its default. The receiver posts the
// envelope it expects; a different one arriving means the ranks called different
// collectives (or the same with different arguments), and the receive fails with
// EnvelopeMismatch instead of corrupting data or hanging.
//
// Part of the wire format between ranks of one build (host byte order), 48 bytes with no
// implicit padding, so that every byte a transport sends is defined.
struct Envelope {
  // Collectives: the communicator's call counter. Point-to-point: the message's number
  // among those from its sender to its receiver (1, 2, ...).
  uint64_t sequence = 0;
  uint64_t count = 0;      // elements of the whole call (not of this message), or of the message
  uint16_t operation = 0;  // which protocol: collective << 8 | algorithm, or p2p::kMessageOperation
  uint8_t dataType = 0;    // ringtree::DataType of the elements
  uint8_t reduceOp = 0;    // ringtree::ReduceOp of a reducing collective; 0 otherwise
  int32_t root = -1;       // root rank of a rooted collective; -1 otherwise
  // A hash of a collective's per-rank counts where ranks check them (the shm_direct
  // allgather and reduce_scatter fingerprints), so that ranks that agree on the total but
  // not on the split mismatch; 0 otherwise.
  uint32_t countsHash = 0;
  int32_t tag = 0;  // a point-to-point message's tag; 0 for collectives
  // An abandon notice (kAbandonNotice): the rank that caused the failure (the one that
  // died, disconnected, did not arrive or called something else; the sender itself when
  // none is known). -1 otherwise.
  int32_t culprit = -1;
  // 0: an ordinary message. Otherwise a notice (see Pair::sendNotice) of a kind the layer
  // above defines (the collectives' kMismatchNotice and kAbandonNotice below,
  // p2p::MessageKind): it never completes an ordinary receive.
  uint8_t noticeKind = 0;
  NoticeFailure noticeFailure = NoticeFailure::kError;  // a collective abandon notice's failure class
  uint8_t sentDataType = 0;  // a point-to-point mismatch notice: the data type the message was sent as
  uint8_t padding = 0;       // always 0
  // Which communicator the message belongs to where several share one connection (the
  // channels of transport/mux/link.h); 0 on a connection that carries one communicator.
  uint64_t channel = 0;

  // Compares every field but padding: a notice never equals an ordinary message.
  bool operator==(const Envelope& o) const {
    return sequence == o.sequence && count == o.count && operation == o.operation && dataType == o.dataType &&
           reduceOp == o.reduceOp && root == o.root && countsHash == o.countsHash && tag == o.tag &&
           culprit == o.culprit && noticeKind == o.noticeKind && noticeFailure == o.noticeFailure &&
           sentDataType == o.sentDataType && channel == o.channel;
  }
  bool operator!=(const Envelope& o) const { return !(*this == o); }
};
static_assert(sizeof(Envelope) == 48, "Envelope is part of the wire format");
static_assert(std::has_unique_object_representations_v<Envelope>, "Envelope has no padding bytes");

// How transports name a message in their errors: "1024 bytes of allreduce(seq=3, ...)"
// through the describer the layer above installed, which knows what the operation codes
// mean (it returns "" for envelopes it does not know); otherwise, and until one is
// installed, "1024 bytes (sequence 3, operation 258, ...)". Thread-safe.
std::string envelopeText(const Envelope& envelope, size_t bytes);
using EnvelopeDescriber = std::string (*)(const Envelope&);
void setEnvelopeDescriber(EnvelopeDescriber describer);

// The collectives' notice kinds (Envelope::noticeKind; Pair::sendNotice).
// kMismatchNotice: "this is the call I made", sent to the peer whose message did not
// match. kAbandonNotice: "I gave up on this call", sent to every other peer by a rank
// whose call failed, with the failure's class in noticeFailure and the rank that caused
// it in culprit; the other fields describe the call that failed.
constexpr uint8_t kMismatchNotice = 1;
constexpr uint8_t kAbandonNotice = 2;

inline bool isNotice(const Envelope& envelope) { return envelope.noticeKind != 0; }
inline bool isAbandonNotice(const Envelope& envelope) { return envelope.noticeKind == kAbandonNotice; }

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
  // Right after a peekIncoming() that returned true (nothing posted since): takes that
  // message, whose payload is `bytes` bytes, into `data` at once when the pair already
  // holds all of it and can hand it over without a posted receive (shared memory: an
  // inline message wholly in the ring). Returns false, having taken nothing, otherwise
  // (the caller then posts a receive for it). Throws like progress(). What a message
  // costs a caller that matches by what arrives: one step instead of postRecv() and
  // progress(). This default takes nothing.
  virtual bool takeIncoming(void* data, size_t bytes) {
    static_cast<void>(data);
    static_cast<void>(bytes);
    return false;
  }

  // Tentative receives, for a multiplexer (transport/mux/link.h) that posts a channel's
  // receive before it knows whose the next message is. Like postRecv(), but the receive
  // takes the next message only when its envelope and size are exactly the expected ones;
  // otherwise it takes nothing and is refused (recvRefused() turns true), the message
  // staying first in line. At most one, posted while no other receive is.
  // withdrawTentativeRecv() takes it back when it has not started to take a message
  // (refused, or nothing arrived yet) and returns whether it did; peekIncoming() may then
  // look at the message.
  virtual void postTentativeRecv(const Envelope& expected, void* data, size_t bytes,
                                 const Accumulate& accumulate) = 0;
  virtual bool recvRefused() const noexcept = 0;
  virtual bool withdrawTentativeRecv() noexcept = 0;

  // For a multiplexer (transport/mux/link.h) whose channel gives up while the connection
  // moves one of its messages: make the posted operations independent of their callers'
  // buffers, which are free once these return, while the byte stream stays whole.
  // detachSends(): every posted send is still sent in full, from a copy the pair makes of
  // its payload. Returns false when that cannot be done by `deadline` (a shared-memory
  // peer that went on copying from the caller's buffer that long); the sends are then
  // left as they were. detachRecvs(): every posted receive still takes its message from
  // the stream (its envelope is still checked) but stores nothing more. Never throw
  // otherwise (bad_alloc aside).
  virtual bool detachSends(net::Deadline deadline) = 0;
  virtual void detachRecvs() = 0;

  // For a multiplexer, once the stream ended cleanly (endedCleanly): whether the peer took
  // every byte this side sent before it went (TCP: its kernel acknowledged them; shared
  // memory: its tail reached this side's head), so that a send that finished did reach it.
  // Never throws.
  virtual bool peerTookEverything() const noexcept = 0;

  // For a caller that reads every message through peekIncoming() (a multiplexer: see
  // transport/mux/link.h): after peekIncoming() threw because the peer went away, whether
  // the stream ended cleanly, at a message boundary with every message delivered (the peer
  // closed the connection, or its process ended between two messages), rather than in
  // the middle of a message or with an error. The pair is failed either way. Never throws.
  virtual bool endedCleanly() const noexcept = 0;

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

  // Whether the peer closed this connection or its process died (for a channel: the peer
  // closed its end of the channel), as far as can be seen without blocking; messages it
  // sent before may still wait to be received (checkIncoming shows a notice among them).
  // For a caller that waits on something else than the pair (the node arena). Never throws.
  virtual bool hungUp() noexcept = 0;

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
  // ordinary message, the whole envelope (its notice fields included) as given here, and
  // the connection's end of stream after it (this side sends nothing more).
  virtual void sendNotice(const Envelope& notice, net::Deadline deadline) noexcept = 0;

 protected:
  Pair(int peerRank, std::string peerDescription)
      : peerRank_(peerRank), peerDescription_(std::move(peerDescription)) {}

 private:
  int peerRank_;
  std::string peerDescription_;
};

}  // namespace ringtree::transport
