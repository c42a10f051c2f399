#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <string>

#include "common/socket.h"
#include "transport/pair.h"
#include "transport/shm/device.h"
#include "transport/shm/protocol.h"
#include "transport/shm/segment.h"

namespace ringtree::transport::shm {

// What createPair() established with the peer, handed to the ShmPair it builds.
struct PairSetup {
  net::Socket socket;       // connected, non-blocking; wake-up bytes and death detection
  Segment tx;               // our ring (we write), created and initialised here
  Segment rx;               // the peer's ring (we read), validated by createPair()
  size_t txRingBytes = 0;
  size_t rxRingBytes = 0;
  pid_t peerPid = 0;        // kernel-attested (SCM_CREDENTIALS), in our pid namespace
  bool peerReadsDirect = false;  // the peer can process_vm_readv our memory
  bool weReadDirect = false;     // we can process_vm_readv the peer's memory
};

// A Pair between two processes (or two threads) of one host, over two single-producer
// single-consumer rings in shared memory (protocol.h has the layouts).
//
// Sends: posted messages are written into our ring in posting order: a MessageHeader,
// then the payload, published every kPublishBytes so that the reader can start early;
// a payload larger than the free space streams through as the reader frees it. An inline
// send is finished once all its bytes are in the ring. A message of at least
// PairOptions::directCopyThreshold bytes, when the peer can read our memory, is only a
// kDirect header and a descriptor (its address); the peer pulls the payload with
// process_vm_readv and moves the tail past both when done, which finishes the send.
//
// Receives: the payload is copied (or, with Accumulate, reduced) from the ring straight
// into the destination, a chunk at a time; an element split by the ring's wrap-around
// is gathered in a small carry buffer. A kDirect payload is pulled in one
// process_vm_readv, or through a per-pair bounce buffer of kBounceBytes (allocated at the
// first such receive), a chunk at a time, each reduced (Accumulate) or copied into the
// destination while it is still in cache. A plain copy goes through the bounce buffer
// when the destination lies at a short distance past the source (isShortCopyDistance in
// common/copy.h): the kernel copies with `rep movsb`, which Zen 4 runs ~15x slower
// there, so the chunk lands at the source's page offset (distance 0) and copyBytes()
// moves it on.
//
// progress() does all the work it can without waiting, so when it returns false the pair
// is waiting for the peer; never blocks otherwise (a direct pull of a large message is a
// memory copy of that size). Peer death is noticed from the socket: a hang-up seen while
// sleeping (armWait) or by a non-blocking check at least every kHealthCheckInterval
// while spinning, or a failed process_vm_readv. Data the peer published before it went
// away is still delivered; a posted operation that can no longer finish throws
// NetworkError.
//
// Sleeping (the eventcount of protocol.h): armWait() raises this side's flags in shared
// memory (readerSleeping while receives are posted or, from armWaitForIncoming(), always;
// writerSleeping while sends wait for ring space or a direct-copy completion) and
// returns {socket, POLLIN}. A peer that publishes data, space or a completion and finds
// the flag raised clears it and writes one byte to the socket. disarmWait() lowers the
// flags, counting the bytes the peer sent or is about to send, which it and progress()
// drain.
//
// Everything read from the peer (head, tail, headers) is validated before use: a peer
// that breaks the protocol makes this side throw NetworkError (or EnvelopeMismatch for
// a well-formed header that differs from the posted receive), never crash. After the
// first error every later call rethrows it. Not thread-safe (one owning thread, per the
// Pair contract).
class ShmPair final : public Pair {
 public:
  ShmPair(PairSetup setup, int peerRank, std::string peerDescription, const PairOptions& options);
  ~ShmPair() override;

  const char* kind() const override { return "shm"; }
  // Throws InvalidArgument for a null buffer of nonzero size.
  void postSend(const Envelope& envelope, const void* data, size_t bytes) override;
  // Throws InvalidArgument for a null buffer of nonzero size, or an Accumulate whose
  // elementSize is 0, above kMaxElementBytes or not a divisor of bytes.
  void postRecv(const Envelope& expected, void* data, size_t bytes, const Accumulate& accumulate) override;
  bool progress() override;
  // A kDirect send counts as pending (and so does every send posted after it) until the
  // peer has pulled its payload.
  size_t pendingSends() const override;
  size_t pendingRecvs() const override { return recvs_.size(); }
  // Reads the header at our tail, validated like a received one; the message stays in
  // the ring. Notices the peer's departure the way progress() does.
  bool peekIncoming(Envelope* envelope, size_t* bytes) override;
  // An inline message whose payload has arrived in full: copied out, the tail moved past it.
  bool takeIncoming(void* data, size_t bytes) override;
  bool endedCleanly() const noexcept override { return endedCleanly_; }
  bool peerTookEverything() const noexcept override;
  void postTentativeRecv(const Envelope& expected, void* data, size_t bytes, const Accumulate& accumulate) override;
  bool recvRefused() const noexcept override { return refused_; }
  bool withdrawTentativeRecv() noexcept override;
  bool detachSends(net::Deadline deadline) override;
  void detachRecvs() override;
  void checkIncoming(const Envelope* current) override;
  bool hungUp() noexcept override { return net::hungUp(socket_.fd()); }
  void armWait(pollfd* pfd) override;
  // armWait() that also raises readerSleeping with no receive posted.
  void armWaitForIncoming(pollfd* pfd) override;
  void disarmWait() override;
  // At a message boundary of our ring (no inline payload partly written; a kDirect
  // header already there is fine, the notice follows it), writes the notice as a
  // header-only inline message once the ring has room for it, publishes it and wakes the
  // peer, then shuts down the socket's sending direction (the peer sees a hang-up after
  // the notice). A kDirect send announced before stays readable by the peer (process_vm_readv of
  // its buffer) until the peer's receive moves past it or fails.
  void sendNotice(const Envelope& notice, net::Deadline deadline) noexcept override;

  // Largest element size an Accumulate may have (the carry buffer's size).
  static constexpr size_t kMaxElementBytes = 64;
  // A writer publishes head (and a reader tail) at least this often within a message.
  static constexpr size_t kPublishBytes = size_t{64} << 10;
  // Bounce buffer of direct receives (with Accumulate, or at a short distance): fits in
  // L2 next to the destination chunk it is reduced or copied into.
  static constexpr size_t kBounceBytes = size_t{256} << 10;
  static constexpr uint64_t kPageBytes = 4096;
  // While spinning, the socket is checked for a hang-up once this much time has passed
  // (the clock is read every kClockCheckCalls progress() calls).
  static constexpr std::chrono::milliseconds kHealthCheckInterval{50};
  static constexpr unsigned kClockCheckCalls = 256;
  // Lines of newly published data a reader fetches ahead when it sees the head move.
  static constexpr uint64_t kPrefetchLines = 4;

 private:
  struct SendOp {
    Envelope envelope;
    const uint8_t* data;
    size_t bytes;
    size_t written;      // payload bytes in the ring
    bool headerWritten;
    bool direct;
    uint64_t number;     // position among all sends posted (0, 1, ...)
    std::unique_ptr<uint8_t[]> copy;  // the payload, once detached (data points here)
  };
  // A kDirect send whose header is in the ring: finished once the peer's tail passes it.
  struct DirectSend {
    uint64_t headerEnd;  // the end of its descriptor
    uint64_t number;     // SendOp::number
    const uint8_t* data;
    size_t bytes;
    std::unique_ptr<uint8_t[]> copy;  // what the peer pulls from, once detached
  };
  struct RecvOp {
    Envelope expected;
    uint8_t* data;
    size_t bytes;
    Accumulate accumulate;
    bool discard = false;    // detached: the payload is consumed and dropped
    bool tentative = false;  // postTentativeRecv
  };

  bool idle() const { return sends_.empty() && directInFlight_.empty() && recvs_.empty(); }
  // Each returns whether anything moved; throws on errors.
  bool progressSends();
  bool progressRecvs();
  // Writes up to the free space of sends_.front()'s payload. Returns whether it wrote.
  bool writePayload(SendOp& op);
  // Consumes what has arrived of recvs_.front()'s inline payload. Returns whether it did.
  bool readInlinePayload(RecvOp& op);
  // Reduces from `src` (n contiguous ring bytes, `atRingEnd` when they end at the wrap
  // point) into op's destination; returns the bytes consumed (0: only part of an element
  // has arrived).
  size_t accumulateFromRing(RecvOp& op, const uint8_t* src, size_t n, bool atRingEnd);
  // Pulls recvs_.front()'s kDirect payload from the peer's memory (its descriptor ends at
  // headerEnd_).
  void pullDirect(RecvOp& op);
  // The descriptor of the kDirect message whose descriptor ends at `end` in a ring.
  DirectDescriptor& txDescriptor(uint64_t end) const;
  DirectDescriptor& rxDescriptor(uint64_t end) const;
  // Reads bytes at the peer's address into dst with process_vm_readv; throws NetworkError.
  void readPeerMemory(uint8_t* dst, uint64_t address, size_t bytes, const RecvOp& op);
  // Checks that the header at our tail is well formed (marker, kind); throws NetworkError.
  void validateHeader(const MessageHeader& header) const;
  // validateHeader(), then checks that it matches op; throws EnvelopeMismatch otherwise.
  void checkHeader(const MessageHeader& header, const RecvOp& op) const;

  // Reload the peer-owned counter, validating it; return the new value.
  uint64_t reloadTail();
  uint64_t reloadHead();
  // Store our counter (release) and wake the peer if it sleeps on it.
  void publishHead();
  void publishTail();
  void wakePeer();
  // Non-blocking: consumes wake-up bytes; notes end of stream in peerClosed_.
  void drainWakeBytes();
  // Non-blocking poll() of the socket for a hang-up.
  void checkPeerAlive();
  // checkPeerAlive() when kHealthCheckInterval has passed (reading the clock every
  // kClockCheckCalls calls only).
  void checkPeerAliveNowAndThen();
  // Sets the sleeping flags for the operations posted (readerSleeping also when
  // `incoming`) and fills *pfd: armWait() and armWaitForIncoming().
  void arm(pollfd* pfd, bool incoming);
  // Waits (sleeping as a writer, see armWait) until our ring has room up to position
  // `end` or the deadline passes or the peer goes away; returns whether it has room.
  // Throws NetworkError when the peer corrupted the tail.
  bool waitForSpace(uint64_t end, net::Deadline deadline);

  [[noreturn]] void throwProtocolError(const std::string& what) const;
  [[noreturn]] void throwPeerGone() const;
  // With no receive posted: throws EnvelopeMismatch when the message at our tail is a
  // notice or, with `current`, a message of current->sequence that differs from it.
  void throwIfNoticeOrOtherCall(const Envelope* current);
  std::string pendingText() const;
  void rethrowIfFailed() const;

  net::Socket socket_;
  Segment tx_;
  Segment rx_;
  RingControl* txControl_;
  RingControl* rxControl_;
  uint8_t* txRing_;
  const uint8_t* rxRing_;
  const size_t txRingBytes_;
  const size_t rxRingBytes_;
  const pid_t peerPid_;
  const bool peerReadsDirect_;
  const bool weReadDirect_;
  const size_t directCopyThreshold_;

  // Sender side.
  std::deque<SendOp> sends_;               // not yet completely in the ring
  std::deque<DirectSend> directInFlight_;  // kDirect sends the peer reads
  uint64_t sendsPosted_ = 0;               // SendOp::number of the next send
  uint64_t writePosition_ = 0;             // our head (bytes written)
  uint64_t publishedHead_ = 0;             // last value stored in txControl_->head
  uint64_t cachedTail_ = 0;                // last validated peer tail

  // Receiver side.
  std::deque<RecvOp> recvs_;
  bool haveHeader_ = false;     // recvs_.front()'s header has arrived and matched
  bool refused_ = false;        // the tentative recvs_.front() refused the message at our tail
  MessageHeader header_{};      // its validated copy
  uint64_t headerEnd_ = 0;      // ring position after it (and a kDirect one's descriptor)
  size_t delivered_ = 0;        // payload bytes of recvs_.front() consumed
  uint64_t readPosition_ = 0;   // our tail (bytes consumed)
  uint64_t publishedTail_ = 0;  // last value stored in rxControl_->tail
  uint64_t cachedHead_ = 0;     // last validated peer head
  uint8_t carry_[kMaxElementBytes] = {};
  size_t carryBytes_ = 0;       // bytes of a wrap-split element gathered in carry_
  // kBounceBytes + kPageBytes, so that a chunk can start at any page offset.
  std::unique_ptr<uint8_t[]> bounce_;

  // Waiting and peer health.
  bool armedRead_ = false;
  bool armedWrite_ = false;
  size_t owedWakeBytes_ = 0;  // wake-up bytes the peer sent or will send us
  bool peerClosed_ = false;   // the socket reported end of stream or a hang-up
  unsigned callsSinceClock_ = 0;
  net::Clock::time_point lastHealthCheck_;

  std::exception_ptr failure_;
  bool endedCleanly_ = false;  // peekIncoming() found the peer gone after its last message
};

}  // namespace ringtree::transport::shm
